package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkv/idemkv"
)

// StorePolicy says what Do does when idemkv cannot be reached within StoreWait.
type StorePolicy string

const (
	// FailClosed (the default): Do returns a *StoreUnavailableError and the tool does
	// not run.
	FailClosed StorePolicy = "fail_closed"
	// Unguarded: an IdempotentMutation op runs its tool anyway, with no record and no
	// lease (Outcome.Unguarded). It is the caller's statement that running the tool
	// twice is harmless. NonIdempotentMutation ops always fail closed; ReadOnly ops
	// never wait for the store in the first place.
	Unguarded StorePolicy = "unguarded"
)

// DefaultStoreWait is the default of StoreWait: longer than a leader election (about
// 1-3 s with the default Raft timeouts) plus a node restart, short enough that an agent
// learns of an outage while it can still tell its user.
const DefaultStoreWait = 30 * time.Second

// storeUnavailable applies the policy once StoreWait is spent before the tool ran.
func (x *run) storeUnavailable(ctx context.Context, sw *storeWaitError, fn Func) (*Outcome, error) {
	x.span.AddEvent("store_unavailable")
	if x.cfg.OnStoreUnavailable == Unguarded && x.op.Class == IdempotentMutation && ctx.Err() == nil {
		x.log.LogAttrs(ctx, slog.LevelWarn, "idemkv unreachable, running an idempotent tool unguarded",
			slog.String(logKeyKey, x.op.Key), slog.String(logKeyTool, x.op.Tool), slog.Any(logKeyErr, sw))
		out, err := x.readOnly(ctx, x.op, fn)
		if err != nil {
			// Nothing is recorded: from idemkv's side the call never happened.
			return nil, notExecuted(x.op, "", err)
		}
		out.Unguarded = true
		out.Fingerprint = x.fp
		return out, nil
	}
	return nil, &StoreUnavailableError{Tenant: x.op.Tenant, Key: x.op.Key, AttemptID: x.op.AttemptID, Waited: sw.waited, Cause: sw}
}

// retryable reports a store error after which the same request may simply be sent
// again: certainly not applied (unavailable, resource_exhausted), or perhaps applied
// (outcome_unknown), which the same attempt id or fence makes safe to repeat.
func retryable(err error) bool {
	return errors.Is(err, idemkv.ErrUnavailable) || errors.Is(err, idemkv.ErrOutcomeUnknown) ||
		errors.Is(err, idemkv.ErrResourceExhausted)
}

// errStoreWait is the cause of a store call cut short by the StoreWait budget.
var errStoreWait = errors.New("store wait spent")

// storeWaitError: the StoreWait budget is spent, or the caller's context ended, while
// the store kept failing with retryable errors. Do turns it into a
// *StoreUnavailableError before the tool ran and an *OutcomeUnknownError after.
type storeWaitError struct {
	what     string
	waited   time.Duration
	last     error
	ctxEnded bool
}

func (e *storeWaitError) Error() string {
	if e.ctxEnded {
		return fmt.Sprintf("%s: the context ended after %s without an answer: %v", e.what, e.waited.Round(time.Millisecond), e.last)
	}
	return fmt.Sprintf("%s: no answer within %s: %v", e.what, e.waited.Round(time.Millisecond), e.last)
}

func (e *storeWaitError) Unwrap() error { return e.last }

// retry calls f with the same request until it succeeds, fails with an error that is
// not retryable, the run's StoreWait budget is spent, or ctx ends. Each call is cut
// short when the budget runs out, so an unresponsive store cannot hold Do past it.
func retry[T any](ctx context.Context, x *run, what string, f func(context.Context) (T, error)) (T, error) {
	var zero T
	last := idemkv.Errorf(idemkv.ErrUnavailable, "StoreWait was spent before this call")
	for n := 1; ; n++ {
		left := x.cfg.StoreWait - x.waited
		if left <= 0 {
			return zero, &storeWaitError{what: what, waited: x.waited, last: last}
		}
		cctx, cancel := context.WithTimeoutCause(ctx, left, errStoreWait)
		start := time.Now()
		v, err := f(cctx)
		cut := cctx.Err() != nil && ctx.Err() == nil
		cancel()
		if err == nil {
			return v, nil
		}
		if !retryable(err) && !cut {
			if ctx.Err() != nil {
				// The caller gave up with this call in flight, which may have landed (a
				// reserve whose lease this attempt now holds): the answer is the one
				// that names the attempt to retry as, even on the first call.
				return zero, &storeWaitError{what: what, waited: x.waited, last: err, ctxEnded: true}
			}
			return zero, err
		}
		x.waited += time.Since(start)
		last = err
		x.log.LogAttrs(ctx, slog.LevelDebug, "idemkv unavailable, retrying", slog.String("call", what), slog.Any(logKeyErr, err))
		d := min(backoff(n, x.cfg.BackoffMin, x.cfg.BackoffMax), max(x.cfg.StoreWait-x.waited, 0))
		if serr := sleep(ctx, d); serr != nil {
			return zero, &storeWaitError{what: what, waited: x.waited, last: err, ctxEnded: true}
		}
		x.waited += d
	}
}
