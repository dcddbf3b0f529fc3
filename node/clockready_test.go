package node_test

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/metrics"
)

// TestWriteBeforeEstablishDoesNotFollowAFastClock: a node restarts with its wall clock
// 3 h fast and a store that kept nothing of what it applied (Pebble's unsynced writes
// lost to a kill -9; here the whole store, the worst case), so it knows no state-machine
// time until it has replayed its log. Writes arrive the moment it wins the election. A
// write proposed then, before the new leader applied the entries of earlier terms,
// used to be stamped from the wall clock, unclamped and uncounted: the state machine
// clock jumped 3 h, a 60 s lease granted before the restart answered recover and a
// record kept for 2 h answered execute (a CI run of TestRestartWithClockAheadWinsElection,
// where the joiners' requests reached n1 first). Every write now waits until the
// leader is ready, whose first stamp anchors at the replayed state machine clock.
func TestWriteBeforeEstablishDoesNotFollowAFastClock(t *testing.T) {
	dir := t.TempDir()
	cfg := opsNodeConfig(t, "n1", dir)
	cfg.Bootstrap = true
	quickTimings(&cfg)
	cfg.SnapshotThreshold, cfg.SnapshotInterval = 1<<20, time.Hour // the log holds every entry
	var offset atomic.Int64
	cfg.Now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	ctx := opsCtx(t)
	n := openNode(t, cfg)
	waitLeaderReady(t, n)
	lease := reserveReq("refund:17", "a1", fp("refund:17"))
	lease.LeaseTTLMs = 60_000
	if res, err := n.Reserve(ctx, lease); err != nil || res.Decision != idemkv.DecisionExecute {
		t.Fatalf("reserve the lease: %v %+v", err, res)
	}
	kept := reserveReq("ticket:9", "a1", fp("ticket:9"))
	kept.TTLMs = 2 * 3600_000
	res, err := n.Reserve(ctx, kept)
	if err != nil || res.Decision != idemkv.DecisionExecute {
		t.Fatalf("reserve the kept record: %v %+v", err, res)
	}
	if _, err := n.Commit(ctx, &idemkv.CommitRequest{Tenant: "acme", Key: kept.Key, Fingerprint: kept.Fingerprint,
		Fence: res.Fence, RemoteSystem: "linear", RemoteID: "LIN-9"}); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "pebble")); err != nil {
		t.Fatal(err)
	}

	offset.Store(int64(3 * time.Hour))
	cfg.Metrics = metrics.New()
	n = openNode(t, cfg)
	// Writers that keep trying from the moment the node opens, as joiners and clients
	// that retry on not_leader do.
	var wg sync.WaitGroup
	var first atomic.Bool
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := n.Reserve(ctx, reserveReq("probe", "p1", fp("probe")))
				if err == nil {
					first.Store(true)
					return
				}
				if !errors.Is(err, idemkv.ErrNotLeader) && !errors.Is(err, idemkv.ErrUnavailable) {
					t.Errorf("probe reserve: %v", err)
					return
				}
				time.Sleep(200 * time.Microsecond)
			}
		}()
	}
	waitLeaderReady(t, n)
	deadline := time.After(10 * time.Second)
	for !first.Load() {
		select {
		case <-deadline:
			close(stop)
			wg.Wait()
			t.Fatal("no probe reserve succeeded")
		case <-time.After(time.Millisecond):
		}
	}
	close(stop)
	wg.Wait()

	lease.AttemptID = "a2"
	if res, err := n.Reserve(ctx, lease); err != nil || res.Decision != idemkv.DecisionInProgress {
		t.Errorf("a second attempt at %s, seconds into a 60 s lease, after a restart 3 h fast: %v %+v, want in_progress", lease.Key, err, res)
	}
	kept.AttemptID = "a2"
	if res, err := n.Reserve(ctx, kept); err != nil || res.Decision != idemkv.DecisionReplay {
		t.Errorf("%s, committed seconds ago with 2 h retention, after a restart 3 h fast: %v %+v, want replay", kept.Key, err, res)
	}
	if clamped(t, cfg.Metrics) < 1 {
		t.Errorf("no clamped stamp counted after a restart 3 h fast")
	}
}
