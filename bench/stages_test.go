package main

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// metricsText is a node's /metrics with the series the breakdown reads: each stage's
// sum in seconds over n samples, and the apply and request histograms.
func metricsText(n float64, stages map[string]float64, apply, reserve, commit float64) string {
	var b strings.Builder
	b.WriteString("# HELP idemkv_write_stage_duration_seconds x\n# TYPE idemkv_write_stage_duration_seconds histogram\n")
	for st, sum := range stages {
		fmt.Fprintf(&b, "idemkv_write_stage_duration_seconds_bucket{stage=%q,le=\"+Inf\"} %g\n", st, n)
		fmt.Fprintf(&b, "idemkv_write_stage_duration_seconds_sum{stage=%q} %g\n", st, sum)
		fmt.Fprintf(&b, "idemkv_write_stage_duration_seconds_count{stage=%q} %g\n", st, n)
	}
	fmt.Fprintf(&b, "idemkv_raft_apply_duration_seconds_sum %g\nidemkv_raft_apply_duration_seconds_count %g\n", apply, n)
	fmt.Fprintf(&b, "idemkv_http_request_duration_seconds_sum{code=\"200\",endpoint=\"POST /v1/reserve\"} %g\n", reserve)
	fmt.Fprintf(&b, "idemkv_http_request_duration_seconds_count{code=\"200\",endpoint=\"POST /v1/reserve\"} %g\n", n/2)
	fmt.Fprintf(&b, "idemkv_http_request_duration_seconds_sum{code=\"200\",endpoint=\"POST /v1/commit\"} %g\n", commit)
	fmt.Fprintf(&b, "idemkv_http_request_duration_seconds_count{code=\"200\",endpoint=\"POST /v1/commit\"} %g\n", n/2)
	b.WriteString("idemkv_http_request_duration_seconds_sum{code=\"200\",endpoint=\"GET /metrics\"} 99\n")
	return b.String()
}

func mustScrape(t *testing.T, text string) scrape {
	t.Helper()
	s, err := parseScrape(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The breakdown takes the leader (the node that read the writes) for every stage but
// a follower's own log write, subtracts what came before the window, and derives the
// quorum wait, the hand-offs and the rest of the endpoint from the totals.
func TestStageBreakdownFromScrapes(t *testing.T) {
	zero := map[string]float64{}
	// 1000 writes in the window: per write (ms) read 0.05, validate 0.01, prepare 0.02,
	// leader append 0.4, commit 1.0, enqueue 0.05, apply 0.1, respond 0.03,
	// append RPC 0.5; propose 1.3; the endpoints 1.5.
	leader := map[string]float64{"read": 0.05, "validate": 0.01, "prepare": 0.02, "leader_append": 0.4, "commit": 1.0,
		"fsm_enqueue": 0.05, "fsm_apply": 0.1, "respond": 0.03, "append_rpc": 0.5}
	follower := map[string]float64{"follower_append": 0.3, "fsm_apply": 0.2}
	w := stageWindow{
		before: []scrape{mustScrape(t, metricsText(0, zero, 0, 0, 0)), mustScrape(t, metricsText(0, zero, 0, 0, 0)), mustScrape(t, metricsText(0, zero, 0, 0, 0))},
		after: []scrape{mustScrape(t, metricsText(1000, follower, 0, 0, 0)), mustScrape(t, metricsText(1000, leader, 1.3, 0.8, 0.7)),
			mustScrape(t, metricsText(1000, follower, 0, 0, 0))},
	}
	s := w.breakdown()
	if s == nil {
		t.Fatal("no breakdown")
	}
	for name, c := range map[string][2]float64{
		"read": {s.Read, 0.05}, "validate": {s.Validate, 0.01}, "prepare": {s.Prepare, 0.02},
		"leader append": {s.LeaderAppend, 0.4}, "quorum": {s.Quorum, 0.6}, "applied": {s.Applied, 0.15},
		"hand-offs": {s.Handoffs, 0.15}, "respond": {s.Respond, 0.03}, "handler": {s.Handler, 1.5},
		"rest": {s.Rest, 1.5 - (0.05 + 0.01 + 0.02 + 1.3 + 0.03)}, "append rpc": {s.AppendRPC, 0.5},
		"follower append": {s.FollowerAppend, 0.3},
	} {
		if math.Abs(c[0]-c[1]) > 1e-9 {
			t.Errorf("%s: %.4f ms, want %.4f", name, c[0], c[1])
		}
	}
	if s.Writes != 1000 {
		t.Errorf("%d writes", s.Writes)
	}
}

// Each idemkv system's breakdown is printed once, in its first pairing, and one node
// shows no quorum wait or follower figures.
func TestMarkdownStageTables(t *testing.T) {
	r := results()
	find(r.New, "idemkv-3/wal", 1).Stages = &Stages{Read: 0.05, LeaderAppend: 0.4, Quorum: 0.6, Handler: 1.5, AppendRPC: 0.5, FollowerAppend: 0.3}
	find(r.New, "idemkv-1/wal", 1).Stages = &Stages{Read: 0.05, LeaderAppend: 0.4, Quorum: 0.001, Handler: 0.6}
	r.Targets = verdicts(r)
	md := markdown(r)
	if n := strings.Count(md, "| leader's log append, until durable |"); n != 2 {
		t.Errorf("%d stage tables, want 2 (three nodes once, one node once):\n%s", n, md)
	}
	for _, want := range []string{
		"| leader's log append, until durable | 0.400 |",
		"| then until a quorum has it | 0.600 |",
		"| then until a quorum has it | — |",
		"| inside that: a follower's log write | 0.300 |",
		"| inside that: a follower's log write | — |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if i, j := strings.Index(md, "| then until a quorum has it | 0.600 |"), strings.Index(md, "### 1 idemkv node vs 1 PostgreSQL"); i < 0 || i > j {
		t.Errorf("the three-node breakdown is not in the first pairing's section")
	}
}

// A breakdown at each number of clients gets a column, with idemkv's own part of the
// endpoint and the peer's p50 at the same number of clients; with two systems each
// column names its system.
func TestMarkdownStageColumnsPerClients(t *testing.T) {
	r := results()
	find(r.New, "idemkv-3/wal", 1).Stages = &Stages{Read: 0.05, Validate: 0.01, Prepare: 0.02, Respond: 0.03, Rest: 0.04, LeaderAppend: 0.4, Quorum: 0.6, Handler: 1.5}
	find(r.New, "idemkv-3/wal", 16).Stages = &Stages{Read: 0.01, Validate: 0.002, Prepare: 0.008, Respond: 0.01, Rest: 0.02, Handoffs: 0.6, LeaderAppend: 0.5, Quorum: 1.3, Handler: 2.5}
	find(r.New, sysPGSync, 16).P50 = 4.25
	find(r.New, "idemkv-1/wal", 64).Stages = &Stages{Read: 0.01, Handler: 4}
	find(r.New, "idemkv-1/bolt", 64).Stages = &Stages{Read: 0.02, Handler: 5}
	r.Targets = verdicts(r)
	md := markdown(r)
	for _, want := range []string{
		"| stage | 1 client | 16 clients |\n",
		"| hand-offs to Raft's goroutines and back | 0.000 | 0.600 |\n",
		"| idemkv's own work: reading, checks, look-ups, the answer, the rest | 0.150 | 0.050 |\n",
		"| its share of the endpoint | 10.0% | 2.0% |\n",
		"| PostgreSQL primary + 2 quorum-sync standbys: p50 of a new operation | 0.000 | 4.250 |\n",
		"| stage | idemkv, 1 node, bolt log, 64 clients | idemkv, 1 node, wal log, 64 clients |\n",
		"| its share of the endpoint | 0.4% | 0.2% |\n",
		"| PostgreSQL, 1 server: p50 of a new operation | 0.000 | 0.000 |\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

// Every point of new operations on an idemkv system is broken down; replays and the
// peers are not.
func TestStageWindowWantsEveryNewPointOfIdemkv(t *testing.T) {
	idem := system{SystemInfo: SystemInfo{Name: "idemkv-3/wal", Nodes: 3}, endpoints: []string{"127.0.0.1:1"}}
	peer := system{SystemInfo: SystemInfo{Name: sysPG}}
	var w stageWindow
	for _, c := range []struct {
		j    job
		want bool
	}{
		{job{sys: idem, workload: "new", clients: 1}, true},
		{job{sys: idem, workload: "new", clients: 16}, true},
		{job{sys: idem, workload: "new", clients: 256}, true},
		{job{sys: idem, workload: "replay", clients: 64}, false},
		{job{sys: peer, workload: "new", clients: 16}, false},
	} {
		if got := w.wanted(c.j); got != c.want {
			t.Errorf("%s %s at %d clients: wanted %v, want %v", c.j.sys.Name, c.j.workload, c.j.clients, got, c.want)
		}
	}
}

// idemkv measured alone (bench --idemkv3 without a peer) still gets its points and its
// breakdown printed.
func TestMarkdownIdemkvWithoutAPeer(t *testing.T) {
	r := &Results{
		Systems: []SystemInfo{{Name: "idemkv-3/wal", Label: "idemkv, 3 nodes, wal log", Nodes: 3, Backend: "wal"}},
		New: []Point{
			{System: "idemkv-3/wal", Workload: "new", Concurrency: 1, OpsPerSec: 456, P50: 2.12,
				Stages: &Stages{Read: 0.02, Handler: 0.8}},
			{System: "idemkv-3/wal", Workload: "new", Concurrency: 16, OpsPerSec: 2466, P50: 6.21,
				Stages: &Stages{Read: 0.01, Handler: 2.5}},
		},
	}
	r.Targets = verdicts(r)
	md := markdown(r)
	for _, want := range []string{
		"### Without a system to compare with",
		"| idemkv, 3 nodes, wal log | new | 16 | 2466 | 6.21 |",
		"| stage | 1 client | 16 clients |\n",
		"| its share of the endpoint | 2.5% | 0.4% |\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}
