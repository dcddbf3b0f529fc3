// Command bench runs the same agent workload against idemkv, etcd and PostgreSQL in one
// run on one machine and writes the comparison as JSON, Markdown and a PNG chart.
// bench/run.sh starts the three systems and calls it; see bench/README.md.
//
// Its subcommands serve `run.sh scale`, which measures idemkv's reserve latency against
// millions of stored records without loading them through the API: `bench seed`
// writes a backup of N synthetic committed records, `bench scale-point` measures one
// record count on a cluster restored from it, and `bench scale-report` gathers the
// points into results/scale.md and scale.json.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench/chart"
	"github.com/idemkv/idemkv/bench/etcdtarget"
	"github.com/idemkv/idemkv/bench/pgtarget"
	"github.com/idemkv/idemkv/loadgen"
)

type options struct {
	idemkv, etcd, pg string
	concurrency      []int
	duration, warmup time.Duration
	keys             int
	replayAt         int
	scale            []int
	scaleAt          int
	fsyncDir         string
	fsyncSamples     int
	out              string
	tenant           string
	profile          bool
}

// subcommands run instead of the comparison when named first (`bench seed …`); they
// serve bench/run.sh's scale mode.
var subcommands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{
	"seed":         runSeed,
	"scale-point":  runScalePoint,
	"scale-report": runScaleReport,
}

func main() {
	if len(os.Args) > 1 {
		if sub, ok := subcommands[os.Args[1]]; ok {
			// run.sh stops what it started with SIGTERM; a seed must still clean up.
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			err := sub(ctx, os.Args[2:], os.Stdout, os.Stderr)
			stop()
			switch {
			case errors.Is(err, flag.ErrHelp):
			case err != nil:
				fmt.Fprintln(os.Stderr, "bench:", err)
				os.Exit(1)
			}
			return
		}
	}
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if err := run(ctx, o, logger, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&o.idemkv, "idemkv", "", "idemkv API addresses, comma separated")
	fs.StringVar(&o.etcd, "etcd", "", "etcd client addresses, comma separated")
	fs.StringVar(&o.pg, "pg", "", "PostgreSQL connection string")
	conc := fs.String("concurrency", "1,16,64,256", "client counts to measure new operations at")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured time per point")
	fs.DurationVar(&o.warmup, "warmup", 3*time.Second, "unmeasured time before each point")
	fs.IntVar(&o.keys, "keys", 2000, "committed keys the replay point draws from")
	fs.IntVar(&o.replayAt, "replay-at", 64, "clients for the replay point (0: none)")
	scale := fs.String("scale", "", "stored-record counts to measure idemkv's reserve p99 at, e.g. 10000,1000000 (loads the cluster up to each)")
	fs.IntVar(&o.scaleAt, "scale-at", 64, "clients for the scale points")
	fs.StringVar(&o.fsyncDir, "fsync-dir", "", "directory to measure fsync latency in (the data dirs' disk)")
	fs.IntVar(&o.fsyncSamples, "fsync-samples", 500, "fsync probe samples")
	fs.StringVar(&o.out, "out", "results", "directory for results.json, results.md and throughput.png")
	fs.StringVar(&o.tenant, "tenant", "bench", "tenant of every key")
	fs.BoolVar(&o.profile, "profile", false, "after the points, profile the idemkv leader's CPU for 10 s under new operations at --replay-at clients, in a run left out of the tables (needs serve --pprof)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	if o.concurrency, err = ints(*conc); err != nil {
		return o, fmt.Errorf("--concurrency: %w", err)
	}
	if o.scale, err = ints(*scale); err != nil {
		return o, fmt.Errorf("--scale: %w", err)
	}
	if o.idemkv == "" && o.etcd == "" && o.pg == "" {
		return o, errors.New("give at least one of --idemkv, --etcd, --pg")
	}
	return o, nil
}

func ints(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// system is one store under comparison.
type system struct {
	name  string
	color color.RGBA
	open  func(ctx context.Context, conns int) (loadgen.Target, error)
}

func systems(o options) []system {
	var out []system
	if o.idemkv != "" {
		out = append(out, system{"idemkv", color.RGBA{214, 39, 40, 255}, func(ctx context.Context, conns int) (loadgen.Target, error) {
			return loadgen.NewHTTPTarget(ctx, loadgen.HTTPConfig{Endpoints: strings.Split(o.idemkv, ","), Tenant: o.tenant, Conns: conns})
		}})
	}
	if o.etcd != "" {
		out = append(out, system{"etcd", color.RGBA{31, 119, 180, 255}, func(ctx context.Context, _ int) (loadgen.Target, error) {
			return etcdtarget.New(ctx, etcdtarget.Config{Endpoints: strings.Split(o.etcd, ","), Tenant: o.tenant})
		}})
	}
	if o.pg != "" {
		out = append(out, system{"postgres", color.RGBA{44, 160, 44, 255}, func(ctx context.Context, conns int) (loadgen.Target, error) {
			return pgtarget.New(ctx, pgtarget.Config{DSN: o.pg, Tenant: o.tenant, Conns: conns})
		}})
	}
	return out
}

// Results is what results.json holds.
type Results struct {
	Started     time.Time       `json:"started"`
	CPUs        int             `json:"cpus"`
	Duration    string          `json:"duration_per_point"`
	Warmup      string          `json:"warmup_per_point"`
	Fsync       loadgen.Summary `json:"fsync"`
	New         []Point         `json:"new_operations"`
	Replay      []Point         `json:"replays,omitempty"`
	Scale       []Point         `json:"scale,omitempty"`
	Targets     []Verdict       `json:"targets"`
	ProfileFile string          `json:"profile,omitempty"`
}

// Point is one measured run.
type Point struct {
	System      string  `json:"system"`
	Workload    string  `json:"workload"`
	Concurrency int     `json:"concurrency"`
	Records     int     `json:"records,omitempty"`
	OpsPerSec   float64 `json:"ops_per_sec"`
	P50         float64 `json:"p50_ms"`
	P99         float64 `json:"p99_ms"`
	ReserveP50  float64 `json:"reserve_p50_ms"`
	ReserveP99  float64 `json:"reserve_p99_ms"`
	Errors      uint64  `json:"errors"`
	// Report is the whole loadgen report, with every kind and quantile.
	Report *loadgen.Report `json:"report"`
}

// Verdict is one target of the issue, as measured.
type Verdict struct {
	Target   string `json:"target"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
}

func run(ctx context.Context, o options, logger *slog.Logger, stdout io.Writer) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	res := &Results{Started: time.Now().UTC(), CPUs: runtime.NumCPU(), Duration: o.duration.String(), Warmup: o.warmup.String()}
	fs, err := loadgen.ProbeFsync(o.fsyncDir, o.fsyncSamples)
	if err != nil {
		return err
	}
	res.Fsync = fs.Summarize()
	logger.Info("fsync probe", "p50_ms", res.Fsync.P50, "p99_ms", res.Fsync.P99)

	syss := systems(o)
	// The scale points come first, on the fresh cluster, so that the record counts
	// they report are exact.
	if len(o.scale) > 0 && o.idemkv != "" {
		if res.Scale, err = measureScale(ctx, o, logger, syss[0]); err != nil {
			return err
		}
	}
	// Systems take turns at each concurrency, so that anything else the machine does
	// during the run falls on all of them alike.
	for _, c := range o.concurrency {
		for _, s := range syss {
			p, err := measure(ctx, o, logger, s, c, loadgen.Mix{New: 1}, "new", false, res)
			if err != nil {
				return err
			}
			res.New = append(res.New, p)
		}
	}
	if o.replayAt > 0 {
		for _, s := range syss {
			p, err := measure(ctx, o, logger, s, o.replayAt, loadgen.Mix{Replay: 1}, "replay", false, res)
			if err != nil {
				return err
			}
			res.Replay = append(res.Replay, p)
		}
	}
	if o.profile && o.idemkv != "" {
		// A run of its own, left out of the tables: profiling costs the leader CPU.
		if _, err := measure(ctx, o, logger, syss[0], max(o.replayAt, 1), loadgen.Mix{New: 1}, "new", true, res); err != nil {
			return err
		}
	}
	res.Targets = verdicts(res, o)
	return write(o.out, res, syss, stdout)
}

func measure(ctx context.Context, o options, logger *slog.Logger, s system, conc int, mix loadgen.Mix, workload string, profile bool, res *Results) (Point, error) {
	tgt, err := openWithRetry(ctx, s, conc)
	if err != nil {
		return Point{}, err
	}
	defer tgt.Close()
	var profDone chan error
	if profile {
		profDone = make(chan error, 1)
		leader := tgt.(*loadgen.HTTPTarget).Leader()
		file := filepath.Join(o.out, "idemkv-cpu.pprof")
		go func() {
			// Start once warm-up is over, so the profile shows the measured load.
			select {
			case <-time.After(o.warmup + time.Second):
			case <-ctx.Done():
			}
			profDone <- fetchProfile(ctx, leader, file, min(10*time.Second, o.duration-2*time.Second))
		}()
		res.ProfileFile = file
	}
	rep, err := loadgen.Run(ctx, loadgen.Config{Target: tgt, Name: s.name, Concurrency: conc, Duration: o.duration,
		Warmup: o.warmup, Keys: o.keys, Mix: mix, Progress: os.Stderr, ProgressTTY: false, Logger: logger})
	if err != nil {
		return Point{}, fmt.Errorf("%s at %d clients: %w", s.name, conc, err)
	}
	if profDone != nil {
		if err := <-profDone; err != nil {
			logger.Warn("no CPU profile", "err", err)
			res.ProfileFile = ""
		}
	}
	p := point(s.name, workload, conc, rep)
	logger.Info("point", "system", s.name, "workload", workload, "clients", conc, "ops_per_sec", int(p.OpsPerSec),
		"p50_ms", p.P50, "p99_ms", p.P99, "errors", p.Errors)
	return p, nil
}

func point(name, workload string, conc int, rep *loadgen.Report) Point {
	k := rep.Kind(workload)
	p := Point{System: name, Workload: workload, Concurrency: conc, OpsPerSec: rep.Throughput,
		P50: k.Latency.P50, P99: k.Latency.P99, Errors: rep.Errors, Report: rep}
	reserve := k
	if workload == "new" {
		reserve = rep.Kind("new.reserve")
	}
	p.ReserveP50, p.ReserveP99 = reserve.Latency.P50, reserve.Latency.P99
	return p
}

// openWithRetry waits up to a minute for a system that is still starting.
func openWithRetry(ctx context.Context, s system, conns int) (loadgen.Target, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		tgt, err := s.open(ctx, conns)
		if err == nil {
			return tgt, nil
		}
		if !errors.Is(err, idemkv.ErrUnavailable) || time.Now().After(deadline) {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// measureScale loads idemkv up to each record count with new operations, then
// measures a point there: reserve latency must not grow with the store.
func measureScale(ctx context.Context, o options, logger *slog.Logger, s system) ([]Point, error) {
	tgt, err := openWithRetry(ctx, s, 256)
	if err != nil {
		return nil, err
	}
	defer tgt.Close()
	loaded := 0
	var out []Point
	for _, n := range o.scale {
		if n > loaded {
			logger.Info("loading", "records", n-loaded)
			rep, err := loadgen.Run(ctx, loadgen.Config{Target: tgt, Name: "load", Concurrency: 256, Ops: int64(n - loaded),
				Duration: 24 * time.Hour, Warmup: -1, Mix: loadgen.Mix{New: 1}, Progress: os.Stderr, Logger: logger})
			if err != nil {
				return nil, err
			}
			loaded += int(rep.Ops)
		}
		rep, err := loadgen.Run(ctx, loadgen.Config{Target: tgt, Name: s.name, Concurrency: o.scaleAt, Duration: o.duration,
			Warmup: o.warmup, Mix: loadgen.Mix{New: 1}, Progress: os.Stderr, Logger: logger})
		if err != nil {
			return nil, err
		}
		p := point(s.name, "new", o.scaleAt, rep)
		p.Records = loaded
		loaded += int(rep.Ops)
		logger.Info("scale point", "records", p.Records, "reserve_p99_ms", p.ReserveP99)
		out = append(out, p)
	}
	return out, nil
}

func fetchProfile(ctx context.Context, leader, file string, d time.Duration) error {
	url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", leader, int(d.Seconds()))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

func find(points []Point, system string, conc int) *Point {
	for i := range points {
		if points[i].System == system && points[i].Concurrency == conc {
			return &points[i]
		}
	}
	return nil
}

// verdicts holds the measured run against the targets of the issue. They are printed,
// never asserted: a machine is what it is.
func verdicts(r *Results, o options) []Verdict {
	var out []Verdict
	at := o.replayAt
	if at == 0 {
		at = 64
	}
	idem, etcd, pg := find(r.New, "idemkv", at), find(r.New, "etcd", at), find(r.New, "postgres", at)
	if idem != nil && etcd != nil {
		ratio := idem.OpsPerSec / etcd.OpsPerSec
		out = append(out, Verdict{
			Target: fmt.Sprintf("new operations, 3 nodes, %d clients: >= 1.5x etcd's throughput, p99 <= etcd's", at),
			Measured: fmt.Sprintf("%.2fx (%.0f vs %.0f ops/s); p99 %.2f vs %.2f ms",
				ratio, idem.OpsPerSec, etcd.OpsPerSec, idem.P99, etcd.P99),
			Met: ratio >= 1.5 && idem.P99 <= etcd.P99,
		})
	}
	if rp := find(r.Replay, "idemkv", at); rp != nil && idem != nil {
		ratio := rp.OpsPerSec / idem.OpsPerSec
		out = append(out, Verdict{
			Target:   "replays: >= 5x idemkv's own new-operation throughput",
			Measured: fmt.Sprintf("%.2fx (%.0f vs %.0f ops/s)", ratio, rp.OpsPerSec, idem.OpsPerSec),
			Met:      ratio >= 5,
		})
	}
	if one := find(r.New, "idemkv", 1); one != nil {
		ratio := one.ReserveP50 / r.Fsync.P50
		out = append(out, Verdict{
			Target:   "one client: reserve p50 within 3x the machine's fsync latency",
			Measured: fmt.Sprintf("%.2fx (reserve p50 %.3f ms, fsync p50 %.3f ms)", ratio, one.ReserveP50, r.Fsync.P50),
			Met:      ratio <= 3,
		})
	}
	if v, ok := scaleVerdict(r.Scale); ok {
		out = append(out, v)
	}
	if idem != nil && pg != nil {
		ratio := idem.OpsPerSec / pg.OpsPerSec
		out = append(out, Verdict{
			Target:   fmt.Sprintf("beat PostgreSQL (one unreplicated server) at %d clients", at),
			Measured: fmt.Sprintf("%.2fx (%.0f vs %.0f ops/s)", ratio, idem.OpsPerSec, pg.OpsPerSec),
			Met:      ratio > 1,
		})
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

func write(dir string, r *Results, syss []system, stdout io.Writer) error {
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	md := markdown(r)
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(md), 0o644); err != nil {
		return err
	}
	c := chart.Chart{Title: "new operations (reserve + commit), durable", XLabel: "clients", YLabel: "ops/s"}
	for _, s := range syss {
		ser := chart.Series{Name: s.name, Color: s.color}
		for _, p := range r.New {
			if p.System == s.name {
				ser.Points = append(ser.Points, chart.Point{X: float64(p.Concurrency), Y: p.OpsPerSec})
			}
		}
		c.Series = append(c.Series, ser)
	}
	f, err := os.Create(filepath.Join(dir, "throughput.png"))
	if err != nil {
		return err
	}
	if err := c.WritePNG(f); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	_, err = io.WriteString(stdout, md)
	return err
}

func markdown(r *Results) string {
	var b strings.Builder
	fmt.Fprintf(&b, "New operations (reserve → commit), %s per point after %s of warm-up, %d CPUs, fsync p50 %.2f ms / p99 %.2f ms.\n\n",
		r.Duration, r.Warmup, r.CPUs, r.Fsync.P50, r.Fsync.P99)
	b.WriteString("| system | clients | ops/s | p50 ms | p99 ms | reserve p50 ms | idemkv ÷ system |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range r.New {
		ratio := "—"
		if idem := find(r.New, "idemkv", p.Concurrency); idem != nil && p.System != "idemkv" {
			ratio = fmt.Sprintf("%.2f×", idem.OpsPerSec/p.OpsPerSec)
		}
		fmt.Fprintf(&b, "| %s | %d | %.0f | %.2f | %.2f | %.2f | %s |\n", p.System, p.Concurrency, p.OpsPerSec, p.P50, p.P99, p.ReserveP50, ratio)
	}
	if len(r.Replay) > 0 {
		b.WriteString("\nReplays (reserve of a committed key with the same effect):\n\n| system | clients | ops/s | p50 ms | p99 ms | idemkv ÷ system |\n|---|---:|---:|---:|---:|---:|\n")
		for _, p := range r.Replay {
			ratio := "—"
			if idem := find(r.Replay, "idemkv", p.Concurrency); idem != nil && p.System != "idemkv" {
				ratio = fmt.Sprintf("%.2f×", idem.OpsPerSec/p.OpsPerSec)
			}
			fmt.Fprintf(&b, "| %s | %d | %.0f | %.2f | %.2f | %s |\n", p.System, p.Concurrency, p.OpsPerSec, p.P50, p.P99, ratio)
		}
	}
	if len(r.Scale) > 0 {
		b.WriteString("\nidemkv reserve latency against stored records:\n\n| records | clients | ops/s | reserve p50 ms | reserve p99 ms |\n|---:|---:|---:|---:|---:|\n")
		for _, p := range r.Scale {
			fmt.Fprintf(&b, "| %d | %d | %.0f | %.2f | %.2f |\n", p.Records, p.Concurrency, p.OpsPerSec, p.ReserveP50, p.ReserveP99)
		}
	}
	errs := uint64(0)
	for _, ps := range [][]Point{r.New, r.Replay, r.Scale} {
		for _, p := range ps {
			errs += p.Errors
		}
	}
	fmt.Fprintf(&b, "\nFailed operations across all points: %d.\n\nTargets:\n\n", errs)
	for _, v := range r.Targets {
		mark := "missed"
		if v.Met {
			mark = "met"
		}
		fmt.Fprintf(&b, "- %s — **%s**: %s\n", v.Target, mark, v.Measured)
	}
	return b.String()
}
