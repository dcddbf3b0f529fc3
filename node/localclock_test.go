package node_test

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// A follower answers from its own state only while the clocks the margin's argument
// assumes are measured and within it (issue 22, point 2): not once it measured its
// wall clock beyond half of node.LocalAnswerMargin from the state machine clock, and not
// after a restart before a live entry anchored it. Node.Reserve on a follower never
// forwards, so ErrNotLeader is a refusal to answer locally.
func TestLocalAnswersNeedAMeasuredClock(t *testing.T) {
	var ahead [3]atomic.Int64 // each node's wall clock offset
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
		cfg.Now = func() time.Time { return time.Now().Add(time.Duration(ahead[i].Load())) }
		cfg.ClockTick = -1 // no entry but the test's own
	}))
	ctx := ctxT(t)
	li := c.LeaderIndex(t)
	fi := (li + 1) % 3
	leader := c.Node(li)
	settle(t, leader, reserveReq("done", "a1", fp("done")), idemkv.StatusCommitted)
	writes := 0
	write := func() {
		t.Helper()
		writes++
		settle(t, c.Node(c.LeaderIndex(t)), reserveReq(fmt.Sprintf("w%d", writes), "a1", fp("w")), idemkv.StatusCommitted)
		want := c.Node(c.LeaderIndex(t)).AppliedIndex()
		waitFor(t, 10*time.Second, "the follower applies the write", func() error {
			if got := c.Node(fi).AppliedIndex(); got < want {
				return fmt.Errorf("follower at %d, leader at %d", got, want)
			}
			return nil
		})
	}
	ask := func() error {
		_, err := c.Node(fi).Reserve(ctx, reserveReq("done", "a2", fp("done")))
		return err
	}
	answers := func(why string) {
		t.Helper()
		waitFor(t, 10*time.Second, "a local answer "+why, ask)
	}
	refuses := func(why string) {
		t.Helper()
		if err := ask(); !errors.Is(err, idemkv.ErrNotLeader) {
			t.Errorf("follower reserve of a committed record %s: %v; want ErrNotLeader (no local answer)", why, err)
		}
	}

	write()
	answers("with every clock right")
	if ci := c.Node(fi).ClockInfo(); !ci.LocalAnswers || ci.OffsetMs == nil || *ci.OffsetMs > 5000 || *ci.OffsetMs < -5000 {
		t.Errorf("clock info with every clock right: %+v", ci)
	}

	// 5 min fast: the record's expiry (24 h) is still far beyond the margin of its wall
	// clock, so only the measured offset can refuse.
	ahead[fi].Store(int64(5 * time.Minute))
	write()
	refuses("once the follower measured its clock 5 min off")
	if ci := c.Node(fi).ClockInfo(); ci.LocalAnswers || ci.LocalAnswersOff != "offset_beyond_margin" {
		t.Errorf("clock info 5 min off: %+v", ci)
	}
	ahead[fi].Store(0)
	write()
	answers("once the follower measured its clock right again")

	// Restarted in a quiet cluster: nothing live anchors it until the next write.
	c.Stop(fi)
	c.Restart(fi)
	waitFor(t, 10*time.Second, "the restarted follower knows the leader", func() error {
		if addr, _ := c.Node(fi).Leader(); addr == "" {
			return errors.New("no leader known")
		}
		return nil
	})
	refuses("right after a restart, before any live entry")
	if ci := c.Node(fi).ClockInfo(); ci.Anchored || ci.LocalAnswersOff != "unanchored" {
		t.Errorf("clock info right after a restart: %+v", ci)
	}
	write()
	answers("after a live entry")
}

// In a quiet period the leader stamps an entry of its own every ClockTick, so the state
// machine clock a restart resumes from is recent, and the offset a node measures stays
// fresh.
func TestLeaderTicksTheClockInAQuietPeriod(t *testing.T) {
	cfg := opsNodeConfig(t, "n1", t.TempDir())
	cfg.Bootstrap = true
	quickTimings(&cfg)
	cfg.ClockTick = 200 * time.Millisecond
	n := openNode(t, cfg)
	waitLeaderReady(t, n)
	start := n.AppliedIndex()
	waitFor(t, 10*time.Second, "three ticks without a write", func() error {
		if got := n.AppliedIndex(); got < start+3 {
			return fmt.Errorf("applied index %d, started at %d", got, start)
		}
		return nil
	})
	if ci := n.ClockInfo(); ci.MeasuredAgoMs == nil || *ci.MeasuredAgoMs > 1000 || !ci.LocalAnswers {
		t.Errorf("clock info while ticking: %+v", ci)
	}
}

// TestLocalAnswersNeedRecentContact: with the margin narrowed to 2 s, a follower that
// hears its leader's heartbeats but applies nothing for longer than the margin has an
// offset too old to rely on (offset_unmeasured), and one cut off from every leader for
// longer says so (no_leader_contact), though its offset is as old: the lost contact is
// the cause. A write brings local answers back. Both refusals used to be checked in the
// other order, so no_leader_contact could never be the answer.
func TestLocalAnswersNeedRecentContact(t *testing.T) {
	const margin = 2 * time.Second
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(_ int, cfg *node.Config) {
		cfg.LocalAnswerMargin = margin
		cfg.ClockTick = -1 // no entry but the test's own
	}))
	ctx := ctxT(t)
	li := c.LeaderIndex(t)
	fi := (li + 1) % 3
	// A record kept a day: its expiry is far beyond any margin.
	settle(t, c.Node(li), reserveReq("done", "a1", fp("done")), idemkv.StatusCommitted)
	ask := func() error {
		_, err := c.Node(fi).Reserve(ctx, reserveReq("done", "a2", fp("done")))
		return err
	}
	waitFor(t, 10*time.Second, "a local answer right after a write", ask)

	waitFor(t, 10*time.Second, "the offset outlives the margin", func() error {
		if ci := c.Node(fi).ClockInfo(); ci.LocalAnswersOff != "offset_unmeasured" {
			return fmt.Errorf("clock info %+v", ci)
		}
		return nil
	})
	if err := ask(); !errors.Is(err, idemkv.ErrNotLeader) {
		t.Errorf("follower reserve with an offset older than the margin: %v; want ErrNotLeader (no local answer)", err)
	}
	if addr, _ := c.Node(fi).Leader(); addr == "" {
		t.Fatal("the follower lost its leader: the refusal above was not the offset's alone")
	}

	settle(t, c.Node(li), reserveReq("w1", "a1", fp("w1")), idemkv.StatusCommitted)
	waitFor(t, 10*time.Second, "a local answer after a write", ask)

	// Cut the follower off: stop the other two nodes.
	for i := range 3 {
		if i != fi {
			c.Stop(i)
		}
	}
	waitFor(t, 15*time.Second, "no leader contact", func() error {
		if ci := c.Node(fi).ClockInfo(); ci.LocalAnswersOff != "no_leader_contact" {
			return fmt.Errorf("clock info %+v", ci)
		}
		return nil
	})
	if err := ask(); err == nil {
		t.Error("a follower cut off from every leader answered locally")
	}
}

// heldLog holds every append of the log store under it while held is set, as a
// follower that a pause or a stalled disk keeps from taking in entries.
type heldLog struct {
	raft.LogStore
	held *atomic.Bool
}

func (l heldLog) StoreLog(e *raft.Log) error { return l.StoreLogs([]*raft.Log{e}) }

func (l heldLog) StoreLogs(es []*raft.Log) error {
	for l.held.Load() {
		time.Sleep(5 * time.Millisecond)
	}
	return l.LogStore.StoreLogs(es)
}

// TestFollowerThatLagsAnswersByItsWallClock: a follower stops taking in entries and its
// monotonic clock stops (a VM paused), while the cluster goes on for 3 min: a record it
// holds expires and its key is committed again with another effect. Its offset and its
// leader contact still look fresh by its stopped monotonic clock; what keeps it from
// answering from its old state is its wall clock, set right on resume (docs/protocol.md
// section 3): the replaced record is within the margin of that clock, so the follower
// forwards both effects' reserves, and still answers a record kept a day.
func TestFollowerThatLagsAnswersByItsWallClock(t *testing.T) {
	base := time.Now()
	walls := []*testClock{newTestClock(base), newTestClock(base), newTestClock(base)}
	monos := []*testClock{newTestClock(base), newTestClock(base), newTestClock(base)}
	var held [3]atomic.Bool
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
		cfg.Now, cfg.Monotonic = walls[i].Now, monos[i].Elapsed
		cfg.WrapRaftStores = func(s node.RaftStores) node.RaftStores {
			s.Log = heldLog{LogStore: s.Log, held: &held[i]}
			return s
		}
	}))
	ctx := ctxT(t)
	li := c.LeaderIndex(t)
	fi := (li + 1) % 3
	leader, f := c.Node(li), c.Node(fi)
	settle(t, leader, withTTL(reserveReq("k", "a1", fp("A")), 2*time.Minute), idemkv.StatusCommitted)
	settle(t, leader, reserveReq("kept", "a1", fp("kept")), idemkv.StatusCommitted)
	want := leader.AppliedIndex()
	waitFor(t, 10*time.Second, "the follower applies the writes", func() error {
		if got := f.AppliedIndex(); got < want {
			return fmt.Errorf("follower at %d, leader at %d", got, want)
		}
		return nil
	})
	if res, err := f.Reserve(ctx, reserveReq("k", "a2", fp("A"))); err != nil || res.Decision != idemkv.DecisionReplay {
		t.Fatalf("follower reserve of k before the pause: %+v, %v; want a local replay", res, err)
	}

	// The pause: the follower takes in nothing and its monotonic clock stands still;
	// every wall clock, the follower's too (set right on resume), moves 3 min.
	held[fi].Store(true)
	t.Cleanup(func() { held[fi].Store(false) })
	for i := range 3 {
		walls[i].Advance(3 * time.Minute)
		if i != fi {
			monos[i].Advance(3 * time.Minute)
		}
	}
	settle(t, leader, reserveReq("w", "a1", fp("w")), idemkv.StatusCommitted)
	settle(t, leader, reserveReq("k", "b1", fp("B")), idemkv.StatusCommitted)
	if f.AppliedIndex() >= leader.AppliedIndex() {
		t.Fatal("the held follower applied the cluster's later entries: the test lost its premise")
	}
	if ci := f.ClockInfo(); !ci.LocalAnswers {
		t.Fatalf("the paused follower's clock checks refuse already (%+v): the test shows nothing of its wall clock", ci)
	}
	for _, e := range []string{"A", "B"} {
		if res, err := f.Reserve(ctx, reserveReq("k", "x-"+e, fp(e))); !errors.Is(err, idemkv.ErrNotLeader) {
			t.Errorf("lagging follower reserve of k with effect %s: %+v, %v; want ErrNotLeader (no local answer): k expired and holds B's receipt now", e, res, err)
		}
	}
	if res, err := f.Reserve(ctx, reserveReq("kept", "a2", fp("kept"))); err != nil || res.Decision != idemkv.DecisionReplay {
		t.Errorf("lagging follower reserve of a record kept a day: %+v, %v; want a local replay", res, err)
	}
}
