package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/telemetry/semconv"
)

// Store is what Do needs from idemkv. The HTTP Client and an in-process node both
// satisfy it. Errors must wrap the sentinels of the root package; Do retries the ones
// wrapping idemkv.ErrUnavailable.
type Store interface {
	Reserve(ctx context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error)
	Commit(ctx context.Context, req *idemkv.CommitRequest) (*idemkv.Receipt, error)
	Fail(ctx context.Context, req *idemkv.FailRequest) (*idemkv.Record, error)
	Release(ctx context.Context, req *idemkv.ReleaseRequest) (*idemkv.ReleaseResult, error)
	Heartbeat(ctx context.Context, req *idemkv.HeartbeatRequest) (*idemkv.Record, error)
	Get(ctx context.Context, req *idemkv.GetRequest) (*idemkv.Record, error)
	// Doubt marks a pending record in doubt (the holder of its fence asks); Resolve
	// settles an in-doubt record without a fence.
	Doubt(ctx context.Context, req *idemkv.DoubtRequest) (*idemkv.Record, error)
	Resolve(ctx context.Context, req *idemkv.ResolveRequest) (*idemkv.ResolveResult, error)
}

// Class says what a retry of a tool may do to the world (docs/protocol.md section 4).
type Class string

const (
	// ReadOnly tools run directly, without a reservation.
	ReadOnly Class = idemkv.SideEffectReadOnly
	// IdempotentMutation tools may run twice with the same effect (a PUT by id); a
	// recovered attempt simply runs them again.
	IdempotentMutation Class = idemkv.SideEffectIdempotentMutation
	// NonIdempotentMutation tools must not run twice (create a ticket, send money). A
	// recovered attempt asks the Probe whether the effect happened; without one it
	// reports ErrInDoubt. It is the class of an Op that names none.
	NonIdempotentMutation Class = idemkv.SideEffectNonIdempotentMutation
)

// Result is what a tool or a probe reports: the downstream system's receipt.
type Result struct {
	RemoteSystem string // "linear"
	RemoteID     string // "LIN-1842"
	RemoteURL    string // optional
	// Result is stored as JSON with the receipt and replayed with it (optional).
	Result any
}

// Func runs the tool. Its context is cancelled when the lease is lost to a newer
// attempt, or runs out by the worker's clock because no heartbeat could renew it
// (cause ErrLeaseExpired: another worker may take the key over from then on); the
// tool should then stop as soon as it can, before any step it cannot undo.
//
// Its error decides the record's fate: Permanent(err) stores the failure, which every
// retry gets back; NotExecuted(err) releases the key; any other error leaves the
// record pending, and the attempt after the lease runs out recovers.
type Func func(ctx context.Context) (*Result, error)

// ErrLeaseExpired is the cause of a tool's (or probe's) context cancelled because its
// lease is running out by the worker's own clock without a renewal (heartbeats failed,
// say, with idemkv unreachable): a sixth of the lease before it ends, so that the tool
// hears it before another worker may recover the key and run the tool itself. The
// tool should stop before any step it cannot undo. Do still tries to commit what the
// tool returns: if nobody took the key over, the fence is current and the commit
// lands.
var ErrLeaseExpired = errors.New("idemkv: lease running out without a renewal")

// ProbeFunc looks the effect up downstream (by an external id derived from the key,
// say) after an attempt died with an unknown outcome. It returns the receipt when the
// effect happened, and (nil, nil) when it certainly did not.
type ProbeFunc func(ctx context.Context) (*Result, error)

// Op names one tool call.
type Op struct {
	Tenant string
	// Key names the business operation ("conversation_9:approval_17:create_ticket"):
	// every retry of it, by any worker, carries the same key.
	Key   string
	Tool  string
	Actor string // who runs this attempt; not part of the identity
	Class Class  // default NonIdempotentMutation

	// Effect is the object of fields that define the side effect; Do fingerprints it
	// (RFC 8785 + SHA-256) after removing the Drop paths (see
	// fingerprint.CanonicalizeWithout). []byte and json.RawMessage are taken as JSON
	// text, anything else is marshalled with encoding/json.
	Effect any
	Drop   []string
	// Fingerprint, instead of Effect, is a fingerprint computed elsewhere.
	Fingerprint string

	// TTL is how long the record (and its receipt) is kept; zero: the server's default
	// (24 h). Keep keys until the business process can no longer be retried.
	TTL time.Duration
	// LeaseTTL is how long an attempt owns the key without a heartbeat; Do heartbeats
	// every third of it. Zero: RunConfig.LeaseTTL.
	LeaseTTL time.Duration

	Probe ProbeFunc
	// Approval, when set, is what this tool asks of approvals (see ApprovalRequirement).
	Approval *ApprovalRequirement

	// AttemptID names this attempt to the server. Default: a fresh NewAttemptID()
	// per Do. Pass StoreUnavailableError.AttemptID to retry a Do whose reserve may
	// have landed unanswered: the server then recognises the same attempt (execute,
	// same fence) instead of a stranger waiting out its lease.
	AttemptID string
}

// Outcome is what Do returns when the operation has a committed receipt. For a
// ReadOnly op, Receipt is built from fn's result and stored nowhere.
type Outcome struct {
	// Decision is the reserve decision that led here: execute, recover or replay.
	Decision idemkv.Decision
	// Replayed: the tool did not run; Receipt is the one stored earlier.
	Replayed bool
	// Probed: a recovered attempt found the effect through the probe and committed
	// what it found, without running the tool.
	Probed      bool
	Receipt     *idemkv.Receipt
	Fingerprint string
	Fence       uint64
	// Attempts is how many attempts were granted ownership of the key.
	Attempts uint32
	// Unguarded: idemkv could not be reached within StoreWait and the policy
	// Unguarded let an idempotent tool run without a record. Nothing is stored.
	Unguarded bool
	// ResultOmitted: the stored receipt holds the note of OmittedResultKey instead of
	// the tool's result, which was too large for the server to store. The call that
	// ran the tool has the result from its own Func; a replay has only the receipt.
	ResultOmitted bool
}

// RunConfig configures a Runner (Do). Zero fields take the defaults of
// DefaultRunConfig, stated on each field.
type RunConfig struct {
	// Logger receives Do's debug and warning logs. Default: discard.
	Logger *slog.Logger
	// TracerProvider makes Do's spans. Default: the global provider.
	TracerProvider trace.TracerProvider
	// LeaseTTL is the lease of an Op that names none. Default the server's default
	// (idemkv.DefaultLimits, 30 s); Do heartbeats every third of it.
	LeaseTTL time.Duration
	// CommitGrace bounds how long Do keeps trying to store an outcome after the tool
	// ran, even when the caller's context has ended: an effect that happened must be
	// recorded if at all possible, or the next attempt has to probe for it.
	// Default 30 s.
	CommitGrace time.Duration
	// PollWait bounds one long-poll while another attempt holds the key. Default 30 s;
	// at most idemkv.MaxWait (5 min).
	PollWait time.Duration
	// BackoffMin and BackoffMax bound the jittered backoff between retries of a store
	// call that failed with unavailable. Defaults 20 ms and 2 s.
	BackoffMin time.Duration
	BackoffMax time.Duration
	// StoreWait bounds the total time one Do spends waiting for a store that does
	// not answer (unavailable, outcome_unknown, resource_exhausted, transport errors,
	// and the backoff between them) before the tool runs, whatever the caller's
	// context says; past it, Do applies OnStoreUnavailable. Storing the outcome
	// after the tool ran gets a StoreWait of its own (and CommitGrace once the
	// caller's context has ended), so a Do that reaches no store returns within
	// StoreWait, and one that ran its tool within the tool's time plus twice
	// StoreWait. Default DefaultStoreWait (30 s).
	StoreWait time.Duration
	// OnStoreUnavailable is the policy once StoreWait is spent before the tool ran.
	// Default FailClosed. After the tool ran, a receipt that cannot be stored is
	// always an *OutcomeUnknownError.
	OnStoreUnavailable StorePolicy
}

// DefaultRunConfig returns the defaults of Do.
func DefaultRunConfig() RunConfig {
	return RunConfig{
		LeaseTTL:           idemkv.DefaultLimits().DefaultLeaseTTL,
		CommitGrace:        30 * time.Second,
		PollWait:           30 * time.Second,
		BackoffMin:         20 * time.Millisecond,
		BackoffMax:         2 * time.Second,
		StoreWait:          DefaultStoreWait,
		OnStoreUnavailable: FailClosed,
	}
}

func (c *RunConfig) withDefaults() {
	d := DefaultRunConfig()
	set := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	set(&c.LeaseTTL, d.LeaseTTL)
	set(&c.CommitGrace, d.CommitGrace)
	set(&c.PollWait, d.PollWait)
	set(&c.BackoffMin, d.BackoffMin)
	set(&c.BackoffMax, d.BackoffMax)
	set(&c.StoreWait, d.StoreWait)
	if c.OnStoreUnavailable == "" {
		c.OnStoreUnavailable = d.OnStoreUnavailable
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
}

// Validate reports a configuration that cannot work.
func (c RunConfig) Validate() error {
	c.withDefaults()
	switch {
	case c.LeaseTTL < idemkv.DefaultLimits().MinLeaseTTL:
		return fmt.Errorf("client: LeaseTTL must be at least %s (the server's minimum)", idemkv.DefaultLimits().MinLeaseTTL)
	case c.CommitGrace < 0 || c.PollWait < 0:
		return errors.New("client: CommitGrace and PollWait must not be negative")
	case c.PollWait > idemkv.MaxWait:
		return fmt.Errorf("client: PollWait must not exceed %s", idemkv.MaxWait)
	case c.BackoffMin < 0 || c.BackoffMax < c.BackoffMin:
		return errors.New("client: need 0 <= BackoffMin <= BackoffMax")
	case c.StoreWait < 0:
		return errors.New("client: StoreWait must not be negative")
	case c.OnStoreUnavailable != FailClosed && c.OnStoreUnavailable != Unguarded:
		return fmt.Errorf("client: OnStoreUnavailable must be %q or %q", FailClosed, Unguarded)
	}
	return nil
}

// Runner runs tool calls through a Store. It is safe for concurrent use.
type Runner struct {
	store  Store
	cfg    RunConfig
	tracer trace.Tracer
	log    *slog.Logger
}

// NewRunner returns a Runner over store: the HTTP Client, or an in-process node.
func NewRunner(store Store, cfg RunConfig) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.withDefaults()
	return &Runner{store: store, cfg: cfg, tracer: cfg.TracerProvider.Tracer(ScopeName), log: cfg.Logger}, nil
}

// Log keys.
const (
	logKeyKey      = "key"
	logKeyTool     = "tool"
	logKeyDecision = "decision"
	logKeyFence    = "fence"
	logKeyErr      = "err"
)

// run is the state of one Do.
type run struct {
	*Runner
	op   Op
	fp   string
	span trace.Span
	// waited is the time this Do has spent waiting for a store that did not answer;
	// StoreWait bounds it.
	waited time.Duration
	// leaseFrom is when the store call that last granted or renewed this attempt's
	// lease was started: the lease runs at least LeaseTTL from then, and, without a
	// renewal, may be gone LeaseTTL after it.
	leaseFrom time.Time
}

// Do runs fn at most once for op's key, across retries, workers and crashes (docs/protocol.md
// section 4):
//
//   - replay: the tool does not run; the stored receipt comes back (Replayed), or
//     the stored failure as a *StoredFailureError, the same every time;
//   - conflict: the key names another effect; nothing runs; a *ConflictError;
//   - in progress: another attempt holds the key; Do waits for its outcome (bounded
//     by ctx) and reserves again, taking over if that attempt's lease runs out;
//   - execute: fn runs under a heartbeat that keeps the lease alive; its context is
//     cancelled if the lease is lost; then the receipt is committed, retrying until
//     it is stored or fenced;
//   - recover: an earlier attempt died. An idempotent tool runs again. A
//     non-idempotent one runs its Probe (found: commit that; not found: run fn);
//     without a probe Do returns an *InDoubtError and leaves the record pending.
//
// A ReadOnly op runs fn directly; its error comes back as a *NotExecutedError (a read
// has no effect to be unsure of).
//
// Every error Do returns answers errors.Is for exactly one of ErrNotExecuted,
// ErrStoredFailure, ErrOutcomeUnknown, ErrConflict, ErrInDoubt and
// ErrStoreUnavailable (or ErrApprovalPending); KindOf names it. Do never waits for an unresponsive store
// longer than StoreWait in total, even under context.Background().
func (r *Runner) Do(ctx context.Context, op Op, fn Func) (out *Outcome, err error) {
	if op.Class == "" {
		op.Class = NonIdempotentMutation
	}
	if op.LeaseTTL == 0 {
		op.LeaseTTL = r.cfg.LeaseTTL
	}
	if op.AttemptID == "" {
		op.AttemptID = NewAttemptID()
	}
	ctx, span := r.tracer.Start(ctx, "execute_tool "+op.Tool,
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(
			semconv.ToolName.String(op.Tool),
			semconv.ToolSideEffect.Bool(op.Class != ReadOnly),
			semconv.ToolClass.String(string(op.Class)),
			semconv.IdempotencyKey.String(op.Key),
			semconv.Tenant.String(op.Tenant),
		))
	defer func() {
		if out != nil {
			span.SetAttributes(semconv.Replayed.Bool(out.Replayed))
			if out.Receipt != nil && out.Receipt.RemoteID != "" {
				span.SetAttributes(semconv.ReceiptRemoteID.String(out.Receipt.RemoteID))
			}
		}
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	if fn == nil {
		return nil, notExecuted(op, "", idemkv.Invalid("fn", "a tool function is required"))
	}
	if err := op.validate(); err != nil {
		return nil, notExecuted(op, "", err)
	}
	if op.Class == ReadOnly {
		out, err := r.readOnly(ctx, op, fn)
		if err != nil {
			return nil, notExecuted(op, "", err)
		}
		return out, nil
	}
	fp, err := op.fingerprint()
	if err != nil {
		return nil, notExecuted(op, "", err)
	}
	span.SetAttributes(semconv.Fingerprint.String(fp))
	return (&run{Runner: r, op: op, fp: fp, span: span}).loop(ctx, fn)
}

func notExecuted(op Op, d idemkv.Decision, cause error) error {
	return &NotExecutedError{Tenant: op.Tenant, Key: op.Key, Decision: d, Cause: cause}
}

func (x *run) outcomeUnknown(g grant, cause error) error {
	x.span.AddEvent("left_pending")
	return &OutcomeUnknownError{Tenant: x.op.Tenant, Key: x.op.Key, Decision: g.decision, Fence: g.fence, Record: g.record, Cause: cause}
}

func (op *Op) validate() error {
	if err := idemkv.ValidTenant(op.Tenant); err != nil {
		return err
	}
	if err := idemkv.ValidKey(op.Key); err != nil {
		return err
	}
	// The server checks the tool too, but only after encoding/json has turned any
	// invalid byte into U+FFFD: two tools would reach it as one.
	if err := idemkv.ValidTool(op.Tool); err != nil {
		return err
	}
	switch op.Class {
	case ReadOnly:
		return nil
	case IdempotentMutation, NonIdempotentMutation:
	default:
		return idemkv.Invalid("class", "unknown tool class %q", op.Class)
	}
	switch {
	case op.Fingerprint != "" && (op.Effect != nil || len(op.Drop) > 0):
		return idemkv.Invalid("effect", "give an effect or a fingerprint, not both")
	case op.Fingerprint == "" && op.Effect == nil:
		return idemkv.Invalid("effect", "a mutating tool call needs an effect or a fingerprint")
	case op.LeaseTTL < idemkv.DefaultLimits().MinLeaseTTL:
		return idemkv.Invalid("lease_ttl_ms", "the lease must be at least %s", idemkv.DefaultLimits().MinLeaseTTL)
	}
	return nil
}

func (op *Op) fingerprint() (string, error) {
	if op.Fingerprint != "" {
		return op.Fingerprint, nil
	}
	var (
		fp  string
		err error
	)
	switch e := op.Effect.(type) {
	case json.RawMessage:
		fp, err = fingerprintJSON(e, op.Drop)
	case []byte:
		fp, err = fingerprintJSON(e, op.Drop)
	default:
		fp, err = fingerprint.OfValue(e, op.Drop...)
	}
	if err != nil {
		return "", &idemkv.Error{Code: idemkv.CodeInvalidArgument, Field: "effect", Message: err.Error()}
	}
	return fp, nil
}

func fingerprintJSON(data []byte, drop []string) (string, error) {
	c, err := fingerprint.CanonicalizeWithout(data, drop...)
	if err != nil {
		return "", err
	}
	return fingerprint.Sum(c), nil
}

func (r *Runner) readOnly(ctx context.Context, op Op, fn Func) (*Outcome, error) {
	res, err := fn(ctx)
	if err != nil {
		return nil, err
	}
	out := &Outcome{Decision: idemkv.DecisionExecute}
	if res != nil {
		raw, err := marshalResult(res)
		if err != nil {
			return nil, err
		}
		out.Receipt = &idemkv.Receipt{Key: op.Key, Status: idemkv.StatusCommitted, RemoteSystem: res.RemoteSystem,
			RemoteID: res.RemoteID, RemoteURL: res.RemoteURL, Result: raw}
	}
	return out, nil
}

func marshalResult(res *Result) (json.RawMessage, error) {
	if res.Result == nil {
		return nil, nil
	}
	if raw, ok := res.Result.(json.RawMessage); ok {
		return raw, nil
	}
	b, err := json.Marshal(res.Result)
	if err != nil {
		return nil, idemkv.Invalid("result", "result cannot be encoded as JSON: %v", err)
	}
	return b, nil
}

// grant is the ownership a reserve handed this attempt.
type grant struct {
	decision idemkv.Decision
	fence    uint64
	record   *idemkv.Record
}

func (x *run) loop(ctx context.Context, fn Func) (*Outcome, error) {
	op := &x.op
	req, err := x.reserveRequest()
	if err != nil {
		return nil, notExecuted(*op, "", err)
	}
	var approvalDeadline time.Time
	settles := 0
	for waits := 0; ; waits++ {
		res, err := retry(ctx, x, "reserve", func(ctx context.Context) (*idemkv.ReserveResult, error) {
			x.leaseFrom = time.Now()
			return x.store.Reserve(ctx, req)
		})
		var sw *storeWaitError
		switch {
		case errors.As(err, &sw):
			return x.storeUnavailable(ctx, sw, fn)
		case err != nil:
			return nil, notExecuted(*op, "", err)
		}
		// A reserve retried after its answer was lost gets the decision that was
		// granted (the state machine answers recover again), so it is used as is.
		decision := res.Decision
		x.decided(ctx, decision, res)

		switch decision {
		case idemkv.DecisionReplay:
			return x.replay(res)
		case idemkv.DecisionConflict:
			ce := &ConflictError{Tenant: op.Tenant, Key: op.Key, Existing: res.Record}
			if res.Conflict != nil {
				ce.Conflict = *res.Conflict
			}
			return nil, ce
		case idemkv.DecisionInProgress:
			if err := x.await(ctx, res, waits); err != nil {
				if errors.As(err, &sw) {
					return x.storeUnavailable(ctx, sw, fn)
				}
				return nil, notExecuted(*op, decision, err)
			}
		case idemkv.DecisionNeedsApproval:
			if err := x.awaitApproval(ctx, res, &approvalDeadline); err != nil {
				var pending *ApprovalPendingError
				switch {
				case errors.As(err, &pending):
					return nil, err
				case errors.As(err, &sw):
					return x.storeUnavailable(ctx, sw, fn)
				default:
					// Refused (a token that may not read the key): nothing ran.
					return nil, notExecuted(*op, decision, err)
				}
			}
		case idemkv.DecisionExecute:
			return x.execute(ctx, grant{decision, res.Fence, res.Record}, fn)
		case idemkv.DecisionRecover:
			if res.Fence == 0 {
				// In doubt: nobody holds the key and nobody gets it.
				out, again, err := x.settleInDoubt(ctx, res.Record)
				if !again {
					return out, err
				}
				if settles++; settles >= maxSettles {
					return nil, &InDoubtError{Tenant: op.Tenant, Key: op.Key, Record: res.Record,
						Cause: fmt.Errorf("still in doubt after %d rounds of probe and resolve", settles)}
				}
				continue
			}
			return x.recover(ctx, grant{decision, res.Fence, res.Record}, fn)
		default:
			return nil, notExecuted(*op, decision, idemkv.Errorf(idemkv.ErrInternal, "unknown reserve decision %q", res.Decision))
		}
	}
}

func (x *run) decided(ctx context.Context, d idemkv.Decision, res *idemkv.ReserveResult) {
	attrs := []attribute.KeyValue{semconv.Decision.String(string(d))}
	if res.Fence != 0 {
		attrs = append(attrs, semconv.FenceValue(res.Fence))
	}
	if res.Record != nil {
		attrs = append(attrs, semconv.Attempts.Int(int(res.Record.Attempts)))
	}
	if c := res.Conflict; c != nil {
		attrs = append(attrs, semconv.ConflictReason.String(c.Reason),
			semconv.ConflictExistingFingerprint.String(c.ExistingFingerprint))
		if c.ExistingRemoteID != "" {
			attrs = append(attrs, semconv.ConflictExistingRemoteID.String(c.ExistingRemoteID))
		}
	}
	x.span.SetAttributes(attrs...)
	x.span.AddEvent("reserve", trace.WithAttributes(attrs...))
	x.log.LogAttrs(ctx, slog.LevelDebug, "idemkv decision", slog.String(logKeyKey, x.op.Key),
		slog.String(logKeyTool, x.op.Tool), slog.String(logKeyDecision, string(d)), slog.Uint64(logKeyFence, res.Fence))
}

func (x *run) replay(res *idemkv.ReserveResult) (*Outcome, error) {
	rec := res.Receipt
	if rec == nil && res.Record != nil {
		rec = res.Record.Outcome()
	}
	if rec == nil {
		return nil, notExecuted(x.op, idemkv.DecisionReplay, idemkv.Errorf(idemkv.ErrInternal, "replay of %q without a receipt", x.op.Key))
	}
	if rec.Status == idemkv.StatusFailed {
		return nil, &StoredFailureError{Key: x.op.Key, Receipt: rec, Replayed: true}
	}
	out := &Outcome{Decision: idemkv.DecisionReplay, Replayed: true, Receipt: rec, Fingerprint: x.fp, ResultOmitted: omittedIn(rec)}
	if res.Record != nil {
		out.Fence, out.Attempts = res.Record.Fence, res.Record.Attempts
	}
	return out, nil
}

// await long-polls the record another attempt holds until it is settled or that
// attempt's lease runs out; the caller then reserves again and learns which.
func (x *run) await(ctx context.Context, res *idemkv.ReserveResult, waits int) error {
	wait := x.cfg.PollWait
	if res.LeaseExpiresAt != 0 {
		// The server ends the wait at lease expiry itself; the margin covers a
		// server that only wakes on a change.
		if until := time.Until(res.LeaseExpiresAt.Time()) + 250*time.Millisecond; until < wait {
			wait = until
		}
	}
	wait = max(wait, 100*time.Millisecond)
	left := x.cfg.StoreWait - x.waited
	if left <= 0 {
		return &storeWaitError{what: "get", waited: x.waited, last: idemkv.Errorf(idemkv.ErrUnavailable, "no answer yet")}
	}
	// The long-poll may take its whole wait; only the time past it is the store's.
	gctx, cancel := context.WithTimeoutCause(ctx, wait+left, errStoreWait)
	defer cancel()
	start := time.Now()
	rec, err := x.store.Get(gctx, &idemkv.GetRequest{Tenant: x.op.Tenant, Key: x.op.Key, Wait: wait})
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("waiting for the attempt that holds %q: %w", x.op.Key, context.Cause(ctx))
	case err == nil && rec.Status == idemkv.StatusPending && time.Since(start) < wait/2:
		// Still held, and the wait ended early: do not spin on a server whose clock
		// and ours disagree about the lease.
		return sleep(ctx, backoff(waits+1, x.cfg.BackoffMin, x.cfg.BackoffMax))
	case err == nil, errors.Is(err, idemkv.ErrNotFound):
		return nil
	case retryable(err) || gctx.Err() != nil:
		x.waited += max(time.Since(start)-wait, 0)
		d := min(backoff(waits+1, x.cfg.BackoffMin, x.cfg.BackoffMax), max(x.cfg.StoreWait-x.waited, 0))
		if err := sleep(ctx, d); err != nil {
			return &storeWaitError{what: "get", waited: x.waited, last: err, ctxEnded: true}
		}
		x.waited += d
		if x.waited >= x.cfg.StoreWait {
			return &storeWaitError{what: "get", waited: x.waited, last: err}
		}
		return nil
	default:
		return err
	}
}

func (x *run) recover(ctx context.Context, g grant, fn Func) (*Outcome, error) {
	if x.op.Class == IdempotentMutation {
		return x.executeAfter(ctx, g, fn, true)
	}
	if x.op.Probe == nil {
		return nil, x.markInDoubt(ctx, g)
	}
	found, err, lost := x.underLease(ctx, g.fence, Func(x.op.Probe))
	if lost != nil {
		return nil, x.outcomeUnknown(g, errors.Join(lost, err))
	}
	if err != nil {
		// Still unknown: the record stays pending for the next attempt.
		return nil, x.outcomeUnknown(g, fmt.Errorf("probe: %w", err))
	}
	if found == nil {
		x.span.AddEvent("probe", trace.WithAttributes(attribute.Bool("found", false)))
		return x.execute(ctx, g, fn)
	}
	x.span.AddEvent("probe", trace.WithAttributes(attribute.Bool("found", true)))
	out, err := x.commit(ctx, g, found, byProbe)
	if out != nil {
		out.Probed = true
	}
	return out, err
}

func (x *run) execute(ctx context.Context, g grant, fn Func) (*Outcome, error) {
	return x.executeAfter(ctx, g, fn, false)
}

// executeAfter runs the tool under g. earlier says that an attempt before this one
// may have run it (an idempotent re-execution on recover): a "not executed" from this
// call then says nothing about that attempt, so the key stays pending instead of
// being released (a release means the effect certainly did not happen, and frees the
// key for other arguments).
func (x *run) executeAfter(ctx context.Context, g grant, fn Func, earlier bool) (*Outcome, error) {
	if ctx.Err() != nil && !approved(g.record) {
		// The caller gave up after the grant and before the tool ran: this call did
		// nothing, so the key is released (it would otherwise wait out the lease and
		// then be in doubt), unless an earlier attempt may have had the effect. A grant
		// that consumed an approval is not released (that would delete the record and
		// the person's approval with it, docs/protocol.md section 7): the tool gets the
		// ended context and decides.
		cause := fmt.Errorf("the context ended before the tool ran: %w", context.Cause(ctx))
		if earlier {
			return nil, x.outcomeUnknown(g, cause)
		}
		return nil, x.release(ctx, g, cause)
	}
	res, ferr, lost := x.underLease(ctx, g.fence, fn)
	if lost != nil {
		// A newer attempt owns the key; it decides the outcome (and probes for ours).
		return nil, x.outcomeUnknown(g, errors.Join(lost, ferr))
	}
	var (
		perm *PermanentError
		ne   *notExecutedMark
	)
	switch {
	case ferr == nil && res == nil:
		return nil, x.outcomeUnknown(g, idemkv.Invalid("result", "the tool returned neither a result nor an error"))
	case ferr == nil:
		return x.commit(ctx, g, res, byTool)
	case errors.As(ferr, &ne) && earlier:
		return nil, x.outcomeUnknown(g, ferr)
	case errors.As(ferr, &ne):
		return nil, x.release(ctx, g, ferr)
	case errors.As(ferr, &perm):
		return x.fail(ctx, g, perm, ferr)
	default:
		return nil, x.outcomeUnknown(g, ferr)
	}
}

// approved reports whether rec carries an approval that was given, which the grant
// consumed.
func approved(rec *idemkv.Record) bool {
	return rec != nil && rec.Approval != nil && rec.Approval.State == idemkv.ApprovalApproved
}

// underLease runs f while a heartbeat keeps the lease alive. lost is set when the
// lease went to a newer attempt, in which case f's context was cancelled.
//
// The heartbeat lasts exactly as long as f: not less when the caller's context ends
// (a tool that does not watch its context goes on, and without a lease a second
// worker would recover the key and run it again), and not more when f panics (the
// lease would then never run out, and every later attempt would wait in_progress).
func (x *run) underLease(ctx context.Context, fence uint64, f Func) (res *Result, err, lost error) {
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	hctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		x.leaseFrom, lost = x.heartbeat(hctx, fence, x.leaseFrom, cancel)
	}()
	defer func() {
		stop()
		wg.Wait()
	}()
	res, err = f(fctx)
	stop()
	wg.Wait()
	// Storing what the tool (or probe) did gets a StoreWait of its own: an effect
	// that happened must not go unrecorded because the reserve had to wait.
	x.waited = 0
	return res, err, lost
}

// heartbeat renews the lease every third of it until ctx ends, and returns when the
// last renewal was sent (renewed). A lease lost to a newer attempt (fenced, or the record gone
// or settled) cancels the tool with that cause and is returned. A lease that runs out
// by this worker's clock, counted from the start of the call that last granted or
// renewed it (earlier than the leader's stamp, so never later than the lease itself),
// cancels the tool with ErrLeaseExpired a sixth of the lease before its end (a margin
// for the tool to hear it and stop) once a heartbeat has failed to renew it: another
// worker may recover the key from the end on, and a tool that went on would run beside
// it. The heartbeat goes on trying, and what the tool returns is still committed: if
// nobody took the key over, the commit lands.
func (x *run) heartbeat(ctx context.Context, fence uint64, from time.Time, cancel context.CancelCauseFunc) (renewed time.Time, lost error) {
	every := x.op.LeaseTTL / 3
	tell := x.op.LeaseTTL - x.op.LeaseTTL/6 // after from, when the tool is told
	next := every
	if time.Until(from.Add(tell)) < every {
		// The grant took long to arrive (retries inside the reserve call): renew at
		// once rather than judge the lease by that call's start.
		next = 0
	}
	expired, tried := false, false
	req := &idemkv.HeartbeatRequest{Tenant: x.op.Tenant, Key: x.op.Key, Fence: fence, LeaseTTLMs: x.op.LeaseTTL.Milliseconds()}
	for {
		wait := next
		if !expired && tried {
			wait = max(min(wait, time.Until(from.Add(tell))), 0)
		}
		if sleep(ctx, wait) != nil {
			return from, nil
		}
		left := time.Until(from.Add(tell))
		if !expired && tried && left <= 0 {
			expired = true
			x.span.AddEvent("lease_expired")
			x.log.LogAttrs(ctx, slog.LevelWarn, "idemkv lease running out without a renewal, the tool was told to stop",
				slog.String(logKeyKey, x.op.Key), slog.Uint64(logKeyFence, fence))
			cancel(fmt.Errorf("%w: no heartbeat of %q renewed it within %s of its %s", ErrLeaseExpired, x.op.Key, tell, x.op.LeaseTTL))
		}
		// A renewal still in flight when the tool is to be told is cut short there.
		d := every
		if !expired && left > 0 && left < d {
			d = left
		}
		sent := time.Now()
		hctx, hcancel := context.WithTimeout(ctx, d)
		_, err := x.store.Heartbeat(hctx, req)
		hcancel()
		tried = true
		switch {
		case err == nil:
			from, next = sent, every
		case errors.Is(err, idemkv.ErrFenced), errors.Is(err, idemkv.ErrNotPending), errors.Is(err, idemkv.ErrNotFound):
			lost := fmt.Errorf("idemkv: lease on %q lost, the tool was stopped: %w", x.op.Key, err)
			x.span.AddEvent("lease_lost")
			cancel(lost)
			return from, lost
		default:
			if ctx.Err() != nil {
				return from, nil
			}
			// Try again soon: the lease may still have time to run.
			x.log.LogAttrs(ctx, slog.LevelWarn, "idemkv heartbeat failed", slog.String(logKeyKey, x.op.Key), slog.Any(logKeyErr, err))
			next = max(every/6, 50*time.Millisecond)
		}
	}
}

// graceContext outlives ctx by CommitGrace, so that an outcome is stored even when the
// caller gave up while the tool ran.
func (x *run) graceContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), x.cfg.CommitGrace)
}

// finder says who found the effect whose receipt is being stored, so that an error
// says what happened: the tool ran, or the tool did not run and the probe found the
// effect a dead attempt left.
type finder string

const (
	byTool  finder = "the tool ran"
	byProbe finder = "the tool did not run: the probe found the effect of an earlier attempt"
)

func (x *run) commit(ctx context.Context, g grant, res *Result, who finder) (*Outcome, error) {
	raw, err := marshalResult(res)
	if err != nil {
		return nil, x.outcomeUnknown(g, fmt.Errorf("%s, but its receipt cannot be stored: %w", who, err))
	}
	req := &idemkv.CommitRequest{
		Tenant: x.op.Tenant, Key: x.op.Key, Fingerprint: x.fp, Fence: g.fence,
		RemoteSystem: res.RemoteSystem, RemoteID: res.RemoteID, RemoteURL: res.RemoteURL, Result: raw,
	}
	// Check the receipt before any call: a receipt without remote_system or remote_id
	// can never be stored, and retrying it would only spend the store-wait budget.
	// The payload limit is the server's to enforce (it is a flag there).
	if err := fitCommit(req); err != nil {
		return nil, x.outcomeUnknown(g, fmt.Errorf("%s, but its receipt is invalid and was not stored: %w", who, err))
	}
	gctx, cancel := x.graceContext(ctx)
	defer cancel()
	receipt, err := x.storeCommit(gctx, req)
	if err != nil {
		return nil, x.outcomeUnknown(g, fmt.Errorf("%s, but its receipt (remote id %q) was not stored: %w", who, res.RemoteID, err))
	}
	if receipt.Status == idemkv.StatusFailed {
		// The first stored outcome wins, and it was a failure.
		return nil, &StoredFailureError{Key: x.op.Key, Receipt: receipt, Replayed: true}
	}
	return &Outcome{Decision: g.decision, Receipt: receipt, Fingerprint: x.fp, Fence: g.fence, Attempts: attempts(g),
		ResultOmitted: omittedIn(receipt)}, nil
}

func attempts(g grant) uint32 {
	if g.record == nil {
		return 0
	}
	return g.record.Attempts
}

func (x *run) fail(ctx context.Context, g grant, perm *PermanentError, ferr error) (*Outcome, error) {
	req := &idemkv.FailRequest{Tenant: x.op.Tenant, Key: x.op.Key, Fingerprint: x.fp, Fence: g.fence, Error: perm.Info()}
	gctx, cancel := x.graceContext(ctx)
	defer cancel()
	rec, err := retry(gctx, x, "fail", func(ctx context.Context) (*idemkv.Record, error) {
		return x.store.Fail(ctx, req)
	})
	if err != nil {
		return nil, x.outcomeUnknown(g, errors.Join(ferr, fmt.Errorf("storing the failure: %w", err)))
	}
	receipt := rec.Outcome()
	if receipt != nil && receipt.Status == idemkv.StatusCommitted {
		return &Outcome{Decision: g.decision, Receipt: receipt, Fingerprint: x.fp, Fence: g.fence, Attempts: rec.Attempts}, nil
	}
	if receipt == nil {
		receipt = &idemkv.Receipt{Key: x.op.Key, Fingerprint: x.fp, Status: idemkv.StatusFailed, Error: &req.Error}
	}
	return nil, &StoredFailureError{Key: x.op.Key, Receipt: receipt, Cause: ferr}
}

func (x *run) release(ctx context.Context, g grant, ferr error) error {
	req := &idemkv.ReleaseRequest{Tenant: x.op.Tenant, Key: x.op.Key, Fingerprint: x.fp, Fence: g.fence}
	gctx, cancel := x.graceContext(ctx)
	defer cancel()
	_, err := retry(gctx, x, "release", func(ctx context.Context) (*idemkv.ReleaseResult, error) {
		return x.store.Release(ctx, req)
	})
	switch {
	case err == nil, errors.Is(err, idemkv.ErrNotFound), errors.Is(err, idemkv.ErrFenced):
		// Gone already, or a newer attempt owns the key: either way not ours to free.
		x.span.AddEvent("released")
		return notExecuted(x.op, g.decision, ferr)
	default:
		// The tool did not run; the key stays held until its lease runs out.
		return notExecuted(x.op, g.decision, errors.Join(ferr, fmt.Errorf("releasing the key: %w", err)))
	}
}
