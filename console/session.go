package console

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"sync"
	"time"

	"github.com/idemkv/idemkv/auth"
	"github.com/idemkv/idemkv/internal/connlimit"
)

// cookiePrefix starts the name of the cookie that carries the session id, never the
// token: the token stays in this process's memory, where the session's requests to the
// API need it.
const cookiePrefix = "idemkv_console_"

// cookieName is the session cookie's name for the host (and port) the browser asked:
// browsers do not separate cookies by port, and two nodes on one host must not end
// each other's sessions.
func cookieName(r *http.Request) string {
	b := []byte(cookiePrefix)
	for _, c := range []byte(r.Host) {
		if ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9') {
			b = append(b, c)
		} else {
			b = append(b, '_')
		}
	}
	return string(b)
}

// session is one browser's login. token is "" when authentication is off.
type session struct {
	id    string
	token string
	// owner is whose share the session counts in: its token's name, or with
	// authentication off the source address of the browser that opened it.
	owner   string
	csrf    string
	created time.Time
	seen    time.Time
	// flash is shown once, on the page an action redirects to.
	flash notice
}

// notice is what an action says on the page it redirects to, once.
type notice struct {
	Msg string
	Err bool
	// Tenant and Key name the record a failed resolve or decision was about; the
	// message links to it, since the record is where the operator learns what really
	// happened (outcome_unknown: whether the change landed; not_pending: who settled it).
	Tenant, Key string
}

// sessions holds the logins of this node, bounded in number, idle time and age. They
// live in memory: a restart logs everyone out, and a session on one node is no
// session on another.
type sessions struct {
	mu       sync.Mutex
	byID     map[string]*session
	max      int
	perOwner int
	idle     time.Duration
	lifetime time.Duration
}

func newSessions(max, perOwner int, idle, lifetime time.Duration) *sessions {
	return &sessions{byID: map[string]*session{}, max: max, perOwner: min(perOwner, max), idle: idle, lifetime: lifetime}
}

func randomID() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// start makes a new session of owner. An owner that holds its share ends its own least
// recently used session; when the table is full, the owner holding the most does. One
// token logging in over and over, or a script without a cookie while authentication is
// off, ends its own sessions and nobody else's.
func (ss *sessions) start(token, owner string, now time.Time) *session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.expireLocked(now)
	held := map[string]int{}
	for _, s := range ss.byID {
		held[s.owner]++
	}
	if held[owner] >= ss.perOwner || len(ss.byID) >= ss.max {
		// Whose session ends: the owner's own at its share, else one of the owners
		// holding the most; of theirs the least recently used.
		gives := func(o string) bool { return o == owner }
		if held[owner] < ss.perOwner {
			most := 0
			for _, n := range held {
				most = max(most, n)
			}
			gives = func(o string) bool { return held[o] == most }
		}
		var lru *session
		for _, s := range ss.byID {
			if gives(s.owner) && (lru == nil || s.seen.Before(lru.seen)) {
				lru = s
			}
		}
		if lru != nil {
			delete(ss.byID, lru.id)
		}
	}
	s := &session{id: randomID(), token: token, owner: owner, csrf: randomID(), created: now, seen: now}
	ss.byID[s.id] = s
	return s
}

func (ss *sessions) expireLocked(now time.Time) {
	for id, s := range ss.byID {
		if ss.expired(s, now) {
			delete(ss.byID, id)
		}
	}
}

func (ss *sessions) expired(s *session, now time.Time) bool {
	return now.Sub(s.seen) > ss.idle || now.Sub(s.created) > ss.lifetime
}

// get returns the live session of id and marks it used; a copy, so a handler never
// races another request of the same browser.
// get returns the live session id; touch counts the request as its user's activity
// (a page's own automatic reload does not: an unattended overview would otherwise keep
// its session for its whole lifetime).
func (ss *sessions) get(id string, now time.Time, touch bool) (session, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s, ok := ss.byID[id]
	if !ok {
		return session{}, false
	}
	if ss.expired(s, now) {
		delete(ss.byID, id)
		return session{}, false
	}
	if touch {
		s.seen = now
	}
	return *s, true
}

// takeFlash returns and clears the session's flash (nil: none).
func (ss *sessions) takeFlash(id string) *notice {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s, ok := ss.byID[id]
	if !ok || s.flash.Msg == "" {
		return nil
	}
	n := s.flash
	s.flash = notice{}
	return &n
}

func (ss *sessions) setFlash(id string, n notice) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if s, ok := ss.byID[id]; ok {
		s.flash = n
	}
}

func (ss *sessions) end(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.byID, id)
}

func (ss *sessions) len() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.byID)
}

// viewer is who a request is from: the session and, with authentication on, the
// principal its token is now (looked up again on every request, so a token removed
// from the token file ends its sessions at once).
type viewer struct {
	sess      session
	principal *auth.Principal // nil: authentication is off
}

func (s *Server) setCookie(w http.ResponseWriter, r *http.Request, sess *session) {
	http.SetCookie(w, &http.Cookie{
		Name: cookieName(r), Value: sess.id, Path: Prefix,
		MaxAge:   int(s.sessions.lifetime / time.Second),
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
}

func clearCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName(r), Value: "", Path: Prefix, MaxAge: -1,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
}

// autoRefresh marks the URL a page reloads itself with (layout.html).
const autoRefresh = "auto-refresh"

// viewerOf returns the request's viewer. With authentication off every browser gets a
// session of its own on its first visit, for the CSRF token of its forms.
func (s *Server) viewerOf(w http.ResponseWriter, r *http.Request) (viewer, bool) {
	now := time.Now()
	var sess session
	var ok bool
	if c, err := r.Cookie(cookieName(r)); err == nil {
		sess, ok = s.sessions.get(c.Value, now, r.URL.Query().Get(autoRefresh) == "")
	}
	if s.auth == nil {
		if !ok {
			sess = *s.sessions.start("", connlimit.SourceOfHostPort(r.RemoteAddr), now)
			s.setCookie(w, r, &sess)
		}
		return viewer{sess: sess}, true
	}
	if !ok {
		return viewer{}, false
	}
	p, err := s.auth.Authenticate(sess.token)
	if err != nil {
		s.sessions.end(sess.id)
		return viewer{}, false
	}
	return viewer{sess: sess, principal: p}, true
}

// checkCSRF refuses a form that is cross-origin (Sec-Fetch-Site, Origin) or lacks
// the session's CSRF token.
func (s *Server) checkCSRF(r *http.Request, v viewer) bool {
	if s.origin.Check(r) != nil {
		return false
	}
	got := r.PostFormValue("csrf")
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(v.sess.csrf)) == 1
}
