package node

import (
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestStopHeartbeatsWaitsForTheHandler: Raft's heartbeat handler runs on the transport's
// connection goroutine, which Raft.Shutdown does not wait for; Close used to close the
// log store under a heartbeat still on its way to saving a newer term, and Raft
// panicked. stopHeartbeats must wait for a handler under way, and no handler may run
// after it. The heartbeats are real ones, sent by another transport over TCP.
func TestStopHeartbeatsWaitsForTheHandler(t *testing.T) {
	nt, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 5*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	tr := &heartbeatTransport{NetworkTransport: nt}
	defer tr.Close() //nolint:errcheck // a test's transport
	entered, release := make(chan struct{}, 4), make(chan struct{})
	var calls atomic.Int32
	var storeClosed, closedUnderHandler atomic.Bool
	tr.SetHeartbeatHandler(func(rpc raft.RPC) {
		calls.Add(1)
		entered <- struct{}{}
		<-release
		if storeClosed.Load() {
			closedUnderHandler.Store(true) // it would save the term now
		}
		rpc.Respond(&raft.AppendEntriesResponse{Term: 1, Success: true}, nil)
	})

	sender, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, 5*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Close() //nolint:errcheck // a test's transport
	heartbeat := func() error {
		var resp raft.AppendEntriesResponse
		return sender.AppendEntries("n1", tr.LocalAddr(), &raft.AppendEntriesRequest{
			RPCHeader: raft.RPCHeader{ID: []byte("n2"), Addr: []byte(sender.LocalAddr())}, Term: 1,
		}, &resp)
	}
	first := make(chan error, 1)
	go func() { first <- heartbeat() }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the heartbeat never reached the handler")
	}

	stopped := make(chan struct{})
	go func() {
		tr.stopHeartbeats()
		storeClosed.Store(true) // what Close does next
		close(stopped)
	}()
	select {
	case <-stopped:
		t.Fatal("stopHeartbeats returned while a heartbeat handler was still running")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	<-stopped
	if closedUnderHandler.Load() {
		t.Fatal("the store closed under a running heartbeat handler")
	}
	if err := <-first; err != nil {
		t.Fatalf("the heartbeat under way: %v", err)
	}

	// A heartbeat after the stop is not handled (and not answered: the transport's
	// close ends the wait, as for a shut-down Raft).
	late := make(chan error, 1)
	go func() { late <- heartbeat() }()
	time.Sleep(200 * time.Millisecond)
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-late:
		if err == nil {
			t.Fatal("a heartbeat after the stop was answered")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a heartbeat after the stop and the close never returned")
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want once (none after the stop)", n)
	}
}
