package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/spf13/cobra"
)

// benchOptions are the flags of `idemkv bench`.
type benchOptions struct {
	endpoints    []string
	tenant       string
	token        string
	concurrency  int
	duration     time.Duration
	ops          int64
	warmup       time.Duration
	keys         int
	hotKeys      int
	mix          string
	seed         uint64
	json         bool
	fsyncDir     string
	fsyncSamples int
	spread       bool
}

// NewBenchCommand returns `idemkv bench`: it drives a running cluster with the agent
// workload and reports throughput and latency per kind of operation.
func NewBenchCommand() *cobra.Command {
	o := benchOptions{}
	d := DefaultConfig()
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Drive a running cluster with agent operations and measure it",
		Long: `bench runs a workload of agent operations against a running idemkv cluster:
new operations (reserve then commit), replays (reserve of a committed key), conflicts
(the same key with another effect) and in-progress contention (reserves of a key that
another attempt holds), at the given mix, concurrency and duration. It prints
throughput and p50/p90/p99/p99.9 latency per kind, and the machine's fsync latency
for comparison.`,
		Example: `  idemkv bench --endpoints 127.0.0.1:7420 --concurrency 64 --duration 30s
  idemkv bench --mix new=100 --concurrency 1 --json
  idemkv bench --endpoints 127.0.0.1:7420,127.0.0.1:7430,127.0.0.1:7440 --spread --mix replay=100`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			return runBench(ctx, o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.endpoints, "endpoints", []string{"127.0.0.1:7420"}, "API addresses of cluster members")
	f.StringVar(&o.tenant, "tenant", "bench", "tenant of every key")
	f.StringVar(&o.token, "token", os.Getenv("IDEMKV_TOKEN"), "bearer token (default $IDEMKV_TOKEN)")
	f.IntVar(&o.concurrency, "concurrency", 64, "workers, each with one operation in flight and its own connection")
	f.DurationVar(&o.duration, "duration", d.Duration, "how long to measure")
	f.Int64Var(&o.ops, "ops", 0, "stop after this many operations (0: run for --duration)")
	f.DurationVar(&o.warmup, "warmup", d.Warmup, "unmeasured run before measuring (0: none)")
	f.IntVar(&o.keys, "keys", d.Keys, "committed keys that replays and conflicts draw from")
	f.IntVar(&o.hotKeys, "hot-keys", d.HotKeys, "pending keys that in-progress operations contend for")
	f.StringVar(&o.mix, "mix", d.Mix.String(), "weights of the kinds of operation")
	f.Uint64Var(&o.seed, "seed", d.Seed, "seed of the kind each worker draws")
	f.BoolVar(&o.json, "json", false, "print the report as JSON")
	f.StringVar(&o.fsyncDir, "fsync-dir", "", "directory to measure fsync latency in, ideally the data dir (default: the temp dir)")
	f.IntVar(&o.fsyncSamples, "fsync-samples", 200, "fsync probe samples (0: no probe)")
	f.BoolVar(&o.spread, "spread", false, "keep each worker on one of --endpoints in turn instead of sending every request to the leader")
	return cmd
}

func runBench(ctx context.Context, o benchOptions, stdout, stderr io.Writer) error {
	mix, err := ParseMix(o.mix)
	if err != nil {
		return err
	}
	if o.warmup == 0 {
		// Zero in Config means the default; on the command line it means none.
		o.warmup = -1
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var fsync *Summary
	if o.fsyncSamples > 0 {
		h, err := ProbeFsync(o.fsyncDir, o.fsyncSamples)
		if err != nil {
			return err
		}
		s := h.Summarize()
		fsync = &s
	}
	target, err := NewHTTPTarget(ctx, HTTPConfig{Endpoints: o.endpoints, Tenant: o.tenant, Token: o.token, Conns: o.concurrency, Pinned: o.spread})
	if err != nil {
		return err
	}
	defer target.Close()
	rep, err := Run(ctx, Config{
		Target: target, Name: "idemkv", Concurrency: o.concurrency, Duration: o.duration, Ops: o.ops,
		Warmup: o.warmup, Keys: o.keys, HotKeys: o.hotKeys, Mix: mix, Seed: o.seed,
		Progress: stderr, ProgressTTY: isTerminal(stderr), Logger: logger,
	})
	if err != nil {
		return err
	}
	rep.Fsync = fsync
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		return err
	}
	if rep.Errors > 0 {
		return fmt.Errorf("loadgen: %d operations failed", rep.Errors)
	}
	return nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
