package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/telemetry"
	"github.com/idemkv/idemkv/telemetry/semconv"
)

// The server spans of a real cluster: a follower's forward is the parent of the
// leader's span; every decision carries the record's fence and the caller's tool class;
// a refused request and a long-poll still name their tenant and key; health probes
// make no span.
func TestServerSpansThroughACluster(t *testing.T) {
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() { otel.SetTracerProvider(prevTP); otel.SetTextMapPropagator(prevProp) })
	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	otel.SetTextMapPropagator(propagation.TraceContext{})

	c := testcluster.Start(t, 3, testcluster.WithAPIMiddleware(telemetry.HTTPMiddleware))
	leader := c.WaitLeader()
	follower := (leader + 1) % 3

	caller := sdktrace.NewTracerProvider().Tracer("caller")
	send := func(i int, method, path string, body any) (int, []sdktrace.ReadOnlySpan, []byte) {
		t.Helper()
		before := len(rec.Ended())
		ctx, span := caller.Start(context.Background(), "caller")
		defer span.End()
		var rd io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
		req, err := http.NewRequestWithContext(ctx, method, "http://"+c.Endpoint(i)+path, rd)
		if err != nil {
			t.Fatal(err)
		}
		propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, rec.Ended()[before:], out
	}
	attrs := func(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
		m := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			m[kv.Key] = kv.Value
		}
		return m
	}

	reserve := idemkv.ReserveRequest{Tenant: "t1", Key: "k1", Tool: "create_ticket", Fingerprint: "sha256:aa",
		AttemptID: "a1", SideEffect: idemkv.SideEffectNonIdempotentMutation}

	// Through a follower: two server spans, the leader's a child of the follower's.
	status, spans, body := send(follower, http.MethodPost, "/v1/reserve", reserve)
	if status != http.StatusOK || len(spans) != 2 {
		t.Fatalf("reserve through the follower: %d, %d spans: %s", status, len(spans), body)
	}
	var res idemkv.ReserveResult
	if err := json.Unmarshal(body, &res); err != nil {
		t.Fatal(err)
	}
	leaderSpan, followerSpan := spans[0], spans[1] // the inner one ends first
	if leaderSpan.Parent().SpanID() != followerSpan.SpanContext().SpanID() {
		t.Errorf("the leader's span has parent %s, want the follower's span %s",
			leaderSpan.Parent().SpanID(), followerSpan.SpanContext().SpanID())
	}
	if leaderSpan.SpanContext().TraceID() != followerSpan.SpanContext().TraceID() {
		t.Error("the leader's span is in another trace")
	}
	a := attrs(leaderSpan)
	if a[semconv.ToolSideEffect].AsString() != idemkv.SideEffectNonIdempotentMutation || a[semconv.Decision].AsString() != "execute" {
		t.Errorf("execute span: %v", a)
	}

	// Commit, then replay and conflict at the leader: both carry the record's fence.
	commit := idemkv.CommitRequest{Tenant: "t1", Key: "k1", Fingerprint: "sha256:aa", Fence: res.Fence, RemoteSystem: "x", RemoteID: "X-1"}
	if status, _, body := send(leader, http.MethodPost, "/v1/commit", commit); status != http.StatusOK {
		t.Fatalf("commit: %d %s", status, body)
	}
	for _, tc := range []struct {
		decision string
		fp       string
	}{{"replay", "sha256:aa"}, {"conflict", "sha256:bb"}} {
		r := reserve
		r.Fingerprint, r.AttemptID = tc.fp, "a2"
		_, spans, _ := send(leader, http.MethodPost, "/v1/reserve", r)
		if len(spans) != 1 {
			t.Fatalf("%s: %d spans", tc.decision, len(spans))
		}
		a := attrs(spans[0])
		if a[semconv.Decision].AsString() != tc.decision || a[semconv.Fence].AsInt64() != int64(res.Fence) {
			t.Errorf("%s span: decision %q fence %d, want fence %d", tc.decision, a[semconv.Decision].AsString(), a[semconv.Fence].AsInt64(), res.Fence)
		}
		if !a[semconv.AnsweredLocally].AsBool() {
			t.Errorf("%s span at the leader: not marked as answered locally: %v", tc.decision, a)
		}
	}

	// Once the follower has applied the commit, it replays by itself: one span, its
	// own, saying so (docs/protocol.md "Followers").
	if err := testcluster.Eventually(10*time.Second, func() error {
		rec, err := c.Node(follower).Get(context.Background(), &idemkv.GetRequest{Tenant: "t1", Key: "k1", Consistency: idemkv.Stale})
		if err == nil && rec.Status != idemkv.StatusCommitted {
			err = fmt.Errorf("follower holds %s", rec.Status)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	r := reserve
	r.AttemptID = "a3"
	status, spans, body = send(follower, http.MethodPost, "/v1/reserve", r)
	if status != http.StatusOK || len(spans) != 1 {
		t.Fatalf("replay at the follower: %d, %d spans: %s", status, len(spans), body)
	}
	if a := attrs(spans[0]); a[semconv.Decision].AsString() != "replay" || !a[semconv.AnsweredLocally].AsBool() || a[semconv.Fence].AsInt64() != int64(res.Fence) {
		t.Errorf("follower's replay span: %v", a)
	}
	// An answer from the log is not marked.
	if _, ok := attrs(leaderSpan)[semconv.AnsweredLocally]; ok {
		t.Errorf("the execute span is marked as answered locally")
	}

	// A refused request still says what it was about.
	bad := reserve
	bad.LeaseTTLMs = 1
	status, spans, _ = send(leader, http.MethodPost, "/v1/reserve", bad)
	if status != http.StatusBadRequest || len(spans) != 1 {
		t.Fatalf("bad reserve: %d, %d spans", status, len(spans))
	}
	if a := attrs(spans[0]); a[semconv.Tenant].AsString() != "t1" || a[semconv.IdempotencyKey].AsString() != "k1" {
		t.Errorf("400 span: %v", a)
	}

	// A long-poll names its record.
	status, spans, _ = send(leader, http.MethodGet, "/v1/records/t1/k1?wait_ms=100", nil)
	if status != http.StatusOK || len(spans) != 1 {
		t.Fatalf("long-poll: %d, %d spans", status, len(spans))
	}
	if a := attrs(spans[0]); a[semconv.Tenant].AsString() != "t1" || a[semconv.IdempotencyKey].AsString() != "k1" {
		t.Errorf("long-poll span: %v", a)
	}

	// Health probes make no span.
	for _, p := range []string{"/healthz", "/readyz"} {
		if _, spans, _ := send(leader, http.MethodGet, p, nil); len(spans) != 0 {
			t.Errorf("%s made %d spans", p, len(spans))
		}
	}
}
