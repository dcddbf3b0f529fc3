package workload

import (
	"context"
	mrand "math/rand/v2"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

// Settle against a real node: keys held by another attempt's lease are redelivered
// until the lease runs out and end committed; keys whose lease outlives the limit
// (as under a state machine clock pushed minutes ahead) stop the redeliveries at the
// limit and come back as left, instead of rounds of whole-Deadline deliveries that
// outlast the run (CI: a sabotaged clock-jump run spent its four minutes settling).
func TestSettleRedeliversWithinItsLimit(t *testing.T) {
	c := testcluster.Start(t, 1)
	c.WaitLeader()
	cases := []struct {
		name     string
		hold     time.Duration
		limit    time.Duration
		wantLeft bool
	}{
		{"lease runs out", 2 * time.Second, time.Minute, false},
		{"lease outlives the limit", time.Hour, 3 * time.Second, true},
	}
	for ci, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			api := NewAPI(c.Endpoints(), 2*time.Second)
			defer api.Close()
			down := NewDownstream(uint64(ci + 1))
			a, err := NewAgent(AgentConfig{Workers: 2, Interval: 25 * time.Millisecond, Lease: 2 * time.Second,
				Deadline: 2 * time.Second}, api, history.NewRecorder(time.Now(), nil), down)
			if err != nil {
				t.Fatal(err)
			}
			r := mrand.New(mrand.NewPCG(uint64(ci), 7))
			for n := range 6 {
				a.newOp(1000*ci+n, r)
			}
			ctx := context.Background()
			for _, key := range a.Keys() {
				var fp string
				for _, op := range a.ops {
					if op.Key == key {
						fp = op.FP
						break
					}
				}
				_, rr, res := api.Reserve(ctx, 0, &idemkv.ReserveRequest{Tenant: Tenant, Key: key, Tool: "jepsen.tickets",
					Fingerprint: fp, AttemptID: "holder-" + key, LeaseTTLMs: tc.hold.Milliseconds(), TTLMs: 3_600_000})
				if res.typ != history.OK || rr == nil || rr.Decision != idemkv.DecisionExecute {
					t.Fatalf("holding %s: %+v %+v", key, res, rr)
				}
			}
			made, left, err := a.Settle(ctx, tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			recs, err := a.FinalRecords(ctx)
			if err != nil {
				t.Fatal(err)
			}
			pending := 0
			for _, rec := range recs {
				// A tool that cannot be probed is in doubt once a holder's lease ran
				// out (the holder may have run it): settled, as Settle means it.
				if rec.Status == idemkv.StatusPending && !rec.InDoubt {
					pending++
				}
			}
			t.Logf("%d keys, %d deliveries, %d left, %d pending and not in doubt", len(a.Keys()), made, left, pending)
			if !tc.wantLeft {
				if left != 0 || pending != 0 {
					t.Fatalf("left %d, pending %d: every lease ran out and nothing should stay pending", left, pending)
				}
				return
			}
			if left != len(a.Keys()) || pending != len(a.Keys()) {
				t.Fatalf("left %d, pending %d of %d keys held for an hour", left, pending, len(a.Keys()))
			}
			// Two workers, 2 s deliveries and a 3 s limit: at most two rounds of
			// two deliveries each begin, not the three rounds of every key.
			if made >= 3*len(a.Keys()) {
				t.Fatalf("%d deliveries: the limit did not stop the rounds", made)
			}
		})
	}
}
