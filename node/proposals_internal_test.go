package node

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// heldFuture is an ApplyFuture whose Error blocks until the test answers it.
type heldFuture struct{ answer chan error }

func newHeldFuture() *heldFuture { return &heldFuture{answer: make(chan error, 1)} }

func (f *heldFuture) Error() error          { return <-f.answer }
func (f *heldFuture) Index() uint64         { return 0 }
func (f *heldFuture) Response() interface{} { return nil }

func recvWithin(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no answer within 5s", what)
		return nil
	}
}

func notYet(t *testing.T, ch <-chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s answered (%v) before its future was", what, err)
	case <-time.After(20 * time.Millisecond):
	}
}

// TestProposalsAnswerEachWriteWithItsOwnFuture: every queued write gets its own
// future's answer, whether Raft answers in queue order, out of it (a write that queued
// late), or with an error; and a write is answered no earlier than its future.
func TestProposalsAnswerEachWriteWithItsOwnFuture(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := newProposals()
	go p.run(ctx)

	a, b, c := newHeldFuture(), newHeldFuture(), newHeldFuture()
	da, _ := p.add(a)
	db, _ := p.add(b)
	dc, _ := p.add(c)
	notYet(t, da, "a")

	// b and c answered before a: the waiter is blocked on a, and answers them after it.
	b.answer <- nil
	c.answer <- raft.ErrLeadershipLost
	notYet(t, db, "b")
	a.answer <- raft.ErrNotLeader
	if err := recvWithin(t, da, "a"); !errors.Is(err, raft.ErrNotLeader) {
		t.Fatalf("a: %v, want its own future's ErrNotLeader", err)
	}
	if err := recvWithin(t, db, "b"); err != nil {
		t.Fatalf("b: %v, want nil", err)
	}
	if err := recvWithin(t, dc, "c"); !errors.Is(err, raft.ErrLeadershipLost) {
		t.Fatalf("c: %v, want ErrLeadershipLost", err)
	}

	// A write queued once the waiter is idle again wakes it.
	d := newHeldFuture()
	dd, _ := p.add(d)
	d.answer <- nil
	if err := recvWithin(t, dd, "d"); err != nil {
		t.Fatalf("d: %v", err)
	}
}

// TestProposalsStopOnlyOnceEveryQueuedWriteIsAnswered: the waiter outlives its context
// while writes are queued, answers each, then refuses new ones rather than leaving
// them without an answer.
func TestProposalsStopOnlyOnceEveryQueuedWriteIsAnswered(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	p := newProposals()
	stopped := make(chan struct{})
	go func() { p.run(ctx); close(stopped) }()

	a := newHeldFuture()
	da, ok := p.add(a)
	if !ok {
		t.Fatal("add refused before the context ended")
	}
	cancel()
	select {
	case <-stopped:
		t.Fatal("the waiter stopped with a write queued")
	case <-time.After(50 * time.Millisecond):
	}
	a.answer <- raft.ErrRaftShutdown
	if err := recvWithin(t, da, "a"); !errors.Is(err, raft.ErrRaftShutdown) {
		t.Fatalf("a: %v, want ErrRaftShutdown", err)
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not stop once its queue was empty and its context ended")
	}
	if _, ok := p.add(newHeldFuture()); ok {
		t.Fatal("add accepted a write after the waiter stopped: it would never be answered")
	}
}
