package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/telemetry/semconv"
)

// tickets is a downstream API that counts what it really did.
type tickets struct {
	mu      sync.Mutex
	byExtID map[string]string
	created atomic.Int32
}

func newTickets() *tickets { return &tickets{byExtID: map[string]string{}} }

func (a *tickets) create(extID string) *Result {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.created.Add(1)
	id := fmt.Sprintf("LIN-%d", 1000+n)
	a.byExtID[extID] = id
	return &Result{RemoteSystem: "linear", RemoteID: id, RemoteURL: "https://linear.example/issue/" + id,
		Result: map[string]any{"id": id}}
}

func (a *tickets) probe(extID string) ProbeFunc {
	return func(ctx context.Context) (*Result, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		if id, ok := a.byExtID[extID]; ok {
			return &Result{RemoteSystem: "linear", RemoteID: id}, nil
		}
		return nil, nil
	}
}

type testEnv struct {
	store   *memStore
	runner  *Runner
	spans   *tracetest.SpanRecorder
	tickets *tickets
}

func newEnv(t *testing.T) *testEnv {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	store := newMemStore()
	cfg := RunConfig{
		Logger:         testlog.New(t),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)),
		BackoffMin:     time.Millisecond,
		BackoffMax:     10 * time.Millisecond,
		CommitGrace:    5 * time.Second,
	}
	runner, err := NewRunner(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &testEnv{store: store, runner: runner, spans: rec, tickets: newTickets()}
}

func ticketOp(key, title string) Op {
	return Op{
		Tenant: "tenant_42",
		Key:    key,
		Tool:   "create_ticket",
		Actor:  "worker-1",
		Class:  NonIdempotentMutation,
		Effect: map[string]any{"project": "OPS", "title": title, "severity": "sev1", "trace_id": time.Now().String()},
		Drop:   []string{"trace_id"},
	}
}

func (e *testEnv) createFn(key string) Func {
	return func(ctx context.Context) (*Result, error) { return e.tickets.create(key), nil }
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (e *testEnv) lastDoSpan(t *testing.T) map[attribute.Key]attribute.Value {
	t.Helper()
	spans := e.spans.Ended()
	for i := len(spans) - 1; i >= 0; i-- {
		if spans[i].Name() == "execute_tool create_ticket" {
			m := map[attribute.Key]attribute.Value{}
			for _, kv := range spans[i].Attributes() {
				m[kv.Key] = kv.Value
			}
			return m
		}
	}
	t.Fatal("no Do span recorded")
	return nil
}

func TestDoExecutesOnceThenReplays(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	op := ticketOp("conv_9:approval_17:create_ticket", "Outage X")

	first, err := e.runner.Do(ctx, op, e.createFn(op.Key))
	if err != nil {
		t.Fatal(err)
	}
	if first.Decision != idemkv.DecisionExecute || first.Replayed || first.Receipt.RemoteID != "LIN-1001" {
		t.Fatalf("first outcome %+v", first)
	}
	wantFP, _ := fingerprint.OfValue(op.Effect, "trace_id")
	if first.Fingerprint != wantFP || first.Receipt.Fingerprint != wantFP {
		t.Fatalf("fingerprint %s / %s, want %s", first.Fingerprint, first.Receipt.Fingerprint, wantFP)
	}
	rec := e.store.record(op.Tenant, op.Key)
	if rec.Status != idemkv.StatusCommitted || rec.Receipt.RemoteID != "LIN-1001" || string(rec.Receipt.Result) != `{"id":"LIN-1001"}` {
		t.Fatalf("stored %+v", rec)
	}
	a := e.lastDoSpan(t)
	if a[semconv.Decision].AsString() != "execute" || a[semconv.ReceiptRemoteID].AsString() != "LIN-1001" ||
		a[semconv.Fingerprint].AsString() != wantFP || a[semconv.IdempotencyKey].AsString() != op.Key ||
		!a[semconv.ToolSideEffect].AsBool() || a[semconv.Fence].AsInt64() != int64(first.Fence) {
		t.Fatalf("span attributes %v", a)
	}

	// A retry by another worker, with a new trace id in the effect: same operation.
	retry := ticketOp(op.Key, "Outage X")
	retry.Actor = "worker-2"
	second, err := e.runner.Do(ctx, retry, func(ctx context.Context) (*Result, error) {
		t.Error("a replay executed the tool")
		return nil, errors.New("must not run")
	})
	if err != nil {
		t.Fatal(err)
	}
	if second.Decision != idemkv.DecisionReplay || !second.Replayed || second.Receipt.RemoteID != "LIN-1001" ||
		second.Receipt.CommittedAt != first.Receipt.CommittedAt {
		t.Fatalf("replay %+v", second)
	}
	if a := e.lastDoSpan(t); a[semconv.Decision].AsString() != "replay" || a[semconv.ReceiptRemoteID].AsString() != "LIN-1001" {
		t.Fatalf("replay span attributes %v", a)
	}
	if n := e.tickets.created.Load(); n != 1 {
		t.Fatalf("%d tickets created", n)
	}
}

func TestDoConflictExecutesNothing(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	op := ticketOp("k-conflict", "Outage X")
	first, err := e.runner.Do(ctx, op, e.createFn(op.Key))
	if err != nil {
		t.Fatal(err)
	}
	other := ticketOp(op.Key, "Outage Y")
	_, err = e.runner.Do(ctx, other, func(ctx context.Context) (*Result, error) {
		t.Error("a conflict executed the tool")
		return nil, nil
	})
	var ce *ConflictError
	if !errors.As(err, &ce) || !errors.Is(err, ErrConflict) {
		t.Fatalf("got %v, want a *ConflictError", err)
	}
	otherFP, _ := fingerprint.OfValue(other.Effect, "trace_id")
	if ce.Conflict.Reason != idemkv.ReasonDifferentEffect || ce.Conflict.ExistingFingerprint != first.Fingerprint ||
		ce.Conflict.ReceivedFingerprint != otherFP || ce.Conflict.ExistingRemoteID != first.Receipt.RemoteID {
		t.Fatalf("conflict %+v", ce.Conflict)
	}
	a := e.lastDoSpan(t)
	if a[semconv.Decision].AsString() != "conflict" || a[semconv.ConflictExistingRemoteID].AsString() != first.Receipt.RemoteID {
		t.Fatalf("span attributes %v", a)
	}

	tool := ticketOp(op.Key, "Outage X")
	tool.Tool = "close_ticket"
	if _, err := e.runner.Do(ctx, tool, e.createFn(op.Key)); !errors.As(err, &ce) || ce.Conflict.Reason != idemkv.ReasonDifferentTool {
		t.Fatalf("another tool on the key: %v", err)
	}
	if n := e.tickets.created.Load(); n != 1 {
		t.Fatalf("%d tickets created", n)
	}
}

// A reserve whose answer is lost is retried with the same attempt id, so the retry is
// the same attempt and gets the same fence instead of in_progress.
func TestDoReserveAnswerLost(t *testing.T) {
	e := newEnv(t)
	e.store.faults(nil, func(op string, n int) error {
		if op == "reserve" && n == 1 {
			return idemkv.Errorf(idemkv.ErrUnavailable, "answer lost")
		}
		return nil
	})
	op := ticketOp("k-reserve-lost", "Outage X")
	out, err := e.runner.Do(ctxT(t), op, e.createFn(op.Key))
	if err != nil {
		t.Fatal(err)
	}
	if e.store.count("reserve") != 2 || out.Decision != idemkv.DecisionExecute || out.Attempts != 1 {
		t.Fatalf("reserves %d, outcome %+v", e.store.count("reserve"), out)
	}
	if e.tickets.created.Load() != 1 {
		t.Fatal("the tool did not run exactly once")
	}
}

// A commit whose answer is lost is retried; the retry gets the stored receipt back.
func TestDoCommitAnswerLost(t *testing.T) {
	e := newEnv(t)
	e.store.faults(nil, func(op string, n int) error {
		if op == "commit" && n <= 2 {
			return idemkv.Errorf(idemkv.ErrUnavailable, "answer lost")
		}
		return nil
	})
	op := ticketOp("k-commit-lost", "Outage X")
	out, err := e.runner.Do(ctxT(t), op, e.createFn(op.Key))
	if err != nil {
		t.Fatal(err)
	}
	if e.store.count("commit") != 3 || out.Receipt.RemoteID != "LIN-1001" || out.Receipt.Status != idemkv.StatusCommitted {
		t.Fatalf("commits %d, outcome %+v", e.store.count("commit"), out)
	}
}

// The caller's context ends while the tool runs, after the effect happened: the
// receipt is still stored, so the retry replays it.
func TestDoCommitsAfterCallerGaveUp(t *testing.T) {
	e := newEnv(t)
	op := ticketOp("k-gave-up", "Outage X")
	ctx, cancel := context.WithCancel(context.Background())
	out, err := e.runner.Do(ctx, op, func(context.Context) (*Result, error) {
		res := e.tickets.create(op.Key)
		cancel()
		return res, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if rec := e.store.record(op.Tenant, op.Key); rec.Status != idemkv.StatusCommitted || rec.Receipt.RemoteID != out.Receipt.RemoteID {
		t.Fatalf("record %+v", rec)
	}
}

func TestDoPermanentFailureIsReplayed(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	op := ticketOp("k-permanent", "Outage X")
	downstream := errors.New("customer cus_9 does not exist\n(HTTP 422)")
	runs := 0
	fn := func(context.Context) (*Result, error) {
		runs++
		return nil, &PermanentError{Code: "invalid_customer", Details: json.RawMessage(`{"customer_id":"cus_9"}`), Err: downstream}
	}
	_, err := e.runner.Do(ctx, op, fn)
	var fe *FailedError
	if !errors.As(err, &fe) || !errors.Is(err, ErrFailed) || !errors.Is(err, downstream) || fe.Replayed {
		t.Fatalf("first: %v", err)
	}
	first := fe.Receipt
	if first.Status != idemkv.StatusFailed || first.Error.Code != "invalid_customer" ||
		first.Error.Message != "customer cus_9 does not exist (HTTP 422)" || string(first.Error.Details) != `{"customer_id":"cus_9"}` {
		t.Fatalf("stored failure %+v %+v", first, first.Error)
	}
	for i := 0; i < 2; i++ {
		_, err = e.runner.Do(ctx, op, fn)
		if !errors.As(err, &fe) || !fe.Replayed || fe.Receipt.Error.Code != first.Error.Code || fe.Receipt.Error.Message != first.Error.Message {
			t.Fatalf("replay %d: %v", i, err)
		}
		if err.Error() != (&FailedError{Key: op.Key, Receipt: first}).Error() {
			t.Fatalf("replayed error %q differs from the first", err)
		}
	}
	if runs != 1 {
		t.Fatalf("the tool ran %d times", runs)
	}
}

func TestDoNotExecutedReleasesTheKey(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	op := ticketOp("k-not-executed", "Outage X")
	refused := errors.New("rate limited before the request was sent")
	_, err := e.runner.Do(ctx, op, func(context.Context) (*Result, error) { return nil, NotExecuted(refused) })
	if !errors.Is(err, refused) {
		t.Fatalf("got %v", err)
	}
	if rec := e.store.record(op.Tenant, op.Key); rec != nil {
		t.Fatalf("record still there: %+v", rec)
	}
	out, err := e.runner.Do(ctx, op, e.createFn(op.Key))
	if err != nil || out.Decision != idemkv.DecisionExecute || out.Attempts != 1 {
		t.Fatalf("after release: %+v, %v", out, err)
	}
}

// leavePending runs a Do whose tool fails with an unclassified error after creating
// the ticket, as a timeout after the downstream commit does, then lets the lease
// run out.
func (e *testEnv) leavePending(t *testing.T, op Op) {
	t.Helper()
	timeout := errors.New("POST /tickets: context deadline exceeded")
	_, err := e.runner.Do(ctxT(t), op, func(context.Context) (*Result, error) {
		e.tickets.create(op.Key)
		return nil, timeout
	})
	if !errors.Is(err, timeout) {
		t.Fatalf("got %v", err)
	}
	if rec := e.store.record(op.Tenant, op.Key); rec == nil || rec.Status != idemkv.StatusPending {
		t.Fatalf("record %+v, want pending", rec)
	}
	e.store.advance(op.LeaseTTL + time.Second)
}

func TestDoRecoverByClass(t *testing.T) {
	t.Run("idempotent re-executes", func(t *testing.T) {
		e := newEnv(t)
		op := ticketOp("k-rec-idem", "Outage X")
		op.Class, op.LeaseTTL = IdempotentMutation, 5*time.Second
		e.leavePending(t, op)
		out, err := e.runner.Do(ctxT(t), op, e.createFn(op.Key))
		if err != nil || out.Decision != idemkv.DecisionRecover || out.Attempts != 2 || out.Probed {
			t.Fatalf("%+v, %v", out, err)
		}
		if e.tickets.created.Load() != 2 {
			t.Fatal("an idempotent tool was not run again")
		}
	})
	// "Not executed" from a re-execution speaks for that call only: the attempt it
	// took over may have run the tool, so the key must not be released (a release
	// says the effect certainly did not happen, and frees the key for other
	// arguments). Found by jepsen-lite as orphan-effect.
	t.Run("idempotent re-execution not executed keeps the key", func(t *testing.T) {
		e := newEnv(t)
		op := ticketOp("k-rec-idem-ne", "Outage X")
		op.Class, op.LeaseTTL = IdempotentMutation, 5*time.Second
		e.leavePending(t, op)
		refused := errors.New("rate limited before the request was sent")
		_, err := e.runner.Do(ctxT(t), op, func(context.Context) (*Result, error) { return nil, NotExecuted(refused) })
		if KindOf(err) != KindOutcomeUnknown {
			t.Fatalf("got %v (kind %q), want %s", err, KindOf(err), KindOutcomeUnknown)
		}
		rec := e.store.record(op.Tenant, op.Key)
		if rec == nil || rec.Status != idemkv.StatusPending || rec.Attempts != 2 {
			t.Fatalf("record %+v, want pending after the recover", rec)
		}
	})
	t.Run("probe finds the effect", func(t *testing.T) {
		e := newEnv(t)
		op := ticketOp("k-rec-probe", "Outage X")
		op.LeaseTTL = 5 * time.Second
		op.Probe = e.tickets.probe(op.Key)
		e.leavePending(t, op)
		out, err := e.runner.Do(ctxT(t), op, func(context.Context) (*Result, error) {
			t.Error("executed although the probe found the ticket")
			return nil, nil
		})
		if err != nil || out.Decision != idemkv.DecisionRecover || !out.Probed || out.Receipt.RemoteID != "LIN-1001" {
			t.Fatalf("%+v, %v", out, err)
		}
		if e.tickets.created.Load() != 1 {
			t.Fatal("ticket created twice")
		}
	})
	t.Run("probe finds nothing", func(t *testing.T) {
		e := newEnv(t)
		op := ticketOp("k-rec-probe-none", "Outage X")
		op.LeaseTTL = 5 * time.Second
		op.Probe = func(context.Context) (*Result, error) { return nil, nil }
		_, err := e.store.Reserve(ctxT(t), &idemkv.ReserveRequest{Tenant: op.Tenant, Key: op.Key, Tool: op.Tool,
			Fingerprint: mustFP(t, op), AttemptID: "dead-worker", LeaseTTLMs: 5000})
		if err != nil {
			t.Fatal(err)
		}
		e.store.advance(6 * time.Second)
		out, err := e.runner.Do(ctxT(t), op, e.createFn(op.Key))
		if err != nil || out.Decision != idemkv.DecisionRecover || out.Probed || out.Receipt.RemoteID != "LIN-1001" {
			t.Fatalf("%+v, %v", out, err)
		}
	})
	t.Run("no probe is in doubt", func(t *testing.T) {
		e := newEnv(t)
		op := ticketOp("k-rec-doubt", "Outage X")
		op.LeaseTTL = 5 * time.Second
		e.leavePending(t, op)
		_, err := e.runner.Do(ctxT(t), op, func(context.Context) (*Result, error) {
			t.Error("executed an in-doubt operation")
			return nil, nil
		})
		var de *InDoubtError
		if !errors.As(err, &de) || !errors.Is(err, ErrInDoubt) {
			t.Fatalf("got %v", err)
		}
		rec := e.store.record(op.Tenant, op.Key)
		if rec.Status != idemkv.StatusPending || de.Record.Fence != rec.Fence || rec.Attempts != 2 {
			t.Fatalf("record %+v, error record %+v", rec, de.Record)
		}
		if a := e.lastDoSpan(t); a[semconv.Decision].AsString() != "recover" {
			t.Fatalf("span attributes %v", a)
		}
	})
	t.Run("retried reserve of a recovery is still a recovery", func(t *testing.T) {
		e := newEnv(t)
		op := ticketOp("k-rec-lost-answer", "Outage X")
		op.LeaseTTL = 5 * time.Second
		e.leavePending(t, op)
		e.store.faults(nil, func(op string, n int) error {
			if op == "reserve" && n == 2 { // the first reserve of this Do: its answer, recover, is lost
				return idemkv.Errorf(idemkv.ErrUnavailable, "answer lost")
			}
			return nil
		})
		_, err := e.runner.Do(ctxT(t), op, e.createFn(op.Key))
		if !errors.Is(err, ErrInDoubt) {
			t.Fatalf("got %v: the retried reserve answered execute and Do ran the tool again", err)
		}
		if e.tickets.created.Load() != 1 {
			t.Fatal("ticket created twice")
		}
	})
}

func mustFP(t *testing.T, op Op) string {
	t.Helper()
	fp, err := op.fingerprint()
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

// Queue redelivery: two workers run the same approval at once. One executes; the
// other waits for it and replays.
func TestDoConcurrentWorkersExecuteOnce(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	op := ticketOp("k-redelivery", "Outage X")
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fn := func(context.Context) (*Result, error) {
		once.Do(func() { close(started) })
		<-release
		return e.tickets.create(op.Key), nil
	}
	outs := make([]*Outcome, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		outs[0], errs[0] = e.runner.Do(ctx, op, fn)
	}()
	<-started
	wg.Add(1)
	go func() {
		defer wg.Done()
		outs[1], errs[1] = e.runner.Do(ctx, op, fn)
	}()
	// The second worker must be waiting on the long-poll before the first finishes.
	waitFor(t, func() bool { return e.store.count("get") >= 1 })
	close(release)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("worker %d: %v", i, err)
		}
	}
	if outs[0].Replayed || !outs[1].Replayed || outs[0].Receipt.RemoteID != outs[1].Receipt.RemoteID {
		t.Fatalf("outcomes %+v %+v", outs[0], outs[1])
	}
	if e.tickets.created.Load() != 1 {
		t.Fatal("ticket created twice")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An attempt that holds the key and dies: the waiting worker takes over once the
// lease runs out.
func TestDoWaitsOutADeadAttempt(t *testing.T) {
	e := newEnv(t)
	op := ticketOp("k-dead-holder", "Outage X")
	op.LeaseTTL = 5 * time.Second
	op.Probe = e.tickets.probe(op.Key)
	if _, err := e.store.Reserve(ctxT(t), &idemkv.ReserveRequest{Tenant: op.Tenant, Key: op.Key, Tool: op.Tool,
		Fingerprint: mustFP(t, op), AttemptID: "dead-worker", LeaseTTLMs: 5000}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var out *Outcome
	var err error
	go func() {
		defer close(done)
		out, err = e.runner.Do(ctxT(t), op, e.createFn(op.Key))
	}()
	waitFor(t, func() bool { return e.store.count("get") >= 1 })
	e.store.advance(6 * time.Second)
	<-done
	if err != nil || out.Decision != idemkv.DecisionRecover || out.Receipt.RemoteID != "LIN-1001" {
		t.Fatalf("%+v, %v", out, err)
	}
}

func TestDoWaitBoundedByContext(t *testing.T) {
	e := newEnv(t)
	op := ticketOp("k-wait-ctx", "Outage X")
	if _, err := e.store.Reserve(ctxT(t), &idemkv.ReserveRequest{Tenant: op.Tenant, Key: op.Key, Tool: op.Tool,
		Fingerprint: mustFP(t, op), AttemptID: "other"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := e.runner.Do(ctx, op, e.createFn(op.Key))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("the wait ignored the context")
	}
	if a := e.lastDoSpan(t); a[semconv.Decision].AsString() != "in_progress" {
		t.Fatalf("span attributes %v", a)
	}
}

// The heartbeat keeps the lease alive while a slow tool runs, so another worker sees
// in_progress, not recover.
func TestDoHeartbeatKeepsLease(t *testing.T) {
	e := newEnv(t)
	e.store.real = true
	ctx := ctxT(t)
	op := ticketOp("k-heartbeat", "Outage X")
	op.LeaseTTL = time.Second
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := e.runner.Do(ctx, op, func(context.Context) (*Result, error) {
			<-release
			return e.tickets.create(op.Key), nil
		})
		done <- err
	}()
	waitFor(t, func() bool { return e.store.count("heartbeat") >= 4 }) // well past the 1s lease
	res, err := e.store.Reserve(ctx, &idemkv.ReserveRequest{Tenant: op.Tenant, Key: op.Key, Tool: op.Tool,
		Fingerprint: mustFP(t, op), AttemptID: "second-worker"})
	if err != nil || res.Decision != idemkv.DecisionInProgress {
		t.Fatalf("second worker got %+v, %v", res, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Losing the lease cancels the tool's context, and Do reports fenced.
func TestDoLeaseLostStopsTheTool(t *testing.T) {
	e := newEnv(t)
	op := ticketOp("k-lease-lost", "Outage X")
	op.LeaseTTL = time.Second
	op.Class = IdempotentMutation
	running := make(chan struct{})
	var cause error
	done := make(chan error, 1)
	go func() {
		_, err := e.runner.Do(ctxT(t), op, func(ctx context.Context) (*Result, error) {
			close(running)
			<-ctx.Done()
			cause = context.Cause(ctx)
			return nil, ctx.Err()
		})
		done <- err
	}()
	<-running
	// Another attempt recovers the key behind the first one's back.
	e.store.advance(time.Hour)
	res, err := e.store.Reserve(ctxT(t), &idemkv.ReserveRequest{Tenant: op.Tenant, Key: op.Key, Tool: op.Tool,
		Fingerprint: mustFP(t, op), AttemptID: "usurper"})
	if err != nil || res.Decision != idemkv.DecisionRecover {
		t.Fatalf("usurper got %+v, %v", res, err)
	}
	err = <-done
	if !errors.Is(err, idemkv.ErrFenced) || !errors.Is(cause, idemkv.ErrFenced) {
		t.Fatalf("Do: %v; the tool's context cause: %v", err, cause)
	}
	if e.store.count("commit") != 0 {
		t.Fatal("committed after losing the lease")
	}
}

func TestDoRetriesWhileUnavailable(t *testing.T) {
	e := newEnv(t)
	e.store.faults(func(op string, n int) error {
		if n <= 3 {
			return idemkv.Errorf(idemkv.ErrUnavailable, "no leader")
		}
		return nil
	}, nil)
	op := ticketOp("k-unavailable", "Outage X")
	out, err := e.runner.Do(ctxT(t), op, e.createFn(op.Key))
	if err != nil || out.Decision != idemkv.DecisionExecute {
		t.Fatalf("%+v, %v", out, err)
	}
	if e.store.count("reserve") != 4 || e.store.count("commit") != 4 {
		t.Fatalf("reserves %d, commits %d", e.store.count("reserve"), e.store.count("commit"))
	}
}

func TestDoReadOnlyTouchesNoStore(t *testing.T) {
	e := newEnv(t)
	op := Op{Tenant: "t", Key: "k", Tool: "get_ticket", Class: ReadOnly}
	out, err := e.runner.Do(ctxT(t), op, func(context.Context) (*Result, error) {
		return &Result{RemoteSystem: "linear", RemoteID: "LIN-1"}, nil
	})
	if err != nil || out.Receipt.RemoteID != "LIN-1" {
		t.Fatalf("%+v, %v", out, err)
	}
	if e.store.count("reserve") != 0 {
		t.Fatal("a read-only tool reserved a key")
	}
	spans := e.spans.Ended()
	for _, kv := range spans[len(spans)-1].Attributes() {
		if kv.Key == semconv.ToolSideEffect && kv.Value.AsBool() {
			t.Fatal("read-only span says side effect")
		}
	}
}

func TestDoRejectsBadOps(t *testing.T) {
	e := newEnv(t)
	fn := e.createFn("x")
	cases := map[string]Op{
		"no effect":          {Tenant: "t", Key: "k", Tool: "x"},
		"effect and fp":      {Tenant: "t", Key: "k", Tool: "x", Effect: 1, Fingerprint: "sha256:00"},
		"no tool":            {Tenant: "t", Key: "k", Fingerprint: "sha256:00"},
		"bad tenant":         {Tenant: "t/1", Key: "k", Tool: "x", Fingerprint: "sha256:00"},
		"unknown class":      {Tenant: "t", Key: "k", Tool: "x", Class: "maybe", Fingerprint: "sha256:00"},
		"invalid JSON":       {Tenant: "t", Key: "k", Tool: "x", Effect: json.RawMessage(`{"a":1,"a":2}`)},
		"short lease":        {Tenant: "t", Key: "k", Tool: "x", Fingerprint: "sha256:00", LeaseTTL: time.Millisecond},
		"unmarshalable blob": {Tenant: "t", Key: "k", Tool: "x", Effect: func() {}},
		// encoding/json would send each of these with U+FFFD for the invalid byte, so
		// that two different ops reached the server as one.
		"effect not UTF-8":     {Tenant: "t", Key: "k", Tool: "x", Effect: map[string]string{"title": "a\xff"}},
		"effect key not UTF-8": {Tenant: "t", Key: "k", Tool: "x", Effect: map[string]int{"a\xfe": 1}},
		"tool not UTF-8":       {Tenant: "t", Key: "k", Tool: "x\xff", Fingerprint: "sha256:00"},
	}
	for name, op := range cases {
		if _, err := e.runner.Do(ctxT(t), op, fn); !errors.Is(err, idemkv.ErrInvalidArgument) {
			t.Errorf("%s: got %v, want invalid argument", name, err)
		}
	}
	if e.store.count("reserve") != 0 {
		t.Fatal("an invalid op reached the store")
	}
}

// The effect given as JSON text and as a value fingerprint alike.
func TestDoEffectForms(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	asValue := ticketOp("k-forms", "Outage X")
	asValue.Effect = struct {
		Title   string `json:"title"`
		Project string `json:"project"`
		TraceID string `json:"trace_id"`
	}{"Outage X", "OPS", "abc"}
	first, err := e.runner.Do(ctx, asValue, e.createFn(asValue.Key))
	if err != nil {
		t.Fatal(err)
	}
	asJSON := asValue
	asJSON.Effect = json.RawMessage(` {"project":"OPS", "title":"Outage X", "trace_id":"def"}`)
	asBytes := asValue
	asBytes.Effect = []byte(`{"title":"Outage X","project":"OPS"}`)
	asBytes.Drop = nil
	for _, op := range []Op{asJSON, asBytes} {
		out, err := e.runner.Do(ctx, op, e.createFn(op.Key))
		if err != nil || !out.Replayed || out.Fingerprint != first.Fingerprint {
			t.Fatalf("%+v, %v", out, err)
		}
	}
}
