// Command bench runs the same agent workload against idemkv, etcd and PostgreSQL in one
// run on one machine and writes the comparison as JSON, Markdown and a PNG chart. It
// leads with like-for-like pairings (three idemkv nodes against a PostgreSQL primary
// with two quorum-synchronous standbys, one node against one server), then etcd, and
// measures each idemkv size once per Raft log backend it is given.
// bench/run.sh starts the systems and calls it; see bench/README.md.
//
// Its subcommands serve `run.sh scale`, which measures idemkv's reserve latency against
// millions of stored records without loading them through the API: `bench seed`
// writes a backup of N synthetic committed records, `bench scale-point` measures one
// record count on a cluster restored from it, and `bench scale-report` gathers the
// points into results/scale.md and scale.json.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/idemkv/idemkv/loadgen"
)

type options struct {
	idemkv3, idemkv1 []cluster
	etcd, pg, pgSync string
	concurrency      []int
	duration, warmup time.Duration
	keys             int
	replayAt         int
	scale            []int
	scaleAt          int
	fsyncDir         string
	fsyncSamples     int
	// floors is how long each floor (floor.go) is measured; 0 skips them.
	floors  time.Duration
	out     string
	part    string
	tenant  string
	profile bool
	// cpuPids are the processes of the one system measured (with their descendants),
	// whose CPU time each point reports per thousand operations.
	cpuPids []int
	procDir string
	// settleMax bounds the wait, before each point, for the system to go idle.
	settleMax time.Duration
}

// subcommands run instead of the comparison when named first (`bench seed …`); they
// serve bench/run.sh's scale mode.
var subcommands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{
	"seed":         runSeed,
	"scale-point":  runScalePoint,
	"scale-report": runScaleReport,
	"report":       runReport,
	"floor-server": runFloorServer,
	"settle":       runSettle,
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
	if errors.Is(err, flag.ErrHelp) {
		return
	}
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
	fs.Var(clusterFlag{3, &o.idemkv3}, "idemkv3", "a three-node idemkv cluster: `BACKEND=ADDR,ADDR,ADDR`, its Raft log and API addresses (repeatable, one per backend)")
	fs.Var(clusterFlag{1, &o.idemkv1}, "idemkv1", "a single-node idemkv cluster: `BACKEND=ADDR` (repeatable, one per backend)")
	fs.StringVar(&o.pgSync, "pg-sync", "", "connection string of a PostgreSQL primary with two standbys in quorum-synchronous replication (each point checks pg_stat_replication first)")
	fs.StringVar(&o.pg, "pg", "", "connection string of a single PostgreSQL server")
	fs.StringVar(&o.etcd, "etcd", "", "etcd client addresses of a three-member cluster, comma separated")
	conc := fs.String("concurrency", "1,16,64,256", "client counts to measure new operations at")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured time per point")
	fs.DurationVar(&o.warmup, "warmup", 3*time.Second, "unmeasured time before each point")
	fs.IntVar(&o.keys, "keys", 2000, "committed keys the replay points draw from")
	fs.IntVar(&o.replayAt, "replay-at", 64, "clients for the replay points (0: none)")
	scale := fs.String("scale", "", "stored-record counts to measure the first three-node cluster's reserve p99 at, e.g. 10000,1000000 (loads the cluster up to each)")
	fs.IntVar(&o.scaleAt, "scale-at", 64, "clients for the scale points")
	fs.StringVar(&o.fsyncDir, "fsync-dir", "", "directory to measure fsync latency in (the data dirs' disk)")
	fs.IntVar(&o.fsyncSamples, "fsync-samples", 500, "fsync probe samples")
	fs.DurationVar(&o.floors, "floors", 2*time.Second, "measure each floor of a lone writer's write for this long before the points, in --fsync-dir: raft-wal's append, hashicorp/raft's Apply on one voter, that Apply behind net/http (0: none)")
	fs.StringVar(&o.out, "out", "results", "directory for results.json, results.md and throughput.png")
	fs.StringVar(&o.part, "part", "", "write the points to this file as JSON instead of writing the results, for `bench report` to gather with other parts")
	fs.StringVar(&o.tenant, "tenant", "bench", "tenant of every key")
	fs.DurationVar(&o.settleMax, "settle-max", 30*time.Second, "with --cpu-pids, the longest wait before each point for the system's processes to go idle (under a fifth of a core): the flushes, compactions and checkpoints the previous point left are not this point's (0: no wait)")
	fs.Var(pidsFlag{&o.cpuPids}, "cpu-pids", "`PIDS` of the processes of the one system measured, comma separated: each point reports the CPU time they and all their descendants spent per thousand operations, from /proc (run.sh passes them)")
	fs.BoolVar(&o.profile, "profile", false, "after the points, profile the first three-node cluster's leader for 10 s under new operations at --replay-at clients, in a run left out of the tables (needs serve --pprof)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if o.concurrency, err = ints(*conc); err != nil {
		return o, fmt.Errorf("--concurrency: %w", err)
	}
	if o.scale, err = ints(*scale); err != nil {
		return o, fmt.Errorf("--scale: %w", err)
	}
	if o.floors < 0 {
		return o, fmt.Errorf("--floors %s: want a duration of 0 or more", o.floors)
	}
	named := len(o.idemkv3) + len(o.idemkv1)
	for _, s := range []string{o.etcd, o.pg, o.pgSync} {
		if s != "" {
			named++
		}
	}
	if named == 0 {
		return o, errors.New("give at least one of --idemkv3, --idemkv1, --pg-sync, --pg, --etcd")
	}
	if len(o.cpuPids) > 0 && named > 1 {
		return o, errors.New("--cpu-pids names the processes of one system: give one of --idemkv3, --idemkv1, --pg-sync, --pg, --etcd with it")
	}
	o.procDir = "/proc"
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

// job is one point to measure.
type job struct {
	sys      system
	clients  int
	workload string // "new" or "replay"
	route    string // a replay's route on idemkv
}

func (j job) String() string {
	what := "new operations"
	if j.workload == "replay" {
		what = "replays"
		if j.route != "" {
			what += " (" + j.route + ")"
		}
	}
	return fmt.Sprintf("%s, %s, %d %s", j.sys.Name, what, j.clients, plural(j.clients, "client"))
}

// plan lists the points in the order they run: at each client count every system in
// turn, so that whatever else the machine does falls on all of them alike; then the
// replays, idemkv's three-node clusters both to the leader and spread over the nodes.
func plan(o options, syss []system) []job {
	var jobs []job
	for _, c := range o.concurrency {
		for _, s := range syss {
			jobs = append(jobs, job{sys: s, clients: c, workload: "new"})
		}
	}
	if o.replayAt > 0 {
		for _, s := range syss {
			switch {
			case s.Nodes > 1:
				jobs = append(jobs, job{s, o.replayAt, "replay", routeLeader}, job{s, o.replayAt, "replay", routeSpread})
			case s.Nodes == 1:
				jobs = append(jobs, job{s, o.replayAt, "replay", routeLeader})
			default:
				jobs = append(jobs, job{s, o.replayAt, "replay", ""})
			}
		}
	}
	return jobs
}

func run(ctx context.Context, o options, logger *slog.Logger, stdout io.Writer) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	res := &Results{Started: time.Now().UTC(), CPUs: runtime.NumCPU(), Duration: o.duration.String(),
		Warmup: o.warmup.String(), LoadAtStart: loadAverage()}
	fs, err := loadgen.ProbeFsync(o.fsyncDir, o.fsyncSamples)
	if err != nil {
		return err
	}
	res.Fsync = fs.Summarize()
	logger.Info("fsync probe", "p50_ms", res.Fsync.P50, "p99_ms", res.Fsync.P99)
	if o.floors > 0 {
		// After the system's own start-up work (a fresh cluster's joins, first
		// checkpoint, Pebble's first flushes), as a point would be.
		if _, _, err := settle(ctx, o); err != nil {
			return fmt.Errorf("floors: waiting for the system to go idle: %w", err)
		}
		logger.Info("measuring the floors of a write", "each", o.floors)
		if res.Floors, err = probeFloors(ctx, o.fsyncDir, o.floors); err != nil {
			return err
		}
		logger.Info("floors", "wal_append_p50_ms", res.Floors.Append.P50, "raft_apply_p50_ms", res.Floors.Raft.P50,
			"http_raft_apply_p50_ms", res.Floors.HTTPRaft.P50, "http_raft_apply_other_process_p50_ms", res.Floors.HTTPRaftServer.P50,
			"http_raft3_apply_p50_ms", res.Floors.HTTPRaft3.P50)
	}

	var repl pgReplication
	syss := systems(o, &repl)
	for _, s := range syss {
		res.Systems = append(res.Systems, s.SystemInfo)
	}
	first, hasCluster := firstCluster(syss)
	// The scale points come first, on the fresh cluster, so that the record counts
	// they report are exact.
	if len(o.scale) > 0 && hasCluster {
		if res.Scale, err = measureScale(ctx, o, logger, first); err != nil {
			return err
		}
	}
	jobs := plan(o, syss)
	started := time.Now()
	for i, j := range jobs {
		eta := ""
		if i > 0 {
			left := time.Since(started) / time.Duration(i) * time.Duration(len(jobs)-i)
			eta = fmt.Sprintf(", about %s left", left.Round(time.Second))
		}
		fmt.Fprintf(os.Stderr, "=== point %d/%d: %s%s\n", i+1, len(jobs), j, eta)
		p, err := measure(ctx, o, logger, j, false, res)
		if err != nil {
			return err
		}
		if j.workload == "new" {
			res.New = append(res.New, p)
		} else {
			res.Replay = append(res.Replay, p)
		}
	}
	if o.profile && hasCluster {
		// A run of its own, left out of the tables: profiling costs the leader CPU.
		if _, err := measure(ctx, o, logger, job{sys: first, clients: max(o.replayAt, 1), workload: "new"}, true, res); err != nil {
			return err
		}
	}
	if o.pgSync != "" {
		res.PGReplication = &repl
	}
	res.LoadAtEnd = loadAverage()
	if o.part != "" {
		return writeJSON(o.part, res)
	}
	res.Targets = verdicts(res)
	return write(o.out, res, stdout)
}

// firstCluster returns the first three-node idemkv system, which --scale and
// --profile measure.
func firstCluster(syss []system) (system, bool) {
	for _, s := range syss {
		if s.Nodes == 3 {
			return s, true
		}
	}
	return system{}, false
}

// loadAverage returns the machine's load averages over 1, 5 and 15 minutes: on a
// shared machine, what else ran is part of every figure.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func measure(ctx context.Context, o options, logger *slog.Logger, j job, profile bool, res *Results) (Point, error) {
	settled, _, err := settle(ctx, o)
	if err != nil {
		return Point{}, fmt.Errorf("%s: waiting for the system to go idle: %w", j, err)
	}
	tgt, err := openWithRetry(ctx, j.sys, j.clients, j.route)
	if err != nil {
		return Point{}, err
	}
	defer tgt.Close()
	var profDone chan error
	if profile {
		profDone = make(chan error, 1)
		leader := tgt.(*loadgen.HTTPTarget).Leader()
		file := filepath.Join(o.out, "cpu-"+strings.ReplaceAll(j.sys.Name, "/", "-")+".pprof")
		go func() {
			// Start once warm-up is over, so the profile shows the measured load.
			select {
			case <-time.After(o.warmup + time.Second):
			case <-ctx.Done():
			}
			profDone <- fetchProfile(ctx, leader, file, min(10*time.Second, o.duration-2*time.Second))
		}()
	}
	mix := loadgen.Mix{New: 1}
	if j.workload == "replay" {
		mix = loadgen.Mix{Replay: 1}
	}
	var cpu cpuWindow
	var stages stageWindow
	cfg := loadgen.Config{Target: tgt, Name: j.sys.Name, Concurrency: j.clients, Duration: o.duration,
		Warmup: o.warmup, Keys: o.keys, Mix: mix, Progress: os.Stderr, ProgressTTY: false, Logger: logger}
	// The scrapes of the stage breakdown fall outside the CPU window: serving /metrics
	// is no operation's work.
	cfg.Measuring = func() {
		stages.start(ctx, j)
		cpu.start(o)
	}
	cfg.Measured = func() {
		cpu.end(o)
		stages.end(ctx, j)
	}
	rep, err := loadgen.Run(ctx, cfg)
	if err != nil {
		return Point{}, fmt.Errorf("%s: %w", j, err)
	}
	if cpu.err != nil {
		return Point{}, fmt.Errorf("%s: CPU time of the system's processes: %w", j, cpu.err)
	}
	if profDone != nil {
		if err := <-profDone; err != nil {
			logger.Warn("no CPU profile", "err", err)
		} else {
			res.Profiles = append(res.Profiles, filepath.Join(o.out, "cpu-"+strings.ReplaceAll(j.sys.Name, "/", "-")+".pprof"))
		}
	}
	p := point(j.sys.Name, j.workload, j.clients, rep)
	p.Route = j.route
	p.LoadAverage = loadAverage()
	if cpu.ok {
		p.CPU = cpu.figure(rep.Ops)
	}
	p.DriverCPU = cpu.driverFigure(rep.Ops)
	p.SettledAfter = settled.Seconds()
	if stages.err != nil {
		logger.Warn("no stage breakdown", "system", j.sys.Name, "err", stages.err)
	} else if stages.ok {
		p.Stages = stages.breakdown()
	}
	logger.Info("point", "system", j.sys.Name, "workload", j.workload, "route", j.route, "clients", j.clients,
		"ops_per_sec", int(p.OpsPerSec), "p50_ms", p.P50, "p99_ms", p.P99, "errors", p.Errors, "cpu_s_per_1k_ops", p.CPU.perKOps())
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
func openWithRetry(ctx context.Context, s system, conns int, route string) (loadgen.Target, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		tgt, err := s.open(ctx, conns, route)
		if err == nil {
			return tgt, nil
		}
		if !errors.Is(err, idemkv.ErrUnavailable) || time.Now().After(deadline) {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
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
	tgt, err := openWithRetry(ctx, s, 256, routeLeader)
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
		rep, err := loadgen.Run(ctx, loadgen.Config{Target: tgt, Name: s.Name, Concurrency: o.scaleAt, Duration: o.duration,
			Warmup: o.warmup, Mix: loadgen.Mix{New: 1}, Progress: os.Stderr, Logger: logger})
		if err != nil {
			return nil, err
		}
		p := point(s.Name, "new", o.scaleAt, rep)
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
