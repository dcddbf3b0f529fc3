package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
)

// pageData is what every page's template gets.
type pageData struct {
	Title   string
	Nav     string
	AuthOff bool
	Who     string
	Role    string
	CSRF    string
	Flash   *notice
	Err     *uiError
	// Refresh, when set, reloads the page every that many seconds (a meta refresh: no
	// script needed).
	Refresh int
	Body    any
	page    string
}

// uiError is an error as a page shows it: the API's code and message, and what it
// means for the operator.
type uiError struct {
	Code    string
	Message string
	Hint    string
}

var hints = map[string]string{
	idemkv.CodeOutcomeUnknown:      "The outcome is unknown: the change may or may not have been applied (leadership moved while it replicated, or a forwarded request timed out). Open the record to see whether it is settled before you try again; trying again is safe.",
	idemkv.CodeUnavailable:         "Nothing was changed: the cluster cannot take it now (no leader, or a node shutting down). Try again in a moment.",
	idemkv.CodePermissionDenied:    "Your token may not do this.",
	idemkv.CodeUnauthenticated:     "Your token is not valid any more: log in again.",
	idemkv.CodeNotFound:            "There is no such record (released, expired, or never reserved).",
	idemkv.CodeNotPending:          "It is no longer waiting: it was settled or decided before this action reached it.",
	idemkv.CodeFingerprintMismatch: "The record holds another effect or approval than the one shown: reload the page.",
	idemkv.CodeInvalidArgument:     "The store refused the input; nothing was changed.",
}

// readHints replace the hints that speak of a change when what failed is a page's
// read: under an action's message, "nothing was changed" would be said of the action.
var readHints = map[string]string{
	idemkv.CodeUnavailable: "This page could not be read: the cluster has no leader now (an election, or too few nodes up), or this node is shutting down. Reload in a moment.",
}

// describeRead is describe for the error of a page's read.
func describeRead(err error) *uiError {
	u := describe(err)
	if h, ok := readHints[idemkv.CodeOf(err)]; ok && u != nil {
		u.Hint = h
	}
	return u
}

// describe turns err into what a page shows.
func describe(err error) *uiError {
	if err == nil {
		return nil
	}
	code := idemkv.CodeOf(err)
	msg := err.Error()
	var e *idemkv.Error
	if errors.As(err, &e) {
		msg = e.Message
		if e.Field != "" {
			msg += " (field " + e.Field + ")"
		}
	}
	return &uiError{Code: code, Message: msg, Hint: hints[code]}
}

func (u *uiError) String() string {
	s := u.Code + ": " + u.Message
	if u.Hint != "" {
		s += ". " + u.Hint
	}
	return s
}

// pages holds a template set per page, each the layout and the page's content.
type pages struct {
	sets map[string]*template.Template
}

var pageNames = []string{"login", "overview", "in-doubt", "approvals", "conflicts", "records", "record", "error"}

func loadPages() *pages {
	p := &pages{sets: map[string]*template.Template{}}
	for _, name := range pageNames {
		t := template.New("layout.html").Funcs(funcs)
		p.sets[name] = template.Must(t.ParseFS(templateFiles, "templates/layout.html", "templates/parts.html", "templates/"+name+".html"))
	}
	return p
}

var funcs = template.FuncMap{
	"prefix": func() string { return Prefix },
	"ts": func(t idemkv.Timestamp) string {
		if t == 0 {
			return "—"
		}
		return t.String()
	},
	"since": func(t idemkv.Timestamp) string {
		if t == 0 {
			return "—"
		}
		return roundDuration(time.Since(t.Time()))
	},
	"dur":    roundDuration,
	"json":   prettyJSON,
	"hidden": holdsHidden,
	// open: an approval a decision can still land on (the API answers not_pending to
	// any other, and the form offered Approve and Deny on those).
	"open": func(a *idemkv.Approval) bool {
		return a != nil && a.State == idemkv.ApprovalWaiting && time.Now().Before(a.ExpiresAt.Time())
	},
	"approvalState": func(a *idemkv.Approval) string {
		if a.State == idemkv.ApprovalWaiting && !time.Now().Before(a.ExpiresAt.Time()) {
			return "expired unanswered"
		}
		return string(a.State)
	},
	"rate": func(f float64) string { return strconv.FormatFloat(f, 'f', 2, 64) },
	"num":  func(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) },
	"ms": func(p *int64) string {
		if p == nil {
			return "not measured"
		}
		return strconv.FormatInt(*p, 10) + " ms"
	},
	"formArgs": func(d *pageData, rec *idemkv.Record, ret string, approver bool) formArgs {
		return formArgs{CSRF: d.CSRF, Rec: rec, Return: ret, Approver: approver}
	},
	"deref": func(p *uint64) string {
		if p == nil {
			return "—"
		}
		return strconv.FormatUint(*p, 10)
	},
}

// formArgs is what the resolve and decide forms need.
type formArgs struct {
	CSRF     string
	Rec      *idemkv.Record
	Return   string
	Approver bool
}

func roundDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	}
	return fmt.Sprintf("%dd%s", d/(24*time.Hour), (d % (24 * time.Hour)).Round(time.Hour))
}

// Stored JSON is indented only when it is small and shallow: indentation writes two
// spaces per level on every line, so 64 KiB nested 1,000 deep (an effect kept for an
// approver may be) is 65 MB indented, and a page of 50 of them would stop the node.
// Anything larger is shown as it is stored.
const (
	maxPrettyBytes = 16 << 10
	maxPrettyDepth = 8
)

func prettyJSON(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	if len(raw) > maxPrettyBytes || jsonDepth(raw) > maxPrettyDepth {
		return escapeHidden(string(raw))
	}
	var b bytes.Buffer
	if json.Indent(&b, raw, "", "  ") != nil {
		return escapeHidden(string(raw))
	}
	return escapeHidden(b.String())
}

// hiddenRune reports whether r would not show as itself: a format character (U+202E
// turns the text after it right to left, U+200B is not seen at all), a control, a
// line separator (the JSON whitespace between tokens aside: a control inside a
// string is escaped already). An approver reads the effect to decide: "DE89\u202e9876-5432\u202c"
// showed an IBAN other than the one approved. JSON's own line breaks and indentation
// stay.
func hiddenRune(r rune) bool {
	return !unicode.IsPrint(r) && r != ' ' && r != '\n' && r != '\t' && r != '\r'
}

// escapeHidden writes every hidden rune of JSON text as its \u escape, which means
// the same in JSON (such runes can only be inside strings), so that it shows.
func escapeHidden(s string) string {
	if !strings.ContainsFunc(s, hiddenRune) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if !hiddenRune(r) {
			b.WriteRune(r)
			continue
		}
		if r1, r2 := utf16.EncodeRune(r); r1 != unicode.ReplacementChar {
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
		} else {
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	return b.String()
}

// holdsHidden reports whether stored JSON holds a hidden rune, for a page to say so
// beside it.
func holdsHidden(raw json.RawMessage) bool {
	return strings.ContainsFunc(string(raw), hiddenRune)
}

// jsonDepth is how deep arrays and objects nest in raw (brackets inside strings do
// not count).
func jsonDepth(raw []byte) int {
	depth, deepest, inString, escaped := 0, 0, false, false
	for _, c := range raw {
		switch {
		case escaped:
			escaped = false
		case inString:
			escaped = c == '\\'
			inString = c != '"'
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			deepest = max(deepest, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return deepest
}

// render writes d with its page's template.
func (s *Server) render(w http.ResponseWriter, status int, d *pageData) {
	var b bytes.Buffer
	if err := s.pages.sets[d.page].Execute(&b, d); err != nil {
		s.log.Error("console: rendering a page", "page", d.page, "err", err)
		http.Error(w, "the console could not render this page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

func (s *Server) renderError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	d := &pageData{Title: "Error", page: "error", AuthOff: s.auth == nil, Err: &uiError{Code: http.StatusText(status), Message: msg}}
	s.render(w, status, d)
}

func (s *Server) baseData(v viewer, page, title string) *pageData {
	d := &pageData{Title: title, Nav: page, page: page, AuthOff: s.auth == nil, CSRF: v.sess.csrf}
	if v.principal != nil {
		d.Who, d.Role = v.principal.Name, string(v.principal.Role)
	}
	d.Flash = s.sessions.takeFlash(v.sess.id)
	return d
}

// page wraps a page's handler: the viewer, or the login page when there is none.
func (s *Server) page(h func(r *http.Request, v viewer, d *pageData)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, ok := s.viewerOf(w, r)
		if !ok {
			http.Redirect(w, r, Prefix+"login?next="+urlQueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		d := s.baseData(v, "", "")
		h(r, v, d)
		s.render(w, http.StatusOK, d)
	}
}

// action wraps a form's handler: the viewer, the CSRF checks, then the handler, which
// returns where to go and the one-time message that page shows.
func (s *Server) action(h func(w http.ResponseWriter, r *http.Request, v viewer) (to string, flash notice)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		v, ok := s.viewerOf(w, r)
		if !ok {
			http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
			return
		}
		if !s.checkCSRF(r, v) {
			s.log.Info("console: form refused: cross-origin or without the CSRF token", "path", r.URL.Path, "remote", r.RemoteAddr)
			s.renderError(w, r, http.StatusForbidden, "This form was refused: it came from another site or without this session's CSRF token. Nothing was changed; reload the page and try again.")
			return
		}
		to, flash := h(w, r, v)
		if flash.Msg != "" {
			s.sessions.setFlash(v.sess.id, flash)
		}
		http.Redirect(w, r, to, http.StatusSeeOther)
	}
}

// maxFormBytes bounds a form: the largest field is a reason or a remote URL.
const maxFormBytes = 64 << 10

// localPath returns next when it is a console page, else fallback: a redirect never
// leaves the console. A path with a dot segment ("/ui/../metrics", which http.Redirect
// cleans to "/metrics", or its escaped "%2e%2e", which a browser resolves) is not one.
func localPath(next, fallback string) string {
	p, _, _ := strings.Cut(next, "?")
	if !strings.HasPrefix(next, Prefix) || strings.ContainsFunc(next, func(r rune) bool { return r < 0x20 || r == 0x7f || r == '\\' }) ||
		strings.Contains(strings.ToLower(p), "%2e") {
		// A control character (a tab, which browsers drop from a URL: "/ui/.\t./x"
		// is "/ui/../x" to them) or a backslash is no console path either.
		return fallback
	}
	if c := path.Clean(p); c != p && c+"/" != p {
		return fallback
	}
	return next
}

func urlQueryEscape(s string) string { return template.URLQueryEscaper(s) }

// may reports whether v may perform op on tenant, as the API will decide it: the
// console shows only the forms the viewer can use (the API still checks each action).
func (v viewer) may(op api.Operation, tenant string) bool {
	return v.principal == nil || v.principal.Allow(op, tenant) == nil
}

// tenants returns the viewer's own tenants and whether it holds every one.
func (v viewer) tenants() ([]string, bool) {
	if v.principal == nil {
		return nil, true
	}
	return v.principal.Tenants()
}

// tenantChoice is the tenant a page is about: the one asked for, or the viewer's only
// tenant.
func tenantChoice(r *http.Request, v viewer) (tenant string, choices []string) {
	tenant = r.URL.Query().Get("tenant")
	choices, _ = v.tenants()
	if tenant == "" && len(choices) == 1 {
		tenant = choices[0]
	}
	return tenant, choices
}
