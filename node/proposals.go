package node

import (
	"context"
	"sync"

	"github.com/hashicorp/raft"
)

// proposals waits for the futures of the entries this node hands to Raft on one
// goroutine, so that a write waiting for its entry needs no goroutine of its own.
// Raft's futures have no channel to select on, only a blocking Error(), and a write
// must also stop waiting when its caller's context ends (outcome_unknown): until issue
// 27 every write started a goroutine to call Error() and selected on its answer,
// which cost 3-4% of a leader's CPU under load (the goroutine's start, its park on
// the future and its exit, once per write).
//
// The waiter takes the futures in the order they were queued and blocks on each in
// turn. Raft answers a leader's futures in log order (each when its entry is applied;
// all in flight at once when leadership is lost; a follower's at once with
// ErrNotLeader), and a write queues its future as soon as raft.Apply returns, so the
// one it blocks on is almost always the next to be answered; a write queued out of
// step with its log position waits at most until the entry before it is answered,
// which is in the same or the next batch.
type proposals struct {
	mu     sync.Mutex
	queue  []*proposal
	spare  []*proposal // the previous queue's array, reused
	closed bool        // the waiter has stopped: nothing more is queued
	wake   chan struct{}
}

// proposal is one future being waited for; done gets its Error() once.
type proposal struct {
	f    raft.ApplyFuture
	done chan error
}

func newProposals() *proposals {
	return &proposals{wake: make(chan struct{}, 1)}
}

// add queues f for the waiter and returns the channel that gets f.Error(), or false
// when the waiter has stopped (the node is closing).
func (p *proposals) add(f raft.ApplyFuture) (<-chan error, bool) {
	w := &proposal{f: f, done: make(chan error, 1)}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false
	}
	p.queue = append(p.queue, w)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default: // the waiter has a wake-up pending and will see the queue
	}
	return w.done, true
}

// run waits for the queued futures until ctx ends and the queue is empty. Futures
// queued before the end are still waited for, so no write's channel is left without
// an answer. A future that Raft never answers (one still in its apply queue when it
// shut down) keeps run blocked on it, and so past Close: the one goroutine a write can
// leave behind, where each write's own goroutine could before.
func (p *proposals) run(ctx context.Context) {
	for {
		p.mu.Lock()
		batch := p.queue
		p.queue, p.spare = p.spare[:0], nil
		if len(batch) == 0 && ctx.Err() != nil {
			p.closed = true
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		if len(batch) == 0 {
			select {
			case <-p.wake:
			case <-ctx.Done():
			}
			continue
		}
		for i, w := range batch {
			w.done <- w.f.Error()
			batch[i] = nil // the answered write's future is no longer referenced
		}
		p.mu.Lock()
		p.spare = batch[:0]
		p.mu.Unlock()
	}
}
