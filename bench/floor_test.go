package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv/loadgen"
)

// TestProbeFloorsMeasuresEachLayer runs the floors for real, briefly, on this disk:
// raft-wal on a data dir, a hashicorp/raft voter, a net/http server on loopback. Each
// layer measured writes and left nothing behind.
func TestProbeFloorsMeasuresEachLayer(t *testing.T) {
	dir := t.TempDir()
	f, err := probeFloors(t.Context(), dir, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]loadgen.Summary{"append": f.Append, "raft": f.Raft, "http": f.HTTPRaft} {
		if s.Count == 0 || s.P50 <= 0 || s.Mean <= 0 {
			t.Errorf("%s floor: %+v", name, s)
		}
	}
	if f.EntryBytes != floorEntryBytes {
		t.Errorf("entry bytes %d", f.EntryBytes)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("the floors left %v in their directory", left)
	}
}

func TestProbeFloorsStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := probeFloors(ctx, t.TempDir(), time.Minute); err == nil {
		t.Fatal("a cancelled probe measured a minute")
	}
}

// TestFloorsPrintedOnceBesideTheOneNodeReserves: the floors sit in the one-node
// pairing, beside each one-node idemkv's reserve and the single PostgreSQL's, and a
// merge of parts keeps the first part's.
func TestFloorsPrintedOnceBesideTheOneNodeReserves(t *testing.T) {
	r := results()
	r.Floors = &Floors{EntryBytes: 400, Append: loadgen.Summary{P50: 0.05, Mean: 0.06},
		Raft: loadgen.Summary{P50: 0.07, Mean: 0.08}, HTTPRaft: loadgen.Summary{P50: 0.15, Mean: 0.16}}
	r.Targets = verdicts(r)
	md := markdown(r)
	single := strings.Index(md, "### 1 idemkv node vs 1 PostgreSQL")
	etcd := strings.Index(md, "### 3 idemkv nodes vs 3 etcd members")
	at := strings.Index(md, "Floors of one write by a lone writer")
	if at < single || at > etcd || strings.Count(md, "Floors of one write") != 1 {
		t.Fatalf("floors at %d, want once between %d and %d:\n%s", at, single, etcd, md)
	}
	for _, want := range []string{
		"| raft-wal's append of one entry, until durable | 0.050 | 0.060 |",
		"| hashicorp/raft, one voter on raft-wal: Apply until applied | 0.070 | 0.080 |",
		"| that Apply behind net/http: a POST over loopback on a kept connection | 0.150 | 0.160 |",
		"| idemkv, 1 node, wal log: a reserve | 0.250 | — |",
		"| PostgreSQL, 1 server: a reserve | 0.250 | — |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}

	// Without a peer the floors still print, after the tables.
	alone := &Results{Floors: r.Floors, Systems: []SystemInfo{{Name: "idemkv-1/wal", Label: "idemkv, 1 node, wal log", Nodes: 1}},
		New: []Point{{System: "idemkv-1/wal", Workload: "new", Concurrency: 1, OpsPerSec: 1, ReserveP50: 0.3}}}
	if md := markdown(alone); !strings.Contains(md, "| idemkv, 1 node, wal log: a reserve | 0.300 | — |") {
		t.Errorf("a run without a peer lacks its floors:\n%s", md)
	}

	// run.sh measures the floors in its first part only; the report keeps them.
	dir := t.TempDir()
	var files []string
	for i, s := range r.Systems[4:6] { // idemkv-1/wal and the single PostgreSQL
		part := &Results{Duration: "10s", Warmup: "3s", Systems: []SystemInfo{s}}
		for _, p := range r.New {
			if p.System == s.Name {
				part.New = append(part.New, p)
			}
		}
		if i == 0 {
			part.Floors = r.Floors
		}
		files = append(files, filepath.Join(dir, s.Name[:4]+string(rune('a'+i))+".json"))
		if err := writeJSON(files[i], part); err != nil {
			t.Fatal(err)
		}
	}
	if err := runReport(t.Context(), append([]string{"--out", dir}, files...), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if got := readResults(t, dir); got.Floors == nil || *got.Floors != *r.Floors {
		t.Errorf("merged floors %+v, want %+v", got.Floors, r.Floors)
	}
}
