package nemesis

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testhooks"
	"github.com/idemkv/idemkv/jepsen-lite/internal/cluster"
)

// fakeNodes stands in for a cluster's API: every node names n1 its leader, takes clock
// offsets through the test hooks, and grants a probe lease, then recovery of it.
type fakeNodes struct {
	mu      sync.Mutex
	offsets map[string][]int64 // node ID -> every clock offset set, in order
	// ignoreOffsets makes every node take clock offsets and keep its clock: it
	// reports an offset of zero.
	ignoreOffsets bool
}

func (f *fakeNodes) handler(id string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/cluster", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(idemkv.ClusterInfo{Leader: idemkv.LeaderInfo{ID: "n1"}, Term: 1})
	})
	mux.HandleFunc("POST "+testhooks.PathHooks, func(w http.ResponseWriter, r *http.Request) {
		var u testhooks.StateUpdate
		if err := json.NewDecoder(r.Body).Decode(&u); err != nil || u.ClockOffsetMs == nil {
			http.Error(w, "bad update", http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.offsets[id] = append(f.offsets[id], *u.ClockOffsetMs)
		st := testhooks.State{ClockOffsetMs: *u.ClockOffsetMs}
		if f.ignoreOffsets {
			st.ClockOffsetMs = 0
		}
		f.mu.Unlock()
		_ = json.NewEncoder(w).Encode(st)
	})
	// Storage faults are taken and never fire: the fake has no store.
	mux.HandleFunc("POST "+testhooks.PathFaults, func(w http.ResponseWriter, r *http.Request) {
		var u testhooks.FaultUpdate
		if err := json.NewDecoder(r.Body).Decode(&u); err != nil {
			http.Error(w, "bad update", http.StatusBadRequest)
			return
		}
		_ = json.NewEncoder(w).Encode(testhooks.FaultState{Faults: u.Faults, Injected: map[string]int64{}})
	})
	mux.HandleFunc("POST /v1/reserve", func(w http.ResponseWriter, r *http.Request) {
		var req idemkv.ReserveRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		d := idemkv.DecisionExecute
		if strings.HasPrefix(req.AttemptID, "probe-b-") {
			d = idemkv.DecisionRecover
		}
		_ = json.NewEncoder(w).Encode(idemkv.ReserveResult{Decision: d})
	})
	return mux
}

// startFakeCluster runs a three-node cluster whose processes only sleep, with fake's
// API served on their addresses.
func startFakeCluster(t *testing.T, fake *fakeNodes) *cluster.Cluster {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	bin := filepath.Join(t.TempDir(), "node")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexec sleep 600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := cluster.New(cluster.Config{Binary: bin, Nodes: 3, Dir: t.TempDir(), Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := range c.Size() {
			_ = c.Kill(i)
		}
		c.Close()
	})
	for i, node := range c.Nodes() {
		ln, err := net.Listen("tcp", node.APIAddr)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: fake.handler(node.ID)}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
		if err := c.StartNode(i); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// A fault that the end of the run catches between its steps still takes every step,
// only with shorter holds: the run's end is no harness error. The CI run of 2026-12-04
// failed on a clock-jump begun 1.9 s before the end, whose second step (the jump back)
// was sent on the run's expired context.
func TestFaultCaughtByTheRunsEndTakesEveryStep(t *testing.T) {
	for _, tc := range []struct {
		family  string
		runLeft time.Duration // how long the run still has when the fault begins
		jumps   int           // clock offsets other than zero the fault sets
	}{
		{FamilyClockJump, 300 * time.Millisecond, 2},
		{FamilyClock, 0, 1}, // the run ended while the fault was being drawn
	} {
		t.Run(tc.family, func(t *testing.T) {
			fake := &fakeNodes{offsets: map[string][]int64{}}
			c := startFakeCluster(t, fake)
			n := New(Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() int64 { return 1 },
				Hold: 2 * time.Second, Seed: 7}, c)

			run, end := context.WithTimeout(t.Context(), tc.runLeft)
			defer end()
			n.inject(run, tc.family)

			faults := n.Faults()
			if len(faults) != 1 {
				t.Fatalf("%d faults recorded, want 1", len(faults))
			}
			if f := faults[0]; f.Err != "" {
				t.Fatalf("a %s that the run's end cut short is a harness error: %s (detail %q)", f.Kind, f.Err, f.Detail)
			}
			fake.mu.Lock()
			defer fake.mu.Unlock()
			var jumped []int64
			for _, offs := range fake.offsets {
				for _, o := range offs {
					if o != 0 {
						jumped = append(jumped, o)
					}
				}
			}
			if len(jumped) != tc.jumps {
				t.Fatalf("the clock offsets set were %v (every node: %v), want %d", jumped, fake.offsets, tc.jumps)
			}
			if tc.jumps == 2 && (jumped[0] <= 0 || jumped[1] >= 0) {
				t.Fatalf("the clock jumps were %v, want one forward, then one back", jumped)
			}
		})
	}
}

// A fault whose effect needs the workload is judged only over a whole hold: a storage
// fault that never fired, or a follower isolated while the others' log never moved past
// a snapshot's reach, is a harness error when the run went on, and not when the run's end
// (which stops the workload) cut the hold short.
func TestEffectOfTheWorkloadJudgedOnlyOverAWholeHold(t *testing.T) {
	for _, tc := range []struct {
		name    string
		family  string
		runLeft time.Duration
		hold    time.Duration
		wantErr string
	}{
		{"disk-full, run ended during the hold", FamilyStorageDiskFull, 200 * time.Millisecond, 4 * time.Second, ""},
		{"disk-full, whole hold", FamilyStorageDiskFull, time.Minute, 400 * time.Millisecond, "never fired"},
		{"isolation, run ended during it", FamilySnapshot, 200 * time.Millisecond, 600 * time.Millisecond, ""},
		// Waits out the isolation's 30 s limit.
		{"isolation, run went on", FamilySnapshot, time.Minute, 600 * time.Millisecond, "did not move far enough"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startFakeCluster(t, &fakeNodes{offsets: map[string][]int64{}})
			n := New(Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() int64 { return 1 },
				Hold: tc.hold, SnapshotGap: 100, Seed: 7}, c)
			run, end := context.WithTimeout(t.Context(), tc.runLeft)
			defer end()
			n.inject(run, tc.family)
			f := n.Faults()[0]
			switch {
			case tc.wantErr == "" && f.Err != "":
				t.Fatalf("a %s that the run's end cut short is a harness error: %s (detail %q)", f.Kind, f.Err, f.Detail)
			case tc.wantErr != "" && !strings.Contains(f.Err, tc.wantErr):
				t.Fatalf("a %s that had its whole hold: error %q, want %q", f.Kind, f.Err, tc.wantErr)
			}
		})
	}
}
