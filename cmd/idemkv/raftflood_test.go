package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/raftflood"
)

// TestRaftPortFloodThenSIGKILLOfTheLeader is issue 22's point 7 as it was found:
// three real processes with peer mTLS, every Raft port flooded with idle sockets from
// other hosts (127.0.0.2 and up), the leader killed with SIGKILL. The old listener
// (64 pending handshakes, the newest refused, 10 s each) kept the survivors from
// reaching each other: ~90 sockets per port, no leader for the whole 32 s of the
// flood. Now a new leader must come within 10 s, and commit.
func TestRaftPortFloodThenSIGKILLOfTheLeader(t *testing.T) {
	const sources, perSource = 8, 16 // 128 per port
	h := startHostileCluster(t)
	e := h.e
	var targets []string
	for _, ni := range h.info.Nodes {
		targets = append(targets, ni.RaftAddr)
	}
	f := raftflood.Start(targets, sources, perSource)
	t.Cleanup(f.Stop)
	if err := f.TakeHold(context.Background(), len(targets)*sources*perSource, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	old := h.leader
	_ = old.signal(syscall.SIGKILL)
	killed := time.Now()
	var leader *opsProc
	waitFor(t, 10*time.Second, "a new leader under the flood", func() error {
		for _, p := range h.procs {
			if p == old {
				continue
			}
			a := e.req(t, http.MethodGet, p.httpAddr, "/v1/cluster", e.tokens["admin"], nil)
			var info idemkv.ClusterInfo
			if a.err != nil || a.status != http.StatusOK || json.Unmarshal([]byte(a.body), &info) != nil {
				continue
			}
			if info.Leader.ID == p.id {
				leader = p
				return nil
			}
		}
		return fmt.Errorf("no leader")
	})
	t.Logf("under the flood: %s leads %s after the SIGKILL of %s (%d dials, %d closed by the nodes)",
		leader.id, time.Since(killed).Round(time.Millisecond), old.id, f.Dials(), f.ClosedByNode())
	body := `{"tenant":"acme","idempotency_key":"under-flood","tool":"create_ticket","effect":{"n":1},"lease_ttl_ms":60000}`
	waitFor(t, 10*time.Second, "a reserve on the new leader under the flood", func() error {
		a := e.raw(t, http.MethodPost, leader.httpAddr, "/v1/reserve", e.tokens["acme"], []byte(body))
		var res idemkv.ReserveResult
		// in_progress: an earlier try went through and its answer was lost.
		if a.status != http.StatusOK || json.Unmarshal([]byte(a.body), &res) != nil ||
			res.Decision != idemkv.DecisionExecute && res.Decision != idemkv.DecisionInProgress {
			return fmt.Errorf("%d %s %v", a.status, a.body, a.err)
		}
		return nil
	})
}
