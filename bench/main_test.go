package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/idemkv/idemkv/bench/pgtarget"
	"github.com/idemkv/idemkv/loadgen"
)

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--idemkv3", "bolt=a:1,a:2,a:3", "--idemkv3", "wal=b:1,b:2,b:3", "--idemkv1", "bolt=c:1",
		"--pg-sync", "postgres://p", "--concurrency", "1, 16,64", "--scale", "10000,1000000"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.concurrency, []int{1, 16, 64}) || !slices.Equal(o.scale, []int{10000, 1000000}) {
		t.Errorf("concurrency %v scale %v", o.concurrency, o.scale)
	}
	if len(o.idemkv3) != 2 || o.idemkv3[1].backend != "wal" || !slices.Equal(o.idemkv3[1].endpoints, []string{"b:1", "b:2", "b:3"}) ||
		len(o.idemkv1) != 1 || o.idemkv1[0].endpoints[0] != "c:1" || o.pgSync != "postgres://p" {
		t.Errorf("clusters %+v %+v, pg-sync %q", o.idemkv3, o.idemkv1, o.pgSync)
	}
	for _, args := range [][]string{
		{},
		{"--pg", "x", "--concurrency", "0"},
		{"--pg", "x", "--concurrency", "x"},
		{"--idemkv3", "a:1,a:2,a:3"},  // no backend
		{"--idemkv3", "bolt=a:1,a:2"}, // two nodes
		{"--idemkv1", "bolt=a:1,a:2"}, // two nodes
		{"--idemkv1", "bolt=a:1", "--idemkv1", "bolt=a:2"}, // the same backend twice
		{"--pg", "x", "leftover"},                          // an argument
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

func TestPlanInterleavesAndSpreadsReplays(t *testing.T) {
	o, err := parseFlags([]string{"--idemkv3", "bolt=a:1,a:2,a:3", "--pg-sync", "p", "--idemkv1", "bolt=c:1", "--pg", "q",
		"--etcd", "e:1", "--concurrency", "1,64", "--replay-at", "16"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, j := range plan(o, systems(o, &pgReplication{})) {
		got = append(got, j.String())
	}
	want := []string{
		"idemkv-3/bolt, new operations, 1 client", "postgres-sync, new operations, 1 client",
		"idemkv-1/bolt, new operations, 1 client", "postgres, new operations, 1 client", "etcd, new operations, 1 client",
		"idemkv-3/bolt, new operations, 64 clients", "postgres-sync, new operations, 64 clients",
		"idemkv-1/bolt, new operations, 64 clients", "postgres, new operations, 64 clients", "etcd, new operations, 64 clients",
		"idemkv-3/bolt, replays (leader), 16 clients", "idemkv-3/bolt, replays (spread), 16 clients",
		"postgres-sync, replays, 16 clients", "idemkv-1/bolt, replays (leader), 16 clients",
		"postgres, replays, 16 clients", "etcd, replays, 16 clients",
	}
	if !slices.Equal(got, want) {
		t.Errorf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// results is a run of every system with two backends; idemkv's figures are chosen
// so that each target lands on a known side of its line.
func results() *Results {
	p := func(sys string, c int, ops, p99 float64) Point {
		return Point{System: sys, Workload: "new", Concurrency: c, OpsPerSec: ops, P99: p99, ReserveP50: p99 / 4}
	}
	r := func(sys, route string, ops float64) Point {
		return Point{System: sys, Workload: "replay", Concurrency: 64, Route: route, OpsPerSec: ops, P99: 5}
	}
	res := &Results{
		Fsync: loadgen.Summary{P50: 0.5},
		Systems: []SystemInfo{
			{Name: "idemkv-3/bolt", Label: "idemkv, 3 nodes, bolt log", Legend: "idemkv 3 bolt", Nodes: 3, Backend: "bolt"},
			{Name: "idemkv-3/wal", Label: "idemkv, 3 nodes, wal log", Legend: "idemkv 3 wal", Nodes: 3, Backend: "wal"},
			{Name: sysPGSync, Label: "PostgreSQL primary + 2 quorum-sync standbys", Legend: "pg + 2 sync"},
			{Name: "idemkv-1/bolt", Label: "idemkv, 1 node, bolt log", Legend: "idemkv 1 bolt", Nodes: 1, Backend: "bolt"},
			{Name: "idemkv-1/wal", Label: "idemkv, 1 node, wal log", Legend: "idemkv 1 wal", Nodes: 1, Backend: "wal"},
			{Name: sysPG, Label: "PostgreSQL, 1 server", Legend: "pg 1"},
			{Name: sysEtcd, Label: "etcd, 3 members", Legend: "etcd 3"},
		},
		New: []Point{
			// 3 nodes vs PG + standbys: bolt 0.79x/1.0x/1.5x/1.49x, wal 1.0x/0.99x/2x/2x.
			p("idemkv-3/bolt", 1, 790, 4), p("idemkv-3/wal", 1, 1000, 3), p(sysPGSync, 1, 1000, 2),
			p("idemkv-3/bolt", 16, 2000, 8), p("idemkv-3/wal", 16, 1980, 7), p(sysPGSync, 16, 2000, 6),
			p("idemkv-3/bolt", 64, 3000, 20), p("idemkv-3/wal", 64, 4000, 15), p(sysPGSync, 64, 2000, 30),
			p("idemkv-3/bolt", 256, 4470, 60), p("idemkv-3/wal", 256, 6000, 50), p(sysPGSync, 256, 3000, 90),
			// 1 vs 1: bolt 1x at 1 client, under 1x at 256; wal 0.5x at 1 client.
			p("idemkv-1/bolt", 1, 2000, 1), p("idemkv-1/wal", 1, 1000, 1), p(sysPG, 1, 2000, 1),
			p("idemkv-1/bolt", 16, 5000, 4), p("idemkv-1/wal", 16, 6000, 4), p(sysPG, 16, 5000, 4),
			p("idemkv-1/bolt", 64, 7000, 9), p("idemkv-1/wal", 64, 8000, 9), p(sysPG, 64, 7000, 9),
			p("idemkv-1/bolt", 256, 6900, 40), p("idemkv-1/wal", 256, 8000, 40), p(sysPG, 256, 7000, 40),
			// etcd at 64: bolt 1.5x, wal 2x.
			p(sysEtcd, 1, 500, 5), p(sysEtcd, 16, 1500, 20), p(sysEtcd, 64, 2000, 90), p(sysEtcd, 256, 2200, 200),
		},
		Replay: []Point{
			r("idemkv-3/bolt", routeLeader, 20000), r("idemkv-3/bolt", routeSpread, 39000),
			r("idemkv-3/wal", routeLeader, 21000), r("idemkv-3/wal", routeSpread, 44000),
			r(sysPGSync, "", 20000), r("idemkv-1/bolt", routeLeader, 25000), r("idemkv-1/wal", routeLeader, 26000),
			r(sysPG, "", 30000), r(sysEtcd, "", 5000),
		},
	}
	// CPU per new operation at 64 clients: 3 nodes bolt above the replicated
	// PostgreSQL's, wal below; 1 node bolt equal to the single server's, wal above.
	for sys, secs := range map[string]float64{"idemkv-3/bolt": 0.5, "idemkv-3/wal": 0.3, sysPGSync: 0.4,
		"idemkv-1/bolt": 0.2, "idemkv-1/wal": 0.25, sysPG: 0.2} {
		find(res.New, sys, 64).CPU = &CPU{Seconds: secs * 10, Processes: 3, PerKOps: secs}
	}
	find(res.New, "idemkv-3/bolt", 64).DriverCPU = &CPU{Seconds: 1.2, Processes: 1, PerKOps: 0.12}
	return res
}

func TestVerdictsJudgeEachPairingAndBackend(t *testing.T) {
	got := map[string]Verdict{}
	for _, v := range verdicts(results()) {
		got[v.Target] = v
	}
	want := map[string]bool{}
	add := func(met bool, format string, args ...any) { want[fmt.Sprintf(format, args...)] = met }
	sync := "vs PostgreSQL + 2 quorum-sync standbys"
	for be, met := range map[string][5]bool{"bolt": {false, true, true, false, false}, "wal": {true, false, true, true, true}} {
		add(met[0], "3 nodes (%s) %s, new operations, 1 client: >= 1.0x", be, sync)
		add(met[1], "3 nodes (%s) %s, new operations, 16 clients: >= 1.0x", be, sync)
		add(met[2], "3 nodes (%s) %s, new operations, 64 clients: >= 1.5x", be, sync)
		add(met[3], "3 nodes (%s) %s, new operations, 256 clients: >= 1.5x", be, sync)
		add(met[4], "3 nodes (%s) %s, replays spread over the nodes, 64 clients: >= 2.0x", be, sync)
		add(be == "wal", "3 nodes (%s) %s, CPU per new operation across all processes, 64 clients: <= the peer's", be, sync)
	}
	for be, met := range map[string][4]bool{"bolt": {true, true, true, false}, "wal": {false, true, true, true}} {
		add(met[0], "1 node (%s) vs 1 PostgreSQL, new operations, 1 client: >= 1.0x", be)
		add(be == "bolt", "1 node (%s) vs 1 PostgreSQL, CPU per new operation across all processes, 64 clients: <= the peer's", be)
		add(met[1], "1 node (%s) vs 1 PostgreSQL, new operations, 16 clients: >= 1.0x", be)
		add(met[2], "1 node (%s) vs 1 PostgreSQL, new operations, 64 clients: >= 1.0x", be)
		add(met[3], "1 node (%s) vs 1 PostgreSQL, new operations, 256 clients: >= 1.0x", be)
	}
	add(true, "3 nodes (bolt) vs 3 etcd members, new operations, 64 clients: >= 1.5x")
	add(true, "3 nodes (wal) vs 3 etcd members, new operations, 64 clients: >= 1.5x")
	if len(got) != len(want) {
		t.Errorf("%d verdicts, want %d", len(got), len(want))
	}
	for target, met := range want {
		v, ok := got[target]
		if !ok {
			t.Errorf("no verdict %q", target)
			continue
		}
		if v.Met != met {
			t.Errorf("%q: met=%v (%s), want %v", target, v.Met, v.Measured, met)
		}
	}
	if m := got["3 nodes (bolt) "+sync+", replays spread over the nodes, 64 clients: >= 2.0x"].Measured; m != "1.95x (39000 vs 20000 replays/s)" {
		t.Errorf("spread replay verdict measured %q", m)
	}
	if m := got["3 nodes (bolt) "+sync+", CPU per new operation across all processes, 64 clients: <= the peer's"].Measured; m != "1.25x (0.500 vs 0.400 CPU s per 1,000 operations)" {
		t.Errorf("CPU verdict measured %q", m)
	}
}

func TestVerdictsSayWhatWasNotMeasured(t *testing.T) {
	r := results()
	r.New = slices.DeleteFunc(r.New, func(p Point) bool { return p.Concurrency == 256 })
	r.Replay = nil
	r.Scale = []Point{{System: "idemkv", Records: 10_000, ReserveP99: 10}, {System: "idemkv", Records: 300_000, ReserveP99: 11}}
	var notMeasured int
	for _, v := range verdicts(r) {
		if strings.Contains(v.Measured, "not measured") {
			notMeasured++
			if v.Met {
				t.Errorf("%+v met without a measurement", v)
			}
		}
		if strings.HasPrefix(v.Target, "reserve p99") && (v.Met || !strings.Contains(v.Measured, "not reached")) {
			t.Errorf("scale verdict %+v with 300,000 records", v)
		}
	}
	// 256 clients for both pairings with PostgreSQL and both backends, and the
	// spread replays of both backends.
	if notMeasured != 6 {
		t.Errorf("%d verdicts not measured, want 6", notMeasured)
	}
}

func TestMarkdownLeadsWithLikeForLike(t *testing.T) {
	r := results()
	r.Targets = verdicts(r)
	md := markdown(r)
	sync := strings.Index(md, "### 3 idemkv nodes vs PostgreSQL primary + 2 quorum-sync standbys")
	single := strings.Index(md, "### 1 idemkv node vs 1 PostgreSQL")
	etcd := strings.Index(md, "### 3 idemkv nodes vs 3 etcd members")
	backends := strings.Index(md, "### Raft log backends: bolt vs wal")
	if sync < 0 || single < sync || etcd < single || backends < etcd {
		t.Fatalf("sections out of order (%d, %d, %d, %d):\n%s", sync, single, etcd, backends, md)
	}
	for _, want := range []string{
		"| 64 | idemkv, 3 nodes, bolt log | 3000 | 0.00 | 20.00 | 5.00 | 0.500 | 0.120 | 1.50× |",
		"| 64 | PostgreSQL primary + 2 quorum-sync standbys | 2000 | 0.00 | 30.00 | 7.50 | 0.400 | — | — |",
		"| idemkv, 3 nodes, wal log | all 3 nodes, each client pinned to one | 64 | 44000 | 0.00 | 5.00 | — | — | 2.20× |",
		"| PostgreSQL primary + 2 quorum-sync standbys | the primary | 64 | 20000 | 0.00 | 5.00 | — | — | — |",
		"| 1 | idemkv, 1 node, wal log | 1000 | 0.00 | 1.00 | 0.25 | — | — | 0.50× |",
		"| 64 | idemkv, 3 nodes, wal log | 4000 | 0.00 | 15.00 | 3.75 | 0.300 | — | 2.00× |", // against etcd
		"| 3 | new operations | 64 | 3000 | 4000 | 1.33× | 20.00 | 15.00 |",
		"| 3 | replays, spread | 64 | 39000 | 44000 | 1.13× | 5.00 | 5.00 |",
		"| 1 | replays | 64 | 25000 | 26000 | 1.04× | 5.00 | 5.00 |",
		"— **missed**: 1.49x (4470 vs 3000 ops/s)",
		"— **met**: 2.00x (6000 vs 3000 ops/s)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	// Each pairing's targets sit in its own section.
	if i := strings.Index(md, "vs 3 etcd members, new operations"); i < etcd {
		t.Errorf("etcd's targets at %d, before its section at %d", i, etcd)
	}
}

func TestChartsDrawEveryPairing(t *testing.T) {
	cs := charts(results())
	if len(cs) != 3 {
		t.Fatalf("%d panels, want one per pairing", len(cs))
	}
	for i, want := range []string{"idemkv 3 bolt,idemkv 3 wal,pg + 2 sync", "idemkv 1 bolt,idemkv 1 wal,pg 1", "idemkv 3 bolt,idemkv 3 wal,etcd 3"} {
		var names []string
		colors := map[color.RGBA]bool{}
		for _, s := range cs[i].Series {
			names = append(names, s.Name)
			colors[s.Color] = true
			if len(s.Points) != 4 {
				t.Errorf("panel %d, %s: %d points, want 4", i, s.Name, len(s.Points))
			}
		}
		if got := strings.Join(names, ","); got != want {
			t.Errorf("panel %d: %s, want %s", i, got, want)
		}
		if len(colors) != len(names) {
			t.Errorf("panel %d: %d colours for %d series", i, len(colors), len(names))
		}
	}
}

// A run measured one system at a time gathers into the same results as one that
// measured them all together.
func TestReportMergesParts(t *testing.T) {
	all := results()
	dir := t.TempDir()
	var files []string
	for i, s := range all.Systems {
		part := &Results{Duration: "10s", Warmup: "3s", LoadAtStart: fmt.Sprint(i), LoadAtEnd: fmt.Sprint(i), Systems: []SystemInfo{s}}
		for _, p := range all.New {
			if p.System == s.Name {
				part.New = append(part.New, p)
			}
		}
		for _, p := range all.Replay {
			if p.System == s.Name {
				part.Replay = append(part.Replay, p)
			}
		}
		if s.Name == sysPGSync {
			part.PGReplication = &pgReplication{Names: "ANY 1 (s1, s2)"}
		}
		files = append(files, filepath.Join(dir, s.Name[:4]+fmt.Sprint(i)+".json"))
		if err := writeJSON(files[i], part); err != nil {
			t.Fatal(err)
		}
	}
	var stdout strings.Builder
	if err := runReport(t.Context(), append([]string{"--out", dir}, files...), &stdout, io.Discard); err != nil {
		t.Fatal(err)
	}
	got := readResults(t, dir)
	if len(got.Systems) != 7 || len(got.New) != len(all.New) || len(got.Replay) != len(all.Replay) ||
		got.LoadAtStart != "0" || got.LoadAtEnd != "6" || got.PGReplication == nil {
		t.Errorf("merged %d systems, %d new points, %d replays, load %s → %s, replication %v",
			len(got.Systems), len(got.New), len(got.Replay), got.LoadAtStart, got.LoadAtEnd, got.PGReplication)
	}
	if want := verdicts(all); !slices.Equal(got.Targets, want) {
		t.Errorf("targets of the merged parts differ:\n%v\nwant\n%v", got.Targets, want)
	}
	for _, f := range []string{"results.md", "throughput.png"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	if !strings.Contains(stdout.String(), "### 1 idemkv node vs 1 PostgreSQL") {
		t.Errorf("stdout lacks the tables:\n%s", stdout.String())
	}
	if err := runReport(t.Context(), []string{"--out", dir, files[0], files[0], files[1]}, io.Discard, io.Discard); err == nil {
		t.Error("a system measured twice was merged with one measured once")
	}
}

// TestReportTakesTheMedianRound: with every system measured in three rounds, each
// point is its median round, every round's throughput is kept, and the ratios divide
// the medians.
func TestReportTakesTheMedianRound(t *testing.T) {
	dir := t.TempDir()
	var files []string
	for round, scale := range []float64{1.0, 0.5, 2.0} {
		part := results()
		for i := range part.New {
			part.New[i].OpsPerSec *= scale
			part.New[i].P50 = float64(round)
		}
		for i := range part.Replay {
			part.Replay[i].OpsPerSec *= scale
		}
		files = append(files, filepath.Join(dir, fmt.Sprint("round", round, ".json")))
		if err := writeJSON(files[round], part); err != nil {
			t.Fatal(err)
		}
	}
	if err := runReport(t.Context(), append([]string{"--out", dir}, files...), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	got := readResults(t, dir)
	want := results()
	if got.Rounds != 3 || len(got.New) != len(want.New) || len(got.Replay) != len(want.Replay) {
		t.Fatalf("%d rounds, %d new points, %d replays", got.Rounds, len(got.New), len(got.Replay))
	}
	for i, p := range got.New {
		if p.OpsPerSec != want.New[i].OpsPerSec || p.P50 != 0 || len(p.Rounds) != 3 || p.Rounds[1].OpsPerSec != want.New[i].OpsPerSec/2 {
			t.Fatalf("point %d: %.0f ops/s, p50 %v (the round's), rounds %+v; want the first round's %.0f", i, p.OpsPerSec, p.P50, p.Rounds, want.New[i].OpsPerSec)
		}
	}
	if !slices.Equal(got.Targets, verdicts(want)) {
		t.Errorf("targets of the median rounds differ:\n%v\nwant\n%v", got.Targets, verdicts(want))
	}
	md, err := os.ReadFile(filepath.Join(dir, "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	if row := "| 64 | idemkv, 3 nodes, bolt log | 3000 (3000, 1500, 6000) |"; !strings.Contains(string(md), row) {
		t.Errorf("results.md lacks %q:\n%s", row, md)
	}
}

// readResults reads the results.json that bench report wrote into dir.
func readResults(t *testing.T, dir string) Results {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestReplicationNeedsTwoStandbysInQuorum(t *testing.T) {
	streaming := func(name, sync string) pgtarget.Standby {
		return pgtarget.Standby{Name: name, State: "streaming", SyncState: sync}
	}
	for _, c := range []struct {
		standbys []pgtarget.Standby
		ok       bool
	}{
		{[]pgtarget.Standby{streaming("s1", "quorum"), streaming("s2", "quorum")}, true},
		{[]pgtarget.Standby{streaming("s1", "quorum")}, false},
		{[]pgtarget.Standby{streaming("s1", "quorum"), streaming("s2", "async")}, false},
		{[]pgtarget.Standby{streaming("s1", "sync"), streaming("s2", "potential")}, false},
		{[]pgtarget.Standby{streaming("s1", "quorum"), {Name: "s2", State: "catchup", SyncState: "quorum"}}, false},
		{nil, false},
	} {
		r := pgReplication{Names: "ANY 1 (s1, s2)", Standbys: c.standbys}
		if err := r.judge(); (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok=%v", c.standbys, err, c.ok)
		}
	}
}
