package client

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkv/idemkv"
)

// maxSettles bounds the rounds of probe, resolve not_executed and reserve again in one
// Do, should other callers keep marking the key in doubt in between.
const maxSettles = 8

// markInDoubt: this attempt took over a dead one and cannot learn its outcome. It
// marks the record in doubt so that retries stop re-leasing it and an operator sees
// it, and returns the in-doubt error.
func (x *run) markInDoubt(ctx context.Context, g grant) error {
	x.span.AddEvent("in_doubt")
	gctx, cancel := x.graceContext(ctx)
	defer cancel()
	rec, err := retry(gctx, x, "doubt", func(ctx context.Context) (*idemkv.Record, error) {
		return x.store.Doubt(ctx, &idemkv.DoubtRequest{Tenant: x.op.Tenant, Key: x.op.Key, Fingerprint: x.fp, Fence: g.fence})
	})
	if err != nil {
		// The record stays pending under this attempt's lease; the next attempt
		// after it marks the record.
		return &InDoubtError{Tenant: x.op.Tenant, Key: x.op.Key, Record: g.record, Cause: fmt.Errorf("marking it in doubt: %w", err)}
	}
	return &InDoubtError{Tenant: x.op.Tenant, Key: x.op.Key, Record: rec}
}

// settleInDoubt answers a recover without a fence: the record is in doubt. Without a
// probe that is the in-doubt error at once. With one, the probe decides: found, the
// receipt is committed with resolve; not found, the key is released with resolve and
// again reports that the caller should reserve afresh.
func (x *run) settleInDoubt(ctx context.Context, rec *idemkv.Record) (out *Outcome, again bool, err error) {
	inDoubt := func(cause error) error {
		x.span.AddEvent("in_doubt")
		return &InDoubtError{Tenant: x.op.Tenant, Key: x.op.Key, Record: rec, Cause: cause}
	}
	if x.op.Probe == nil {
		return nil, false, inDoubt(nil)
	}
	found, err := x.op.Probe(ctx)
	x.waited = 0 // the probe's own time is not the store's
	if err != nil {
		return nil, false, inDoubt(fmt.Errorf("probe: %w", err))
	}
	x.span.AddEvent("probe", trace.WithAttributes(attribute.Bool("found", found != nil)))
	req := &idemkv.ResolveRequest{Tenant: x.op.Tenant, Key: x.op.Key, Fingerprint: x.fp, Outcome: idemkv.ResolveNotExecuted}
	if found != nil {
		raw, err := marshalResult(found)
		if err != nil {
			return nil, false, inDoubt(fmt.Errorf("%s, but its receipt cannot be stored: %w", byProbe, err))
		}
		req.Outcome, req.RemoteSystem, req.RemoteID, req.RemoteURL, req.Result = idemkv.ResolveCommitted,
			found.RemoteSystem, found.RemoteID, found.RemoteURL, raw
		err = req.Validate(idemkv.Limits{MaxPayloadBytes: idemkv.MaxRequestBytes})
		if tooLarge(err) {
			req.Result = omittedResult(len(raw))
			err = req.Validate(idemkv.Limits{MaxPayloadBytes: idemkv.MaxRequestBytes})
		}
		if err != nil {
			return nil, false, inDoubt(fmt.Errorf("%s, but its receipt is invalid and was not stored: %w", byProbe, err))
		}
	}
	gctx, cancel := x.graceContext(ctx)
	defer cancel()
	if rec != nil {
		// The probe answers for the doubt it looked at. Should the key have been
		// settled and marked in doubt anew while it looked (another caller released
		// it, ran the tool and died), its "not found" says nothing of that run, and a
		// resolve by key would release the key after an effect: reserve and look
		// again. (What remains is the time from this read to the resolve, not the
		// probe's; a new doubt takes at least a whole lease to form.)
		cur, err := retry(gctx, x, "get", func(ctx context.Context) (*idemkv.Record, error) {
			return x.store.Get(ctx, &idemkv.GetRequest{Tenant: x.op.Tenant, Key: x.op.Key})
		})
		switch {
		case errors.Is(err, idemkv.ErrNotFound):
			return nil, true, nil
		case err != nil:
			return nil, false, inDoubt(fmt.Errorf("reading it again after the probe: %w", err))
		case cur.Status != idemkv.StatusPending || !cur.InDoubt || cur.Fence != rec.Fence:
			x.span.AddEvent("doubt_changed")
			return nil, true, nil
		}
	}
	resolve := func(ctx context.Context) (*idemkv.ResolveResult, error) { return x.store.Resolve(ctx, req) }
	res, err := retry(gctx, x, "resolve", resolve)
	if tooLarge(err) && len(req.Result) > 0 && !ResultOmitted(req.Result) {
		req.Result = omittedResult(len(req.Result))
		res, err = retry(gctx, x, "resolve", resolve)
	}
	switch {
	case errors.Is(err, idemkv.ErrNotPending), errors.Is(err, idemkv.ErrNotFound):
		// Someone settled it first: reserve again to learn how.
		return nil, true, nil
	case err != nil:
		return nil, false, inDoubt(fmt.Errorf("resolving it: %w", err))
	case res.Receipt != nil:
		out := &Outcome{Decision: idemkv.DecisionRecover, Probed: true, Receipt: res.Receipt, Fingerprint: x.fp,
			ResultOmitted: omittedIn(res.Receipt)}
		if rec != nil {
			out.Fence, out.Attempts = rec.Fence, rec.Attempts
		}
		return out, false, nil
	default:
		x.span.AddEvent("released")
		return nil, true, nil
	}
}
