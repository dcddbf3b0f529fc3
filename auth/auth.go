// Package auth authenticates API callers by bearer token and decides what each of them
// may do. Tokens, their roles and their tenants come from a token file (JSON or YAML)
// that holds only SHA-256 hashes of the tokens, so a leaked file grants nothing.
//
// It must never log, store or echo a token, and it compares hashes in constant time.
package auth

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
)

// Role is what a token may do beyond its tenants.
type Role string

const (
	// RoleClient acts on the records of its tenants: reserve, commit, fail, release,
	// heartbeat, get (long-poll included) and list. It may read the membership, which
	// clients use to find the leader.
	RoleClient Role = "client"
	// RoleAdmin is global: it can do what a client can on every tenant, and also
	// change the membership, take backups, scrape metrics and read profiles. A token
	// file that scopes an admin to tenants is refused.
	RoleAdmin Role = "admin"
	// RoleMonitor may only scrape /metrics and read the membership: for Prometheus
	// and dashboards, which must not read records.
	RoleMonitor Role = "monitor"
	// RoleApprover approves or denies what the records of its tenants wait for, lists
	// the waiting approvals and reads the records (to see the effect); it writes
	// nothing else. A client may not approve: the agent that asks must not be able to
	// approve itself.
	RoleApprover Role = "approver"
)

// AllTenants in a token's tenants grants every tenant.
const AllTenants = "*"

// HashPrefix starts every token hash in a token file.
const HashPrefix = "sha256:"

// ErrInvalidFile is wrapped by every error about the content of a token file.
var ErrInvalidFile = errors.New("auth: invalid token file")

// Token is one entry of the token file.
type Token struct {
	// Name identifies the token in logs; it is not secret.
	Name string `json:"name" yaml:"name"`
	// Hash is HashToken of the token: "sha256:" and 64 hex digits.
	Hash    string   `json:"hash" yaml:"hash"`
	Role    Role     `json:"role" yaml:"role"`
	Tenants []string `json:"tenants,omitempty" yaml:"tenants,omitempty"`
}

// File is the content of a token file.
type File struct {
	Tokens []Token `json:"tokens" yaml:"tokens"`
}

// Parse reads a token file. A document whose first non-blank byte is '{' is JSON;
// anything else is YAML. Unknown fields are errors in both, so that a misspelt
// "tenants" cannot silently grant nothing or everything.
func Parse(data []byte) (*File, error) {
	var f File
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			return nil, fmt.Errorf("%w: JSON: %v", ErrInvalidFile, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("%w: JSON: more data after the document", ErrInvalidFile)
		}
	} else {
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: YAML: %v", ErrInvalidFile, err)
		}
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return &f, nil
}

// Validate reports an entry that is malformed or ambiguous.
func (f *File) Validate() error {
	if len(f.Tokens) == 0 {
		return fmt.Errorf("%w: no tokens: nobody could use the API", ErrInvalidFile)
	}
	hashes := map[string]string{}
	names := map[string]bool{}
	for i, t := range f.Tokens {
		where := fmt.Sprintf("token %d (%q)", i+1, t.Name)
		if t.Name == "" {
			return fmt.Errorf("%w: token %d has no name", ErrInvalidFile, i+1)
		}
		if names[t.Name] {
			return fmt.Errorf("%w: %s: the name is used twice", ErrInvalidFile, where)
		}
		names[t.Name] = true
		if err := validHash(t.Hash); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrInvalidFile, where, err)
		}
		h := strings.ToLower(t.Hash)
		if other, dup := hashes[h]; dup {
			return fmt.Errorf("%w: %s has the same hash as %q", ErrInvalidFile, where, other)
		}
		hashes[h] = t.Name
		switch t.Role {
		case RoleClient, RoleApprover:
			if len(t.Tenants) == 0 {
				return fmt.Errorf("%w: %s: a %s token needs tenants", ErrInvalidFile, where, t.Role)
			}
		case RoleAdmin:
			// Admin operations (backups of every tenant, membership, profiles) cannot be
			// scoped to a tenant, so an admin is global: a file that lists an admin's
			// tenants would promise a limit that does not exist.
			if len(t.Tenants) > 1 || (len(t.Tenants) == 1 && t.Tenants[0] != AllTenants) {
				return fmt.Errorf("%w: %s: an admin token is global; give it no tenants (or [\"*\"]), and a client token for tenant-scoped access", ErrInvalidFile, where)
			}
		case RoleMonitor:
			if len(t.Tenants) > 0 {
				return fmt.Errorf("%w: %s: a monitor token reads no tenant's records; remove its tenants", ErrInvalidFile, where)
			}
		default:
			return fmt.Errorf("%w: %s: role %q is not client, approver, admin or monitor", ErrInvalidFile, where, t.Role)
		}
		for _, tenant := range t.Tenants {
			if tenant == AllTenants {
				continue
			}
			if err := idemkv.ValidTenant(tenant); err != nil {
				return fmt.Errorf("%w: %s: tenant %q: %v", ErrInvalidFile, where, tenant, err)
			}
		}
	}
	return nil
}

func validHash(h string) error {
	hexPart, ok := strings.CutPrefix(strings.ToLower(h), HashPrefix)
	if !ok {
		return fmt.Errorf("hash must start with %q (see idemkv auth hash-token)", HashPrefix)
	}
	if b, err := hex.DecodeString(hexPart); err != nil || len(b) != sha256.Size {
		return fmt.Errorf("hash must be %s and %d hex digits", HashPrefix, 2*sha256.Size)
	}
	return nil
}

// HashToken returns the hash of token as a token file stores it.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return HashPrefix + hex.EncodeToString(sum[:])
}

// NewToken returns a fresh random token: 32 bytes from crypto/rand, URL-safe base64,
// behind a prefix that makes it easy to find in leaked text.
func NewToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("auth: new token: %w", err)
	}
	return "idk_" + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// Principal is an authenticated token: what api.Caller asks about.
type Principal struct {
	Name       string
	Role       Role
	allTenants bool
	tenants    map[string]bool
}

var (
	_ api.Caller     = (*Principal)(nil)
	_ api.LimitKeyer = (*Principal)(nil)
	_ api.Identified = (*Principal)(nil)
)

// LimitKey implements api.LimitKeyer: per-token caps count by token name.
func (p *Principal) LimitKey() string { return p.Name }

// Identity implements api.Identified: a record's history names the token that
// resolved it by its name and role ("oncall-alice (admin)").
func (p *Principal) Identity() string { return p.Name + " (" + string(p.Role) + ")" }

// Allow implements api.Caller: the role decides the operations, the tenants decide the
// records. A refusal names only what the caller asked for, never what exists.
func (p *Principal) Allow(op api.Operation, tenant string) error {
	switch op {
	case api.OpCluster:
		return nil
	case api.OpAdmin, api.OpMetrics:
		if p.Role == RoleAdmin || (op == api.OpMetrics && p.Role == RoleMonitor) {
			return nil
		}
		return idemkv.Errorf(idemkv.ErrPermissionDenied, "token %q (role %s) may not perform %s operations", p.Name, p.Role, op)
	case api.OpWrite, api.OpRead, api.OpList:
		if p.everyTenant() || (p.Role == RoleClient && p.tenants[tenant]) ||
			(op == api.OpRead && p.Role == RoleApprover && p.hasTenant(tenant)) {
			return nil
		}
		return idemkv.Errorf(idemkv.ErrPermissionDenied, "token %q may not act on tenant %q", p.Name, tenant)
	case api.OpApprove:
		if p.Role == RoleAdmin || (p.Role == RoleApprover && p.hasTenant(tenant)) {
			return nil
		}
		return idemkv.Errorf(idemkv.ErrPermissionDenied, "token %q (role %s) may not decide approvals of tenant %q; that takes an approver token of the tenant or an admin", p.Name, p.Role, tenant)
	case api.OpListApprovals:
		if p.everyTenant() || ((p.Role == RoleClient || p.Role == RoleApprover) && p.hasTenant(tenant)) {
			return nil
		}
		return idemkv.Errorf(idemkv.ErrPermissionDenied, "token %q may not list the approvals of tenant %q", p.Name, tenant)
	case api.OpListEveryTenant:
		if p.everyTenant() {
			return nil
		}
		return idemkv.Errorf(idemkv.ErrPermissionDenied, "token %q may not list every tenant's records; that takes a token for every tenant (an admin)", p.Name)
	}
	return idemkv.Errorf(idemkv.ErrPermissionDenied, "token %q: unknown operation %q", p.Name, op)
}

// Tenants returns the tenants p names, sorted, and whether it holds every tenant
// ("*", or an admin): the console offers them to pick from.
func (p *Principal) Tenants() (tenants []string, every bool) {
	for t := range p.tenants {
		if t != AllTenants {
			tenants = append(tenants, t)
		}
	}
	slices.Sort(tenants)
	return tenants, p.allTenants || p.Role == RoleAdmin
}

// hasTenant reports whether tenant is among p's tenants ("*" grants every one).
func (p *Principal) hasTenant(tenant string) bool { return p.allTenants || p.tenants[tenant] }

// everyTenant reports whether p acts on the records of every tenant: an admin, or a
// client whose tenants are "*".
func (p *Principal) everyTenant() bool {
	return p.Role == RoleAdmin || (p.Role == RoleClient && p.allTenants)
}

// entry is a token in memory: its hash as bytes, for the constant-time compare.
type entry struct {
	hash      [sha256.Size]byte
	principal *Principal
}

// Authenticator checks bearer tokens against a token file. Reload swaps the file in
// atomically, so tokens can rotate without a restart.
type Authenticator struct {
	path    string
	log     *slog.Logger
	entries atomic.Pointer[[]entry]
	refused RefusalLog
}

// New returns an Authenticator for f, which must be valid.
func New(f *File, logger *slog.Logger) (*Authenticator, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	a := &Authenticator{log: logger.With("component", "auth")}
	if err := a.install(f); err != nil {
		return nil, err
	}
	return a, nil
}

// Load reads the token file at path; Reload reads it again.
func Load(path string, logger *slog.Logger) (*Authenticator, error) {
	f, err := readFile(path)
	if err != nil {
		return nil, err
	}
	a, err := New(f, logger)
	if err != nil {
		return nil, err
	}
	a.path = path
	return a, nil
}

func readFile(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	f, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Reload reads the token file again. If it is unreadable or invalid, the tokens in use
// stay in force and the error says why.
func (a *Authenticator) Reload() error {
	if a.path == "" {
		return errors.New("auth: this authenticator was not loaded from a file")
	}
	f, err := readFile(a.path)
	if err != nil {
		return err
	}
	if err := a.install(f); err != nil {
		return err
	}
	a.log.Info("token file reloaded", "path", a.path, "tokens", len(f.Tokens))
	return nil
}

func (a *Authenticator) install(f *File) error {
	if err := f.Validate(); err != nil {
		return err
	}
	entries := make([]entry, 0, len(f.Tokens))
	for _, t := range f.Tokens {
		p := &Principal{Name: t.Name, Role: t.Role, tenants: map[string]bool{}}
		for _, tenant := range t.Tenants {
			if tenant == AllTenants {
				p.allTenants = true
			}
			p.tenants[tenant] = true
		}
		var e entry
		// Validate checked the length and the digits.
		_, _ = hex.Decode(e.hash[:], []byte(strings.ToLower(t.Hash[len(HashPrefix):])))
		e.principal = p
		entries = append(entries, e)
	}
	a.entries.Store(&entries)
	return nil
}

// Authenticate returns the principal of token, or an error wrapping
// idemkv.ErrUnauthenticated. Every entry is compared, in constant time, whether or not
// an earlier one matched, so the time taken tells nothing about the tokens.
func (a *Authenticator) Authenticate(token string) (*Principal, error) {
	if token == "" {
		return nil, idemkv.Errorf(idemkv.ErrUnauthenticated, "a bearer token is required (Authorization: Bearer <token>)")
	}
	sum := sha256.Sum256([]byte(token))
	var found *Principal
	for _, e := range *a.entries.Load() {
		if subtle.ConstantTimeCompare(sum[:], e.hash[:]) == 1 {
			found = e.principal
		}
	}
	if found == nil {
		return nil, idemkv.Errorf(idemkv.ErrUnauthenticated, "the bearer token is not valid")
	}
	return found, nil
}

// Anyone may send requests without a token, as many and with paths as long as they
// like (100 requests with 60 KB paths added 5.9 MB to the log when each was logged
// whole). So the refusals are logged at most once per unauthenticatedLogEvery, each
// line saying how many were left out since the previous one, with the path clipped to
// maxLoggedPathBytes (and its length given). Every refusal still counts in the
// request metrics by code.
const (
	unauthenticatedLogEvery = time.Second
	maxLoggedPathBytes      = 256
)

// RefusalLog decides which refusals of callers who proved nothing are logged: one a
// second, with how many were left out before it. The console's refused logins use it
// too. The zero value is ready.
type RefusalLog struct {
	mu         sync.Mutex
	next       time.Time // no line before this
	suppressed int       // refusals left out since the last line
}

// Admit reports whether a refusal at now is logged and, if so, how many were left out
// before it.
func (l *RefusalLog) Admit(now time.Time) (log bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) {
		l.suppressed++
		return false, 0
	}
	l.next = now.Add(unauthenticatedLogEvery)
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}

// BearerToken returns the token of an "Authorization: Bearer <token>" header, or "".
func BearerToken(r *http.Request) string {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// open are the paths anyone may reach: liveness and readiness probes of orchestrators,
// which carry no token and learn nothing about records.
var open = map[string]bool{"/healthz": true, "/readyz": true}

// Middleware authenticates every request but the health probes and puts the principal
// into the request's context for the API to ask (api.WithCaller). A request without a
// valid token gets 401 before anything else runs.
func (a *Authenticator) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if open[r.URL.Path] && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			next.ServeHTTP(w, r)
			return
		}
		p, err := a.Authenticate(BearerToken(r))
		if err != nil {
			if log, suppressed := a.refused.Admit(time.Now()); log {
				a.log.LogAttrs(r.Context(), slog.LevelInfo, "unauthenticated request",
					slog.String("method", idemkv.ClipText(r.Method, maxLoggedPathBytes)),
					slog.String("path", idemkv.ClipText(r.URL.Path, maxLoggedPathBytes)), slog.Int("path_bytes", len(r.URL.Path)),
					slog.String("remote", r.RemoteAddr), slog.Any("err", err), slog.Int("suppressed", suppressed))
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="idemkv"`)
			api.WriteError(w, r, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(api.WithCaller(r.Context(), p)))
	})
}
