package node_test

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// TestReleasedHistoryIsTheSameOnEveryNode: on three nodes, a key is reserved and
// released while a follower is away long enough to be sent a snapshot. Every node
// then answers a stale read of the key's history, from its own state, with not_found
// and the same tombstone (the apply is deterministic: the leader's stamp, no clock);
// a read without ?history is the plain not_found. The next reserve executes, and every
// node holds the new record continuing that history, and no tombstone.
func TestReleasedHistoryIsTheSameOnEveryNode(t *testing.T) {
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(_ int, cfg *node.Config) {
		cfg.SnapshotThreshold, cfg.TrailingLogs = 16, 8
	}))
	ctx := ctxT(t)
	const key = "refund:order-18"
	fp := "sha256:released"
	var first *idemkv.ReserveResult
	if err := c.OnLeader(func(n *node.Node) (err error) {
		r := reserveReq(key, "att-1", fp)
		r.Actor = "worker-1"
		first, err = n.Reserve(ctx, r)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	leader := c.LeaderIndex(t)
	away := (leader + 1) % 3
	awayApplied := c.Node(away).AppliedIndex()
	c.Stop(away)
	if err := c.OnLeader(func(n *node.Node) error {
		_, err := n.Release(ctx, &idemkv.ReleaseRequest{Tenant: "acme", Key: key, Fingerprint: fp, Fence: first.Fence})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	writeFillers(t, c, ctx, 30)
	snapshotPast(t, c, awayApplied)
	c.Restart(away)
	c.WaitConverged()

	released := func(i int) *idemkv.Tombstone {
		t.Helper()
		n := c.Node(i)
		if _, err := n.Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: key, Consistency: idemkv.Stale}); !errors.Is(err, idemkv.ErrNotFound) {
			t.Fatalf("%s: get without history: %v", c.ID(i), err)
		} else if e := (*idemkv.Error)(nil); errors.As(err, &e) && e.Details != nil {
			t.Fatalf("%s: get without history carries details %+v", c.ID(i), e.Details)
		}
		_, err := n.Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: key, Consistency: idemkv.Stale, History: true})
		var e *idemkv.Error
		if !errors.Is(err, idemkv.ErrNotFound) || !errors.As(err, &e) || e.Details == nil || e.Details.Released == nil {
			t.Fatalf("%s: get with history of a released key: %v", c.ID(i), err)
		}
		return e.Details.Released
	}
	want := released(leader)
	if len(want.History) != 2 || want.History[0].Event != idemkv.EventExecute || want.History[1].Event != idemkv.EventRelease ||
		want.History[1].Fence != first.Fence || want.History[1].AttemptID != "att-1" || want.History[1].Actor != "worker-1" ||
		want.ReleasedAt != want.History[1].At || want.ExpiresAt != first.Record.ExpiresAt {
		t.Fatalf("tombstone %+v", want)
	}
	for i := range c.Len() {
		if got := released(i); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s holds\n %+v\n%s holds\n %+v", c.ID(i), got, c.ID(leader), want)
		}
	}

	var second *idemkv.ReserveResult
	if err := c.OnLeader(func(n *node.Node) (err error) { second, err = n.Reserve(ctx, reserveReq(key, "att-2", fp)); return err }); err != nil {
		t.Fatal(err)
	}
	if second.Decision != idemkv.DecisionExecute {
		t.Fatalf("reserve after the release: %s", second.Decision)
	}
	c.WaitConverged()
	for i := range c.Len() {
		rec, err := c.Node(i).Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: key, Consistency: idemkv.Stale, History: true})
		if err != nil {
			t.Fatalf("%s: %v", c.ID(i), err)
		}
		if len(rec.History) != 3 || !reflect.DeepEqual(rec.History[:2], want.History) || rec.History[2].Fence != second.Fence {
			t.Fatalf("%s: history of the new record %+v", c.ID(i), rec.History)
		}
		if err := c.Node(i).CheckExpiryIndex(); err != nil {
			t.Fatalf("%s: %v", c.ID(i), err)
		}
	}
}

// TestSweeperDeletesReleasedHistory: the leader's sweeper, which proposes only when the
// backlog shows work, sees a tombstone past its record's expires_at and deletes it:
// the read of the key's history is then the plain not_found, and the swept counter
// counts it.
func TestSweeperDeletesReleasedHistory(t *testing.T) {
	clock := newTestClock(time.Now())
	c := testcluster.Start(t, 1, testcluster.WithConfig(func(i int, cfg *node.Config) {
		cfg.Now, cfg.Monotonic = clock.Now, clock.Elapsed
		cfg.Sweep.Interval = 20 * time.Millisecond
	}))
	n := c.Node(0)
	ctx := ctxT(t)
	res, err := n.Reserve(ctx, withTTL(reserveReq("mail-1", "att-1", "sha256:m1"), time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Release(ctx, &idemkv.ReleaseRequest{Tenant: "acme", Key: "mail-1", Fingerprint: "sha256:m1", Fence: res.Fence}); err != nil {
		t.Fatal(err)
	}
	history := &idemkv.GetRequest{Tenant: "acme", Key: "mail-1", History: true}
	var e *idemkv.Error
	if _, err := n.Get(ctx, history); !errors.As(err, &e) || e.Details == nil || e.Details.Released == nil {
		t.Fatalf("before expiry: %v", err)
	}
	if count, _, _ := n.Backlog(); count != 0 {
		t.Fatalf("backlog before expiry: %d", count)
	}
	swept := metricValue(t, c.Metrics(0).Swept)
	clock.Advance(time.Minute)
	waitFor(t, 10*time.Second, "the sweeper deletes the tombstone", func() error {
		if count, _, _ := n.Backlog(); count != 0 {
			return fmt.Errorf("backlog %d", count)
		}
		return nil
	})
	_, err = n.Get(ctx, history)
	if !errors.Is(err, idemkv.ErrNotFound) || (errors.As(err, &e) && e.Details != nil) {
		t.Fatalf("after the sweep: %v", err)
	}
	if got := metricValue(t, c.Metrics(0).Swept); got != swept+1 {
		t.Fatalf("swept counter %v, want %v", got, swept+1)
	}
	if err := n.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
}
