package node_test

import (
	"context"
	"errors"
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
