package node_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// failingLog fails every append to Raft's log with an I/O error while on.
type failingLog struct {
	raft.LogStore
	on     *atomic.Bool
	failed *atomic.Int64
}

func (l failingLog) StoreLog(e *raft.Log) error { return l.StoreLogs([]*raft.Log{e}) }

func (l failingLog) StoreLogs(es []*raft.Log) error {
	if l.on.Load() {
		l.failed.Add(1)
		return fmt.Errorf("injected raft log write failure: %w", syscall.EIO)
	}
	return l.LogStore.StoreLogs(es)
}

// TestRaftLogWriteFaultsUnderLoad: appends to Raft's log fail, on the leader (which
// steps down and fails the writes it had not stored) and on followers (which refuse
// the entries), in short bursts on a random node while four clients commit. No
// acknowledged commit may be lost and every replica must end in the same state, on
// each Raft log backend.
func TestRaftLogWriteFaultsUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("a load run of several seconds")
	}
	for _, backend := range node.RaftLogs {
		t.Run(backend, func(t *testing.T) { raftLogWriteFaults(t, backend) })
	}
}

func raftLogWriteFaults(t *testing.T, backend string) {
	on := []*atomic.Bool{new(atomic.Bool), new(atomic.Bool), new(atomic.Bool)}
	var failed atomic.Int64
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
		cfg.RaftLog = backend
		cfg.WrapRaftStores = func(s node.RaftStores) node.RaftStores {
			s.Log = failingLog{LogStore: s.Log, on: on[i], failed: &failed}
			return s
		}
	}))
	w := &writer{c: c, acked: map[string]string{}}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for id := range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); w.run(ctx, id) }()
	}
	r := rand.New(rand.NewPCG(1, 2))
	bursts := 0
	for deadline := time.Now().Add(8 * time.Second); time.Now().Before(deadline); bursts++ {
		victim := r.IntN(3)
		if r.IntN(2) == 0 {
			victim = c.WaitLeader()
		}
		on[victim].Store(true)
		time.Sleep(time.Duration(100+r.IntN(300)) * time.Millisecond)
		on[victim].Store(false)
		time.Sleep(time.Duration(200+r.IntN(300)) * time.Millisecond)
	}
	stop()
	wg.Wait()
	if failed.Load() == 0 {
		t.Fatal("no append failed: the faults never fired")
	}
	lost := w.lostAcked(t)
	w.mu.Lock()
	acked := len(w.acked)
	w.mu.Unlock()
	t.Logf("%d bursts, %d appends failed, %d of %d commits acknowledged", bursts, failed.Load(), acked, w.tries.Load())
	if acked == 0 {
		t.Fatal("no commit was acknowledged: the test proved nothing")
	}
	if len(lost) > 0 {
		t.Fatalf("%d of %d acknowledged commits lost, e.g. %v", len(lost), acked, lost[:min(5, len(lost))])
	}
	c.WaitConverged()
}
