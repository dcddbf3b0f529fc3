package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv/internal/testhooks"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/jepsen-lite/internal/cluster"
	"github.com/idemkv/idemkv/jepsen-lite/internal/model"
	"github.com/idemkv/idemkv/jepsen-lite/internal/nemesis"
	"github.com/idemkv/idemkv/jepsen-lite/internal/progress"
	"github.com/idemkv/idemkv/jepsen-lite/internal/workload"
)

// These tests run the whole harness against real processes. Each breaks the nodes in
// one way on purpose and asserts that the checkers catch it: a checker that cannot
// fail proves nothing.

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

func testBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "jepsen-lite-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "idemkv")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		buildErr = cluster.Build(ctx, "..", binary)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// sabotaged shortens what a sabotaged run waits for: a run that is meant to end
// unhealed, diverged or unsettled would otherwise spend the full limits of a real run
// (90 s, 60 s and 90 s) proving it. It also lets the sabotage runs share the machine:
// they run in parallel (go test's -parallel, GOMAXPROCS by default), after the healthy
// run, which runs alone so that its progress verdict is not judged beside a neighbour.
func sabotaged(t *testing.T, cfg *config) {
	t.Helper()
	cfg.HealLimit, cfg.ConvergeLimit, cfg.SettleLimit = 30*time.Second, 20*time.Second, 30*time.Second
}

func runHarness(t *testing.T, mutate func(*config)) (*summary, error) {
	t.Helper()
	cfg := defaultConfig()
	cfg.Binary = testBinary(t)
	cfg.Out = t.TempDir()
	cfg.Time = 20 * time.Second
	cfg.Concurrency = 12
	cfg.Quiet, cfg.Hold = 2*time.Second, 5*time.Second
	cfg.Progress = testlog.NewWriter(t, "")
	mutate(&cfg)
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	// A run that never got its cluster up (a port taken between picking and binding
	// it, on a machine where other suites pick ports too) writes no summary: it judged
	// nothing, so one fresh start is allowed. A run that got as far as a verdict is
	// never retried.
	var runErr error
	var b []byte
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		runErr = run(ctx, cfg)
		cancel()
		var err error
		if b, err = os.ReadFile(filepath.Join(cfg.Out, "summary.json")); err == nil {
			break
		}
		if attempt == 2 {
			t.Fatalf("no summary (run: %v): %v", runErr, err)
		}
		t.Logf("the harness did not get to a verdict (%v); starting once more", runErr)
		cfg.Out = t.TempDir()
	}
	var s summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"history.jsonl", "linearizability.html", "timeline.svg"} {
		if st, err := os.Stat(filepath.Join(cfg.Out, name)); err != nil || st.Size() == 0 {
			t.Errorf("%s missing or empty: %v", name, err)
		}
	}
	return &s, runErr
}

func TestSabotageIsCaught(t *testing.T) {
	t.Parallel()
	cases := []struct {
		mode     testhooks.Mode
		families []string
		// Any of these anomaly kinds shows the sabotage was caught.
		want []string
		// Each of these must be found: the checks the sabotage is there to prove can
		// fail (a case may give both lists).
		every []string
		// time is the run's length when it is not runHarness's 20 s.
		time time.Duration
	}{
		// Commits with stale fences are part of the workload; no fault is needed. The
		// register's zombie commits (a fifth of its writes reuse a fence seen for the
		// key) land, and CheckStaleFences names them.
		{testhooks.IgnoreFences, nil, []string{"nonlinearizable"}, []string{workload.AnomalyStaleFenceAccepted}, 10 * time.Second},
		// Reads from followers see old states, more so behind a partition.
		{testhooks.StaleReads, []string{nemesis.FamilyPartition}, []string{"nonlinearizable", "clock-regression"}, nil, 0},
		// Answers from the leader's local state disagree with what commits, and an
		// isolated leader acknowledges writes that are then lost.
		{testhooks.EarlyAck, []string{nemesis.FamilyPartition}, []string{"nonlinearizable", "lost-acknowledged-write", "double-effect", "lost-receipt", "receipt-mismatch"}, nil, 0},
		// Every write answered 503: nothing else can find it, only the progress verdict.
		{testhooks.FailWrites, []string{nemesis.FamilyKill}, []string{progress.AnomalyNoProgress}, nil, 0},
		// One write in eight answered 500 after it went through.
		{testhooks.InternalErrors, nil, []string{workload.AnomalyServerError}, nil, 0},
		// Leases stored at a quarter of what the answer says: the short-lease
		// workload sees a recover before the lease it was told of ran out.
		{testhooks.EarlyRecover, nil, []string{workload.AnomalyEarlyRecover}, nil, 0},
		// Commits turned into releases: effects downstream whose keys are gone.
		{testhooks.OrphanEffects, nil, []string{workload.AnomalyOrphanEffect}, nil, 0},
		// Pending records answered from a node's own state: a follower that has not
		// applied the latest commit answers in_progress where the leader replays. The
		// followers' lag of milliseconds is enough; no fault is needed.
		{testhooks.LocalPending, nil, []string{"nonlinearizable", "clock-regression"}, nil, 0},
		// An approval unbound from its effect: a reserve of another fingerprint under
		// a key whose approval was granted executes instead of conflicting. The
		// approvals workload asks another refund right after an approval.
		{testhooks.UnboundApproval, nil, []string{workload.AnomalyUnapprovedExecute}, nil, 0},
		// A disk that silently changed one stored entry: only raft-wal's verifier,
		// reading the entry back, sees it, and the check of the nodes' logs reports it.
		{testhooks.RotRaftLog, nil, []string{anomalyLogMismatch}, nil, 0},
		// A commit that lands on a lease that ran out, answered and not stored. No fault
		// is needed: the short-lease clients commit on their own keys just after their
		// leases ran out, and the next reserve recovers the key.
		{testhooks.DropLateCommits, nil, []string{workload.AnomalyAckThenExecuted}, nil, 0},
		// Replays a follower answers from its own state lose their result.
		{testhooks.ReplayDropsResult, nil, []string{workload.AnomalyReceiptMismatch}, nil, 0},
		// Stamps without the upper bound of their band: a leader whose clock jumps
		// minutes ahead stamps minutes ahead, which ends every live lease at once. Every
		// stamp agrees with every other, and the lower bound keeps leases running out
		// after the reset; only the harness's own clock shows it.
		{testhooks.UnboundedForwardClock, []string{nemesis.FamilyClockJump}, []string{model.AnomalyClockAhead, workload.AnomalyLeaseCutShort}, nil, 0},
		// A node that dies by itself while the others go on; the final heal starts it
		// again, so only its exit shows.
		{testhooks.CrashesAlone, nil, []string{anomalyNodeExited}, nil, 0},
		// Records left to the default retention kept only as long as their lease:
		// every receipt the agents acknowledged has expired by the final read.
		{testhooks.ShortDefaultRetention, nil, nil, []string{workload.AnomalyLostReceipt}, 10 * time.Second},
		// A recover under an approval answered execute: the approvals workload's agents
		// that die after their grant leave the key to a later ask, which recovers it.
		{testhooks.ApprovalRecoverExecutes, nil, nil, []string{workload.AnomalyApprovalReused}, 10 * time.Second},
		// Local replays that do not compare the effect: the agents' operations that
		// reuse a committed key with other arguments are told they committed.
		{testhooks.LocalReplayAnyEffect, nil, nil, []string{workload.AnomalyMissedConflict, workload.AnomalyMissingEffect}, 10 * time.Second},
		// A decision on an approval already decided answered 200: the approvers
		// decide the ids they saw, often twice.
		{testhooks.RedecideAnswersOK, nil, nil, []string{workload.AnomalyLostDecision}, 10 * time.Second},
		// One local replay in eight answered with another key's.
		{testhooks.CrossedReplays, nil, nil, []string{workload.AnomalyPhantomReceipt}, 10 * time.Second},
		// in_progress answered as a conflict naming the caller's own effect: agent
		// deliveries that meet a holder whose downstream call timed out.
		{testhooks.InProgressConflict, nil, nil, []string{workload.AnomalyWrongConflict}, 10 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.mode.String(), func(t *testing.T) {
			t.Parallel()
			s, err := runHarness(t, func(cfg *config) {
				sabotaged(t, cfg)
				cfg.Sabotage = c.mode
				cfg.Families = c.families
				if c.time != 0 {
					cfg.Time = c.time
				}
			})
			if !errors.Is(err, errAnomalies) {
				t.Fatalf("the run was not judged invalid: %v", err)
			}
			if s.Verdict != "invalid" {
				t.Fatalf("verdict %q", s.Verdict)
			}
			caught := len(c.want) == 0
			for _, k := range c.want {
				caught = caught || s.Anomalies[k] > 0
			}
			if !caught {
				t.Fatalf("anomalies %v hold none of %v", s.Anomalies, c.want)
			}
			for _, k := range c.every {
				if s.Anomalies[k] == 0 {
					t.Errorf("anomalies %v hold no %s", s.Anomalies, k)
				}
			}
			t.Logf("caught: %v", s.Anomalies)
		})
	}
}

// The same harness without sabotage, under crashes, finds nothing: the anomalies
// above come from the sabotage, not from the harness.
func TestHealthyClusterIsValid(t *testing.T) {
	s, err := runHarness(t, func(cfg *config) { cfg.Families = []string{nemesis.FamilyKill} })
	if err != nil {
		t.Fatalf("run: %v (anomalies %v)", err, s.Anomalies)
	}
	if s.Verdict != "valid" || len(s.Anomalies) != 0 || !s.Convergence.Converged {
		t.Fatalf("verdict %q, anomalies %v, converged %v", s.Verdict, s.Anomalies, s.Convergence.Converged)
	}
	// The approvals' recovers come from the abandoned grants asked again after their
	// lease (the approval-recover-executes sabotage needs them).
	if s.Ops["register:reserve"]["ok"] == 0 || s.Ops["agent:do"]["ok"] == 0 || s.Outcomes["lease:reserve"]["recover"] == 0 ||
		s.Outcomes["approvals:reserve"]["recover"] == 0 {
		t.Fatalf("the workloads did nothing: %v", s.Ops)
	}
	recovered := 0
	for _, w := range s.Progress.Windows {
		if w.RecoveredIn != nil {
			recovered++
		}
	}
	if len(s.FaultLog) > 0 && recovered == 0 {
		t.Fatalf("%d faults and no recovery measured: %+v", len(s.FaultLog), s.Progress.Windows)
	}
}
