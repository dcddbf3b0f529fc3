package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemkv/idemkv/internal/testhooks"
	"github.com/idemkv/idemkv/jepsen-lite/internal/cluster"
	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
	"github.com/idemkv/idemkv/jepsen-lite/internal/model"
	"github.com/idemkv/idemkv/jepsen-lite/internal/nemesis"
	"github.com/idemkv/idemkv/jepsen-lite/internal/progress"
	"github.com/idemkv/idemkv/jepsen-lite/internal/report"
	"github.com/idemkv/idemkv/jepsen-lite/internal/workload"
	"github.com/idemkv/idemkv/node"
)

// errAnomalies marks a run that completed and found anomalies (exit status 1).
var errAnomalies = errors.New("anomalies found")

// errFaults marks a run in which a fault did not apply (exit status 2): the run did
// not test what it claims to.
var errFaults = errors.New("faults did not apply")

// snapshotInterval is every node's --snapshot-interval: Raft checks whether to
// snapshot every interval to twice it.
const snapshotInterval = time.Second

type config struct {
	Nodes       int
	Time        time.Duration
	Concurrency int
	Families    []string
	Sabotage    testhooks.Mode
	Out         string
	Quiet, Hold time.Duration
	Slots       int
	OpTimeout   time.Duration
	Seed        uint64
	Binary      string
	Root        string

	// Raft tuning of every node: fast elections, and snapshots small and often so
	// that a node cut off for a few seconds needs one.
	SnapshotThreshold, TrailingLogs uint64
	// RaftLog is every node's --raft-log ("": idemkv serve's default).
	RaftLog string
	// RaftWALSegmentBytes is every node's --raft-wal-segment-bytes: small, so that
	// compaction deletes wal segments and a node cut off needs a snapshot, as with
	// bolt (raft-wal serves compacted entries from a segment it still keeps).
	RaftWALSegmentBytes int

	// HealLimit bounds the wait for a healthy cluster after the final heal, and
	// ConvergeLimit the wait for every node to reach the same applied state. A run
	// whose nodes never heal or converge spends both in full before its verdict, so
	// the sabotage tests, which expect exactly that, keep them short.
	HealLimit, ConvergeLimit time.Duration
	// SettleLimit bounds the agent redeliveries after the heal: keys still pending
	// when it passes are judged unsettled (a lease that never ran out on a healed
	// cluster), and the run goes on to its verdict.
	SettleLimit time.Duration

	// Recovery states how fast write throughput must come back after each heal.
	Recovery progress.Config

	// Progress receives the live progress line (stderr by default).
	Progress io.Writer
}

func defaultConfig() config {
	return config{Nodes: 3, Time: 60 * time.Second, Concurrency: 16, Out: "jepsen-out", Quiet: 5 * time.Second,
		Hold: 8 * time.Second, Slots: 8, OpTimeout: 3 * time.Second, Root: ".",
		SnapshotThreshold: 256, TrailingLogs: 128, RaftWALSegmentBytes: 64 << 10,
		HealLimit: 90 * time.Second, ConvergeLimit: 60 * time.Second, SettleLimit: 90 * time.Second, Recovery: progress.DefaultConfig(), Progress: os.Stderr}
}

// summary is summary.json.
type summary struct {
	Verdict     string                    `json:"verdict"`
	Nodes       int                       `json:"nodes"`
	Seconds     float64                   `json:"seconds"`
	Concurrency int                       `json:"concurrency"`
	Nemesis     []string                  `json:"nemesis"`
	Sabotage    []string                  `json:"sabotage"`
	Seed        uint64                    `json:"seed"`
	RaftLog     string                    `json:"raft_log,omitempty"`
	Ops         map[string]map[string]int `json:"ops"`
	Outcomes    map[string]map[string]int `json:"outcomes"`
	// Faults counts the faults that applied and showed their effect.
	Faults   map[string]int  `json:"faults"`
	FaultLog []nemesis.Fault `json:"fault_log"`
	// FaultErrors are the faults that did not apply or showed no effect: each is a
	// harness error, and none is counted in Faults.
	FaultErrors []nemesis.Fault `json:"fault_errors"`
	Anomalies   map[string]int  `json:"anomalies"`
	Details     []anomaly       `json:"anomaly_details"`
	Linear      model.Result    `json:"linearizability"`
	Convergence *convergence    `json:"convergence"`
	Effects     map[string]int  `json:"downstream_effects"`
	Progress    progress.Result `json:"progress"`
	// Settled counts the agent deliveries made after the heal for keys left pending.
	Settled int `json:"agent_settle_deliveries"`
}

type anomaly struct {
	Kind   string `json:"kind"`
	Key    string `json:"key,omitempty"`
	Detail string `json:"detail"`
}

type convergence struct {
	AppliedIndex uint64            `json:"applied_index"`
	StateHash    string            `json:"state_hash"`
	Nodes        map[string]string `json:"nodes"`
	Converged    bool              `json:"converged"`
}

func run(ctx context.Context, cfg config) error {
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(cfg.Out, "jepsen.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	logger := slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo}))
	say := func(format string, args ...any) { fmt.Fprintf(cfg.Progress, format+"\n", args...) }

	bin := cfg.Binary
	if bin == "" {
		bin, err = filepath.Abs(filepath.Join(cfg.Out, "idemkv"))
		if err != nil {
			return err
		}
		say("building idemkv with -tags idemkv_testhooks ...")
		if err := cluster.Build(ctx, cfg.Root, bin); err != nil {
			return err
		}
	}
	nodesDir := filepath.Join(cfg.Out, "nodes")
	if err := os.RemoveAll(nodesDir); err != nil {
		return err
	}
	var env []string
	if cfg.Sabotage != 0 {
		env = append(env, testhooks.EnvSabotage+"="+cfg.Sabotage.String())
	}
	verifyEvery := verifyInterval
	if cfg.Sabotage&testhooks.WedgeGap != 0 {
		// A checkpoint is a state-machine entry: one 200 ms after a churn's last
		// leader took over ends the wedge this sabotage restores before the probe
		// sees it, and on a loaded machine, where each leader of the churn lasts
		// longer, checkpoints land between the elections and no wedge forms (a CI run
		// found none in five churns).
		verifyEvery = time.Hour
	}
	serveFlags := []string{"--heartbeat-timeout", "500ms", "--election-timeout", "500ms", "--leader-lease-timeout", "250ms",
		"--snapshot-threshold", fmt.Sprint(cfg.SnapshotThreshold), "--trailing-logs", fmt.Sprint(cfg.TrailingLogs),
		"--snapshot-interval", snapshotInterval.String(), "--raft-wal-segment-bytes", fmt.Sprint(cfg.RaftWALSegmentBytes),
		// The short-lease workload leases for 1-2 s and keeps records 3 s; the
		// early-recover sabotage stores a quarter of a 1 s lease.
		"--min-lease-ttl", "250ms", "--min-ttl", "2s",
		// raft-wal's verifier checks every node's log against the leader's five times a
		// second (checkLogReports): a range must be read back before a snapshot
		// compacts it (TrailingLogs is small here), or it goes unchecked.
		"--raft-log-verify-interval", verifyEvery.String(), "--raft-log-verify-entries", "4096"}
	if cfg.RaftLog != "" {
		serveFlags = append(serveFlags, "--raft-log", cfg.RaftLog)
	}
	c, err := cluster.New(cluster.Config{Binary: bin, Dir: nodesDir, Nodes: cfg.Nodes, Env: env, Logger: logger,
		ServeFlags: serveFlags})
	if err != nil {
		return err
	}
	defer c.Close()
	say("starting %d nodes in %s ...", cfg.Nodes, nodesDir)
	if err := c.Start(ctx); err != nil {
		return err
	}

	hf, err := os.Create(filepath.Join(cfg.Out, "history.jsonl"))
	if err != nil {
		return err
	}
	defer hf.Close()
	rec := history.NewRecorder(time.Now(), hf)
	api := workload.NewAPI(c.APIAddrs(), cfg.OpTimeout)
	defer api.Close()
	reg := workload.NewRegister(workload.RegisterConfig{Clients: cfg.Concurrency, Slots: cfg.Slots, OpsPerKey: 30}, api, rec)
	down := workload.NewDownstream(cfg.Seed)
	agent, err := workload.NewAgent(workload.AgentConfig{Workers: max(1, cfg.Concurrency/2), Interval: 25 * time.Millisecond,
		Lease: 2 * time.Second, Deadline: 15 * time.Second}, api, rec, down)
	if err != nil {
		return err
	}
	approvals := workload.NewApprovals(workload.ApprovalsConfig{Clients: max(4, cfg.Concurrency/3), Slots: max(2, cfg.Slots/2)}, api, rec)
	leases := workload.NewLease(workload.LeaseConfig{Clients: max(4, cfg.Concurrency/3), Keys: 3,
		LeaseMin: time.Second, LeaseMax: 2 * time.Second, TTL: 3 * time.Second}, api, rec)
	var nem *nemesis.Nemesis
	nem = nemesis.New(nemesis.Config{Families: cfg.Families, Quiet: cfg.Quiet, Hold: cfg.Hold, Logger: logger,
		Now: rec.Now, Seed: cfg.Seed, SnapshotGap: cfg.SnapshotThreshold + cfg.TrailingLogs + 64,
		SnapshotSettle: 2*snapshotInterval + 500*time.Millisecond,
		AwaitRecovery:  func(ctx context.Context, healed int64) { awaitRecovery(ctx, rec, nem, healed, cfg.Recovery) },
		Writes:         api}, c)

	say("running for %s: %d register clients, %d agent workers, %d short-lease and %d approvals clients, nemesis %s, sabotage %q, seed %d",
		cfg.Time, cfg.Concurrency, max(1, cfg.Concurrency/2), max(4, cfg.Concurrency/3), max(4, cfg.Concurrency/3), strings.Join(cfg.Families, ","), cfg.Sabotage.String(), cfg.Seed)
	runCtx, stopRun := context.WithTimeout(ctx, cfg.Time)
	defer stopRun()
	var wg sync.WaitGroup
	for _, f := range []func(context.Context){reg.Run, agent.Run, leases.Run, approvals.Run, nem.Run} {
		wg.Add(1)
		go func() { defer wg.Done(); f(runCtx) }()
	}
	progressDone := make(chan struct{})
	go func() { defer close(progressDone); progressLine(runCtx, cfg, rec, nem) }()
	wg.Wait()
	<-progressDone
	// The workloads' time; deliveries in flight when it ended complete later, and the
	// progress verdict does not judge the time after it.
	runEnd := min(rec.Now(), int64(cfg.Time))
	if ctx.Err() != nil {
		return ctx.Err()
	}

	say("healing every fault ...")
	unhealed := nem.HealAll(ctx, cfg.HealLimit)
	if unhealed != nil && !nemesis.OnlyUnhealed(unhealed) {
		return fmt.Errorf("heal: %w", unhealed)
	}
	say("final reads ...")
	if err := reg.FinalReads(ctx); err != nil {
		return err
	}
	if err := approvals.FinalReads(ctx); err != nil {
		return err
	}
	say("settling the agent keys left pending ...")
	settled, unsettled, err := agent.Settle(ctx, cfg.SettleLimit)
	if err != nil {
		return err
	}
	finalRecs, err := agent.FinalRecords(ctx)
	if err != nil {
		return err
	}
	say("waiting for the nodes to converge ...")
	conv := converge(ctx, c, cfg.ConvergeLimit)
	if err := rec.Flush(); err != nil {
		return err
	}

	say("checking %d operations ...", len(rec.Ops()))
	ops := rec.Ops()
	var regOps []history.Op
	for _, op := range ops {
		if op.Workload == "register" {
			regOps = append(regOps, op)
		}
	}
	sum := summarize(cfg, ops, nem.Faults(), rec.Now())
	sum.Convergence = conv
	sum.Settled = settled
	if unsettled > 0 {
		sum.add("unsettled", "", fmt.Sprintf("%d agent keys still pending, their leases not run out, %s after the heal's redeliveries began", unsettled, cfg.SettleLimit))
	}
	if unhealed != nil {
		// Judged below with the other anomalies: every fault was off and every process
		// ran, and the nodes still did not come back.
		sum.add("unhealed", "", unhealed.Error())
	}
	lin := model.Check(regOps, 20*time.Second)
	sum.Linear = lin
	for _, k := range lin.Illegal {
		sum.add("nonlinearizable", k.Key, fmt.Sprintf("%d operations on the key have no linearization (see linearizability.html)", k.Ops))
	}
	for _, k := range lin.Unknown {
		sum.add("unchecked", k.Key, "the linearizability check timed out")
	}
	for _, a := range model.CheckClock(regOps) {
		sum.add("clock-regression", a.Key, a.String())
	}
	for _, a := range model.CheckDurable(regOps) {
		sum.add("lost-acknowledged-write", a.Key, fmt.Sprintf("op %d: %s", a.Op, a.Detail))
	}
	for _, a := range model.CheckClockAhead(ops, rec.Start()) {
		sum.add(model.AnomalyClockAhead, a.Key, a.String())
	}
	for _, a := range workload.CheckLeases(ops) {
		sum.add(a.Kind, a.Key, a.Detail)
	}
	for _, a := range workload.CheckStaleFences(ops) {
		sum.add(a.Kind, a.Key, a.Detail)
	}
	for _, a := range workload.CheckLeasesRealTime(ops) {
		sum.add(a.Kind, a.Key, a.Detail)
	}
	for _, a := range workload.CheckApprovals(ops) {
		sum.add(a.Kind, a.Key, a.Detail)
	}
	for _, a := range workload.CheckAcknowledged(ops) {
		sum.add(a.Kind, a.Key, a.Detail)
	}
	effects := down.Effects()
	for _, a := range workload.CheckAgents(ops, effects, finalRecs) {
		sum.add(a.Kind, a.Key, a.Detail)
	}
	for _, list := range effects {
		for _, e := range list {
			sum.Effects[e.Class]++
		}
	}
	sum.Progress = progress.Check(ops, sum.FaultLog, runEnd, cfg.Recovery)
	for _, a := range sum.Progress.Anomalies {
		sum.add(a.Kind, "", a.Detail)
	}
	for _, b := range api.BadAnswers() {
		sum.add(b.Kind, "", fmt.Sprintf("%s %s on %s: %s", b.Method, b.Path, b.Node, b.Detail))
	}
	for _, f := range sum.FaultLog {
		for _, fd := range f.Findings {
			sum.add(fd.Kind, "", fmt.Sprintf("%s: %s", f.Kind, fd.Detail))
		}
	}
	if !conv.Converged {
		sum.add("divergence", "", fmt.Sprintf("nodes did not converge: %v", conv.Nodes))
	}
	mismatches, err := checkLogReports(c.Nodes())
	if err != nil {
		return err
	}
	for _, m := range mismatches {
		sum.add(anomalyLogMismatch, "", m)
	}
	for _, e := range c.UnexpectedExits() {
		sum.add(anomalyNodeExited, "", e)
	}
	switch {
	case len(sum.Anomalies) > 0:
		sum.Verdict = "invalid"
	case len(sum.FaultErrors) > 0:
		sum.Verdict = "harness-error"
	default:
		sum.Verdict = "valid"
	}

	if err := porcupine.VisualizePath(model.Porcupine(), lin.Info, filepath.Join(cfg.Out, "linearizability.html")); err != nil {
		return fmt.Errorf("write linearizability.html: %w", err)
	}
	if err := writeJSON(filepath.Join(cfg.Out, "summary.json"), sum); err != nil {
		return err
	}
	svg, err := os.Create(filepath.Join(cfg.Out, "timeline.svg"))
	if err != nil {
		return err
	}
	title := fmt.Sprintf("idemkv jepsen-lite: %d nodes, %s, nemesis %s%s: %s", cfg.Nodes, cfg.Time,
		strings.Join(cfg.Families, ","), sabotageLabel(cfg.Sabotage), sum.Verdict)
	if err := report.WriteSVG(svg, title, report.Buckets(ops, time.Duration(rec.Now())), sum.FaultLog, sum.Progress.Windows); err != nil {
		svg.Close()
		return err
	}
	if err := svg.Close(); err != nil {
		return err
	}
	printVerdict(cfg.Progress, sum)
	switch sum.Verdict {
	case "invalid":
		return fmt.Errorf("%w: %v (see %s)", errAnomalies, sum.Anomalies, cfg.Out)
	case "harness-error":
		return fmt.Errorf("%w: %d of %d (see fault_errors in %s/summary.json)", errFaults, len(sum.FaultErrors), len(sum.FaultLog), cfg.Out)
	}
	return nil
}

// awaitRecovery returns once write throughput is back after the heal at healed, by
// the same rule the progress verdict applies, or once the limit has passed.
func awaitRecovery(ctx context.Context, rec *history.Recorder, nem *nemesis.Nemesis, healed int64, cfg progress.Config) {
	for ctx.Err() == nil {
		if _, _, decided := progress.Recovered(rec.AckedWrites(), nem.Faults(), healed, cfg); decided {
			return
		}
		if rec.Now() > healed+int64(cfg.Limit)+int64(2*time.Second) {
			return
		}
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

func sabotageLabel(m testhooks.Mode) string {
	if m == 0 {
		return ""
	}
	return ", sabotage " + m.String()
}

func (s *summary) add(kind, key, detail string) {
	s.Anomalies[kind]++
	// Enough detail to start from; the counts stay exact.
	if s.Anomalies[kind] <= 50 {
		s.Details = append(s.Details, anomaly{Kind: kind, Key: key, Detail: detail})
	}
}

func summarize(cfg config, ops []history.Op, faults []nemesis.Fault, now int64) *summary {
	s := &summary{Nodes: cfg.Nodes, Seconds: time.Duration(now).Seconds(), Concurrency: cfg.Concurrency,
		Nemesis: cfg.Families, Sabotage: cfg.Sabotage.Names(), Seed: cfg.Seed, RaftLog: cfg.RaftLog,
		Ops: map[string]map[string]int{}, Outcomes: map[string]map[string]int{}, Faults: map[string]int{},
		FaultLog: faults, Anomalies: map[string]int{}, Effects: map[string]int{}}
	if s.Nemesis == nil {
		s.Nemesis = []string{}
	}
	for _, op := range ops {
		name := op.Workload + ":" + op.F
		if op.In.Final {
			name += ":final"
		}
		if s.Ops[name] == nil {
			s.Ops[name] = map[string]int{}
			s.Outcomes[name] = map[string]int{}
		}
		s.Ops[name][string(op.Type)]++
		if op.Type == history.OK && op.Out != nil {
			switch {
			case op.Out.Err != "":
				s.Outcomes[name][op.Out.Err]++
			case op.Out.Decision != "":
				s.Outcomes[name][op.Out.Decision]++
			default:
				s.Outcomes[name]["ok"]++
			}
		}
	}
	s.FaultErrors = []nemesis.Fault{}
	for _, f := range faults {
		if f.Err != "" {
			s.FaultErrors = append(s.FaultErrors, f)
			continue
		}
		s.Faults[f.Kind]++
	}
	return s
}

// converge waits until every node reports the same applied index and state hash.
func converge(ctx context.Context, c *cluster.Cluster, timeout time.Duration) *convergence {
	deadline := time.Now().Add(timeout)
	var last *convergence
	for {
		conv := &convergence{Nodes: map[string]string{}, Converged: true}
		for i, n := range c.Nodes() {
			s, err := c.StateHash(ctx, i)
			if err != nil {
				conv.Nodes[n.ID] = "error: " + err.Error()
				conv.Converged = false
				continue
			}
			conv.Nodes[n.ID] = fmt.Sprintf("%d/%s", s.AppliedIndex, s.StateHash)
			if i == 0 {
				conv.AppliedIndex, conv.StateHash = s.AppliedIndex, s.StateHash
			} else if s.AppliedIndex != conv.AppliedIndex || s.StateHash != conv.StateHash {
				conv.Converged = false
			}
		}
		last = conv
		if conv.Converged || time.Now().After(deadline) || ctx.Err() != nil {
			return last
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// progressLine prints a status line every second on a terminal, every five otherwise.
func progressLine(ctx context.Context, cfg config, rec *history.Recorder, nem *nemesis.Nemesis) {
	tty := false
	if f, ok := cfg.Progress.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	every := 5 * time.Second
	if tty {
		every = time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var prevOK int
	for {
		select {
		case <-ctx.Done():
			if tty {
				fmt.Fprintln(cfg.Progress)
			}
			return
		case <-t.C:
		}
		st := rec.Stats()
		rate := float64(st.OK-prevOK) / every.Seconds()
		prevOK = st.OK
		cur := nem.Current()
		if cur == "" {
			cur = "-"
		}
		line := fmt.Sprintf("[%4.0fs/%.0fs] ok %d  unknown %d  failed %d  %.0f ok/s  faults %d  now: %s",
			time.Duration(rec.Now()).Seconds(), cfg.Time.Seconds(), st.OK, st.Info, st.Fail, rate, len(nem.Faults()), cur)
		if tty {
			fmt.Fprintf(cfg.Progress, "\r\033[K%s", line)
		} else {
			fmt.Fprintln(cfg.Progress, line)
		}
	}
}

func printVerdict(w io.Writer, s *summary) {
	fmt.Fprintf(w, "\n%d operations in %.0fs; faults:", countOps(s), s.Seconds)
	kinds := make([]string, 0, len(s.Faults))
	for k := range s.Faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(w, " %s×%d", k, s.Faults[k])
	}
	fmt.Fprintf(w, "\nlinearizability: %s (%d keys, %d ops); convergence: %v at index %d\n",
		s.Linear.Result, s.Linear.Keys, s.Linear.Ops, s.Convergence.Converged, s.Convergence.AppliedIndex)
	printProgress(w, s.Progress)
	for _, f := range s.FaultErrors {
		fmt.Fprintf(w, "fault did not apply (harness error): %s at %.1fs: %s: %s\n", f.Kind, float64(f.Start)/1e9, f.Detail, f.Err)
	}
	if len(s.Anomalies) == 0 {
		if len(s.FaultErrors) > 0 {
			fmt.Fprintf(w, "HARNESS ERROR: no anomalies, but %d faults did not apply\n", len(s.FaultErrors))
			return
		}
		fmt.Fprintln(w, "VALID: no anomalies")
		return
	}
	fmt.Fprintf(w, "INVALID: %v\n", s.Anomalies)
	for i, d := range s.Details {
		if i == 10 {
			fmt.Fprintf(w, "  ... (summary.json has more)\n")
			break
		}
		fmt.Fprintf(w, "  %s %s: %s\n", d.Kind, d.Key, d.Detail)
	}
}

// printProgress prints write availability per fault window and the recoveries.
func printProgress(w io.Writer, p progress.Result) {
	var faults, recovered, judged int
	var worst float64
	for _, win := range p.Windows {
		if len(win.Faults) == 0 {
			continue
		}
		faults++
		if win.NotJudged == "" {
			judged++
		}
		if win.RecoveredIn != nil {
			recovered++
			worst = max(worst, *win.RecoveredIn)
		}
	}
	fmt.Fprintf(w, "progress: %d fault windows, write throughput back to %.0f%% of the baseline within %.0f s after %d of %d judged heals (slowest %.1f s)\n",
		faults, 100*p.Threshold, p.Limit, recovered, judged, worst)
	for _, win := range p.Windows {
		if len(win.Faults) == 0 {
			continue
		}
		avail := "n/a"
		if win.Availability != nil {
			avail = fmt.Sprintf("%3.0f%%", 100**win.Availability)
		}
		back := "NOT back in time"
		if win.RecoveredIn != nil {
			back = fmt.Sprintf("back in %.1fs", *win.RecoveredIn)
		} else if win.NotJudged != "" {
			back = "recovery not judged: " + win.NotJudged
		}
		rel := ""
		if win.Relative != nil {
			rel = fmt.Sprintf(" (%3.0f%% of baseline)", 100**win.Relative)
		}
		fmt.Fprintf(w, "  %6.1fs-%6.1fs %-28s writes %5d acked %5d = %s, %5.0f acked/s%s, %s\n",
			win.Start, win.End, strings.Join(win.Faults, "+"), win.Writes, win.Acked, avail, win.Rate, rel, back)
	}
}

func countOps(s *summary) int {
	n := 0
	for _, m := range s.Ops {
		for _, v := range m {
			n += v
		}
	}
	return n
}

// verifyInterval is how often the leader appends a checkpoint for raft-wal's verifier
// in a run (node.Config.RaftLogVerifyInterval, which is also how often the leader
// looks whether one is due).
const verifyInterval = 200 * time.Millisecond

// anomalyLogMismatch: a node reported that its Raft log differs from the leader's. Its
// log tells the operator to replace the node's data dir: on a healthy node it is a
// false alarm (the verifier's running checksum kept across a cut Raft made, fixed in
// node/verify.go), otherwise the node's disk lost or changed entries (the
// rot-raft-log sabotage).
const anomalyLogMismatch = "raft-log-mismatch"

// anomalyNodeExited: a node process ended although neither the harness (a kill, a
// termination) nor a storage fault set on it asked for that: a panic on some goroutine
// (the sweeper, a snapshot's persist), a fatal error, an exit of its own. Quorum
// carried on and the final heal started it again, so the run was valid before.
const anomalyNodeExited = "node-exited"

// logMismatchLine is in every line of node/verify.go's report of a mismatch (the
// message up to its first quote, which a text log escapes).
var logMismatchLine, _, _ = strings.Cut(node.RaftLogMismatchMessage, `"`)

// checkLogReports reads every node's log (all its starts) for the verifier's mismatch
// reports, one line each.
func checkLogReports(nodes []*cluster.Node) ([]string, error) {
	var out []string
	for _, n := range nodes {
		f, err := os.Open(n.LogPath)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if line := sc.Text(); strings.Contains(line, logMismatchLine) {
				out = append(out, fmt.Sprintf("%s: %s", n.ID, line))
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", n.LogPath, err)
		}
	}
	return out, nil
}
