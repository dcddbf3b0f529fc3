// Package console is idemkv's operator console (docs/console.md): server-rendered pages
// at /ui for the people who settle in-doubt records, decide approvals and ask why a
// call did not run.
//
// It is a client of the API, not a second server. Every page reads, and every action
// writes, through requests to the API's own handler, in-process and carrying the
// session's token, so the roles, limits, errors and the forwarding to the leader are the
// API's own; only the other nodes' views of the cluster are asked over the network, as
// `idemkv status` asks them. It must never import the node, Raft or Pebble, and never
// put a token in a URL, a page or a log.
package console

import (
	"embed"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idemkv/idemkv/auth"
	"github.com/idemkv/idemkv/internal/httpx"
)

// Prefix is where the console is served; "/ui" redirects to it.
const Prefix = "/ui/"

// Defaults of Config.
const (
	DefaultMaxSessions = 1000
	// DefaultMaxSessionsPerCaller is one token's share of them (with authentication
	// off, one source address's): past it the caller's own oldest session ends.
	DefaultMaxSessionsPerCaller = 50
	// DefaultSessionIdle ends a session nobody used for that long; DefaultSessionLifetime
	// ends every session, used or not, so a stolen cookie is worth a bounded time.
	DefaultSessionIdle     = 30 * time.Minute
	DefaultSessionLifetime = 12 * time.Hour
	// DefaultPeerTimeout bounds each other node's answer on the overview: a node that is
	// down costs the page that long, not the browser's patience.
	DefaultPeerTimeout = 2 * time.Second
	// DefaultCallTimeout bounds one request to the API.
	DefaultCallTimeout = 10 * time.Second
	// pageSize is the length of every list page: nothing loads everything.
	pageSize = 50
)

// Authenticator checks a token; *auth.Authenticator is one.
type Authenticator interface {
	Authenticate(token string) (*auth.Principal, error)
}

var _ Authenticator = (*auth.Authenticator)(nil)

// Config configures a Server. Zero fields take defaults; API is required.
type Config struct {
	// API is the API's whole handler, its middleware (authentication) included: every
	// page and action is a request to it.
	API http.Handler
	// Auth checks the token entered on the login page and, on every later request, that
	// it is still in the token file. Nil: authentication is off, which every page says.
	Auth Authenticator
	// Peers reaches the other nodes' APIs for their own view of the cluster (the
	// client the API forwards with: peer TLS and timeouts). Default: plain HTTP.
	Peers *http.Client
	// PeerScheme is the scheme of the nodes' API addresses ("http" by default).
	PeerScheme string
	// Conflicts is the ring of recent conflicts the API feeds (api.Config.OnReserve).
	// Default: an empty ring of DefaultConflictsKept that nobody feeds.
	Conflicts *Conflicts
	Logger    *slog.Logger // default: discard
	// MaxSessions bounds the sessions held; a login beyond it ends the least recently
	// used one. Defaults DefaultMaxSessions, DefaultSessionIdle, DefaultSessionLifetime.
	MaxSessions int
	// MaxSessionsPerCaller is one token's share of MaxSessions (with authentication
	// off, one source address's); default DefaultMaxSessionsPerCaller.
	MaxSessionsPerCaller int
	SessionIdle          time.Duration
	SessionLifetime      time.Duration
}

// Server serves the console.
type Server struct {
	api        http.Handler
	auth       Authenticator
	peers      *http.Client
	peerScheme string
	conflicts  *Conflicts
	log        *slog.Logger
	sessions   *sessions
	// loginRefusals bounds the log lines of refused logins.
	loginRefusals auth.RefusalLog
	pages         *pages
	static        http.Handler
	origin        *http.CrossOriginProtection
	rates         rates
	mux           *http.ServeMux
}

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

// New returns a Server for cfg. It panics if cfg.API is nil: that is a wiring bug.
func New(cfg Config) *Server {
	if cfg.API == nil {
		panic("console: Config.API is required")
	}
	s := &Server{
		api:        cfg.API,
		auth:       cfg.Auth,
		peers:      cfg.Peers,
		peerScheme: cfg.PeerScheme,
		conflicts:  cfg.Conflicts,
		log:        cfg.Logger,
		origin:     http.NewCrossOriginProtection(),
		pages:      loadPages(),
		mux:        http.NewServeMux(),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.peers == nil {
		s.peers = &http.Client{Transport: httpx.NodeTransport(nil)}
	}
	if s.peerScheme == "" {
		s.peerScheme = "http"
	}
	if s.conflicts == nil {
		s.conflicts = NewConflicts(0)
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.SessionIdle <= 0 {
		cfg.SessionIdle = DefaultSessionIdle
	}
	if cfg.SessionLifetime <= 0 {
		cfg.SessionLifetime = DefaultSessionLifetime
	}
	if cfg.MaxSessionsPerCaller <= 0 {
		cfg.MaxSessionsPerCaller = DefaultMaxSessionsPerCaller
	}
	s.sessions = newSessions(cfg.MaxSessions, cfg.MaxSessionsPerCaller, cfg.SessionIdle, cfg.SessionLifetime)
	sub, err := fs.Sub(staticFiles, "static")
	if err != nil {
		panic(err)
	}
	s.static = http.StripPrefix(Prefix+"static/", http.FileServerFS(sub))
	s.routes()
	return s
}

func (s *Server) routes() {
	s.mux.Handle("GET "+Prefix+"static/", s.static)
	s.mux.HandleFunc("GET "+Prefix+"login", s.loginPage)
	s.mux.HandleFunc("POST "+Prefix+"login", s.login)
	s.mux.HandleFunc("POST "+Prefix+"logout", s.action(s.logout))
	s.mux.HandleFunc("GET "+Prefix+"{$}", s.page(s.overview))
	s.mux.HandleFunc("GET "+Prefix+"in-doubt", s.page(s.inDoubt))
	s.mux.HandleFunc("POST "+Prefix+"in-doubt/resolve", s.action(s.resolve))
	s.mux.HandleFunc("GET "+Prefix+"approvals", s.page(s.approvals))
	s.mux.HandleFunc("POST "+Prefix+"approvals/decide", s.action(s.decide))
	s.mux.HandleFunc("GET "+Prefix+"conflicts", s.page(s.conflictsPage))
	s.mux.HandleFunc("GET "+Prefix+"records", s.page(s.records))
	s.mux.HandleFunc("GET "+Prefix+"record", s.page(s.record))
	s.mux.HandleFunc(Prefix, func(w http.ResponseWriter, r *http.Request) {
		s.renderError(w, r, http.StatusNotFound, "No such page.")
	})
}

// Mount returns a handler that serves the console at /ui and everything else with
// next (the API). It is no ServeMux: the API's record paths must reach it unchanged,
// never cleaned or redirected.
func (s *Server) Mount(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == strings.TrimSuffix(Prefix, "/"):
			secure(w)
			http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
		case strings.HasPrefix(r.URL.Path, Prefix):
			s.ServeHTTP(w, r)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// ServeHTTP serves the console's paths.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	secure(w)
	s.mux.ServeHTTP(w, r)
}

// contentSecurityPolicy allows only the console's own files: no inline script or
// style, no other origin, no framing, forms posting only to the console.
const contentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// secure sets the headers of every console answer.
func secure(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cache-Control", "no-store")
}
