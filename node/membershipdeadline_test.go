package node_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
)

// TestMembershipChangeWithAPassedDeadlineEnds: a membership change hands Raft the time
// left to the request's deadline as its enqueue timeout, and Raft takes a timeout that
// is not positive for none at all. A change whose deadline had passed by then (an
// ended request, or one that spent its time in the removal guard) waited to be
// enqueued for good while the leader's loop could not take it: here a loop held in an
// append, as behind a forced removal that cannot commit. Nothing was proposed, so it
// is unavailable, at once. So is a change whose deadline is still ahead and whose
// enqueue Raft gives up with it: the wait, ending at the same moment, answered
// outcome_unknown for a change Raft never took.
func TestMembershipChangeWithAPassedDeadlineEnds(t *testing.T) {
	c, logs := startStalling(t, 1)
	n := c.Node(c.WaitLeader())
	ctx := ctxT(t)
	if _, err := reserveAndCommit(ctx, n, "before", true); err != nil {
		t.Fatal(err)
	}
	holdAWrite(t, ctx, n, logs[0], "held")

	// A deadline still ahead: Raft's enqueue times out with it, and the change was
	// never proposed.
	t.Run("enqueue timed out", func(t *testing.T) {
		dctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		_, err := n.Remove(dctx, &idemkv.RemoveRequest{ID: c.ID(0), Force: true})
		if !errors.Is(err, idemkv.ErrUnavailable) {
			t.Fatalf("a removal Raft never took (its enqueue timed out): %v, want unavailable", err)
		}
	})
	for _, tc := range []struct {
		name   string
		change func(context.Context) error
	}{
		{"remove", func(ctx context.Context) error {
			_, err := n.Remove(ctx, &idemkv.RemoveRequest{ID: c.ID(0), Force: true})
			return err
		}},
		{"join", func(ctx context.Context) error {
			_, err := n.Join(ctx, &idemkv.JoinRequest{ID: "n9", RaftAddr: "127.0.0.1:1", APIAddr: "127.0.0.1:2", Format: n.Format(), Stage: idemkv.JoinLearner})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dctx, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Millisecond))
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- tc.change(dctx) }()
			select {
			case err := <-done:
				if !errors.Is(err, idemkv.ErrUnavailable) {
					t.Fatalf("a %s whose deadline had passed: %v, want unavailable (nothing was proposed)", tc.name, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("a %s whose deadline had passed still waits 5 s on, on a leader whose loop cannot take it", tc.name)
			}
		})
	}
}
