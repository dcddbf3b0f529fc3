package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/telemetry"
	"github.com/idemkv/idemkv/telemetry/semconv"
)

// apiStore puts a memStore behind the real API server, as one node of a cluster
// whose leader is leaderAddr ("" when this node leads).
type apiStore struct {
	*memStore
	mu         sync.Mutex
	self       string
	leaderAddr string
}

func (s *apiStore) Leader() (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leaderAddr == "" {
		return s.self, true
	}
	return s.leaderAddr, false
}

func (s *apiStore) IsLeader() bool {
	_, l := s.Leader()
	return l
}

func (s *apiStore) Ready() error { return nil }

// ReserveLocal never answers: every reserve goes through memStore.Reserve (or its
// leader), so the client's tests see every call.
func (s *apiStore) ReserveLocal(*idemkv.ReserveRequest) (*idemkv.ReserveResult, bool) {
	return nil, false
}

// Limits are the defaults: memStore validates against idemkv.Limits{}.
func (s *apiStore) Limits() idemkv.Limits { return idemkv.DefaultLimits() }

func (s *apiStore) List(ctx context.Context, req *idemkv.ListRequest) (*idemkv.ListResult, error) {
	s.memStore.mu.Lock()
	defer s.memStore.mu.Unlock()
	out := &idemkv.ListResult{Records: []*idemkv.Record{}}
	for _, rec := range s.recs {
		if rec.Tenant == req.Tenant && strings.HasPrefix(rec.Key, req.Prefix) && (req.Status == "" || rec.Status == req.Status) {
			out.Records = append(out.Records, rec.Clone())
		}
	}
	slices.SortFunc(out.Records, func(a, b *idemkv.Record) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

func (s *apiStore) ListInDoubt(context.Context, *idemkv.InDoubtRequest) (*idemkv.ListResult, error) {
	return nil, idemkv.Errorf(idemkv.ErrInvalidArgument, "not in this test")
}

func (s *apiStore) Cluster(ctx context.Context) (*idemkv.ClusterInfo, error) {
	addr, _ := s.Leader()
	return &idemkv.ClusterInfo{Leader: idemkv.LeaderInfo{ID: "n1", APIAddr: addr}, Term: 3,
		Nodes: []idemkv.NodeInfo{{ID: "n1", APIAddr: addr, State: "leader", Suffrage: "voter"}}}, nil
}

func (s *apiStore) Join(context.Context, *idemkv.JoinRequest) (*idemkv.ClusterInfo, error) {
	return nil, idemkv.Errorf(idemkv.ErrInvalidArgument, "not in this test")
}

func (s *apiStore) Remove(context.Context, *idemkv.RemoveRequest) (*idemkv.ClusterInfo, error) {
	return nil, idemkv.Errorf(idemkv.ErrInvalidArgument, "not in this test")
}

// testNode is the API server over a memStore, with a hook in front of it.
type testNode struct {
	srv   *httptest.Server
	store *apiStore
	// hook, when set, sees each request first and may answer it itself.
	hook  atomic.Pointer[func(w http.ResponseWriter, r *http.Request, next http.Handler) bool]
	mu    sync.Mutex
	reqs  []*http.Request
	count atomic.Int32
}

func startNode(t *testing.T, mem *memStore) *testNode {
	t.Helper()
	n := &testNode{store: &apiStore{memStore: mem}}
	h := api.New(api.Config{Store: n.store, Logger: testlog.New(t)}).Handler()
	n.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.count.Add(1)
		n.mu.Lock()
		n.reqs = append(n.reqs, r.Clone(context.Background()))
		n.mu.Unlock()
		if hook := n.hook.Load(); hook != nil && (*hook)(w, r, h) {
			return
		}
		h.ServeHTTP(w, r)
	}))
	n.srv.Start()
	t.Cleanup(n.srv.Close)
	n.store.self = n.addr()
	return n
}

func (n *testNode) addr() string { return strings.TrimPrefix(n.srv.URL, "http://") }

func (n *testNode) setHook(f func(w http.ResponseWriter, r *http.Request, next http.Handler) bool) {
	n.hook.Store(&f)
}

func (n *testNode) requests() []*http.Request {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.reqs)
}

func newClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testlog.New(t)
	}
	if cfg.BackoffMin == 0 {
		cfg.BackoffMin, cfg.BackoffMax = time.Millisecond, 5*time.Millisecond
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// dropConnection hijacks the connection and closes it: the caller sees a transport
// error and cannot know whether the request was applied.
func dropConnection(t *testing.T, w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Error(err)
		return
	}
	conn.Close()
}

func TestClientCallsAgainstAPI(t *testing.T) {
	n := startNode(t, newMemStore())
	c := newClient(t, Config{Endpoints: []string{n.srv.URL}})
	ctx := ctxT(t)
	key := "conv:9/appr 17/../%2F?x=1#frag"
	res, err := c.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "t1", Key: key, Tool: "create_ticket", Fingerprint: "sha256:aa"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Decision != idemkv.DecisionExecute || res.Fence == 0 || !strings.HasPrefix(res.AttemptID, "att_") {
		t.Fatalf("reserve %+v", res)
	}
	rec, err := c.Get(ctx, &idemkv.GetRequest{Tenant: "t1", Key: key})
	if err != nil || rec.Key != key || rec.Status != idemkv.StatusPending {
		t.Fatalf("get %+v, %v", rec, err)
	}
	if _, err := c.Heartbeat(ctx, &idemkv.HeartbeatRequest{Tenant: "t1", Key: key, Fence: res.Fence, LeaseTTLMs: 60000}); err != nil {
		t.Fatal(err)
	}
	receipt, err := c.Commit(ctx, &idemkv.CommitRequest{Tenant: "t1", Key: key, Fingerprint: "sha256:aa", Fence: res.Fence,
		RemoteSystem: "linear", RemoteID: "LIN-1", Result: json.RawMessage(`{"n":1}`)})
	if err != nil || receipt.Status != idemkv.StatusCommitted || receipt.RemoteID != "LIN-1" || string(receipt.Result) != `{"n":1}` {
		t.Fatalf("commit %+v, %v", receipt, err)
	}
	list, err := c.List(ctx, &idemkv.ListRequest{Tenant: "t1", Prefix: "conv:9/"})
	if err != nil || len(list.Records) != 1 || list.Records[0].Key != key {
		t.Fatalf("list %+v, %v", list, err)
	}
	info, err := c.Cluster(ctx)
	if err != nil || info.Leader.APIAddr != n.addr() || info.Term != 3 {
		t.Fatalf("cluster %+v, %v", info, err)
	}
	for _, k := range []string{".", "..", "a/./b", "%2E"} {
		_, err := c.Get(ctx, &idemkv.GetRequest{Tenant: "t1", Key: k})
		var e *idemkv.Error
		if !errors.As(err, &e) || e.Code != idemkv.CodeNotFound || strings.Contains(e.Message, "no endpoint") {
			t.Errorf("get of key %q: %v (the key must reach the handler as a key)", k, err)
		}
	}
}

func TestClientMapsErrorsToSentinels(t *testing.T) {
	n := startNode(t, newMemStore())
	c := newClient(t, Config{Endpoints: []string{n.addr()}})
	ctx := ctxT(t)
	res, err := c.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "t1", Key: "k", Tool: "x", Fingerprint: "sha256:aa"})
	if err != nil {
		t.Fatal(err)
	}
	commit := func(fp string, fence uint64) error {
		_, err := c.Commit(ctx, &idemkv.CommitRequest{Tenant: "t1", Key: "k", Fingerprint: fp, Fence: fence, RemoteSystem: "s", RemoteID: "r"})
		return err
	}
	cases := []struct {
		name  string
		err   error
		want  error
		field string
	}{
		{"unknown fence", commit("sha256:aa", res.Fence+1), idemkv.ErrFenced, ""},
		{"other fingerprint", commit("sha256:bb", res.Fence), idemkv.ErrFingerprintMismatch, ""},
		{"absent", func() error {
			_, err := c.Get(ctx, &idemkv.GetRequest{Tenant: "t1", Key: "nope"})
			return err
		}(), idemkv.ErrNotFound, ""},
		{"bad tenant", func() error {
			_, err := c.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "t/1", Key: "k", Tool: "x", Fingerprint: "sha256:aa"})
			return err
		}(), idemkv.ErrInvalidArgument, "tenant"},
		{"not pending", func() error {
			if err := commit("sha256:aa", res.Fence); err != nil {
				return err
			}
			_, err := c.Release(ctx, &idemkv.ReleaseRequest{Tenant: "t1", Key: "k", Fingerprint: "sha256:aa", Fence: res.Fence})
			return err
		}(), idemkv.ErrNotPending, ""},
	}
	for _, tc := range cases {
		var e *idemkv.Error
		if !errors.Is(tc.err, tc.want) || !errors.As(tc.err, &e) || e.Field != tc.field {
			t.Errorf("%s: got %v, want %v (field %q)", tc.name, tc.err, tc.want, tc.field)
		}
		if errors.Is(tc.err, idemkv.ErrUnavailable) {
			t.Errorf("%s: a definite answer was reported as unavailable", tc.name)
		}
	}
	if got := n.count.Load(); got != 7 {
		t.Errorf("%d requests: definite errors must not be retried", got)
	}
}

func TestClientFollowsTheLeader(t *testing.T) {
	mem := newMemStore()
	leader := startNode(t, mem)
	follower := startNode(t, mem)
	follower.store.leaderAddr = leader.addr()
	c := newClient(t, Config{Endpoints: []string{follower.addr()}})
	ctx := ctxT(t)
	for i := 0; i < 3; i++ {
		if _, err := c.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "t1", Key: "k", Tool: "x", Fingerprint: "sha256:aa"}); err != nil {
			t.Fatal(err)
		}
	}
	if c.Leader() != leader.srv.URL {
		t.Fatalf("leader %q, want %q", c.Leader(), leader.srv.URL)
	}
	direct := 0
	for _, r := range leader.requests() {
		if r.Header.Get(api.HeaderForwarded) == "" {
			direct++
		}
	}
	if follower.count.Load() != 1 || direct != 2 {
		t.Fatalf("follower saw %d, the leader %d directly: after one answer the client must go to the leader", follower.count.Load(), direct)
	}
}

func TestClientFailsOver(t *testing.T) {
	mem := newMemStore()
	live := startNode(t, mem)
	unavailable := startNode(t, mem)
	unavailable.setHook(func(w http.ResponseWriter, r *http.Request, next http.Handler) bool {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":{"code":"unavailable","message":"no leader"}}`)
		return true
	})
	// An address nothing listens on: connection refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()

	live.store.self = "" // the live node names no leader, so only failover can find it
	live.store.leaderAddr = ""
	c := newClient(t, Config{Endpoints: []string{dead, unavailable.addr(), live.addr()}})
	ctx := ctxT(t)
	for i := 0; i < 3; i++ {
		if _, err := c.Get(ctx, &idemkv.GetRequest{Tenant: "t1", Key: "k"}); !errors.Is(err, idemkv.ErrNotFound) {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if unavailable.count.Load() != 1 || live.count.Load() != 3 {
		t.Fatalf("unavailable node saw %d, live %d: failed endpoints must lose their preference", unavailable.count.Load(), live.count.Load())
	}
}

func TestClientRetryKeepsTheAttempt(t *testing.T) {
	n := startNode(t, newMemStore())
	var reserves atomic.Int32
	var bodies [][]byte
	var mu sync.Mutex
	n.setHook(func(w http.ResponseWriter, r *http.Request, next http.Handler) bool {
		if r.URL.Path != "/v1/reserve" {
			return false
		}
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, body)
		mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		if reserves.Add(1) == 1 {
			// Apply the reserve, then lose the answer.
			next.ServeHTTP(httptest.NewRecorder(), r.Clone(context.Background()))
			dropConnection(t, w)
			return true
		}
		return false
	})
	c := newClient(t, Config{Endpoints: []string{n.addr()}})
	res, err := c.Reserve(ctxT(t), &idemkv.ReserveRequest{Tenant: "t1", Key: "k", Tool: "x", Fingerprint: "sha256:aa"})
	if err != nil {
		t.Fatal(err)
	}
	var first, second idemkv.ReserveRequest
	if len(bodies) != 2 || json.Unmarshal(bodies[0], &first) != nil || json.Unmarshal(bodies[1], &second) != nil {
		t.Fatalf("bodies %q", bodies)
	}
	if first.AttemptID == "" || first.AttemptID != second.AttemptID || res.AttemptID != first.AttemptID {
		t.Fatalf("attempt ids %q %q %q", first.AttemptID, second.AttemptID, res.AttemptID)
	}
	if res.Decision != idemkv.DecisionExecute || res.Record.Attempts != 1 {
		t.Fatalf("the retried reserve was not the same attempt: %+v", res)
	}
}

func TestClientReleaseAfterLostAnswer(t *testing.T) {
	n := startNode(t, newMemStore())
	c := newClient(t, Config{Endpoints: []string{n.addr()}})
	ctx := ctxT(t)
	res, err := c.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "t1", Key: "k", Tool: "x", Fingerprint: "sha256:aa"})
	if err != nil {
		t.Fatal(err)
	}
	req := &idemkv.ReleaseRequest{Tenant: "t1", Key: "k", Fingerprint: "sha256:aa", Fence: res.Fence}
	var releases atomic.Int32
	n.setHook(func(w http.ResponseWriter, r *http.Request, next http.Handler) bool {
		if r.URL.Path == "/v1/release" && releases.Add(1) == 1 {
			next.ServeHTTP(httptest.NewRecorder(), r.Clone(context.Background()))
			dropConnection(t, w)
			return true
		}
		return false
	})
	out, err := c.Release(ctx, req)
	if err != nil || !out.Released {
		t.Fatalf("release after a lost answer: %+v, %v", out, err)
	}
	if releases.Load() != 2 {
		t.Fatalf("%d release requests", releases.Load())
	}
	// Without a retry, not_found is what it says.
	if _, err := c.Release(ctx, req); !errors.Is(err, idemkv.ErrNotFound) {
		t.Fatalf("release of an absent key: %v", err)
	}
}

func TestClientSendsTokenAndTraceContext(t *testing.T) {
	n := startNode(t, newMemStore())
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	c := newClient(t, Config{Endpoints: []string{n.addr()}, Token: "s3cret", TracerProvider: tp, Propagator: propagation.TraceContext{}})
	ctx, parent := tp.Tracer("test").Start(ctxT(t), "agent step")
	if _, err := c.Get(ctx, &idemkv.GetRequest{Tenant: "t1", Key: "k", Wait: 10 * time.Millisecond}); !errors.Is(err, idemkv.ErrNotFound) {
		t.Fatal(err)
	}
	parent.End()
	r := n.requests()[0]
	if r.Header.Get("Authorization") != "Bearer s3cret" {
		t.Errorf("authorization %q", r.Header.Get("Authorization"))
	}
	sent := propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(r.Header))
	sc := trace.SpanContextFromContext(sent)
	if sc.TraceID() != parent.SpanContext().TraceID() {
		t.Fatalf("traceparent %q does not carry the caller's trace", r.Header.Get("traceparent"))
	}
	if r.URL.Query().Get("wait_ms") != "10" {
		t.Errorf("query %q", r.URL.RawQuery)
	}
	var span sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindClient {
			span = s
		}
	}
	if span == nil || span.Name() != "GET /v1/records/{tenant}/{key}" || span.Parent().SpanID() != parent.SpanContext().SpanID() ||
		span.SpanContext().SpanID() != sc.SpanID() {
		t.Fatalf("client span %v: must be the caller's child and the server's parent", span)
	}
	var key string
	for _, kv := range span.Attributes() {
		if kv.Key == semconv.IdempotencyKey {
			key = kv.Value.AsString()
		}
	}
	if key != "k" {
		t.Errorf("client span key %q", key)
	}
}

func TestClientNonIdemkvAnswers(t *testing.T) {
	n := startNode(t, newMemStore())
	var hits atomic.Int32
	status := atomic.Int32{}
	status.Store(http.StatusBadGateway)
	n.setHook(func(w http.ResponseWriter, r *http.Request, next http.Handler) bool {
		if hits.Add(1) == 1 || status.Load() == http.StatusInternalServerError {
			http.Error(w, "<html>upstream</html>", int(status.Load()))
			return true
		}
		return false
	})
	c := newClient(t, Config{Endpoints: []string{n.addr()}})
	ctx := ctxT(t)
	if _, err := c.Get(ctx, &idemkv.GetRequest{Tenant: "t1", Key: "k"}); !errors.Is(err, idemkv.ErrNotFound) {
		t.Fatalf("a 502 from a proxy must be retried: %v", err)
	}
	status.Store(http.StatusInternalServerError)
	before := hits.Load()
	_, err := c.Get(ctx, &idemkv.GetRequest{Tenant: "t1", Key: "k"})
	if !errors.Is(err, idemkv.ErrInternal) || hits.Load() != before+1 {
		t.Fatalf("a plain 500: %v after %d requests", err, hits.Load()-before)
	}
}

func TestClientGivesUpAfterMaxAttempts(t *testing.T) {
	n := startNode(t, newMemStore())
	n.setHook(func(w http.ResponseWriter, r *http.Request, next http.Handler) bool {
		dropConnection(t, w)
		return true
	})
	c := newClient(t, Config{Endpoints: []string{n.addr()}, MaxAttempts: 4})
	_, err := c.Cluster(ctxT(t))
	if !errors.Is(err, idemkv.ErrUnavailable) || n.count.Load() != 4 {
		t.Fatalf("got %v after %d requests", err, n.count.Load())
	}
}

func TestClientAttemptTimeout(t *testing.T) {
	mem := newMemStore()
	slow, fast := startNode(t, mem), startNode(t, mem)
	slow.setHook(func(w http.ResponseWriter, r *http.Request, next http.Handler) bool {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
		return true
	})
	fast.store.self = ""
	c := newClient(t, Config{Endpoints: []string{slow.addr(), fast.addr()}, Timeout: 150 * time.Millisecond})
	start := time.Now()
	if _, err := c.Cluster(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %s: a hung node must cost one attempt timeout", d)
	}

	// A long-poll gets its wait on top of the attempt timeout.
	res, err := mem.Reserve(ctxT(t), &idemkv.ReserveRequest{Tenant: "t1", Key: "held", Tool: "x", Fingerprint: "sha256:aa", AttemptID: "other"})
	if err != nil || res.Decision != idemkv.DecisionExecute {
		t.Fatal(res, err)
	}
	c2 := newClient(t, Config{Endpoints: []string{fast.addr()}, Timeout: 150 * time.Millisecond})
	before := fast.count.Load()
	start = time.Now()
	rec, err := c2.Get(ctxT(t), &idemkv.GetRequest{Tenant: "t1", Key: "held", Wait: 500 * time.Millisecond})
	if err != nil || rec.Status != idemkv.StatusPending {
		t.Fatalf("%+v, %v", rec, err)
	}
	if d := time.Since(start); d < 450*time.Millisecond || fast.count.Load() != before+1 {
		t.Fatalf("long-poll returned after %s in %d requests", d, fast.count.Load()-before)
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []Config{
		{Endpoints: []string{"ftp://x:1"}},
		{Endpoints: []string{"http://x:1/prefix"}},
		{Endpoints: []string{"http://"}},
		{MaxAttempts: -1},
		{BackoffMin: time.Second, BackoffMax: time.Millisecond},
		{Run: RunConfig{LeaseTTL: time.Millisecond}},
	}
	for i, cfg := range bad {
		if _, err := New(cfg); err == nil {
			t.Errorf("config %d accepted: %+v", i, cfg)
		}
	}
	c, err := New(Config{Endpoints: []string{"example.test:7420"}, TLSConfig: nil})
	if err != nil || c.endpoints[0] != "http://example.test:7420" {
		t.Fatalf("%v %v", c, err)
	}
}

func TestBackoffIsBoundedAndJittered(t *testing.T) {
	seen := map[time.Duration]bool{}
	for n := 1; n < 70; n++ {
		d := backoff(n, 10*time.Millisecond, 300*time.Millisecond)
		if d < 10*time.Millisecond || d > 300*time.Millisecond {
			t.Fatalf("backoff(%d) = %s", n, d)
		}
		seen[d] = true
	}
	if len(seen) < 10 {
		t.Fatalf("only %d distinct delays: no jitter", len(seen))
	}
}

// W3C trace context crosses the wire: the server span that the API's tracing
// middleware starts is the child of the client's HTTP span, and carries the decision.
func TestTraceContinuesOnTheServer(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
	})
	store := &apiStore{memStore: newMemStore()}
	srv := httptest.NewServer(api.New(api.Config{Store: store, Logger: testlog.New(t), Middleware: telemetry.HTTPMiddleware}).Handler())
	t.Cleanup(srv.Close)
	store.self = strings.TrimPrefix(srv.URL, "http://")

	c := newClient(t, Config{Endpoints: []string{srv.URL}, TracerProvider: tp, Propagator: propagation.TraceContext{}})
	op := ticketOp("k-traced", "Outage X")
	out, err := c.Do(ctxT(t), op, func(context.Context) (*Result, error) {
		return &Result{RemoteSystem: "linear", RemoteID: "LIN-7"}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byID[s.SpanContext().SpanID()] = s
	}
	var server sdktrace.ReadOnlySpan
	for _, s := range byID {
		if s.SpanKind() == trace.SpanKindServer && s.Name() == "POST /v1/reserve" {
			server = s
		}
	}
	if server == nil {
		t.Fatal("no server span for the reserve")
	}
	httpSpan, ok := byID[server.Parent().SpanID()]
	if !ok || httpSpan.SpanKind() != trace.SpanKindClient || httpSpan.Name() != "POST /v1/reserve" {
		t.Fatalf("the server span's parent %v is not the client's HTTP span", server.Parent())
	}
	doSpan, ok := byID[httpSpan.Parent().SpanID()]
	if !ok || doSpan.Name() != "execute_tool create_ticket" {
		t.Fatal("the client's HTTP span is not under the Do span")
	}
	var decision, fp string
	for _, kv := range server.Attributes() {
		switch kv.Key {
		case semconv.Decision:
			decision = kv.Value.AsString()
		case semconv.Fingerprint:
			fp = kv.Value.AsString()
		}
	}
	if decision != "execute" || fp != out.Fingerprint {
		t.Fatalf("server span decision %q fingerprint %q", decision, fp)
	}
}

func TestClientIgnoresUndialableLeader(t *testing.T) {
	c := newClient(t, Config{Endpoints: []string{"127.0.0.1:7420"}})
	for _, addr := range []string{"0.0.0.0:7420", "[::]:7420", ":7420", "not a host"} {
		c.setLeader(addr)
		if l := c.Leader(); l != "" {
			t.Errorf("leader %q adopted from %q", l, addr)
		}
	}
	c.setLeader("10.0.0.5:7420")
	if l := c.Leader(); l != "http://10.0.0.5:7420" {
		t.Errorf("leader %q", l)
	}
}

// A proxy's 502 or 504 to a write may come after it forwarded the write, which may
// then have been applied: outcome_unknown, retried as before. Its 503, and any of them
// to a read, is unavailable.
func TestProxyGatewayErrorsOnWrites(t *testing.T) {
	n := startNode(t, newMemStore())
	var status atomic.Int32
	n.setHook(func(w http.ResponseWriter, r *http.Request, next http.Handler) bool {
		http.Error(w, "<html>upstream</html>", int(status.Load()))
		return true
	})
	c := newClient(t, Config{Endpoints: []string{n.addr()}, MaxAttempts: 2})
	ctx := ctxT(t)
	for _, tc := range []struct {
		status int
		write  bool
		want   error
	}{
		{http.StatusBadGateway, true, idemkv.ErrOutcomeUnknown},
		{http.StatusGatewayTimeout, true, idemkv.ErrOutcomeUnknown},
		{http.StatusServiceUnavailable, true, idemkv.ErrUnavailable},
		{http.StatusBadGateway, false, idemkv.ErrUnavailable},
		{http.StatusGatewayTimeout, false, idemkv.ErrUnavailable},
	} {
		status.Store(int32(tc.status))
		var err error
		if tc.write {
			_, err = c.Release(ctx, &idemkv.ReleaseRequest{Tenant: "t1", Key: "k", Fingerprint: "sha256:" + strings.Repeat("0", 64), Fence: 1})
		} else {
			_, err = c.Get(ctx, &idemkv.GetRequest{Tenant: "t1", Key: "k"})
		}
		if !errors.Is(err, tc.want) || (tc.want == idemkv.ErrUnavailable && errors.Is(err, idemkv.ErrOutcomeUnknown)) {
			t.Errorf("HTTP %d to a write (%v): %v, want %v", tc.status, tc.write, err, tc.want)
		}
	}
}

// A leader address that names another scheme than the client's own is not followed:
// a client that reaches its cluster over TLS with a token must not send the next
// request, token and all, in plain text because an answer named an http:// leader.
func TestClientKeepsItsSchemeWhenFollowingTheLeader(t *testing.T) {
	mem := newMemStore()
	plain := startNode(t, mem)
	store := &apiStore{memStore: mem}
	srv := httptest.NewTLSServer(api.New(api.Config{Store: store, Logger: testlog.New(t)}).Handler())
	t.Cleanup(srv.Close)
	store.self = strings.TrimPrefix(srv.URL, "https://")
	store.leaderAddr = plain.srv.URL // "http://127.0.0.1:…"
	c := newClient(t, Config{Endpoints: []string{srv.URL}, Token: "s3cret", HTTPClient: srv.Client()})
	ctx := ctxT(t)
	for range 3 {
		if _, err := c.Get(ctx, &idemkv.GetRequest{Tenant: "t1", Key: "k", Consistency: idemkv.Stale}); !errors.Is(err, idemkv.ErrNotFound) {
			t.Fatal(err)
		}
	}
	for _, r := range plain.requests() {
		if r.Header.Get(api.HeaderForwarded) == "" {
			t.Fatalf("the client followed an http:// leader from a TLS endpoint: %s %s with authorization %q in plain text",
				r.Method, r.URL, r.Header.Get("Authorization"))
		}
	}
	if l := c.Leader(); strings.HasPrefix(l, "http://") {
		t.Fatalf("leader %q adopted", l)
	}
}

// A node (or anything posing as one) that answers a record read with an endless body
// does not make the client read it all: an answer past what any record can be is
// refused, as a transport failure, once that much is read.
func TestClientBoundsWhatItReadsOfAnAnswer(t *testing.T) {
	n := startNode(t, newMemStore())
	const endless = 96 << 20
	var written atomic.Int64
	n.setHook(func(w http.ResponseWriter, r *http.Request, next http.Handler) bool {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		chunk := bytes.Repeat([]byte("a"), 64<<10)
		if _, err := w.Write([]byte(`{"tenant":"`)); err != nil {
			return true
		}
		for written.Load() < endless {
			m, err := w.Write(chunk)
			written.Add(int64(m))
			if err != nil {
				return true
			}
		}
		return true
	})
	c := newClient(t, Config{Endpoints: []string{n.addr()}, MaxAttempts: 1})
	_, err := c.Get(ctxT(t), &idemkv.GetRequest{Tenant: "t1", Key: "k"})
	if !errors.Is(err, idemkv.ErrUnavailable) {
		t.Fatalf("Get: %v, want unavailable", err)
	}
	waitFor(t, func() bool { return n.count.Load() == 1 })
	// The server stops writing once the client has closed the connection; what the
	// socket buffers took on top of the bound is a few MiB.
	if w := written.Load(); w > maxAnswerBytes+16<<20 {
		t.Fatalf("the client read %d MiB of one answer (bound %d MiB)", w>>20, maxAnswerBytes>>20)
	}
}

// A node that names a leader this client cannot reach (an address inside a cluster's
// network, behind the load balancer the client uses) is not followed again and again:
// once that leader failed, the client keeps to its endpoints for a while instead of
// paying a timeout on every call, and on every heartbeat, which a short lease cannot
// afford.
func TestClientDoesNotChaseAnUnreachableLeader(t *testing.T) {
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int32
	var held sync.WaitGroup
	done := make(chan struct{})
	t.Cleanup(func() { close(done); hole.Close(); held.Wait() })
	go func() {
		for {
			conn, err := hole.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			held.Add(1)
			go func() { defer held.Done(); <-done; conn.Close() }()
		}
	}()
	n := startNode(t, newMemStore())
	n.store.leaderAddr = hole.Addr().String()
	c := newClient(t, Config{Endpoints: []string{n.addr()}, Timeout: 300 * time.Millisecond})
	ctx := ctxT(t)
	start := time.Now()
	for range 5 {
		if _, err := c.Get(ctx, &idemkv.GetRequest{Tenant: "t1", Key: "k", Consistency: idemkv.Stale}); !errors.Is(err, idemkv.ErrNotFound) {
			t.Fatal(err)
		}
	}
	if got := conns.Load(); got > 1 {
		t.Fatalf("the unreachable leader was tried %d times in 5 calls (%s)", got, time.Since(start).Round(time.Millisecond))
	}
}

// A leader that answered, even 503 unavailable (an election), is reachable: it is
// followed again as soon as a node names it, not kept away as one that never answers.
func TestClientFollowsALeaderThatAnsweredAnError(t *testing.T) {
	mem := newMemStore()
	leader := startNode(t, mem)
	follower := startNode(t, mem)
	follower.store.leaderAddr = leader.addr()
	var direct atomic.Int32
	leader.setHook(func(w http.ResponseWriter, r *http.Request, next http.Handler) bool {
		if r.Header.Get(api.HeaderForwarded) != "" {
			return false
		}
		if direct.Add(1) == 1 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":{"code":"unavailable","message":"electing"}}`))
			return true
		}
		return false
	})
	c := newClient(t, Config{Endpoints: []string{follower.addr()}})
	ctx := ctxT(t)
	for i := range 3 {
		if _, err := c.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "t1", Key: fmt.Sprintf("k%d", i), Tool: "x", Fingerprint: "sha256:aa"}); err != nil {
			t.Fatal(err)
		}
	}
	if n := direct.Load(); n != 2 || c.Leader() != leader.srv.URL {
		t.Fatalf("the leader saw %d direct requests (want 2: the 503, then the third call), leader %q", n, c.Leader())
	}
}
