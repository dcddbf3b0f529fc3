package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkv/idemkv"
)

// HTTPConfig configures the idemkv target.
type HTTPConfig struct {
	// Endpoints are API addresses of cluster members (host:port or http://host:port).
	Endpoints []string
	Tenant    string
	// Token, when set, is sent as a bearer token.
	Token string
	// Conns is the number of keep-alive connections kept open: one per worker.
	Conns int
	// Timeout bounds one request (default 10 s).
	Timeout time.Duration
	// Pinned keeps worker w (see Worker) on Endpoints[w % len(Endpoints)] and never
	// follows the leader: a runtime that talks to the node nearest to it. A follower
	// forwards to the leader what it does not answer itself. A request that carries no
	// worker goes to the next endpoint in turn.
	Pinned bool
}

// HTTPTarget drives an idemkv cluster through its HTTP API (docs/protocol.md section 2). It sends
// every request to the leader, as the Go client does, and follows the Idemkv-Leader
// header when leadership moves; or, Pinned, each worker's to one node. It never
// retries: a failed request is the store's answer and is counted, so the figures hide
// nothing.
type HTTPTarget struct {
	cfg    HTTPConfig
	wire   *wire
	base   atomic.Pointer[string] // base URL of the node requests go to
	next   atomic.Uint32          // endpoint to try when the current one fails
	closed atomic.Bool
}

var _ Target = (*HTTPTarget)(nil)

// NewHTTPTarget connects to the cluster and finds its leader.
func NewHTTPTarget(ctx context.Context, cfg HTTPConfig) (*HTTPTarget, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, idemkv.Invalid("endpoints", "at least one endpoint is required")
	}
	if err := idemkv.ValidTenant(cfg.Tenant); err != nil {
		return nil, err
	}
	if cfg.Conns <= 0 {
		cfg.Conns = 64
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	for i, e := range cfg.Endpoints {
		cfg.Endpoints[i] = baseURL(e)
	}
	t := &HTTPTarget{cfg: cfg, wire: newWire(cfg.Token, cfg.Timeout, cfg.Conns)}
	t.base.Store(&cfg.Endpoints[0])
	find := t.findLeader
	if cfg.Pinned {
		find = t.checkNodes
	}
	if err := find(ctx); err != nil {
		t.wire.close()
		return nil, err
	}
	return t, nil
}

func baseURL(endpoint string) string {
	endpoint = strings.TrimRight(endpoint, "/")
	if strings.Contains(endpoint, "://") {
		return endpoint
	}
	return "http://" + endpoint
}

// findLeader asks each endpoint in turn for the cluster and goes to its leader.
func (t *HTTPTarget) findLeader(ctx context.Context) error {
	var last error
	for _, ep := range t.cfg.Endpoints {
		var info idemkv.ClusterInfo
		err := t.do(ctx, http.MethodGet, ep, "/v1/cluster", nil, &info)
		if err != nil {
			last = err
			continue
		}
		if info.Leader.APIAddr == "" {
			last = idemkv.Errorf(idemkv.ErrUnavailable, "%s knows no leader", ep)
			continue
		}
		leader := baseURL(info.Leader.APIAddr)
		t.base.Store(&leader)
		return nil
	}
	return fmt.Errorf("loadgen: no leader among %v: %w", t.cfg.Endpoints, last)
}

// checkNodes makes sure every endpoint answers and knows a leader to forward to.
func (t *HTTPTarget) checkNodes(ctx context.Context) error {
	for _, ep := range t.cfg.Endpoints {
		var info idemkv.ClusterInfo
		if err := t.do(ctx, http.MethodGet, ep, "/v1/cluster", nil, &info); err != nil {
			return fmt.Errorf("loadgen: %s: %w", ep, err)
		}
		if info.Leader.APIAddr == "" {
			return idemkv.Errorf(idemkv.ErrUnavailable, "loadgen: %s knows no leader", ep)
		}
	}
	return nil
}

// Leader returns the base URL requests go to (when Pinned, the leader last named).
func (t *HTTPTarget) Leader() string { return *t.base.Load() }

// answerFields is an answer of which the driver decodes a few top-level members
// (see members).
type answerFields interface {
	field(name, value []byte) error
}

type reserveAnswer struct {
	Decision idemkv.Decision `json:"decision"`
	Fence    uint64          `json:"fence"`
}

func (a *reserveAnswer) field(name, value []byte) error {
	switch string(name) {
	case "decision":
		return json.Unmarshal(value, &a.Decision)
	case "fence":
		return json.Unmarshal(value, &a.Fence)
	}
	return nil
}

type commitAnswer struct {
	Status idemkv.Status `json:"status"`
}

func (a *commitAnswer) field(name, value []byte) error {
	if string(name) == "status" {
		return json.Unmarshal(value, &a.Status)
	}
	return nil
}

// Reserve implements Target.
func (t *HTTPTarget) Reserve(ctx context.Context, r *Reserve) (Reservation, error) {
	req := idemkv.ReserveRequest{Tenant: t.cfg.Tenant, Key: r.Key, Tool: r.Tool, Actor: "bench",
		Fingerprint: r.Fingerprint, AttemptID: r.AttemptID, LeaseTTLMs: r.LeaseTTLMs}
	var ans reserveAnswer
	if err := t.write(ctx, "/v1/reserve", &req, &ans); err != nil {
		return Reservation{}, err
	}
	return Reservation{Decision: ans.Decision, Fence: ans.Fence}, nil
}

// Commit implements Target.
func (t *HTTPTarget) Commit(ctx context.Context, c *Commit) error {
	req := idemkv.CommitRequest{Tenant: t.cfg.Tenant, Key: c.Key, Fingerprint: c.Fingerprint,
		Fence: c.Reservation.Fence, RemoteSystem: c.RemoteSystem, RemoteID: c.RemoteID}
	var ans commitAnswer
	if err := t.write(ctx, "/v1/commit", &req, &ans); err != nil {
		return err
	}
	if ans.Status != idemkv.StatusCommitted {
		return idemkv.Errorf(idemkv.ErrInternal, "commit of %s answered status %q", c.Key, ans.Status)
	}
	return nil
}

// Close implements Target.
func (t *HTTPTarget) Close() error {
	if t.closed.CompareAndSwap(false, true) {
		t.wire.close()
	}
	return nil
}

// write posts body to the current node. A transport error or 503 sends the next
// request to the next endpoint, which forwards to the leader or names it.
func (t *HTTPTarget) write(ctx context.Context, path string, body, into any) error {
	// A fresh buffer per request: the transport may still read a body after Do returns.
	b, err := json.Marshal(body)
	if err != nil {
		return idemkv.Errorf(idemkv.ErrInternal, "encode %s: %v", path, err)
	}
	if t.cfg.Pinned {
		return t.do(ctx, http.MethodPost, t.pinned(ctx), path, b, into)
	}
	cur := t.base.Load()
	err = t.do(ctx, http.MethodPost, *cur, path, b, into)
	if err != nil && idemkv.CodeOf(err) == idemkv.CodeUnavailable && ctx.Err() == nil {
		n := t.next.Add(1)
		ep := t.cfg.Endpoints[int(n)%len(t.cfg.Endpoints)]
		t.base.CompareAndSwap(cur, &ep)
	}
	return err
}

// pinned returns the node of the worker whose request ctx carries.
func (t *HTTPTarget) pinned(ctx context.Context) string {
	eps := t.cfg.Endpoints
	w, ok := Worker(ctx)
	if !ok {
		w = int(t.next.Add(1))
	}
	return eps[w%len(eps)]
}

func (t *HTTPTarget) do(ctx context.Context, method, base, path string, body []byte, into any) error {
	ans, err := t.wire.do(ctx, method, base, path, body)
	if err != nil {
		return idemkv.Errorf(idemkv.ErrUnavailable, "%s %s%s: %v", method, base, path, err)
	}
	if ans.leader != "" && !strings.HasSuffix(*t.base.Load(), ans.leader) {
		l := baseURL(ans.leader)
		t.base.Store(&l)
	}
	if ans.status/100 != 2 {
		e := idemkv.ParseErrorBody(ans.body)
		if e == nil {
			code := idemkv.CodeInternal
			if ans.status == http.StatusServiceUnavailable {
				code = idemkv.CodeUnavailable
			}
			return &idemkv.Error{Code: code, Message: fmt.Sprintf("%s %s%s: HTTP %d", method, base, path, ans.status)}
		}
		return e
	}
	if err := decodeAnswer(ans.body, into); err != nil {
		return idemkv.Errorf(idemkv.ErrInternal, "%s %s%s: decode answer: %v", method, base, path, err)
	}
	return nil
}

func decodeAnswer(body []byte, into any) error {
	a, ok := into.(answerFields)
	if !ok {
		return json.Unmarshal(body, into)
	}
	var err error
	if merr := members(body, func(name, value []byte) {
		if err == nil {
			err = a.field(name, value)
		}
	}); merr != nil {
		return merr
	}
	return err
}
