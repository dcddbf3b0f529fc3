package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/node"
	"github.com/idemkv/idemkv/telemetry/semconv"
)

// The node satisfies the client's Store: Do runs in-process just as over HTTP.
var _ client.Store = (*node.Node)(nil)

// ticketAPI is the downstream system: it creates tickets, can time out after creating
// one, and counts what it really did.
type ticketAPI struct {
	mu      sync.Mutex
	byExtID map[string]string
	perExt  map[string]int
	total   atomic.Int32
}

func newTicketAPI() *ticketAPI {
	return &ticketAPI{byExtID: map[string]string{}, perExt: map[string]int{}}
}

var errDownstreamTimeout = errors.New("POST https://linear.example/tickets: context deadline exceeded")

func (a *ticketAPI) create(extID string) *client.Result {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.total.Add(1)
	id := fmt.Sprintf("LIN-%d", 1840+n)
	a.byExtID[extID] = id
	a.perExt[extID]++
	return &client.Result{RemoteSystem: "linear", RemoteID: id, RemoteURL: "https://linear.example/issue/" + id,
		Result: map[string]string{"id": id}}
}

func (a *ticketAPI) id(extID string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.byExtID[extID]
}

func (a *ticketAPI) count(extID string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.perExt[extID]
}

// probe looks the ticket up by the external id the tool sets: the idempotency key.
func (a *ticketAPI) probe(extID string) client.ProbeFunc {
	return func(context.Context) (*client.Result, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		if id, ok := a.byExtID[extID]; ok {
			return &client.Result{RemoteSystem: "linear", RemoteID: id, RemoteURL: "https://linear.example/issue/" + id}, nil
		}
		return nil, nil
	}
}

type env struct {
	cluster *testcluster.Cluster
	client  *client.Client
	spans   *tracetest.SpanRecorder
	api     *ticketAPI
}

func startEnv(t *testing.T, n int) *env {
	t.Helper()
	c := testcluster.Start(t, n)
	rec := tracetest.NewSpanRecorder()
	cl, err := client.New(client.Config{
		Endpoints:      c.Endpoints(),
		Timeout:        3 * time.Second,
		Logger:         testlog.New(t),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)),
		Propagator:     propagation.TraceContext{},
		Run: client.RunConfig{
			BackoffMin: 5 * time.Millisecond,
			BackoffMax: 200 * time.Millisecond,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return &env{cluster: c, client: cl, spans: rec, api: newTicketAPI()}
}

func timeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// createTicket is the operation of the article: an approved incident ticket.
func createTicket(key, title string) client.Op {
	return client.Op{
		Tenant: "tenant_42",
		Key:    key,
		Tool:   "create_ticket",
		Actor:  "agent-runtime",
		Class:  client.NonIdempotentMutation,
		Effect: map[string]any{
			"tenant": "tenant_42", "project": "OPS", "title": title, "severity": "sev1",
			"customer_id": "cus_9", "incident_id": "inc_17",
			// Volatile: differs on every attempt and must not change the fingerprint.
			"trace_id": fmt.Sprintf("%x", time.Now().UnixNano()),
		},
		Drop:     []string{"trace_id"},
		LeaseTTL: 2 * time.Second,
	}
}

func (e *env) create(key string) client.Func {
	return func(context.Context) (*client.Result, error) { return e.api.create(key), nil }
}

func mustNotRun(t *testing.T) client.Func {
	return func(context.Context) (*client.Result, error) {
		t.Error("the tool ran, and must not have")
		return nil, errors.New("must not run")
	}
}

// TestProductionGrade runs the article's production-grade tests, and the recovery
// cases, against one real three-node cluster.
func TestProductionGrade(t *testing.T) {
	e := startEnv(t, 3)

	t.Run("the first attempt commits exactly once", func(t *testing.T) {
		key := "conversation_9:approval_17:create_ticket"
		out, err := e.client.Do(timeout(t, 20*time.Second), createTicket(key, "Outage X"), e.create(key))
		if err != nil {
			t.Fatal(err)
		}
		if out.Decision != idemkv.DecisionExecute || out.Replayed || e.api.count(key) != 1 {
			t.Fatalf("outcome %+v, %d tickets", out, e.api.count(key))
		}
		// Replicated: every node's own copy holds the receipt.
		for i := range e.cluster.Len() {
			err := testcluster.Eventually(10*time.Second, func() error {
				rec, err := e.cluster.Node(i).Get(context.Background(), &idemkv.GetRequest{Tenant: "tenant_42", Key: key, Consistency: idemkv.Stale})
				if err != nil {
					return err
				}
				if rec.Status != idemkv.StatusCommitted || rec.Receipt.RemoteID != out.Receipt.RemoteID || rec.Fingerprint != out.Fingerprint {
					return fmt.Errorf("node %d holds %+v", i, rec)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("a timeout after the downstream commit returns the same receipt on retry", func(t *testing.T) {
		key := "conversation_9:approval_18:create_ticket"
		op := createTicket(key, "Outage Y")
		op.Probe = e.api.probe(key)
		// The ticket API creates the ticket, then the call times out.
		_, err := e.client.Do(timeout(t, 20*time.Second), op, func(context.Context) (*client.Result, error) {
			e.api.create(key)
			return nil, errDownstreamTimeout
		})
		if !errors.Is(err, errDownstreamTimeout) {
			t.Fatalf("got %v", err)
		}
		// The runtime retries: the lease runs out, the retry recovers through the probe.
		first, err := e.client.Do(timeout(t, 20*time.Second), op, mustNotRun(t))
		if err != nil {
			t.Fatal(err)
		}
		if first.Decision != idemkv.DecisionRecover || !first.Probed || first.Receipt.RemoteID != e.api.id(key) {
			t.Fatalf("recovery %+v", first)
		}
		// And every retry after that replays the same receipt.
		again, err := e.client.Do(timeout(t, 20*time.Second), op, mustNotRun(t))
		if err != nil || !again.Replayed || again.Receipt.RemoteID != first.Receipt.RemoteID || again.Receipt.CommittedAt != first.Receipt.CommittedAt {
			t.Fatalf("replay %+v, %v", again, err)
		}
		if e.api.count(key) != 1 {
			t.Fatalf("%d tickets", e.api.count(key))
		}
	})

	t.Run("a timeout after idemkv stored the receipt returns the same receipt on retry", func(t *testing.T) {
		key := "conversation_9:approval_19:create_ticket"
		op := createTicket(key, "Outage Z")
		// The runtime's call into idemkv times out after the commit landed.
		lossy, err := client.NewRunner(lostCommitAnswer{e.client}, client.RunConfig{Logger: testlog.New(t), CommitGrace: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		_, err = lossy.Do(timeout(t, 20*time.Second), op, e.create(key))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v", err)
		}
		out, err := e.client.Do(timeout(t, 20*time.Second), op, mustNotRun(t))
		if err != nil || !out.Replayed || out.Receipt.RemoteID != e.api.id(key) {
			t.Fatalf("retry %+v, %v", out, err)
		}
		if e.api.count(key) != 1 {
			t.Fatalf("%d tickets", e.api.count(key))
		}
	})

	t.Run("queue redelivery replays instead of executing", func(t *testing.T) {
		key := "conversation_9:approval_20:create_ticket"
		var wg sync.WaitGroup
		start := make(chan struct{})
		outs := make([]*client.Outcome, 2)
		errs := make([]error, 2)
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				op := createTicket(key, "Outage W")
				op.Actor = fmt.Sprintf("worker-%d", w)
				<-start
				outs[w], errs[w] = e.client.Do(timeout(t, 20*time.Second), op, func(context.Context) (*client.Result, error) {
					time.Sleep(300 * time.Millisecond) // the API is slow: both workers overlap
					return e.api.create(key), nil
				})
			}()
		}
		close(start)
		wg.Wait()
		for w, err := range errs {
			if err != nil {
				t.Fatalf("worker %d: %v", w, err)
			}
		}
		replays := 0
		for _, o := range outs {
			if o.Replayed {
				replays++
			}
		}
		if replays != 1 || outs[0].Receipt.RemoteID != outs[1].Receipt.RemoteID || e.api.count(key) != 1 {
			t.Fatalf("outcomes %+v %+v, %d tickets", outs[0], outs[1], e.api.count(key))
		}
	})

	t.Run("a reused key with different arguments is a conflict and nothing executes", func(t *testing.T) {
		key := "conversation_9:approval_21:create_ticket"
		first, err := e.client.Do(timeout(t, 20*time.Second), createTicket(key, "Outage V"), e.create(key))
		if err != nil {
			t.Fatal(err)
		}
		other := createTicket(key, "Outage V, but sev2")
		_, err = e.client.Do(timeout(t, 20*time.Second), other, mustNotRun(t))
		var ce *client.ConflictError
		if !errors.As(err, &ce) {
			t.Fatalf("got %v", err)
		}
		otherFP, _ := fingerprint.OfValue(other.Effect, "trace_id")
		c := ce.Conflict
		if c.Status != "conflict" || c.Reason != idemkv.ReasonDifferentEffect || c.ExistingFingerprint != first.Fingerprint ||
			c.ReceivedFingerprint != otherFP || c.ExistingRemoteID != first.Receipt.RemoteID {
			t.Fatalf("conflict %+v", c)
		}
		if e.api.count(key) != 1 {
			t.Fatalf("%d tickets", e.api.count(key))
		}
	})

	t.Run("the trace holds key, fingerprint, decision and receipt id", func(t *testing.T) {
		key := "conversation_9:approval_22:create_ticket"
		ctx, parent := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.spans)).Tracer("agent").Start(timeout(t, 20*time.Second), "agent turn")
		first, err := e.client.Do(ctx, createTicket(key, "Outage U"), e.create(key))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.client.Do(ctx, createTicket(key, "Outage U"), mustNotRun(t)); err != nil {
			t.Fatal(err)
		}
		if _, err := e.client.Do(ctx, createTicket(key, "Outage U2"), mustNotRun(t)); err == nil {
			t.Fatal("no conflict")
		}
		parent.End()
		var dos []sdktrace.ReadOnlySpan
		children := map[trace.SpanID][]string{}
		for _, s := range e.spans.Ended() {
			if s.SpanContext().TraceID() != parent.SpanContext().TraceID() {
				continue
			}
			if s.Name() == "execute_tool create_ticket" {
				dos = append(dos, s)
			}
			children[s.Parent().SpanID()] = append(children[s.Parent().SpanID()], s.Name())
		}
		if len(dos) != 3 {
			t.Fatalf("%d Do spans in the trace", len(dos))
		}
		for i, want := range []string{"execute", "replay", "conflict"} {
			a := attrs(dos[i])
			if a[semconv.Decision].AsString() != want || a[semconv.IdempotencyKey].AsString() != key ||
				a[semconv.ToolName].AsString() != "create_ticket" || !a[semconv.ToolSideEffect].AsBool() ||
				a[semconv.Tenant].AsString() != "tenant_42" || a[semconv.Fingerprint].AsString() == "" {
				t.Errorf("Do span %d (%s): %v", i, want, a)
			}
			if want != "conflict" && a[semconv.ReceiptRemoteID].AsString() != first.Receipt.RemoteID {
				t.Errorf("Do span %d (%s) receipt id %q", i, want, a[semconv.ReceiptRemoteID].AsString())
			}
			if want == "conflict" && a[semconv.ConflictExistingRemoteID].AsString() != first.Receipt.RemoteID {
				t.Errorf("conflict span does not name the existing receipt: %v", a)
			}
			if dos[i].Parent().SpanID() != parent.SpanContext().SpanID() {
				t.Errorf("Do span %d is not a child of the agent's span", i)
			}
		}
		if a := attrs(dos[0]); a[semconv.Fingerprint].AsString() != first.Fingerprint || a[semconv.Fence].AsInt64() != int64(first.Fence) {
			t.Errorf("execute span %v", a)
		}
		calls := strings.Join(children[dos[0].SpanContext().SpanID()], ",")
		if !strings.Contains(calls, "POST /v1/reserve") || !strings.Contains(calls, "POST /v1/commit") {
			t.Errorf("HTTP spans under the execute span: %s", calls)
		}
	})

	t.Run("a worker killed mid-execution is recovered through the probe", func(t *testing.T) {
		key := "conversation_9:approval_23:create_ticket"
		op := createTicket(key, "Outage T")
		op.LeaseTTL = time.Second
		op.Probe = e.api.probe(key)
		killWorker(t, e, op)
		out, err := e.client.Do(timeout(t, 20*time.Second), op, mustNotRun(t))
		if err != nil || out.Decision != idemkv.DecisionRecover || !out.Probed || out.Attempts != 2 {
			t.Fatalf("%+v, %v", out, err)
		}
		if e.api.count(key) != 1 {
			t.Fatalf("%d tickets", e.api.count(key))
		}
	})

	t.Run("a worker that reserved and vanished is recovered through the probe, which finds nothing", func(t *testing.T) {
		key := "conversation_9:approval_24:create_ticket"
		op := createTicket(key, "Outage S")
		op.Probe = e.api.probe(key)
		fp, _ := fingerprint.OfValue(op.Effect, "trace_id")
		if _, err := e.client.Reserve(timeout(t, 10*time.Second), &idemkv.ReserveRequest{Tenant: op.Tenant, Key: key,
			Tool: op.Tool, Fingerprint: fp, LeaseTTLMs: 1000}); err != nil {
			t.Fatal(err)
		}
		out, err := e.client.Do(timeout(t, 20*time.Second), op, e.create(key))
		if err != nil || out.Decision != idemkv.DecisionRecover || out.Probed {
			t.Fatalf("%+v, %v", out, err)
		}
		if e.api.count(key) != 1 {
			t.Fatalf("%d tickets", e.api.count(key))
		}
	})

	t.Run("without a probe a dead worker leaves the operation in doubt", func(t *testing.T) {
		key := "conversation_9:approval_25:create_ticket"
		op := createTicket(key, "Outage R")
		op.LeaseTTL = time.Second
		killWorker(t, e, op)
		_, err := e.client.Do(timeout(t, 20*time.Second), op, mustNotRun(t))
		var de *client.InDoubtError
		if !errors.As(err, &de) || !errors.Is(err, client.ErrInDoubt) {
			t.Fatalf("got %v", err)
		}
		rec, err := e.client.Get(timeout(t, 10*time.Second), &idemkv.GetRequest{Tenant: op.Tenant, Key: key})
		if err != nil || rec.Status != idemkv.StatusPending || rec.Fence != de.Record.Fence || rec.Attempts != 2 {
			t.Fatalf("record %+v, %v", rec, err)
		}
		// A person looks the ticket up and commits it with the fence from the error,
		// as `idemkv commit` does; from then on every attempt replays.
		id := e.api.id(key)
		if _, err := e.client.Commit(timeout(t, 10*time.Second), &idemkv.CommitRequest{Tenant: op.Tenant, Key: key,
			Fingerprint: rec.Fingerprint, Fence: rec.Fence, RemoteSystem: "linear", RemoteID: id}); err != nil {
			t.Fatal(err)
		}
		out, err := e.client.Do(timeout(t, 20*time.Second), op, mustNotRun(t))
		if err != nil || !out.Replayed || out.Receipt.RemoteID != id || e.api.count(key) != 1 {
			t.Fatalf("%+v, %v", out, err)
		}
	})

	t.Run("a permanent failure is stored and replayed", func(t *testing.T) {
		key := "conversation_9:approval_26:create_ticket"
		op := createTicket(key, "Outage Q")
		_, err := e.client.Do(timeout(t, 20*time.Second), op, func(context.Context) (*client.Result, error) {
			return nil, &client.PermanentError{Code: "customer_not_found", Err: errors.New("no customer cus_9")}
		})
		var fe *client.FailedError
		if !errors.As(err, &fe) || fe.Receipt.Error.Code != "customer_not_found" {
			t.Fatalf("got %v", err)
		}
		_, err = e.client.Do(timeout(t, 20*time.Second), op, mustNotRun(t))
		if !errors.As(err, &fe) || !fe.Replayed || fe.Receipt.Error.Message != "no customer cus_9" {
			t.Fatalf("replay: %v", err)
		}
	})

	t.Run("Do runs against an in-process node", func(t *testing.T) {
		leader := e.cluster.Node(e.cluster.LeaderIndex(t))
		r, err := client.NewRunner(leader, client.RunConfig{Logger: testlog.New(t)})
		if err != nil {
			t.Fatal(err)
		}
		key := "conversation_9:approval_27:create_ticket"
		first, err := r.Do(timeout(t, 20*time.Second), createTicket(key, "Outage P"), e.create(key))
		if err != nil || first.Decision != idemkv.DecisionExecute {
			t.Fatalf("%+v, %v", first, err)
		}
		// The same record, seen over HTTP, replays.
		again, err := e.client.Do(timeout(t, 20*time.Second), createTicket(key, "Outage P"), mustNotRun(t))
		if err != nil || !again.Replayed || again.Receipt.RemoteID != first.Receipt.RemoteID {
			t.Fatalf("%+v, %v", again, err)
		}
		if _, err := r.Do(timeout(t, 20*time.Second), createTicket(key, "Outage P2"), mustNotRun(t)); !errors.Is(err, client.ErrConflict) {
			t.Fatalf("in-process conflict: %v", err)
		}
	})

	t.Run("the server fingerprints effects like the test vectors", func(t *testing.T) {
		data, err := os.ReadFile("../testdata/fingerprint/vectors.json")
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Vectors []struct {
				Name, Input, InputHex, Fingerprint string
				Drop                               []string
				Invalid                            bool
			}
		}
		if err := json.Unmarshal(data, &doc); err != nil {
			t.Fatal(err)
		}
		checked, rejected := 0, 0
		for i, v := range doc.Vectors {
			// Only JSON can travel inside a request body; drop paths are client-side.
			if v.InputHex != "" || len(v.Drop) > 0 || !json.Valid([]byte(v.Input)) {
				continue
			}
			req := &idemkv.ReserveRequest{Tenant: "vectors", Key: fmt.Sprintf("vector-%d", i), Tool: "fingerprint",
				Effect: json.RawMessage(v.Input)}
			res, err := e.client.Reserve(timeout(t, 10*time.Second), req)
			if v.Invalid {
				var ie *idemkv.Error
				if !errors.As(err, &ie) || ie.Code != idemkv.CodeInvalidArgument || ie.Field != "effect" {
					t.Errorf("%s: the server accepted or misreported an invalid effect: %v", v.Name, err)
				}
				rejected++
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", v.Name, err)
			}
			if res.Record.Fingerprint != v.Fingerprint {
				t.Errorf("%s: server fingerprint %s, vector %s", v.Name, res.Record.Fingerprint, v.Fingerprint)
			}
			checked++
		}
		if checked < 40 || rejected < 5 {
			t.Fatalf("checked %d vectors and %d rejections only", checked, rejected)
		}
	})
}

// killWorker runs a Do that creates the ticket and is then killed before it can
// commit: its context ends, its heartbeats stop, nothing is committed or released.
func killWorker(t *testing.T, e *env, op client.Op) {
	t.Helper()
	ctx, kill := context.WithCancel(context.Background())
	defer kill()
	created := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := e.client.Do(ctx, op, func(ctx context.Context) (*client.Result, error) {
			e.api.create(op.Key)
			close(created)
			<-ctx.Done() // blocked downstream when the process dies
			return nil, ctx.Err()
		})
		done <- err
	}()
	<-created
	kill()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("killed worker: %v", err)
	}
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// lostCommitAnswer is a Store whose commits land but whose answers never arrive, as
// when the runtime's own deadline hits right after idemkv stored the receipt.
type lostCommitAnswer struct{ *client.Client }

func (s lostCommitAnswer) Commit(ctx context.Context, req *idemkv.CommitRequest) (*idemkv.Receipt, error) {
	if _, err := s.Client.Commit(ctx, req); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("waiting for the commit answer: %w", context.DeadlineExceeded)
}

// TestLeaderKilledDuringDo stops the leader while the tool runs, with a second worker
// redelivered the same approval meanwhile: Do still ends with exactly one ticket.
func TestLeaderKilledDuringDo(t *testing.T) {
	e := startEnv(t, 3)
	key := "conversation_9:approval_30:create_ticket"
	op := createTicket(key, "Outage during failover")
	op.LeaseTTL = 5 * time.Second
	running, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fn := func(context.Context) (*client.Result, error) {
		once.Do(func() { close(running) })
		<-proceed
		return e.api.create(key), nil
	}
	type result struct {
		out *client.Outcome
		err error
	}
	first := make(chan result, 1)
	go func() {
		out, err := e.client.Do(timeout(t, 60*time.Second), op, fn)
		first <- result{out, err}
	}()
	<-running
	old := e.cluster.LeaderIndex(t)
	e.cluster.Stop(old)

	second := make(chan result, 1)
	go func() {
		out, err := e.client.Do(timeout(t, 60*time.Second), op, fn)
		second <- result{out, err}
	}()
	// The tool finishes while the survivors are still electing a leader: the commit
	// has to find the new one.
	close(proceed)
	r1, r2 := <-first, <-second
	if now := e.cluster.LeaderIndex(t); now == old {
		t.Fatal("the stopped node is still the leader")
	}
	if r1.err != nil || r2.err != nil {
		t.Fatalf("first: %v, second: %v", r1.err, r2.err)
	}
	if r1.out.Replayed || !r2.out.Replayed || r1.out.Receipt.RemoteID != r2.out.Receipt.RemoteID {
		t.Fatalf("outcomes %+v %+v", r1.out, r2.out)
	}
	if e.api.count(key) != 1 {
		t.Fatalf("%d tickets for one approval", e.api.count(key))
	}
	rec, err := e.client.Get(timeout(t, 10*time.Second), &idemkv.GetRequest{Tenant: op.Tenant, Key: key})
	if err != nil || rec.Status != idemkv.StatusCommitted || rec.Receipt.RemoteID != r1.out.Receipt.RemoteID {
		t.Fatalf("record %+v, %v", rec, err)
	}
}
