package client_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
)

// A probe that settles an in-doubt key answers for the doubt it looked at. Here it
// looks (nothing found), and while it is still on its way another caller settles the
// same doubt, runs the tool (a ticket), dies, and a third marks the key in doubt
// anew. The first probe's "not found" is about the old doubt: released on it, the key
// would run the tool a second time. Do must see that the doubt changed and look again.
func TestAStaleProbeDoesNotSettleALaterDoubt(t *testing.T) {
	e := startEnv(t, 1)
	key := "conversation_9:approval_42:create_ticket"
	op := createTicket(key, "Stale probe")
	op.LeaseTTL = time.Second
	ctx := timeout(t, 30*time.Second)
	died := func(create bool) client.Func {
		return func(context.Context) (*client.Result, error) {
			if create {
				e.api.create(key)
			}
			return nil, errDownstreamTimeout
		}
	}
	// A worker dies before creating anything; the next, without a probe, marks the
	// key in doubt.
	if _, err := e.client.Do(ctx, op, died(false)); client.KindOf(err) != client.KindOutcomeUnknown {
		t.Fatalf("first worker: %v", err)
	}
	if _, err := e.client.Do(ctx, op, mustNotRun(t)); !errors.Is(err, client.ErrInDoubt) {
		t.Fatalf("second worker: %v, want in doubt", err)
	}

	// B probes: nothing yet, and its answer takes a while to come back.
	probing, proceed := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	slow := op
	slow.Probe = func(pctx context.Context) (*client.Result, error) {
		if calls.Add(1) > 1 {
			return e.api.probe(key)(pctx)
		}
		found, err := e.api.probe(key)(pctx)
		close(probing)
		<-proceed
		return found, err
	}
	type result struct {
		out *client.Outcome
		err error
	}
	b := make(chan result, 1)
	go func() {
		out, err := e.client.Do(ctx, slow, e.create(key))
		b <- result{out, err}
	}()
	<-probing

	// A settles the doubt with its own probe, runs the tool, which creates the ticket
	// and dies; C, without a probe, marks the key in doubt again.
	fast := op
	fast.Probe = e.api.probe(key)
	if _, err := e.client.Do(ctx, fast, died(true)); client.KindOf(err) != client.KindOutcomeUnknown {
		t.Fatalf("A: %v", err)
	}
	if _, err := e.client.Do(ctx, op, mustNotRun(t)); !errors.Is(err, client.ErrInDoubt) {
		t.Fatalf("C: %v, want in doubt", err)
	}

	close(proceed)
	r := <-b
	if n := e.api.count(key); n != 1 {
		t.Fatalf("%d tickets for one operation: B settled the new doubt with its stale probe (B: %+v, %v)", n, r.out, r.err)
	}
	if r.err != nil || !r.out.Probed || r.out.Receipt.RemoteID != e.api.id(key) {
		t.Fatalf("B: %+v, %v; want the ticket A created, found by the probe", r.out, r.err)
	}
	rec, err := e.client.Get(ctx, &idemkv.GetRequest{Tenant: op.Tenant, Key: key})
	if err != nil || rec.Status != idemkv.StatusCommitted || rec.Receipt.RemoteID != e.api.id(key) {
		t.Fatalf("record %+v, %v", rec, err)
	}
}
