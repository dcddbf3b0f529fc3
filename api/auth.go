package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/idemkv/idemkv"
)

// Operation is what a request does, as far as authorization cares.
type Operation string

const (
	// OpWrite: reserve, commit, fail, release, heartbeat, doubt and resolve on a
	// tenant's records. Resolve is a write like the others: an agent whose probe
	// found the effect settles an in-doubt record with it.
	OpWrite Operation = "write"
	// OpRead: read one record of a tenant, long-poll included.
	OpRead Operation = "read"
	// OpList: page through a tenant's records.
	OpList Operation = "list"
	// OpListEveryTenant: page through records of every tenant at once (the in-doubt
	// records of GET /v1/in-doubt), for a caller that may list every tenant.
	OpListEveryTenant Operation = "list_every_tenant"
	// OpApprove: approve or deny what a tenant's record waits for. A client may not:
	// the agent that asks must not be the one that approves.
	OpApprove Operation = "approve"
	// OpListApprovals: list a tenant's waiting approvals and read its approval rules.
	OpListApprovals Operation = "list_approvals"
	// OpCluster: read the membership (GET /v1/cluster).
	OpCluster Operation = "cluster"
	// OpAdmin: change the membership, take a backup, read Go's profiles, set approval
	// rules (a rule no client may switch off is no client's to set).
	OpAdmin Operation = "admin"
	// OpMetrics: scrape /metrics. Tool names and decision counts of every tenant are in
	// it, so it is not a tenant's right.
	OpMetrics Operation = "metrics"
)

// Caller is the authenticated caller of a request. Authentication middleware
// (Config.Middleware) puts it into the request's context with WithCaller; the API then
// asks it about every operation, once it knows the tenant the request is about, and
// before the store sees the request. A request without a Caller is not checked: that
// is a server without authentication.
type Caller interface {
	// Allow returns nil when the caller may perform op on tenant ("" for operations
	// that concern no tenant), and otherwise an error wrapping
	// idemkv.ErrPermissionDenied.
	Allow(op Operation, tenant string) error
}

// Identified is implemented by Callers that can name themselves for a record's
// history (the token's name and role): who resolved an in-doubt record.
type Identified interface {
	Identity() string
}

// callerIdentity names the caller of ctx for a record's history: its Identity, or ""
// on a server without authentication.
func callerIdentity(ctx context.Context) string {
	if c, ok := CallerFrom(ctx); ok {
		if id, ok := c.(Identified); ok {
			return idemkv.ClipText(id.Identity(), idemkv.MaxActorLen)
		}
	}
	return ""
}

type callerKey struct{}

// WithCaller returns ctx carrying c.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the Caller in ctx, if any.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// tenantSource says where a route carries its tenant.
type tenantSource int

const (
	tenantNone tenantSource = iota
	tenantPath
	tenantBody
	tenantQuery // ?tenant=
)

type routeAccess struct {
	op     Operation
	tenant tenantSource
}

// access maps every route pattern to what it does. A route missing here needs OpAdmin,
// so that an endpoint added without a thought for authorization is closed, not open.
var access = map[string]routeAccess{
	"POST /v1/reserve":                  {OpWrite, tenantBody},
	"POST /v1/commit":                   {OpWrite, tenantBody},
	"POST /v1/fail":                     {OpWrite, tenantBody},
	"POST /v1/release":                  {OpWrite, tenantBody},
	"POST /v1/heartbeat":                {OpWrite, tenantBody},
	"POST /v1/doubt":                    {OpWrite, tenantBody},
	"POST /v1/resolve":                  {OpWrite, tenantBody},
	"GET /v1/records/{tenant}/{key...}": {OpRead, tenantPath},
	"GET /v1/records/{tenant}":          {OpList, tenantPath},
	"GET /v1/in-doubt":                  {OpListEveryTenant, tenantNone},
	approvalPattern:                     {OpApprove, tenantPath},
	approvalsPattern:                    {OpListApprovals, tenantQuery},
	approvalRulePattern:                 {OpListApprovals, tenantQuery},
	setRulePattern:                      {OpAdmin, tenantNone},
	"GET /v1/cluster":                   {OpCluster, tenantNone},
	"POST /v1/cluster/join":             {OpAdmin, tenantNone},
	"POST /v1/cluster/remove":           {OpAdmin, tenantNone},
	"GET /v1/backup":                    {OpAdmin, tenantNone},
	"GET /metrics":                      {OpMetrics, tenantNone},
	"GET /debug/pprof/":                 {OpAdmin, tenantNone},
	"GET /debug/pprof/cmdline":          {OpAdmin, tenantNone},
	"GET /debug/pprof/profile":          {OpAdmin, tenantNone},
	"GET /debug/pprof/symbol":           {OpAdmin, tenantNone},
	"POST /debug/pprof/symbol":          {OpAdmin, tenantNone},
	"GET /debug/pprof/trace":            {OpAdmin, tenantNone},
	"GET /healthz":                      {"", tenantNone},
	"GET /readyz":                       {"", tenantNone},
}

// allowRoute checks, before the handler of pattern runs, what can be checked from the
// route alone: the operation, and the tenant when the path names it. Routes with the
// tenant in the body are checked by allowBody once it is decoded. It writes the
// refusal itself and reports whether the handler may run.
func (s *Server) allowRoute(w http.ResponseWriter, r *http.Request, pattern string) bool {
	c, ok := CallerFrom(r.Context())
	if !ok {
		return true
	}
	a, known := access[pattern]
	if !known {
		a = routeAccess{OpAdmin, tenantNone}
	}
	var err error
	switch {
	case a.op == "":
		return true
	case a.tenant == tenantPath:
		err = c.Allow(a.op, r.PathValue("tenant"))
	case a.tenant == tenantQuery:
		// A malformed query names no tenant: refused like any other tenant's, before
		// the handler's own 400 could tell a caller anything.
		q, _ := parseQuery(r)
		err = c.Allow(a.op, q.Get("tenant"))
	case a.tenant == tenantNone:
		err = c.Allow(a.op, "")
	}
	if err != nil {
		s.refuse(w, r, err)
		return false
	}
	return true
}

// allowBody checks a decoded request body against the caller. The check runs before
// validation and before the store or the leader see anything, so a refusal is the
// same whatever the other tenant holds.
func (s *Server) allowBody(r *http.Request, req any) error {
	c, ok := CallerFrom(r.Context())
	if !ok {
		return nil
	}
	var tenant string
	switch q := req.(type) {
	case *idemkv.ReserveRequest:
		tenant = q.Tenant
	case *idemkv.CommitRequest:
		tenant = q.Tenant
	case *idemkv.FailRequest:
		tenant = q.Tenant
	case *idemkv.ReleaseRequest:
		tenant = q.Tenant
	case *idemkv.HeartbeatRequest:
		tenant = q.Tenant
	case *idemkv.DoubtRequest:
		tenant = q.Tenant
	case *idemkv.ResolveRequest:
		tenant = q.Tenant
	case *idemkv.JoinRequest, *idemkv.RemoveRequest, *idemkv.SetApprovalRuleRequest:
		// Checked by route: admin operations.
		return nil
	case *idemkv.DecideApprovalRequest:
		// Checked by route: the tenant is in the path.
		return nil
	default:
		return fmt.Errorf("api: no authorization rule for a %T body: %w", req, idemkv.ErrPermissionDenied)
	}
	if err := c.Allow(OpWrite, tenant); err != nil {
		s.log.LogAttrs(r.Context(), slog.LevelInfo, "request refused",
			slog.String(logKeyMethod, r.Method), slog.String(logKeyPath, r.URL.Path), slog.Any(logKeyErr, err))
		return err
	}
	return nil
}

func (s *Server) refuse(w http.ResponseWriter, r *http.Request, err error) {
	s.log.LogAttrs(r.Context(), slog.LevelInfo, "request refused",
		slog.String(logKeyMethod, r.Method), slog.String(logKeyPath, r.URL.Path), slog.Any(logKeyErr, err))
	s.writeError(w, r, err)
}

// WriteError answers r with err in the API's error shape and the status of its code,
// for middleware that must answer before the API does (authentication).
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	writeError(slog.New(slog.DiscardHandler), w, r, err)
}
