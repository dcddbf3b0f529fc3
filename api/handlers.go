package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/httpx"
	"github.com/idemkv/idemkv/metrics"
	"github.com/idemkv/idemkv/telemetry"
	"github.com/idemkv/idemkv/telemetry/semconv"
)

// Bounds of cluster membership requests; the root package has no validation for them.
const (
	maxNodeIDLen = 128
	maxAddrLen   = 256
)

func (s *Server) addRoutes() {
	s.handle("POST /v1/reserve", localFirstWrite(s, func(q *idemkv.ReserveRequest) error {
		// The node validates again against the time the leader stamps on the command;
		// this early check only spares a round trip for requests that cannot succeed.
		l := s.store.Limits()
		if err := q.Validate(l, idemkv.TimestampOf(time.Now())); err != nil {
			return err
		}
		q.EnsureDefaults(l)
		return nil
	}, s.store.ReserveLocal, s.sabotageReserve(s.store.Reserve), s.countDecision))
	s.handle("POST /v1/commit", leaderWrite(s, func(q *idemkv.CommitRequest) error {
		return q.Validate(s.store.Limits())
	}, s.sabotageCommit(s.store.Commit), annotateCommit))
	s.handle("POST /v1/fail", leaderWrite(s, func(q *idemkv.FailRequest) error {
		return q.Validate(s.store.Limits())
	}, s.store.Fail, nil))
	s.handle("POST /v1/release", leaderWrite(s, (*idemkv.ReleaseRequest).Validate, s.store.Release, nil))
	s.handle("POST /v1/heartbeat", leaderWrite(s, func(q *idemkv.HeartbeatRequest) error {
		l := s.store.Limits()
		if err := q.Validate(l); err != nil {
			return err
		}
		q.EnsureDefaults(l)
		return nil
	}, s.store.Heartbeat, nil))
	s.handle("POST /v1/doubt", leaderWrite(s, (*idemkv.DoubtRequest).Validate, s.store.Doubt, nil))
	s.handle("POST /v1/resolve", http.HandlerFunc(s.resolve))
	s.handle(recordPattern, http.HandlerFunc(s.get))
	s.handle("GET /v1/records/{tenant}", http.HandlerFunc(s.list))
	s.handle("GET /v1/in-doubt", http.HandlerFunc(s.listInDoubt))
	s.handle("GET /v1/cluster", http.HandlerFunc(s.cluster))
	s.handle("POST /v1/cluster/join", leaderWrite(s, validJoin, s.store.Join, nil))
	s.handle("POST /v1/cluster/remove", leaderWrite(s, validRemove, s.store.Remove, nil))
	s.handle("GET /healthz", http.HandlerFunc(s.healthz))
	s.handle("GET /readyz", http.HandlerFunc(s.readyz))
	s.handle("GET /metrics", promhttp.HandlerFor(s.metrics.Registry, promhttp.HandlerOpts{}))
	s.approvalRoutes()
	s.mountBackup()
	s.mountDebug()
}

// recordPattern is the route of one record. Its key is the rest of the path, taken
// raw: see serveUnclean.
const recordPattern = "GET /v1/records/{tenant}/{key...}"

// handle registers h for pattern, timed under the pattern so that the endpoint label
// never carries a tenant or a key.
func (s *Server) handle(pattern string, h http.Handler) {
	// The route's series of 200 answers, looked up on the first: most answers are
	// 200, and a look-up hashes both label values.
	var ok atomic.Pointer[prometheus.Observer]
	wrapped := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		markReached(w)
		start := time.Now()
		sw := &httpx.StatusWriter{ResponseWriter: w}
		if s.allowRoute(sw, r, pattern) {
			h.ServeHTTP(sw, r)
		}
		status := sw.Status()
		if status != http.StatusOK {
			s.metrics.Requests.WithLabelValues(pattern, strconv.Itoa(status)).Observe(time.Since(start).Seconds())
			return
		}
		obs := ok.Load()
		if obs == nil {
			o := s.metrics.Requests.WithLabelValues(pattern, "200")
			obs = &o
			ok.Store(obs)
		}
		(*obs).Observe(time.Since(start).Seconds())
	})
	if pattern == recordPattern {
		s.recordRoute = wrapped
	}
	s.mux.Handle(pattern, wrapped)
	s.routes.Handle(pattern, wrapped)
}

// reachWriter is the writer countAnsweredBefore hands the middleware: the endpoint
// that gets the request marks it, through whatever writers the middleware wrapped
// around it, so that a request is timed once, by the endpoint or else here.
type reachWriter struct {
	httpx.StatusWriter
	reached bool
}

// markReached marks the reachWriter under w, if there is one.
func markReached(w http.ResponseWriter) {
	for {
		if rw, ok := w.(*reachWriter); ok {
			rw.reached = true
			return
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return
		}
		w = u.Unwrap()
	}
}

// countAnsweredBefore times, under the endpoint they were for, the requests that the
// middleware answered itself (a 401 for a missing or unknown token, say), which never
// reach an endpoint's own timing: failed authentication belongs in the request metric.
func (s *Server) countAnsweredBefore(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rw := &reachWriter{StatusWriter: httpx.StatusWriter{ResponseWriter: w}}
		h.ServeHTTP(rw, r)
		if rw.reached {
			return
		}
		_, pattern := s.routes.Handler(r)
		if pattern == "" {
			pattern = "unmatched"
		}
		s.metrics.Requests.WithLabelValues(pattern, strconv.Itoa(rw.Status())).Observe(time.Since(start).Seconds())
	})
}

// serve is the entry point of every request.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if addr, _ := s.store.Leader(); addr != "" {
		w.Header()[HeaderLeader] = s.leaderHeader(addr)
	}
	if err := crossOrigin.Check(r); err != nil {
		// A browser's cross-site POST (a form or a text/plain fetch, which need no
		// preflight) to a node a web page can reach, 127.0.0.1 with authentication
		// off the first of them: no client of the API is a browser on another site.
		s.writeError(w, r, fmt.Errorf("%w: a cross-origin request from a browser (%v); call the API from a client, not a web page", idemkv.ErrPermissionDenied, err))
		return
	}
	if p := r.URL.EscapedPath(); !isClean(p) {
		s.serveUnclean(w, r, p)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// crossOrigin refuses the writes a browser sends on behalf of another site (its
// Sec-Fetch-Site or Origin says so); requests without those headers, every client's,
// pass. It holds no configuration, so one serves every Server.
var crossOrigin = http.NewCrossOriginProtection()

// leaderHeader returns the values of the HeaderLeader header for addr: the slice of
// the last address, shared by every answer while the leader stays (see
// contentTypeJSON), and a new one when it changed.
func (s *Server) leaderHeader(addr string) []string {
	if v := s.leaderValue.Load(); v != nil && (*v)[0] == addr {
		return *v
	}
	v := []string{addr}
	s.leaderValue.Store(&v)
	return v
}

// isClean reports whether the mux would serve p as it is rather than answer a
// redirect to a cleaned path (no "//", "." or ".." segments; a trailing slash kept).
func isClean(p string) bool {
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}

// serveUnclean answers a path the mux would redirect. A 307 to the cleaned path of
// /v1/records/acme/a/../../other/k is another tenant's record, and /v1/records/acme/a//b
// another key's: a record path is never redirected. Its key is the raw rest of the
// path, as an escaped one would be, so that "a//b" names the key "a//b". Any other
// unclean path is refused.
func (s *Server) serveUnclean(w http.ResponseWriter, r *http.Request, escaped string) {
	rest, isRecord := strings.CutPrefix(escaped, "/v1/records/")
	if isRecord && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		tenant, key, ok := strings.Cut(rest, "/")
		t, terr := url.PathUnescape(tenant)
		k, kerr := url.PathUnescape(key)
		if ok && terr == nil && kerr == nil {
			r.SetPathValue("tenant", t)
			r.SetPathValue("key", k)
			r.Pattern = recordPattern
			s.recordRoute.ServeHTTP(w, r)
			return
		}
	}
	s.writeError(w, r, idemkv.Invalid("", "the path %q has empty, \".\" or \"..\" segments, which idemkv never redirects; "+
		"escape \"/\" and \".\" in a key as %%2F and %%2E", escaped))
}

// leaderWrite serves a POST whose JSON body is a Q, executed on the leader: it decodes
// and validates the body, forwards it when this node is not the leader, and otherwise
// calls the store. served, when set, sees every answer this node produced itself.
func leaderWrite[Q, A any](s *Server, validate func(*Q) error,
	call func(context.Context, *Q) (*A, error), served func(context.Context, *Q, *A)) http.Handler {
	return localFirstWrite(s, validate, nil, call, served)
}

// localFirstWrite is leaderWrite that first asks local, on any node, whether this
// node's own state settles the answer (a reserve's replay or conflict against a
// committed or failed record, docs/protocol.md "Followers"). What local answers is
// served here, from a follower too, and marked on the request's span; the rest goes
// the leader's way. The leader asks its store once: call answers from the local state
// itself first, and says so through idemkv.NotingLocalAnswer.
//
// The stages of the request are timed (metrics.WriteStages): reading and decoding
// the body, the checks until the store is called, writing the answer.
func localFirstWrite[Q, A any](s *Server, validate func(*Q) error, local func(*Q) (*A, bool),
	call func(context.Context, *Q) (*A, error), served func(context.Context, *Q, *A)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.sabotageRefuse(w, r) {
			return
		}
		start := time.Now()
		var req Q
		body, err := s.decode(w, r, &req)
		decoded := time.Now()
		s.metrics.Stage(metrics.StageRead).Observe(decoded.Sub(start).Seconds())
		if err == nil {
			telemetry.AnnotateRequest(r.Context(), &req)
		}
		if err == nil {
			err = s.allowBody(r, &req)
		}
		if err == nil {
			err = validate(&req)
		}
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		var res *A
		answered := false
		isLeader := s.store.IsLeader()
		if local != nil && !isLeader {
			res, answered = local(&req)
		}
		if !answered {
			if !isLeader && s.forwardIfFollower(w, r, body, 0) {
				return
			}
			ctx := r.Context()
			if local != nil {
				ctx = idemkv.NotingLocalAnswer(ctx, &answered)
			}
			s.metrics.Stage(metrics.StageValidate).Observe(time.Since(decoded).Seconds())
			res, err = call(ctx, &req)
		}
		if answered && err == nil {
			telemetry.Annotate(r.Context(), semconv.AnsweredLocally.Bool(true))
		}
		if errors.Is(err, idemkv.ErrNotLeader) {
			s.forwardToLeader(w, r, body, 0)
			return
		}
		if err == nil && res == nil {
			err = fmt.Errorf("api: the store answered %s with neither a result nor an error", r.URL.Path)
		}
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		if served != nil {
			served(r.Context(), &req, res)
		}
		if s.sabotageAnswer(w, r) {
			return
		}
		answering := time.Now()
		s.writeJSON(w, r, http.StatusOK, withoutHistory(res))
		s.metrics.Stage(metrics.StageRespond).Observe(time.Since(answering).Seconds())
	})
}

// resolve is a leader write whose history event names the caller: By is the token
// that resolves, never what the body claims (the body cannot set it).
func (s *Server) resolve(w http.ResponseWriter, r *http.Request) {
	by := callerIdentity(r.Context())
	leaderWrite(s, func(q *idemkv.ResolveRequest) error {
		q.By = by
		return q.Validate(s.store.Limits())
	}, s.store.Resolve, nil).ServeHTTP(w, r)
}

// countDecision counts a reserve decision and puts it on the request's span.
func (s *Server) countDecision(ctx context.Context, req *idemkv.ReserveRequest, res *idemkv.ReserveResult) {
	s.metrics.Decisions.WithLabelValues(s.metrics.Tools.Value(req.Tenant, req.Tool), string(res.Decision)).Inc()
	telemetry.AnnotateReserve(ctx, req, res)
	if s.onReserve != nil {
		s.onReserve(ctx, req, res)
	}
}

// annotateCommit puts the stored receipt on the request's span.
func annotateCommit(ctx context.Context, req *idemkv.CommitRequest, rc *idemkv.Receipt) {
	telemetry.Annotate(ctx,
		semconv.Tenant.String(req.Tenant),
		semconv.IdempotencyKey.String(req.Key),
		semconv.Fingerprint.String(req.Fingerprint),
		semconv.FenceValue(req.Fence),
		semconv.ReceiptRemoteID.String(rc.RemoteID))
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	// PathValue has already unescaped the key once; unescaping again would turn a key
	// that contains "%2F" literally into another key.
	req := idemkv.GetRequest{Tenant: r.PathValue("tenant"), Key: r.PathValue("key")}
	telemetry.AnnotateRequest(r.Context(), &req)
	q, err := parseQuery(r)
	if err == nil {
		req.Consistency = idemkv.Consistency(q.Get("consistency"))
		req.Wait, err = waitParam(q)
	}
	if err == nil {
		req.History, err = boolParam(q, "history")
	}
	if err == nil {
		err = req.Validate()
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	req.EnsureDefaults()
	if req.Wait > 0 {
		release, err := s.polls.acquire(r, req.Tenant)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		defer release()
	}
	sabotageRead(&req)
	if req.Consistency == idemkv.Linearizable && s.forwardIfFollower(w, r, nil, req.Wait) {
		return
	}
	rec, err := s.store.Get(r.Context(), &req)
	if errors.Is(err, idemkv.ErrNotLeader) {
		s.forwardToLeader(w, r, nil, req.Wait)
		return
	}
	if err == nil && rec != nil && req.History {
		s.writeJSON(w, r, http.StatusOK, rec)
		return
	}
	answer(s, w, r, rec, err)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	req := idemkv.ListRequest{Tenant: r.PathValue("tenant")}
	q, err := parseQuery(r)
	if err == nil {
		req.Prefix = q.Get("prefix")
		req.Status = idemkv.Status(q.Get("status"))
		req.InDoubt, err = inDoubtParam(q)
	}
	var stale bool
	if err == nil {
		req.After, req.Limit, stale, err = pageParams(q)
	}
	if err == nil {
		err = req.Validate()
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	req.EnsureDefaults()
	if stale {
		req.Consistency = idemkv.Stale
	}
	s.readPage(w, r, stale, func() (*idemkv.ListResult, error) { return s.store.List(r.Context(), &req) })
}

// listInDoubt pages through the in-doubt records of every tenant, oldest first, with
// the paging and consistency parameters of a list.
func (s *Server) listInDoubt(w http.ResponseWriter, r *http.Request) {
	var req idemkv.InDoubtRequest
	q, err := parseQuery(r)
	var stale bool
	if err == nil {
		req.After, req.Limit, stale, err = pageParams(q)
	}
	if err == nil {
		err = req.Validate()
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	req.EnsureDefaults()
	if stale {
		req.Consistency = idemkv.Stale
	}
	s.readPage(w, r, stale, func() (*idemkv.ListResult, error) { return s.store.ListInDoubt(r.Context(), &req) })
}

// readPage answers a page of records read by call. A page is a linearizable read
// served by the leader unless the caller asks for consistency=stale, as on a get.
func (s *Server) readPage(w http.ResponseWriter, r *http.Request, stale bool, call func() (*idemkv.ListResult, error)) {
	if !stale && s.forwardIfFollower(w, r, nil, 0) {
		return
	}
	res, err := call()
	if errors.Is(err, idemkv.ErrNotLeader) {
		s.forwardToLeader(w, r, nil, 0)
		return
	}
	if err == nil && res != nil && res.Records == nil {
		// An empty page is [] on the wire, never null.
		res.Records = []*idemkv.Record{}
	}
	answer(s, w, r, res, err)
}

func (s *Server) cluster(w http.ResponseWriter, r *http.Request) {
	info, err := s.store.Cluster(r.Context())
	answer(s, w, r, info, err)
}

// Halter is implemented by a store that can halt for good (a node whose state machine
// met a storage error): /healthz then answers 503, so that a liveness probe restarts
// the process, which is what a halted node needs.
type Halter interface {
	Halted() error
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	if h, ok := s.store.(Halter); ok {
		if err := h.Halted(); err != nil {
			s.writeError(w, r, idemkv.Errorf(idemkv.ErrUnavailable, "halted: %v; the node must restart", err))
			return
		}
	}
	s.writeJSON(w, r, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if err := s.store.Ready(); err != nil {
		if idemkv.CodeOf(err) == idemkv.CodeInternal {
			// Not being ready is the expected answer of a node that is catching up, not an
			// internal failure.
			err = idemkv.Errorf(idemkv.ErrUnavailable, "not ready: %v", err)
		}
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, r, http.StatusOK, map[string]string{"status": "ready"})
}

func validJoin(r *idemkv.JoinRequest) error {
	if err := validNodeID(r.ID); err != nil {
		return err
	}
	if err := validAddr("raft_addr", r.RaftAddr); err != nil {
		return err
	}
	return validAddr("api_addr", r.APIAddr)
}

func validRemove(r *idemkv.RemoveRequest) error { return validNodeID(r.ID) }

func validNodeID(id string) error {
	if id == "" || len(id) > maxNodeIDLen {
		return idemkv.Invalid("id", "id must be 1-%d bytes", maxNodeIDLen)
	}
	return nil
}

func validAddr(field, addr string) error {
	if addr == "" || len(addr) > maxAddrLen {
		return idemkv.Invalid(field, "%s must be host:port, at most %d bytes", field, maxAddrLen)
	}
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return idemkv.Invalid(field, "%s must be host:port", field)
	}
	return nil
}
