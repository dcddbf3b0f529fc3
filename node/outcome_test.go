package node_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// TestProposedWriteWithoutAnswerIsOutcomeUnknown: a leader that proposed a write and
// then cannot finish it answers outcome_unknown, not unavailable: the caller that gives
// up waiting (its deadline) and the one whose leader loses leadership while
// replicating may both see the write applied later. A write refused before it was
// proposed stays unavailable (issue 12, defect 6).
func TestProposedWriteWithoutAnswerIsOutcomeUnknown(t *testing.T) {
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(_ int, cfg *node.Config) {
		// The leader keeps leading this long after it lost its followers.
		cfg.HeartbeatTimeout = 3 * time.Second
		cfg.ElectionTimeout = 3 * time.Second
		cfg.LeaderLeaseTimeout = 3 * time.Second
	}))
	l := c.WaitLeader()
	leader := c.Node(l)
	for i := range c.Len() {
		if i != l {
			c.Stop(i)
		}
	}
	if !leader.IsLeader() {
		t.Fatal("the leader stepped down before the test could propose: the scenario is wrong")
	}

	// The caller's deadline passes while the entry waits for a quorum.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := leader.Reserve(ctx, reserveReq("k1", "a1", fp("k1")))
	if !errors.Is(err, idemkv.ErrOutcomeUnknown) || !strings.Contains(err.Error(), "after proposing") {
		t.Fatalf("reserve past its deadline: %v, want outcome_unknown after proposing", err)
	}

	// The leader steps down with the entry in flight.
	_, err = leader.Reserve(opsCtx(t), reserveReq("k2", "a2", fp("k2")))
	if !errors.Is(err, idemkv.ErrOutcomeUnknown) || !strings.Contains(err.Error(), "leadership lost") {
		t.Fatalf("reserve while leadership is lost: %v, want outcome_unknown (leadership lost)", err)
	}

	// Now not the leader: refused before proposing, certainly not applied.
	if err := testcluster.Eventually(10*time.Second, func() error {
		if leader.IsLeader() {
			return errors.New("still the leader")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_, err = leader.Reserve(opsCtx(t), reserveReq("k3", "a3", fp("k3")))
	if !errors.Is(err, idemkv.ErrUnavailable) || errors.Is(err, idemkv.ErrOutcomeUnknown) {
		t.Fatalf("reserve on a former leader: %v, want unavailable", err)
	}
}

// TestWaitingWritesShareOneWaiter: writes waiting for a quorum do not each park a
// goroutine on their Raft future; one waiter per node does (issue 27: a goroutine per
// write cost 3-4% of a leader's CPU). Twenty writes wait on a leader whose followers
// are stopped; the goroutines blocked in a future's Error() from this package are
// counted from a dump of every stack.
func TestWaitingWritesShareOneWaiter(t *testing.T) {
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(_ int, cfg *node.Config) {
		cfg.HeartbeatTimeout = 5 * time.Second
		cfg.ElectionTimeout = 5 * time.Second
		cfg.LeaderLeaseTimeout = 5 * time.Second
	}))
	l := c.WaitLeader()
	leader := c.Node(l)
	for i := range c.Len() {
		if i != l {
			c.Stop(i)
		}
	}
	const writes = 20
	errs := make(chan error, writes)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for i := range writes {
		k := fmt.Sprintf("w%d", i)
		go func() {
			_, err := leader.Reserve(ctx, reserveReq(k, "a"+k, fp(k)))
			errs <- err
		}()
	}
	// Every write is waiting once twenty callers are parked in waitProposed.
	var waiters int
	if err := testcluster.Eventually(2*time.Second, func() error {
		buf := make([]byte, 1<<22)
		stacks := strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n")
		callers := 0
		waiters = 0
		for _, s := range stacks {
			if strings.Contains(s, "node.(*Node).waitProposed(") {
				callers++
			}
			if strings.Contains(s, "raft.(*deferError).Error(") && strings.Contains(s, "idemkv/node.") {
				waiters++
			}
		}
		if callers != writes {
			return fmt.Errorf("%d of %d writes waiting", callers, writes)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if waiters != 1 {
		t.Fatalf("%d goroutines of the node blocked on Raft futures for %d waiting writes, want 1", waiters, writes)
	}
	cancel()
	for range writes {
		if err := <-errs; !errors.Is(err, idemkv.ErrOutcomeUnknown) {
			t.Fatalf("a write whose caller gave up: %v, want outcome_unknown", err)
		}
	}
}
