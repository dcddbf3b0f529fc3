package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/idemkv/idemkv/bench/chart"
	"github.com/idemkv/idemkv/loadgen"
)

// Results is what results.json holds.
type Results struct {
	Started  time.Time       `json:"started"`
	CPUs     int             `json:"cpus"`
	Duration string          `json:"duration_per_point"`
	Warmup   string          `json:"warmup_per_point"`
	Fsync    loadgen.Summary `json:"fsync"`
	// Floors are a lone writer's write with nothing of idemkv's in it (floor.go).
	Floors *Floors `json:"floors,omitempty"`
	// LoadAtStart and LoadAtEnd are the machine's load averages (1, 5, 15 minutes).
	LoadAtStart string       `json:"load_average_at_start,omitempty"`
	LoadAtEnd   string       `json:"load_average_at_end,omitempty"`
	Systems     []SystemInfo `json:"systems"`
	// PGReplication is what the replicated PostgreSQL's primary showed when its last
	// point began (each point checks it).
	PGReplication *pgReplication `json:"postgres_replication,omitempty"`
	New           []Point        `json:"new_operations"`
	Replay        []Point        `json:"replays,omitempty"`
	Scale         []Point        `json:"scale,omitempty"`
	Targets       []Verdict      `json:"targets"`
	// Rounds is how many times every system was measured (run.sh's ROUNDS): each
	// point is then its system's median round.
	Rounds int `json:"rounds,omitempty"`
	// Profiles are the CPU profiles --profile took.
	Profiles []string `json:"profiles,omitempty"`
}

// Round is one round's figures of a point measured in several.
type Round struct {
	OpsPerSec  float64 `json:"ops_per_sec"`
	CPUPerKOps float64 `json:"cpu_s_per_1k_ops,omitempty"`
}

// SystemInfo names a system of the run.
type SystemInfo struct {
	Name  string `json:"name"`
	Label string `json:"label"`
	// Legend is its name in the chart, whose font has no capitals.
	Legend string `json:"legend"`
	// Nodes and Backend describe idemkv's systems: cluster size and Raft log.
	Nodes   int    `json:"nodes,omitempty"`
	Backend string `json:"raft_log,omitempty"`
}

// Point is one measured run.
type Point struct {
	System      string `json:"system"`
	Workload    string `json:"workload"`
	Concurrency int    `json:"concurrency"`
	// Route says where an idemkv replay point sent its reserves: "leader", or
	// "spread" over the nodes with each worker pinned to one.
	Route      string  `json:"route,omitempty"`
	Records    int     `json:"records,omitempty"`
	OpsPerSec  float64 `json:"ops_per_sec"`
	P50        float64 `json:"p50_ms"`
	P99        float64 `json:"p99_ms"`
	ReserveP50 float64 `json:"reserve_p50_ms"`
	ReserveP99 float64 `json:"reserve_p99_ms"`
	Errors     uint64  `json:"errors"`
	// LoadAverage is the machine's load average (1, 5, 15 minutes) as the point ended.
	LoadAverage string `json:"load_average,omitempty"`
	// CPU is what the system's processes spent while the point was measured (run
	// with --cpu-pids).
	CPU *CPU `json:"cpu,omitempty"`
	// SettledAfter is how long the point waited for the system to go idle first
	// (settle).
	SettledAfter float64 `json:"settled_after_s,omitempty"`
	// DriverCPU is what the driver itself spent meanwhile: the load generator, which
	// shares the machine's cores with the system.
	DriverCPU *CPU `json:"driver_cpu,omitempty"`
	// Rounds holds every round's figures when the run measured each system more than
	// once; the point itself is the median round.
	Rounds []Round `json:"rounds,omitempty"`
	// Stages is where a write's time went on idemkv's leader (points of new
	// operations).
	Stages *Stages `json:"stages,omitempty"`
	// Report is the whole loadgen report, with every kind and quantile.
	Report *loadgen.Report `json:"report"`
}

// Verdict is one target of the issue, as measured.
type Verdict struct {
	Target   string `json:"target"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
}

func find(points []Point, system string, conc int) *Point {
	for i := range points {
		if points[i].System == system && points[i].Concurrency == conc {
			return &points[i]
		}
	}
	return nil
}

func findRoute(points []Point, system, route string) *Point {
	for i := range points {
		if points[i].System == system && points[i].Route == route {
			return &points[i]
		}
	}
	return nil
}

// pairingSystems returns the idemkv systems of p's size in the run, if its peer ran.
func pairingSystems(r *Results, p pairing) []SystemInfo {
	if !slices.ContainsFunc(r.Systems, func(s SystemInfo) bool { return s.Name == p.peer }) {
		return nil
	}
	return systemsOfSize(r, p.nodes)
}

// systemsOfSize are the idemkv systems of r with n nodes.
func systemsOfSize(r *Results, n int) []SystemInfo {
	var out []SystemInfo
	for _, s := range r.Systems {
		if s.Nodes == n {
			out = append(out, s)
		}
	}
	return out
}

// issueClients are the client counts the issue sets targets at; a run that skipped
// one says so rather than leave the target out.
var issueClients = []int{1, 16, 64, 256}

// runReport gathers the parts of a run (`bench --part`), one per system or group of
// systems measured while nothing else of the comparison ran, into the results.
func runReport(_ context.Context, args []string, stdout, _ io.Writer) error {
	fs := flag.NewFlagSet("bench report", flag.ContinueOnError)
	out := fs.String("out", "results", "directory for results.json, results.md and throughput.png")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("usage: bench report [--out DIR] PART…")
	}
	var parts []*Results
	for _, file := range fs.Args() {
		b, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		var r Results
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		parts = append(parts, &r)
	}
	r, err := merge(parts)
	if err != nil {
		return err
	}
	r.Targets = verdicts(r)
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	return write(*out, r, stdout)
}

// merge puts parts together in their order: the first's start, settings and fsync
// probe, the last's load at the end, every system and point. A system that several
// parts measured was measured in several rounds (run.sh's ROUNDS): every system must
// then have the same number of rounds, and each of its points becomes the median
// round's (medianRounds).
func merge(parts []*Results) (*Results, error) {
	r := *parts[0]
	r.Systems, r.New, r.Replay, r.Scale, r.Profiles = nil, nil, nil, nil, nil
	rounds := map[string]int{}
	var floors []*Floors
	for _, p := range parts {
		if p.Duration != r.Duration || p.Warmup != r.Warmup {
			return nil, fmt.Errorf("parts measured %s after %s of warm-up and %s after %s", r.Duration, r.Warmup, p.Duration, p.Warmup)
		}
		for _, s := range p.Systems {
			if rounds[s.Name]++; rounds[s.Name] == 1 {
				r.Systems = append(r.Systems, s)
			}
		}
		r.New = append(r.New, p.New...)
		r.Replay = append(r.Replay, p.Replay...)
		r.Scale = append(r.Scale, p.Scale...)
		if p.PGReplication != nil {
			r.PGReplication = p.PGReplication
		}
		if p.Floors != nil {
			floors = append(floors, p.Floors)
		}
		r.Profiles = append(r.Profiles, p.Profiles...)
		r.LoadAtEnd = p.LoadAtEnd
	}
	r.Floors = medianFloors(floors)
	r.Rounds = 1
	if len(r.Systems) > 0 {
		r.Rounds = rounds[r.Systems[0].Name]
	}
	for name, n := range rounds {
		if n != r.Rounds {
			return nil, fmt.Errorf("%s was measured in %d rounds, %s in %d", name, n, r.Systems[0].Name, r.Rounds)
		}
	}
	if r.Rounds > 1 {
		r.New, r.Replay = medianRounds(r.New), medianRounds(r.Replay)
	}
	return &r, nil
}

// medianRounds replaces the rounds of each point (same system, workload, clients and
// route) by the round with the median throughput (the lower of the two middle ones
// for an even count), which keeps every round's throughput and CPU in Rounds. A point
// is one round's whole, so that its latencies, CPU and stages belong together.
func medianRounds(points []Point) []Point {
	type key struct {
		system, workload, route string
		clients                 int
	}
	var order []key
	byKey := map[key][]Point{}
	for _, p := range points {
		k := key{p.System, p.Workload, p.Route, p.Concurrency}
		if _, ok := byKey[k]; !ok {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], p)
	}
	out := make([]Point, 0, len(order))
	for _, k := range order {
		rounds := byKey[k]
		each := make([]Round, len(rounds))
		for i, p := range rounds {
			each[i] = Round{OpsPerSec: p.OpsPerSec, CPUPerKOps: p.CPU.perKOps()}
		}
		sorted := slices.Clone(rounds)
		slices.SortStableFunc(sorted, func(a, b Point) int { return cmp.Compare(a.OpsPerSec, b.OpsPerSec) })
		m := sorted[(len(sorted)-1)/2]
		m.Rounds = each
		out = append(out, m)
	}
	return out
}

// verdicts holds the measured run against the targets of the issue. They are printed,
// never asserted: a machine is what it is.
func verdicts(r *Results) []Verdict {
	var out []Verdict
	for _, p := range pairings {
		out = append(out, pairingVerdicts(r, p)...)
	}
	return append(out, scaleVerdicts(r.Scale)...)
}

// scaleVerdicts judges the scale points of each system that has them.
func scaleVerdicts(points []Point) []Verdict {
	var out []Verdict
	var names []string
	for _, p := range points {
		if !slices.Contains(names, p.System) {
			names = append(names, p.System)
		}
	}
	for _, name := range names {
		v, ok := scaleVerdict(slices.DeleteFunc(slices.Clone(points), func(p Point) bool { return p.System != name }))
		if !ok {
			continue
		}
		if len(names) > 1 {
			v.Target = name + ": " + v.Target
		}
		out = append(out, v)
	}
	return out
}

func pairingVerdicts(r *Results, p pairing) []Verdict {
	counts := clientCounts(r.New)
	for _, c := range issueClients {
		if !slices.Contains(counts, c) {
			counts = append(counts, c)
		}
	}
	slices.Sort(counts)
	var out []Verdict
	for _, s := range pairingSystems(r, p) {
		who := fmt.Sprintf("%d %s (%s) %s", p.nodes, plural(p.nodes, "node"), s.Backend, p.short)
		for _, c := range counts {
			want, ok := p.newTarget(c)
			if !ok {
				continue
			}
			v := Verdict{Target: fmt.Sprintf("%s, new operations, %d %s: >= %.1fx", who, c, plural(c, "client"), want)}
			idem, peer := find(r.New, s.Name, c), find(r.New, p.peer, c)
			if idem == nil || peer == nil || peer.OpsPerSec == 0 {
				v.Measured = "not measured in this run"
			} else {
				ratio := idem.OpsPerSec / peer.OpsPerSec
				v.Measured = fmt.Sprintf("%.2fx (%.0f vs %.0f ops/s)", ratio, idem.OpsPerSec, peer.OpsPerSec)
				v.Met = ratio >= want
			}
			out = append(out, v)
		}
		if p.cpuTargetAt > 0 {
			v := Verdict{Target: fmt.Sprintf("%s, CPU per new operation across all processes, %d clients: <= the peer's", who, p.cpuTargetAt)}
			idem, peer := find(r.New, s.Name, p.cpuTargetAt), find(r.New, p.peer, p.cpuTargetAt)
			if idem == nil || peer == nil || idem.CPU == nil || peer.CPU == nil || peer.CPU.PerKOps == 0 {
				v.Measured = "not measured in this run"
			} else {
				v.Measured = fmt.Sprintf("%.2fx (%.3f vs %.3f CPU s per 1,000 operations)", idem.CPU.PerKOps/peer.CPU.PerKOps, idem.CPU.PerKOps, peer.CPU.PerKOps)
				v.Met = idem.CPU.PerKOps <= peer.CPU.PerKOps
			}
			out = append(out, v)
		}
		if p.spreadReplayTarget > 0 {
			v := Verdict{Target: fmt.Sprintf("%s, replays spread over the nodes: >= %.1fx", who, p.spreadReplayTarget)}
			idem := findRoute(r.Replay, s.Name, routeSpread)
			var peer *Point
			if idem != nil {
				peer = find(r.Replay, p.peer, idem.Concurrency)
			}
			if idem == nil || peer == nil || peer.OpsPerSec == 0 {
				v.Measured = "not measured in this run"
			} else {
				v.Target = fmt.Sprintf("%s, replays spread over the nodes, %d clients: >= %.1fx", who, idem.Concurrency, p.spreadReplayTarget)
				ratio := idem.OpsPerSec / peer.OpsPerSec
				v.Measured = fmt.Sprintf("%.2fx (%.0f vs %.0f replays/s)", ratio, idem.OpsPerSec, peer.OpsPerSec)
				v.Met = ratio >= p.spreadReplayTarget
			}
			out = append(out, v)
		}
	}
	return out
}

// scaleVerdict judges reserve p99 at the most stored records against the fewest. It
// needs two record counts; the target is met only if the larger reached 10 million.
func scaleVerdict(points []Point) (Verdict, bool) {
	if len(points) < 2 {
		return Verdict{}, false
	}
	first, last := points[0], points[0]
	for _, p := range points[1:] {
		if p.Records < first.Records {
			first = p
		}
		if p.Records > last.Records {
			last = p
		}
	}
	change := last.ReserveP99/first.ReserveP99 - 1
	measured := fmt.Sprintf("%+.0f%% (%.2f ms at %d records, %.2f ms at %d records)",
		change*100, first.ReserveP99, first.Records, last.ReserveP99, last.Records)
	if last.Records < 10_000_000 {
		measured += "; 10 million records not reached in this run"
	}
	return Verdict{
		Target:   "reserve p99 unchanged (within 20%) from 10 thousand to 10 million stored records",
		Measured: measured,
		Met:      math.Abs(change) <= 0.2 && last.Records >= 10_000_000,
	}, true
}

func writeJSON(file string, v any) error {
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(file, append(js, '\n'), 0o644)
}

func write(dir string, r *Results, stdout io.Writer) error {
	if err := writeJSON(filepath.Join(dir, "results.json"), r); err != nil {
		return err
	}
	md := markdown(r)
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(md), 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "throughput.png"))
	if err != nil {
		return err
	}
	if err := chart.WritePanelsPNG(f, charts(r)); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	_, err = io.WriteString(stdout, md)
	return err
}

// Colours: reds and purples for three idemkv nodes (one per backend), oranges and
// pinks for one, a colour of its own for each peer.
var (
	idemkvColors = map[int][]color.RGBA{
		3: {{214, 39, 40, 255}, {148, 103, 189, 255}, {140, 86, 75, 255}},
		1: {{255, 127, 14, 255}, {227, 119, 194, 255}, {188, 189, 34, 255}},
	}
	peerColors = map[string]color.RGBA{
		sysPGSync: {23, 190, 207, 255},
		sysPG:     {44, 160, 44, 255},
		sysEtcd:   {31, 119, 180, 255},
	}
)

// charts draws one panel per pairing that ran: new operations against clients.
func charts(r *Results) []chart.Chart {
	series := func(s SystemInfo) chart.Series {
		c, ok := peerColors[s.Name]
		if s.Nodes > 0 {
			i := 0
			for _, o := range r.Systems {
				if o.Name == s.Name {
					break
				}
				if o.Nodes == s.Nodes {
					i++
				}
			}
			colors := idemkvColors[min(s.Nodes, 3)]
			if colors == nil {
				colors = idemkvColors[3]
			}
			c, ok = colors[i%len(colors)], true
		}
		if !ok {
			c = color.RGBA{127, 127, 127, 255}
		}
		out := chart.Series{Name: s.Legend, Color: c}
		for _, p := range r.New {
			if p.System == s.Name {
				out.Points = append(out.Points, chart.Point{X: float64(p.Concurrency), Y: p.OpsPerSec})
			}
		}
		return out
	}
	info := func(name string) SystemInfo {
		i := slices.IndexFunc(r.Systems, func(s SystemInfo) bool { return s.Name == name })
		return r.Systems[i]
	}
	var out []chart.Chart
	for _, p := range pairings {
		idem := pairingSystems(r, p)
		if len(idem) == 0 {
			continue
		}
		c := chart.Chart{Title: strings.ToLower(p.title), XLabel: "clients", YLabel: "ops/s"}
		for _, s := range idem {
			c.Series = append(c.Series, series(s))
		}
		c.Series = append(c.Series, series(info(p.peer)))
		out = append(out, c)
	}
	if len(out) == 0 {
		// No pairing with both sides in the run: one panel with whatever ran.
		c := chart.Chart{Title: "new operations (reserve + commit), durable", XLabel: "clients", YLabel: "ops/s"}
		for _, s := range r.Systems {
			c.Series = append(c.Series, series(s))
		}
		out = append(out, c)
	}
	return out
}

// medianFloors merges the floors of several rounds (run.sh measures them at the start
// of each): each layer is the round of median p50, as each point is its system's
// round of median throughput. nil for none, the one for one.
func medianFloors(fs []*Floors) *Floors {
	switch len(fs) {
	case 0:
		return nil
	case 1:
		return fs[0]
	}
	m := &Floors{EntryBytes: fs[0].EntryBytes, Rounds: len(fs)}
	for _, layer := range []func(*Floors) *loadgen.Summary{
		func(f *Floors) *loadgen.Summary { return &f.Append },
		func(f *Floors) *loadgen.Summary { return &f.Raft },
		func(f *Floors) *loadgen.Summary { return &f.HTTPRaft },
		func(f *Floors) *loadgen.Summary { return &f.HTTPRaftServer },
		func(f *Floors) *loadgen.Summary { return &f.HTTPRaft3 },
	} {
		var got []loadgen.Summary
		for _, f := range fs {
			if s := *layer(f); s.Count > 0 {
				got = append(got, s)
			}
		}
		if len(got) == 0 {
			continue
		}
		slices.SortFunc(got, func(a, b loadgen.Summary) int { return cmp.Compare(a.P50, b.P50) })
		*layer(m) = got[(len(got)-1)/2]
	}
	// The write rates: each number of writers its median round's.
	rates := map[int][]float64{}
	var writers []int
	for _, f := range fs {
		for _, t := range f.HTTPRaft3Writers {
			if _, ok := rates[t.Writers]; !ok {
				writers = append(writers, t.Writers)
			}
			rates[t.Writers] = append(rates[t.Writers], t.WritesPerSec)
		}
	}
	slices.Sort(writers)
	for _, w := range writers {
		got := rates[w]
		slices.Sort(got)
		m.HTTPRaft3Writers = append(m.HTTPRaft3Writers, FloorThroughput{Writers: w, WritesPerSec: got[(len(got)-1)/2]})
	}
	return m
}
