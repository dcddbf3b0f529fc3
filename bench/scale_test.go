package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestScaleReportTablesAndVerdict(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, p ScalePoint) string {
		t.Helper()
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	pt := func(records int, ops, p50, p99 float64, phases ...Phase) ScalePoint {
		return ScalePoint{Point: Point{System: "idemkv", Workload: "new", Concurrency: 16, Records: records,
			OpsPerSec: ops, ReserveP50: p50, ReserveP99: p99}, Warmup: "5s", Duration: "30s", Phases: phases}
	}
	// Given largest first: the report orders by records and compares with the smallest.
	big := write("b.json", pt(10_000_000, 1500, 4, 11.5, Phase{"seed", 0}, Phase{"restore", 60}, Phase{"install", 120.25}, Phase{"measure", 35}))
	small := write("a.json", pt(10_000, 1600, 3.5, 10, Phase{"seed", 0.4}, Phase{"restore", 0.5}, Phase{"install", 2}, Phase{"measure", 35}))
	out := filepath.Join(dir, "results")
	var stdout bytes.Buffer
	if err := runScaleReport(context.Background(), []string{"--out", out, big, small}, &stdout, nil); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(out, "scale.md"))
	if err != nil {
		t.Fatal(err)
	}
	if stdout.String() != string(md) {
		t.Errorf("printed and written Markdown differ")
	}
	for _, want := range []string{
		"| 10000 | 1600 | 3.50 | 10.00 | 1.00× |",
		"| 10000000 | 1500 | 4.00 | 11.50 | 1.15× |",
		"| records | seed | restore | install | measure | snapshots |",
		"| 10000000 | 0.0 | 60.0 | 120.2 | 35.0 | 0 |",
		"- reserve p99 unchanged (within 20%) from 10 thousand to 10 million stored records — **met**: +15% (10.00 ms at 10000 records, 11.50 ms at 10000000 records)",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("scale.md lacks %q:\n%s", want, md)
		}
	}
	var res ScaleResults
	b, err := os.ReadFile(filepath.Join(out, "scale.json"))
	if err == nil {
		err = json.Unmarshal(b, &res)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Points) != 2 || res.Points[0].Records != 10_000 || res.Target == nil || !res.Target.Met {
		t.Errorf("scale.json: %+v", res)
	}
}

func TestScaleVerdictMissesWithoutTenMillion(t *testing.T) {
	v, ok := scaleVerdict([]Point{{Records: 200_000, ReserveP99: 10.5}, {Records: 10_000, ReserveP99: 10}})
	if !ok || v.Met || !strings.Contains(v.Measured, "not reached") || !strings.HasPrefix(v.Measured, "+5%") {
		t.Errorf("verdict %+v", v)
	}
	v, ok = scaleVerdict([]Point{{Records: 10_000, ReserveP99: 10}, {Records: 10_000_000, ReserveP99: 12.5}})
	if !ok || v.Met {
		t.Errorf("+25%% judged met: %+v", v)
	}
	if _, ok := scaleVerdict([]Point{{Records: 10_000, ReserveP99: 10}}); ok {
		t.Error("one record count judged")
	}
}

func TestPhaseFlag(t *testing.T) {
	o, err := parseScalePointFlags([]string{"--idemkv", "a:1", "--records", "10", "--point", "p.json",
		"--phase", "seed=1m2.5s", "--phase", "restore=250ms"})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.phases) != 2 || o.phases[0] != (Phase{"seed", 62.5}) || o.phases[1] != (Phase{"restore", 0.25}) {
		t.Errorf("phases %+v", o.phases)
	}
	if _, err := parseScalePointFlags([]string{"--idemkv", "a:1", "--records", "10", "--point", "p", "--phase", "seed"}); err == nil {
		t.Error("--phase without a duration accepted")
	}
}

func TestCountSnapshots(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "n1.log"), filepath.Join(dir, "n2.log")
	for f, text := range map[string]string{
		a: "level=INFO msg=\"persisted snapshot\" index=9\nlevel=INFO msg=other\nlevel=INFO msg=\"persisted snapshot\" index=20\n",
		b: "level=INFO msg=\"persisted snapshot\" index=9\n",
	} {
		if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := countSnapshots([]string{a, b}); n != 3 || err != nil {
		t.Errorf("countSnapshots = %d, %v; want 3", n, err)
	}
	if _, err := countSnapshots([]string{filepath.Join(dir, "missing.log")}); err == nil {
		t.Error("missing log counted")
	}
}

func TestMedianRound(t *testing.T) {
	rounds := []Point{{ReserveP99: 12, OpsPerSec: 1}, {ReserveP99: 9, OpsPerSec: 2, Errors: 1}, {ReserveP99: 10, OpsPerSec: 3}, {ReserveP99: 30, OpsPerSec: 4}}
	p := medianRound(rounds)
	if p.ReserveP99 != 10 || p.OpsPerSec != 3 {
		t.Errorf("median of p99 9, 10, 12, 30: got the round with p99 %v", p.ReserveP99)
	}
	if p.Errors != 1 {
		t.Errorf("errors %d, want the sum over the rounds, 1", p.Errors)
	}
	if len(p.RoundsP99) != 4 || p.RoundsP99[0] != 12 || p.RoundsP99[3] != 30 {
		t.Errorf("rounds %v, want every round's p99 in the order run", p.RoundsP99)
	}
	if one := medianRound(rounds[:1]); one.ReserveP99 != 12 || one.RoundsP99 != nil {
		t.Errorf("one round: %+v", one)
	}
	md := scaleMarkdown(&ScaleResults{Points: []ScalePoint{p}})
	if !strings.Contains(md, "| 12.00, 9.00, 10.00, 30.00 |") || !strings.Contains(md, "median reserve p99") {
		t.Errorf("Markdown lacks the rounds:\n%s", md)
	}
}
