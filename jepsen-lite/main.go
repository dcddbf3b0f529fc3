// Command jepsen-lite runs real idemkv processes on loopback, breaks them while a
// workload runs, and judges the whole history: linearizability of the record
// operations (porcupine), no duplicate effects for the agent workload, every
// acknowledged outcome still stored, and every node converged to the same state.
// It exits non-zero on any anomaly.
//
//	go run ./jepsen-lite --nodes 3 --time 60s --concurrency 16 --nemesis all --out DIR
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemkv/idemkv/internal/testhooks"
	"github.com/idemkv/idemkv/jepsen-lite/internal/nemesis"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "jepsen-lite:", err)
		if errors.Is(err, errAnomalies) {
			os.Exit(1)
		}
		os.Exit(2)
	}
}

func newCommand() *cobra.Command {
	cfg := defaultConfig()
	var nem, sabotage string
	cmd := &cobra.Command{
		Use:   "jepsen-lite",
		Short: "Fault-injection test of an idemkv cluster: partitions, crashes, pauses, membership, snapshots, clocks",
		Long: `jepsen-lite builds idemkv with the test hooks, starts a cluster of real processes on
loopback with a TCP proxy on every Raft link, runs its workloads (register, agent,
short-lease, approvals) while a nemesis
breaks the cluster, heals everything, and checks the history.

Nemesis families (--nemesis all, none, or a comma list):
  partition   random halves, isolated leader, bridge, majority ring, slow links, flaky links
  kill        SIGKILL and restart of one node, of the leader, of every node
  pause       SIGSTOP / SIGCONT of the leader
  membership  remove a node, wipe its data, add it back
  snapshot    isolate a follower until the others compacted past it (snapshot install)
  clock       offset the leader's clock (test build only)
  churn       leadership transfers or leader restarts with every write held back, then
              ready, linearizable reads and replays must be served on every node
  storage     Pebble disk full, Raft log writes or reads failing, the leader's Raft log
              appends held (another node must lead within 15 s), a snapshot install
              failing midway (test build only; a node the fault stops is restarted)
  clock-jump  one node's clock jumps minutes forward, then minutes back
  clock-restart
              every node SIGKILLed, one started first with its clock hours off so that
              it wins the first election; alone or with a partition (test build only)
  raft-port   128 idle sockets on every node's Raft port from 8 other loopback
              hosts while the leader is killed: a new leader must come within 10 s

Sabotage modes (--sabotage, to prove the checkers can fail):
  stale-reads, ignore-fences, early-ack, fail-writes, internal-errors,
  early-recover, orphan-effects, skip-failed-restore, wedge-gap, unbounded-clock,
  local-pending, unanchored-stamps, legacy-listen-policy, unbound-approval,
  rot-raft-log, drop-late-commits, replay-drops-result, unbounded-forward-clock,
  crashes-alone, short-default-retention, approval-recover-executes,
  local-replay-any-effect, redecide-answers-ok, crossed-replays,
  in-progress-conflict, ignore-disk-stall

Exit status: 0 valid, 1 anomalies found, 2 the harness itself failed (a fault that
did not apply or showed no effect counts as a harness failure).`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if cfg.Families, err = nemesis.ParseFamilies(nem); err != nil {
				return err
			}
			if cfg.Sabotage, err = testhooks.ParseModes(sabotage); err != nil {
				return err
			}
			if err := cfg.validate(); err != nil {
				return err
			}
			return run(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Nodes, "nodes", cfg.Nodes, "cluster size (3 or 5)")
	f.DurationVar(&cfg.Time, "time", cfg.Time, "how long the workload runs under faults")
	f.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "register clients; the agent workload gets half as many workers")
	f.StringVar(&nem, "nemesis", "all", "fault families: all, none, or a comma list of "+fmt.Sprint(nemesis.Families))
	f.StringVar(&cfg.Out, "out", cfg.Out, "directory for history.jsonl, linearizability.html, summary.json, timeline.svg, node logs")
	f.StringVar(&sabotage, "sabotage", "", "break the nodes on purpose (comma list): "+testhooks.AllModes.String())
	f.DurationVar(&cfg.Quiet, "quiet", cfg.Quiet, "longest pause between faults")
	f.DurationVar(&cfg.Hold, "hold", cfg.Hold, "longest a fault lasts")
	f.IntVar(&cfg.Slots, "keys", cfg.Slots, "register keys live at once (fewer: more contention)")
	f.DurationVar(&cfg.OpTimeout, "op-timeout", cfg.OpTimeout, "client timeout of one request (a timeout is an unknown outcome)")
	f.DurationVar(&cfg.Recovery.Limit, "recovery", cfg.Recovery.Limit, "write throughput must be back to a quarter of the baseline this long after each heal")
	f.DurationVar(&cfg.HealLimit, "heal-limit", cfg.HealLimit, "longest wait for a healthy cluster after the final heal (past it: unhealed)")
	f.DurationVar(&cfg.ConvergeLimit, "converge-limit", cfg.ConvergeLimit, "longest wait for every node to reach the same state (past it: divergence)")
	f.DurationVar(&cfg.SettleLimit, "settle-limit", cfg.SettleLimit, "longest the agent keys left pending are redelivered after the heal (past it: unsettled)")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the nemesis schedule (0: from the clock)")
	f.StringVar(&cfg.Binary, "binary", "", "use this idemkv binary (built with -tags idemkv_testhooks) instead of building one")
	f.StringVar(&cfg.Root, "root", cfg.Root, "module root to build idemkv from")
	f.StringVar(&cfg.RaftLog, "raft-log", "", "every node's Raft log backend, bolt or wal (default: idemkv serve's)")
	f.IntVar(&cfg.RaftWALSegmentBytes, "raft-wal-segment-bytes", cfg.RaftWALSegmentBytes, "every node's wal segment size: small, so that compaction deletes segments and a node cut off needs a snapshot")
	return cmd
}

func (c *config) validate() error {
	switch {
	case c.Nodes < 1:
		return errors.New("--nodes must be at least 1")
	case c.Time <= 0:
		return errors.New("--time must be positive")
	case c.Concurrency < 1:
		return errors.New("--concurrency must be at least 1")
	case c.Out == "":
		return errors.New("--out is required")
	case c.Recovery.Limit <= 0:
		return errors.New("--recovery must be positive")
	case c.HealLimit <= 0 || c.ConvergeLimit <= 0 || c.SettleLimit <= 0:
		return errors.New("--heal-limit, --converge-limit and --settle-limit must be positive")
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	return nil
}
