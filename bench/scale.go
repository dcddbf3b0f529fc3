package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/idemkv/idemkv/loadgen"
)

// ScalePoint is one record count of `run.sh scale`: the new operations measured on a
// cluster restored from a seeded backup of that many records, and how long getting
// there took.
type ScalePoint struct {
	Point
	Warmup   string  `json:"warmup"`
	Duration string  `json:"duration"`
	Phases   []Phase `json:"phases"`
	// RoundsP99 holds the reserve p99 of every round when the point ran more than one
	// (--rounds); the point's figures are those of the round with the median p99.
	RoundsP99 []float64 `json:"reserve_p99_ms_per_round,omitempty"`
	// Snapshots counts the Raft snapshots the nodes persisted while the point ran
	// (warm-up included), from their logs. Each writes the whole store, so at millions
	// of records one that falls inside the window weighs on the latencies.
	Snapshots int `json:"raft_snapshots_during_point"`
}

// Phase is one timed step of a scale point.
type Phase struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
}

// ScaleResults is what scale.json holds.
type ScaleResults struct {
	Written time.Time    `json:"written"`
	CPUs    int          `json:"cpus"`
	Points  []ScalePoint `json:"points"`
	Target  *Verdict     `json:"target,omitempty"`
}

// phaseFlag collects --phase name=duration in the order given.
type phaseFlag []Phase

func (p *phaseFlag) String() string {
	parts := make([]string, len(*p))
	for i, ph := range *p {
		parts[i] = fmt.Sprintf("%s=%gs", ph.Name, ph.Seconds)
	}
	return strings.Join(parts, ",")
}

func (p *phaseFlag) Set(v string) error {
	name, dur, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return fmt.Errorf("%q is not name=duration", v)
	}
	d, err := time.ParseDuration(dur)
	if err != nil {
		return fmt.Errorf("phase %s: %w", name, err)
	}
	*p = append(*p, Phase{Name: name, Seconds: d.Seconds()})
	return nil
}

type scalePointOptions struct {
	idemkv      string
	records     int
	concurrency int
	duration    time.Duration
	warmup      time.Duration
	rounds      int
	tenant      string
	phases      phaseFlag
	nodeLogs    string
	point       string
}

func parseScalePointFlags(args []string) (scalePointOptions, error) {
	var o scalePointOptions
	fs := flag.NewFlagSet("bench scale-point", flag.ContinueOnError)
	fs.StringVar(&o.idemkv, "idemkv", "", "idemkv API addresses, comma separated (required)")
	fs.IntVar(&o.records, "records", 0, "records the cluster was seeded with (required)")
	fs.IntVar(&o.concurrency, "concurrency", 16, "clients running new operations")
	fs.DurationVar(&o.duration, "duration", 30*time.Second, "measured time")
	fs.DurationVar(&o.warmup, "warmup", 5*time.Second, "unmeasured time before measuring")
	fs.IntVar(&o.rounds, "rounds", 1, "measured rounds of --duration, back to back after one warm-up; the point is the round with the median reserve p99")
	fs.StringVar(&o.tenant, "tenant", "bench", "tenant of every key")
	fs.Var(&o.phases, "phase", "name=duration of a phase that led here, e.g. seed=1m2s (repeatable, kept in order)")
	fs.StringVar(&o.nodeLogs, "node-logs", "", "the nodes' log files, comma separated, to count the Raft snapshots taken during the point")
	fs.StringVar(&o.point, "point", "", "file to write the point to as JSON (required)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.idemkv == "":
		return o, errors.New("--idemkv is required")
	case o.records <= 0:
		return o, errors.New("--records must be positive")
	case o.concurrency <= 0:
		return o, errors.New("--concurrency must be positive")
	case o.duration <= 0:
		return o, errors.New("--duration must be positive")
	case o.rounds <= 0:
		return o, errors.New("--rounds must be positive")
	case o.point == "":
		return o, errors.New("--point is required")
	}
	return o, nil
}

// runScalePoint measures new operations at one record count and writes the point.
func runScalePoint(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseScalePointFlags(args)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	sys := system{SystemInfo: SystemInfo{Name: "idemkv"}, open: func(ctx context.Context, conns int, _ string) (loadgen.Target, error) {
		return loadgen.NewHTTPTarget(ctx, loadgen.HTTPConfig{Endpoints: strings.Split(o.idemkv, ","), Tenant: o.tenant, Conns: conns})
	}}
	tgt, err := openWithRetry(ctx, sys, o.concurrency, routeLeader)
	if err != nil {
		return err
	}
	defer tgt.Close()
	var logs []string
	if o.nodeLogs != "" {
		logs = strings.Split(o.nodeLogs, ",")
	}
	before, err := countSnapshots(logs)
	if err != nil {
		return err
	}
	warmup := o.warmup
	if warmup == 0 {
		warmup = -1 // zero means the default to loadgen; here it means none
	}
	start := time.Now()
	var rounds []Point
	for r := range o.rounds {
		if r > 0 {
			warmup = -1 // the cluster is warm from the round before
		}
		rep, err := loadgen.Run(ctx, loadgen.Config{Target: tgt, Name: "idemkv", Concurrency: o.concurrency, Duration: o.duration,
			Warmup: warmup, Mix: loadgen.Mix{New: 1}, Progress: stderr, Logger: logger})
		if err != nil {
			return fmt.Errorf("%d records, round %d: %w", o.records, r+1, err)
		}
		rounds = append(rounds, point("idemkv", "new", o.concurrency, rep))
	}
	took := time.Since(start)
	after, err := countSnapshots(logs)
	if err != nil {
		return err
	}
	p := medianRound(rounds)
	p.Records, p.Warmup, p.Duration = o.records, o.warmup.String(), o.duration.String()
	p.Phases = append(slices.Clone(o.phases), Phase{Name: "measure", Seconds: took.Seconds()})
	p.Snapshots = after - before
	js, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(o.point, append(js, '\n'), 0o644); err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%d records: %.0f ops/s, reserve p50 %.2f ms, p99 %.2f ms, %d errors, %d Raft snapshots during the point\n",
		p.Records, p.OpsPerSec, p.ReserveP50, p.ReserveP99, p.Errors, p.Snapshots)
	return err
}

// medianRound makes the point of the round with the median reserve p99 (the lower
// middle one of an even count), listing every round's p99 when there are several.
// Errors count across all rounds: a failure in any round is a failure of the point.
func medianRound(rounds []Point) ScalePoint {
	sorted := slices.Clone(rounds)
	slices.SortStableFunc(sorted, func(a, b Point) int { return cmp.Compare(a.ReserveP99, b.ReserveP99) })
	p := ScalePoint{Point: sorted[(len(sorted)-1)/2]}
	p.Errors = 0
	for _, r := range rounds {
		p.Errors += r.Errors
		if len(rounds) > 1 {
			p.RoundsP99 = append(p.RoundsP99, r.ReserveP99)
		}
	}
	return p
}

// snapshotLogLine is what package fsm logs each time a node persists a Raft snapshot.
var snapshotLogLine = []byte("persisted snapshot")

// countSnapshots counts the persisted snapshots recorded in the given log files.
func countSnapshots(files []string) (int, error) {
	n := 0
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return 0, err
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if bytes.Contains(sc.Bytes(), snapshotLogLine) {
				n++
			}
		}
		err = errors.Join(sc.Err(), fh.Close())
		if err != nil {
			return 0, fmt.Errorf("%s: %w", f, err)
		}
	}
	return n, nil
}

// runScaleReport gathers the points that scale-point wrote into scale.json and
// scale.md, with the verdict on the target, and prints the Markdown.
func runScaleReport(_ context.Context, args []string, stdout, _ io.Writer) error {
	fs := flag.NewFlagSet("bench scale-report", flag.ContinueOnError)
	out := fs.String("out", "results", "directory for scale.json and scale.md")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("give the point files that scale-point wrote")
	}
	res := &ScaleResults{Written: time.Now().UTC(), CPUs: runtime.NumCPU()}
	for _, f := range fs.Args() {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var p ScalePoint
		if err := json.Unmarshal(b, &p); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		res.Points = append(res.Points, p)
	}
	slices.SortStableFunc(res.Points, func(a, b ScalePoint) int { return a.Records - b.Records })
	plain := make([]Point, len(res.Points))
	for i, p := range res.Points {
		plain[i] = p.Point
	}
	if v, ok := scaleVerdict(plain); ok {
		res.Target = &v
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "scale.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	md := scaleMarkdown(res)
	if err := os.WriteFile(filepath.Join(*out, "scale.md"), []byte(md), 0o644); err != nil {
		return err
	}
	_, err = io.WriteString(stdout, md)
	return err
}

func scaleMarkdown(r *ScaleResults) string {
	var b strings.Builder
	if len(r.Points) == 0 {
		return "No scale points.\n"
	}
	p0 := r.Points[0]
	rounds := slices.ContainsFunc(r.Points, func(p ScalePoint) bool { return len(p.RoundsP99) > 0 })
	fmt.Fprintf(&b, "idemkv reserve latency against stored records: new operations (reserve → commit) at %d clients, "+
		"%s measured after %s of warm-up, %d CPUs. ", p0.Concurrency, p0.Duration, p0.Warmup, r.CPUs)
	if rounds {
		b.WriteString("Points ran several rounds of that length back to back; a point's figures are those of its round " +
			"with the median reserve p99. ")
	}
	b.WriteString("Each three-node cluster was restored from a seeded backup of that many committed records, the " +
		"followers getting them by Raft snapshot install. The records column counts the seeded records; each point " +
		"adds its own new ones on top (about ops/s × the time it ran).\n\n")
	b.WriteString("| records | ops/s | reserve p50 ms | reserve p99 ms | p99 ÷ smallest count's p99 |")
	if rounds {
		b.WriteString(" reserve p99 ms of each round |")
	}
	b.WriteString("\n|---:|---:|---:|---:|---:|")
	if rounds {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, p := range r.Points {
		fmt.Fprintf(&b, "| %d | %.0f | %.2f | %.2f | %.2f× |", p.Records, p.OpsPerSec, p.ReserveP50, p.ReserveP99, p.ReserveP99/p0.ReserveP99)
		if rounds {
			each := make([]string, len(p.RoundsP99))
			for i, v := range p.RoundsP99 {
				each[i] = fmt.Sprintf("%.2f", v)
			}
			fmt.Fprintf(&b, " %s |", strings.Join(each, ", "))
		}
		b.WriteString("\n")
	}
	var names []string
	for _, p := range r.Points {
		for _, ph := range p.Phases {
			if !slices.Contains(names, ph.Name) {
				names = append(names, ph.Name)
			}
		}
	}
	b.WriteString("\nTime per phase, seconds (seed 0: the cached backup was reused), and Raft snapshots persisted by the nodes during the point:\n\n| records |")
	for _, n := range names {
		fmt.Fprintf(&b, " %s |", n)
	}
	b.WriteString(" snapshots |\n|---:|" + strings.Repeat("---:|", len(names)+1) + "\n")
	for _, p := range r.Points {
		fmt.Fprintf(&b, "| %d |", p.Records)
		for _, n := range names {
			i := slices.IndexFunc(p.Phases, func(ph Phase) bool { return ph.Name == n })
			if i < 0 {
				b.WriteString(" — |")
			} else {
				fmt.Fprintf(&b, " %.1f |", p.Phases[i].Seconds)
			}
		}
		fmt.Fprintf(&b, " %d |\n", p.Snapshots)
	}
	errs := uint64(0)
	for _, p := range r.Points {
		errs += p.Errors
	}
	fmt.Fprintf(&b, "\nFailed operations across all points: %d.\n\nTargets:\n\n", errs)
	if r.Target == nil {
		b.WriteString("- reserve p99 unchanged (within 20%) from 10 thousand to 10 million stored records — not judged: it needs two record counts\n")
	} else {
		mark := "missed"
		if r.Target.Met {
			mark = "met"
		}
		fmt.Fprintf(&b, "- %s — **%s**: %s\n", r.Target.Target, mark, r.Target.Measured)
	}
	return b.String()
}
