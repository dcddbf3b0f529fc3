package api_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
	"github.com/idemkv/idemkv/metrics"
)

// logSink sends a server's logs to t.Log, so they show only when a test fails, and
// keeps them for tests that check what was logged.
type logSink struct {
	t   testing.TB
	mu  sync.Mutex
	buf strings.Builder
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.buf.Write(p)
	s.mu.Unlock()
	s.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// testNode is one API server on a loopback port in front of a FakeStore. Its
// Middleware records every request that reaches it, forwarded ones included.
type testNode struct {
	srv     *httptest.Server
	addr    string
	url     string
	fake    *FakeStore
	metrics *metrics.Metrics
	logs    *logSink

	mu       sync.Mutex
	requests []*http.Request
}

// startNode serves fake. A fake without LeaderFunc is the leader at its own address.
func startNode(t *testing.T, fake *FakeStore, tweak func(*api.Config)) *testNode {
	t.Helper()
	n := &testNode{fake: fake, metrics: metrics.New(), logs: &logSink{t: t}}
	cfg := api.Config{
		Store:   fake,
		Logger:  slog.New(slog.NewTextHandler(n.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: n.metrics,
		Middleware: func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n.mu.Lock()
				n.requests = append(n.requests, r.Clone(r.Context()))
				n.mu.Unlock()
				next.ServeHTTP(w, r)
			})
		},
	}
	if tweak != nil {
		tweak(&cfg)
	}
	n.srv = httptest.NewServer(api.New(cfg).Handler())
	t.Cleanup(n.srv.Close)
	n.addr = n.srv.Listener.Addr().String()
	n.url = n.srv.URL
	if fake.LeaderFunc == nil {
		fake.LeaderFunc = func() (string, bool) { return n.addr, true }
	}
	return n
}

// seen returns the requests that reached the node.
func (n *testNode) seen() []*http.Request {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.requests)
}

// decisions reads the decision counter of this node.
func (n *testNode) decisions(t *testing.T, tool string, d idemkv.Decision) float64 {
	t.Helper()
	var m dto.Metric
	if err := n.metrics.Decisions.WithLabelValues(tool, string(d)).Write(&m); err != nil {
		t.Fatalf("reading the decision counter: %v", err)
	}
	return m.GetCounter().GetValue()
}

// requestCount reads how many requests the node timed under endpoint and status code.
func (n *testNode) requestCount(t *testing.T, endpoint, code string) uint64 {
	t.Helper()
	families, err := n.metrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != "idemkv_http_request_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["endpoint"] == endpoint && labels["code"] == code {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}

var testClient = &http.Client{
	Timeout: 20 * time.Second,
	// Tests look at redirects instead of following them.
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends one request. body may be nil, a string (sent as is), an io.Reader (sent
// chunked, with no length) or any value (sent as JSON).
func do(t *testing.T, method, url string, body any, header map[string]string) response {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case io.Reader:
		rd = b
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			t.Fatalf("encoding the request: %v", err)
		}
		rd = strings.NewReader(string(raw))
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatalf("building %s %s: %v", method, url, err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, url, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: raw}
}

// object decodes the answer as a JSON object after checking its status.
func (r response) object(t *testing.T, wantStatus int) map[string]any {
	t.Helper()
	if r.status != wantStatus {
		t.Fatalf("status %d, want %d; body %s", r.status, wantStatus, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("answer is not a JSON object: %v; body %s", err, r.body)
	}
	return m
}

// wantError checks the status and the exact shape {"error":{"code","message"[,"field"]}}.
func (r response) wantError(t *testing.T, status int, code, field string) map[string]any {
	t.Helper()
	m := r.object(t, status)
	wantKeys(t, "error body", m, "error")
	e, ok := m["error"].(map[string]any)
	if !ok {
		t.Fatalf("error is %T, want an object; body %s", m["error"], r.body)
	}
	if field == "" {
		wantKeys(t, "error", e, "code", "message")
	} else {
		wantKeys(t, "error", e, "code", "field", "message")
		if e["field"] != field {
			t.Errorf("field %v, want %q; body %s", e["field"], field, r.body)
		}
	}
	if e["code"] != code {
		t.Errorf("code %v, want %q; body %s", e["code"], code, r.body)
	}
	if msg, _ := e["message"].(string); msg == "" {
		t.Errorf("empty message; body %s", r.body)
	}
	return e
}

// wantKeys checks that m has exactly the keys want.
func wantKeys(t *testing.T, what string, m map[string]any, want ...string) {
	t.Helper()
	got := make([]string, 0, len(m))
	for k := range m {
		got = append(got, k)
	}
	slices.Sort(got)
	want = slices.Clone(want)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s has keys %v, want %v", what, got, want)
	}
}

func object(t *testing.T, what string, v any) map[string]any {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%s is %T, want an object", what, v)
	}
	return m
}

// Fixtures in the shapes of docs/protocol.md section 2.
const (
	testTenant = "acme"
	testKey    = "conversation_9:approval_17:create_ticket"
	testTool   = "create_ticket"
	testFP     = "sha256:7f4c2a9d0b1e3f5a7c9e1b3d5f7a9c1e3b5d7f9a1c3e5b7d9f1a3c5e7b9d1f3a"
	otherFP    = "sha256:b23a000000000000000000000000000000000000000000000000000000000000"
)

var (
	t0          = idemkv.TimestampOf(time.Date(2026, 7, 29, 13, 0, 0, 0, time.UTC))
	t13         = idemkv.TimestampOf(time.Date(2026, 7, 29, 13, 0, 13, 0, time.UTC))
	pendingKeys = []string{"tenant", "idempotency_key", "effect_fingerprint", "tool", "actor", "status", "fence",
		"attempt_id", "attempts", "created_at", "updated_at", "lease_expires_at", "expires_at"}
	receiptKeys = []string{"idempotency_key", "effect_fingerprint", "status", "remote_system", "remote_id",
		"remote_url", "committed_at", "result"}
)

func pendingRecord(key string) *idemkv.Record {
	return &idemkv.Record{
		Tenant: testTenant, Key: key, Fingerprint: testFP, Tool: testTool, Actor: "agent-7",
		Status: idemkv.StatusPending, Fence: 7, AttemptID: "att-1", Attempts: 1,
		CreatedAt: t0, UpdatedAt: t0, LeaseExpiresAt: t0 + 30_000, ExpiresAt: t0 + 86_400_000,
	}
}

func committedRecord() *idemkv.Record {
	r := pendingRecord(testKey)
	r.Status = idemkv.StatusCommitted
	r.LeaseExpiresAt = 0
	r.UpdatedAt = t13
	r.Receipt = &idemkv.StoredReceipt{
		RemoteSystem: "linear", RemoteID: "LIN-1842", RemoteURL: "https://linear.example/issue/LIN-1842",
		Result: json.RawMessage(`{"number":1842}`), CommittedAt: t13,
	}
	return r
}

func validReserve() map[string]any {
	return map[string]any{
		"tenant": testTenant, "idempotency_key": testKey, "tool": testTool,
		"actor": "agent-7", "effect_fingerprint": testFP,
	}
}

func validCommit() map[string]any {
	return map[string]any{
		"tenant": testTenant, "idempotency_key": testKey, "effect_fingerprint": testFP, "fence": 7,
		"remote_system": "linear", "remote_id": "LIN-1842", "remote_url": "https://linear.example/issue/LIN-1842",
		"result": map[string]any{"number": 1842},
	}
}

func validFail() map[string]any {
	return map[string]any{
		"tenant": testTenant, "idempotency_key": testKey, "effect_fingerprint": testFP, "fence": 7,
		"error": map[string]any{"code": "quota_exceeded", "message": "project is full", "details": map[string]any{"limit": 10}},
	}
}

func validRelease() map[string]any {
	return map[string]any{"tenant": testTenant, "idempotency_key": testKey, "effect_fingerprint": testFP, "fence": 7}
}

func validHeartbeat() map[string]any {
	return map[string]any{"tenant": testTenant, "idempotency_key": testKey, "fence": 7, "lease_ttl_ms": 60_000}
}

// with returns a copy of m with the given members set, or removed when the value is
// the remove marker.
func with(m map[string]any, kv ...any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		k := kv[i].(string)
		if kv[i+1] == remove {
			delete(out, k)
			continue
		}
		out[k] = kv[i+1]
	}
	return out
}

type removeMarker struct{}

var remove = removeMarker{}

func sampleCluster() *idemkv.ClusterInfo {
	return &idemkv.ClusterInfo{
		Leader: idemkv.LeaderInfo{ID: "n1", APIAddr: "127.0.0.1:7420"},
		Nodes: []idemkv.NodeInfo{
			{ID: "n1", RaftAddr: "127.0.0.1:7421", APIAddr: "127.0.0.1:7420", Suffrage: "voter", State: "leader"},
			{ID: "n2", RaftAddr: "127.0.0.1:7431", APIAddr: "127.0.0.1:7430", Suffrage: "voter", State: "follower"},
		},
		Term: 3, CommitIndex: 42, AppliedIndex: 41,
	}
}
