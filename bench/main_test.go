package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/idemkv/idemkv/loadgen"
)

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--idemkv", "a:1", "--concurrency", "1, 16,64", "--scale", "10000,1000000"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.concurrency, []int{1, 16, 64}) || !slices.Equal(o.scale, []int{10000, 1000000}) {
		t.Errorf("concurrency %v scale %v", o.concurrency, o.scale)
	}
	for _, args := range [][]string{
		{},
		{"--idemkv", "a:1", "--concurrency", "0"},
		{"--idemkv", "a:1", "--concurrency", "x"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
}

func results() *Results {
	p := func(sys, workload string, c int, ops, p99, reserveP50 float64) Point {
		return Point{System: sys, Workload: workload, Concurrency: c, OpsPerSec: ops, P99: p99, ReserveP50: reserveP50}
	}
	return &Results{
		Fsync: loadgen.Summary{P50: 0.5},
		New: []Point{
			p("idemkv", "new", 1, 200, 5, 1.2), p("etcd", "new", 1, 100, 6, 2),
			p("idemkv", "new", 64, 3000, 40, 10), p("etcd", "new", 64, 1500, 50, 20), p("postgres", "new", 64, 4000, 30, 5),
		},
		Replay: []Point{p("idemkv", "replay", 64, 20000, 5, 1), p("etcd", "replay", 64, 2000, 20, 5)},
		Scale: []Point{
			{System: "idemkv", Records: 10_000, ReserveP99: 10},
			{System: "idemkv", Records: 10_000_000, ReserveP99: 11.5},
		},
	}
}

func TestVerdictsJudgeTheMeasuredRun(t *testing.T) {
	got := map[string]Verdict{}
	for _, v := range verdicts(results(), options{replayAt: 64}) {
		got[strings.SplitN(v.Target, ":", 2)[0]] = v
	}
	want := map[string]bool{
		"new operations, 3 nodes, 64 clients": true, // 2x etcd, p99 40 <= 50
		"replays":                             true, // 20000/3000 = 6.7x
		"one client":                          true, // 1.2 ms vs 3 x 0.5 ms: met
		"reserve p99 unchanged (within 20%) from 10 thousand to 10 million stored records": true, // +15%
		"beat PostgreSQL (one unreplicated server) at 64 clients":                          false,
	}
	if len(got) != len(want) {
		t.Fatalf("verdicts %v, want %d", got, len(want))
	}
	for target, met := range want {
		v, ok := got[target]
		if !ok {
			t.Errorf("no verdict for %q", target)
			continue
		}
		if v.Met != met {
			t.Errorf("%q: met=%v (%s), want %v", target, v.Met, v.Measured, met)
		}
	}
	if m := got["beat PostgreSQL (one unreplicated server) at 64 clients"].Measured; !strings.HasPrefix(m, "0.75x") {
		t.Errorf("PostgreSQL ratio %q, want 0.75x", m)
	}
}

func TestVerdictsNeedTenMillionRecords(t *testing.T) {
	r := results()
	r.Scale[1].Records = 300_000
	for _, v := range verdicts(r, options{replayAt: 64}) {
		if strings.HasPrefix(v.Target, "reserve p99") && (v.Met || !strings.Contains(v.Measured, "not reached")) {
			t.Errorf("scale verdict %+v with 300,000 records", v)
		}
	}
}

func TestMarkdownShowsRatiosToEachPeer(t *testing.T) {
	r := results()
	r.Targets = verdicts(r, options{replayAt: 64})
	md := markdown(r)
	for _, want := range []string{
		"| etcd | 64 | 1500 | 0.00 | 50.00 | 20.00 | 2.00× |",
		"| postgres | 64 | 4000 | 0.00 | 30.00 | 5.00 | 0.75× |",
		"| idemkv | 64 | 3000 | 0.00 | 40.00 | 10.00 | — |",
		"| etcd | 64 | 2000 | 0.00 | 20.00 | 10.00× |",
		"| 10000000 |",
		"**missed**",
		"**met**",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}
