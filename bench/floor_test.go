package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv/loadgen"
)

// floorServerEnv makes the test binary the other-process floor's server: a test
// binary runs tests, not `bench floor-server`.
const floorServerEnv = "BENCH_TEST_FLOOR_SERVER"

func TestMain(m *testing.M) {
	if dir := os.Getenv(floorServerEnv); dir != "" {
		if err := runFloorServer(context.Background(), []string{dir}, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "floor server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	floorServerCmd = func(ctx context.Context, dir string) (*exec.Cmd, error) {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), floorServerEnv+"="+dir)
		return cmd, nil
	}
	os.Exit(m.Run())
}

// TestProbeFloorsMeasuresEachLayer runs the floors for real, briefly, on this disk:
// raft-wal on a data dir, a hashicorp/raft voter, a net/http server on loopback,
// another process serving the same, and three voters in three processes. Each layer
// measured writes and left nothing behind: no file, no process.
func TestProbeFloorsMeasuresEachLayer(t *testing.T) {
	dir := t.TempDir()
	f, err := probeFloors(t.Context(), dir, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]loadgen.Summary{"append": f.Append, "raft": f.Raft, "http": f.HTTPRaft, "http, other process": f.HTTPRaftServer, "three voters": f.HTTPRaft3} {
		if s.Count == 0 || s.P50 <= 0 || s.Mean <= 0 {
			t.Errorf("%s floor: %+v", name, s)
		}
	}
	if len(f.HTTPRaft3Writers) != len(floorWriters) {
		t.Errorf("three voters measured with %+v writers, want %v", f.HTTPRaft3Writers, floorWriters)
	}
	for i, r := range f.HTTPRaft3Writers {
		if r.Writers != floorWriters[i] || r.WritesPerSec <= 0 {
			t.Errorf("three voters with %d writers: %+v", floorWriters[i], r)
		}
	}
	if f.EntryBytes != floorEntryBytes {
		t.Errorf("entry bytes %d", f.EntryBytes)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("the floors left %v in their directory", left)
	}
	if kids := childProcesses(t); len(kids) != 0 {
		t.Errorf("the floors left processes %v running", kids)
	}
}

// childProcesses lists this process's children, from /proc.
func childProcesses(t *testing.T) []string {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", os.Getpid()))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("no /proc task list: %v", err)
	}
	var kids []string
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // a thread that has exited
		}
		kids = append(kids, strings.Fields(string(b))...)
	}
	return kids
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
		Raft: loadgen.Summary{P50: 0.07, Mean: 0.08}, HTTPRaft: loadgen.Summary{P50: 0.15, Mean: 0.16},
		HTTPRaftServer: loadgen.Summary{Count: 100, P50: 0.2, Mean: 0.21}, HTTPRaft3: loadgen.Summary{Count: 100, P50: 0.6, Mean: 0.65}}
	r.Targets = verdicts(r)
	md := markdown(r)
	// The three voters' floor: once, in the first three-node pairing (PostgreSQL's).
	sync := strings.Index(md, "### 3 idemkv nodes vs PostgreSQL primary")
	at3 := strings.Index(md, "The floor of one write on three voters")
	if at3 < sync || at3 > strings.Index(md, "### 1 idemkv node vs 1 PostgreSQL") || strings.Count(md, "The floor of one write on three voters") != 1 {
		t.Fatalf("the three voters' floor at %d, want once after %d and before the one-node pairing:\n%s", at3, sync, md)
	}
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
		"| the same, served by another process (as idemkv's API is to the driver) | 0.200 | 0.210 |",
		"| idemkv, 1 node, wal log: a reserve | 0.250 | — |",
		"| PostgreSQL, 1 server: a reserve | 0.250 | — |",
		// The peer's reserve is above the last floor: the gap is idemkv's.
		"The reserve of PostgreSQL, 1 server (p50 0.250 ms) is 0.050 ms above the last floor (0.200 ms): all that is left for idemkv's own work on a write (decoding, checks, look-ups, its state machine's Pebble batch, the answer) if it is to match the peer. Each reserve on raft-wal less that floor: idemkv, 1 node, wal log +0.050 ms.",
		"| hashicorp/raft, three voters: Apply behind net/http, from another process | 0.600 | 0.650 |",
		// The quorum-sync primary's reserve is below the three voters' floor.
		"The reserve of PostgreSQL primary + 2 quorum-sync standbys (p50 0.500 ms) takes less than the last floor (0.600 ms)",
		"That would take a Raft whose leader sends an entry to its followers while it appends it (hashicorp/raft appends first), with fewer goroutine hand-offs on the way. Each reserve on raft-wal less that floor: idemkv, 3 nodes, wal log +0.150 ms.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}

	// A peer whose reserve is under the last floor: no work of idemkv's can close it.
	under := *r.Floors
	under.HTTPRaftServer.P50 = 0.3
	r.Floors = &under
	if md := markdown(r); !strings.Contains(md, "The reserve of PostgreSQL, 1 server (p50 0.250 ms) takes less than the last floor (0.300 ms)") ||
		!strings.Contains(md, "That would take a write path without Raft's goroutine hand-offs and net/http's between the request and the fsync. Each reserve on raft-wal less that floor: idemkv, 1 node, wal log -0.050 ms.") {
		t.Errorf("a peer under the last floor is not said to be:\n%s", md)
	}
	// Results from before the other-process floor: no row, no verdict.
	old := under
	old.HTTPRaftServer, old.HTTPRaft3 = loadgen.Summary{}, loadgen.Summary{}
	r.Floors = &old
	if md := markdown(r); strings.Contains(md, "served by another process") || strings.Contains(md, "last floor") {
		t.Errorf("results without the other-process floor print one:\n%s", md)
	}
	r.Floors = &Floors{EntryBytes: 400, Append: loadgen.Summary{P50: 0.05, Mean: 0.06},
		Raft: loadgen.Summary{P50: 0.07, Mean: 0.08}, HTTPRaft: loadgen.Summary{P50: 0.15, Mean: 0.16},
		HTTPRaftServer: loadgen.Summary{Count: 100, P50: 0.2, Mean: 0.21}}

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
	if got := readResults(t, dir); got.Floors == nil || !reflect.DeepEqual(*got.Floors, *r.Floors) {
		t.Errorf("merged floors %+v, want %+v", got.Floors, r.Floors)
	}
}

// TestFloorsOfSeveralRoundsAreTheirMedians: run.sh measures the floors at the start of
// each round; the report keeps, layer by layer, the round of median p50 (a layer no
// round measured stays empty) and says how many rounds they came from.
func TestFloorsOfSeveralRoundsAreTheirMedians(t *testing.T) {
	round := func(p50 float64, three bool) *Floors {
		f := &Floors{EntryBytes: 400,
			Append:         loadgen.Summary{Count: 1, P50: p50, Mean: p50 + 0.01},
			Raft:           loadgen.Summary{Count: 1, P50: 4 - p50, Mean: 1},
			HTTPRaft:       loadgen.Summary{Count: 1, P50: p50 * 2, Mean: 1},
			HTTPRaftServer: loadgen.Summary{Count: 1, P50: p50 * 3, Mean: 1}}
		if three {
			f.HTTPRaft3 = loadgen.Summary{Count: 1, P50: p50 * 10, Mean: 1}
			f.HTTPRaft3Writers = []FloorThroughput{{Writers: 16, WritesPerSec: 1000 * p50}, {Writers: 64, WritesPerSec: 5000 - 1000*p50}}
		}
		return f
	}
	dir := t.TempDir()
	var files []string
	for i, f := range []*Floors{round(3, true), round(1, false), nil, round(2, true)} {
		part := &Results{Duration: "10s", Warmup: "3s", Floors: f,
			Systems: []SystemInfo{{Name: "idemkv-1/wal", Label: "idemkv, 1 node, wal log", Nodes: 1, Backend: "wal"}},
			New:     []Point{{System: "idemkv-1/wal", Workload: "new", Concurrency: 1, OpsPerSec: float64(1000 + i), ReserveP50: 0.3}}}
		files = append(files, filepath.Join(dir, fmt.Sprintf("part-%d.json", i)))
		if err := writeJSON(files[i], part); err != nil {
			t.Fatal(err)
		}
	}
	if err := runReport(t.Context(), append([]string{"--out", dir}, files...), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	got := readResults(t, dir).Floors
	if got == nil {
		t.Fatal("no floors after the merge")
	}
	for name, c := range map[string]struct{ got, want float64 }{
		"append": {got.Append.P50, 2}, "append's mean": {got.Append.Mean, 2.01}, "raft": {got.Raft.P50, 2},
		"http": {got.HTTPRaft.P50, 4}, "other process": {got.HTTPRaftServer.P50, 6},
		// Two rounds measured three voters: the lower of the two.
		"three voters": {got.HTTPRaft3.P50, 20},
	} {
		if c.got != c.want {
			t.Errorf("%s: p50 %v, want %v", name, c.got, c.want)
		}
	}
	// Each number of writers: the lower of its two rounds, each on its own.
	if want := []FloorThroughput{{Writers: 16, WritesPerSec: 2000}, {Writers: 64, WritesPerSec: 2000}}; !reflect.DeepEqual(got.HTTPRaft3Writers, want) {
		t.Errorf("write rates %+v, want %+v", got.HTTPRaft3Writers, want)
	}
	if got.Rounds != 3 {
		t.Errorf("rounds %d, want 3", got.Rounds)
	}
	if md, _ := os.ReadFile(filepath.Join(dir, "results.md")); !strings.Contains(string(md), "measured at the start of each of 3 rounds") {
		t.Errorf("results.md does not say the floors are medians of 3 rounds:\n%s", md)
	}
}

// The three voters' rates under several writers are printed beside the new operations
// at as many clients, halved (a new operation is two writes), and judged against the
// pairing's targets there: below a target, or above it with what is left to spare.
func TestMarkdownFloorRatesAgainstTheTargets(t *testing.T) {
	r := results()
	r.Floors = &Floors{EntryBytes: 400, HTTPRaft3: loadgen.Summary{Count: 100, P50: 0.75, Mean: 0.8},
		HTTPRaft3Writers: []FloorThroughput{{Writers: 16, WritesPerSec: 3000}, {Writers: 64, WritesPerSec: 9000}}}
	r.Targets = verdicts(r)
	md := markdown(r)
	for _, want := range []string{
		"| 16 | 3000 | 1500 | 2000 | 1980 | 2000 |\n",
		"| 64 | 9000 | 4500 | 3000 | 4000 | 2000 |\n",
		// 16 clients: 1.0× the peer's 2000 is above the floor's 1500.
		"Against the targets (the peer: PostgreSQL primary + 2 quorum-sync standbys): at 16 clients the target, 1.0× the peer's 2000, is 2000 new operations/s, above the floor's 1500",
		// 64 clients: 1.5× 2000 = 3000, the floor's 4500 is 50% above it.
		"at 64 clients the floor's 4500 new operations/s reach the target, 1.5× the peer's 2000 (3000), with 50% to spare",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}
