// Package api is idemkv's HTTP/JSON server (docs/protocol.md section 2): it decodes and validates
// requests, hands them to a Store, writes the answers and errors in their wire shapes,
// and forwards writes and linearizable reads that reach a follower to the leader.
//
// It never decides anything about a record: the decision table lives in the state
// machine, behind the Store. It must not import Raft, Pebble or the node package; the
// node satisfies the Store interface declared here.
package api

import (
	"context"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/httpx"
	"github.com/idemkv/idemkv/metrics"
)

// Store is what the API needs from a node. Its methods validate their requests
// themselves and return errors wrapping the sentinels of the root package; a write or
// a linearizable read that reaches a follower fails with idemkv.ErrNotLeader.
type Store interface {
	Reserve(ctx context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error)
	// ReserveLocal answers a reserve from this node's own state, with no read index
	// and no leader, when that state settles it (a replay or conflict against a
	// committed or failed record, docs/protocol.md "Followers"); ok is false otherwise,
	// an invalid request included, and the reserve takes the leader's way.
	ReserveLocal(req *idemkv.ReserveRequest) (res *idemkv.ReserveResult, ok bool)
	Commit(ctx context.Context, req *idemkv.CommitRequest) (*idemkv.Receipt, error)
	Fail(ctx context.Context, req *idemkv.FailRequest) (*idemkv.Record, error)
	Release(ctx context.Context, req *idemkv.ReleaseRequest) (*idemkv.ReleaseResult, error)
	Heartbeat(ctx context.Context, req *idemkv.HeartbeatRequest) (*idemkv.Record, error)
	Doubt(ctx context.Context, req *idemkv.DoubtRequest) (*idemkv.Record, error)
	Resolve(ctx context.Context, req *idemkv.ResolveRequest) (*idemkv.ResolveResult, error)
	// Get handles Wait (the long-poll) itself.
	Get(ctx context.Context, req *idemkv.GetRequest) (*idemkv.Record, error)
	List(ctx context.Context, req *idemkv.ListRequest) (*idemkv.ListResult, error)
	// ListInDoubt pages through the in-doubt records of every tenant, oldest first.
	ListInDoubt(ctx context.Context, req *idemkv.InDoubtRequest) (*idemkv.ListResult, error)
	Cluster(ctx context.Context) (*idemkv.ClusterInfo, error)
	Join(ctx context.Context, req *idemkv.JoinRequest) (*idemkv.ClusterInfo, error)
	Remove(ctx context.Context, req *idemkv.RemoveRequest) (*idemkv.ClusterInfo, error)
	// Limits returns the limits the store enforces, defaults filled. The API checks
	// requests against them early and fills their defaults from them; it keeps no
	// copy of its own, so the two can never disagree.
	Limits() idemkv.Limits
	// Leader returns the API address of the current leader ("" if unknown) and whether
	// this node is it.
	Leader() (apiAddr string, isLeader bool)
	// IsLeader is Leader's second answer alone, without looking up any address: what
	// a request on its way to the store asks.
	IsLeader() bool
	// Ready reports nil when a leader is known and this node has caught up.
	Ready() error
	ApprovalStore
}

// Headers idemkv adds to HTTP traffic.
const (
	// HeaderLeader is idemkv.HeaderLeader, named here for the API's readers.
	HeaderLeader = idemkv.HeaderLeader
	// HeaderForwarded marks a request a follower forwarded to the leader. A node that
	// is not the leader answers such a request with unavailable instead of forwarding it
	// again, so that two nodes with different ideas of the leader cannot loop.
	HeaderForwarded = "Idemkv-Forwarded"
)

// DefaultForwardTimeout bounds a forwarded request, on top of the wait of a long-poll.
// It stays below the margin NewHTTPServer leaves in WriteTimeout, so that a follower
// answers a slow forward itself before its own connection is cut.
const DefaultForwardTimeout = 20 * time.Second

// Config configures a Server. Zero fields take defaults; Store is required.
type Config struct {
	Store  Store
	Logger *slog.Logger // default: discard
	// Metrics default to a fresh set on their own registry.
	Metrics *metrics.Metrics
	// Forward carries requests to the leader. Default: a client with dial and
	// handshake timeouts, no proxy from the environment and no overall timeout (each
	// forward gets a deadline of its own). Redirects are never followed.
	Forward *http.Client
	// ForwardScheme is the scheme of the leader's API address ("http" by default).
	ForwardScheme string
	// ForwardTimeout bounds a forwarded request beyond its long-poll wait
	// (DefaultForwardTimeout by default).
	ForwardTimeout time.Duration
	// Middleware, when set, wraps the whole handler (tracing, authentication).
	Middleware func(http.Handler) http.Handler
	// MaxLongPolls, MaxLongPollsPerCaller and MaxLongPollsPerTenant cap the long-polls
	// this node holds, in all, per token and per tenant (DefaultMaxLongPolls,
	// DefaultMaxLongPollsPerCaller, DefaultMaxLongPollsPerTenant).
	MaxLongPolls          int
	MaxLongPollsPerCaller int
	MaxLongPollsPerTenant int
	// Pprof serves Go's profiles at /debug/pprof/ for the admin role alone: the
	// command line, heap and goroutine stacks are no tenant's business.
	Pprof bool
	// OnReserve, when set, sees every reserve decision this node answered (a reserve
	// forwarded to the leader is answered, and seen, there), after it is counted. It
	// runs on the request's goroutine and must not block: the console keeps its ring
	// of recent conflicts with it.
	OnReserve func(context.Context, *idemkv.ReserveRequest, *idemkv.ReserveResult)
}

// Server serves the API of one node.
type Server struct {
	store          Store
	log            *slog.Logger
	metrics        *metrics.Metrics
	forward        *http.Client
	scheme         string
	forwardTimeout time.Duration
	// mux serves every request: the routes, and "/" for whatever none of them
	// matches (unmatched), so that a request is matched once. routes holds the routes
	// alone, for unmatched to tell a path it does not know from a method it does not
	// allow, and for the metrics' endpoint label.
	mux         *http.ServeMux
	routes      *http.ServeMux
	leaderValue atomic.Pointer[[]string] // leaderHeader's last value
	handler     http.Handler
	polls       *longPolls
	onReserve   func(context.Context, *idemkv.ReserveRequest, *idemkv.ReserveResult)
	// recordRoute is the registered handler of recordPattern, which serveUnclean
	// calls for record paths the mux would redirect.
	recordRoute http.Handler
}

// New returns a Server for cfg. It panics if cfg.Store is nil: that is a wiring bug.
func New(cfg Config) *Server {
	if cfg.Store == nil {
		panic("api: Config.Store is required")
	}
	s := &Server{
		store:          cfg.Store,
		log:            cfg.Logger,
		metrics:        cfg.Metrics,
		scheme:         cfg.ForwardScheme,
		forwardTimeout: cfg.ForwardTimeout,
		mux:            http.NewServeMux(),
		routes:         http.NewServeMux(),
		polls:          newLongPolls(cfg.MaxLongPolls, cfg.MaxLongPollsPerCaller, cfg.MaxLongPollsPerTenant),
		onReserve:      cfg.OnReserve,
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.metrics == nil {
		s.metrics = metrics.New()
	}
	if s.scheme == "" {
		s.scheme = "http"
	}
	if s.forwardTimeout <= 0 {
		s.forwardTimeout = DefaultForwardTimeout
	}
	fwd := &http.Client{Transport: httpx.NodeTransport(nil)}
	if cfg.Forward != nil {
		c := *cfg.Forward
		fwd = &c
	}
	// A redirect from the leader is relayed to the caller, not followed with a body
	// that may already be spent.
	fwd.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	s.forward = fwd
	s.addRoutes()
	if cfg.Pprof {
		s.mountPprof()
	}
	s.mux.Handle("/", http.HandlerFunc(s.unmatched))
	var h http.Handler = http.HandlerFunc(s.serve)
	if cfg.Middleware != nil {
		h = s.countAnsweredBefore(cfg.Middleware(h))
	}
	s.handler = h
	return s
}

// Handler returns the handler of every endpoint.
func (s *Server) Handler() http.Handler { return s.handler }

// The bounds of the API's connections (idemkv serve's --max-conns and
// --max-conns-per-source): room for a fleet of workers on one host, while one host's
// flood of idle sockets fills its share and no more (internal/connlimit).
const (
	DefaultMaxConns          = 8192
	DefaultMaxConnsPerSource = 1024
)

// NewHTTPServer returns an *http.Server for h with timeouts that bound slow clients
// while still letting the longest long-poll (idemkv.MaxWait) finish.
func NewHTTPServer(addr string, h http.Handler) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      idemkv.MaxWait + 30*time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
}
