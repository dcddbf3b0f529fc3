// Package raftflood floods Raft ports with idle sockets, as a stranger who reaches
// them would: tests of the Raft listener and jepsen-lite's raft-port nemesis use it.
//
// It is for tests only; nothing in the server imports it.
package raftflood

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Flood keeps idle sockets open on Raft ports.
type Flood struct {
	dials, closedByNode atomic.Int64
	cancel              context.CancelFunc
	wg                  sync.WaitGroup
	once                sync.Once
}

// Start opens perSource connections from each of sources loopback addresses
// (127.0.0.2 and up, which stand for other hosts) to every target, none of which
// ever sends a byte; each is redialled as soon as the node closes it, until Stop.
func Start(targets []string, sources, perSource int) *Flood {
	ctx, cancel := context.WithCancel(context.Background())
	f := &Flood{cancel: cancel}
	for _, target := range targets {
		for s := range sources {
			src := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+s))}
			for range perSource {
				f.wg.Add(1)
				go f.hold(ctx, target, src)
			}
		}
	}
	return f
}

func (f *Flood) hold(ctx context.Context, target string, src *net.TCPAddr) {
	defer f.wg.Done()
	d := net.Dialer{LocalAddr: src, Timeout: 2 * time.Second}
	for ctx.Err() == nil {
		c, err := d.DialContext(ctx, "tcp", target)
		if err != nil {
			// The node is down (killed) or its backlog is full: try again shortly.
			t := time.NewTimer(20 * time.Millisecond)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			continue
		}
		f.dials.Add(1)
		stop := context.AfterFunc(ctx, func() { c.Close() })
		var b [1]byte
		_, _ = c.Read(b[:]) // returns when the node closes it, or at Stop
		stop()
		c.Close()
		if ctx.Err() == nil {
			f.closedByNode.Add(1)
		}
	}
}

// Dials counts the connections that were established; ClosedByNode those the nodes
// closed.
func (f *Flood) Dials() int64        { return f.dials.Load() }
func (f *Flood) ClosedByNode() int64 { return f.closedByNode.Load() }

// TakeHold waits until at least sockets connections were established and the nodes
// closed some (the ones over their caps): the flood has its effect.
func (f *Flood) TakeHold(ctx context.Context, sockets int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if f.Dials() >= int64(sockets) && f.ClosedByNode() > 0 {
			return nil
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	return fmt.Errorf("raftflood: the flood did not take hold within %s: %d of %d sockets dialled, %d closed by the nodes",
		limit, f.Dials(), sockets, f.ClosedByNode())
}

// Stop closes every socket and waits for the flood's goroutines.
func (f *Flood) Stop() {
	f.once.Do(func() {
		f.cancel()
		f.wg.Wait()
	})
}
