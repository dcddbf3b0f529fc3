package node_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/expiry"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// TestSweepScale loads a million records into one node, a tenth of them about to
// expire, and measures reserve latency at a fixed rate with and without a sweep
// running, and the sweep's throughput. It fails if reserve p99 during the sweep
// exceeds twice p99 without one.
//
// Two CPUs shared with other work make latency drift by more than the effect under
// test, so sweep and rest alternate in windows of a few seconds while the reserves run
// on, and each reserve counts for the window it was due in: both sides see the same
// drift. The rounds are those of a real expiry.Sweeper, with the node's configuration,
// proposing through the node; only when a round starts and stops is the test's choice
// (the node's own sweeper is off). A baseline before anything expired is reported too.
//
// It takes minutes, so it runs only with IDEMKV_SCALE=1:
//
//	IDEMKV_SCALE=1 go test -run TestSweepScale -v -timeout 60m ./node
//
// IDEMKV_SCALE_RECORDS, IDEMKV_SCALE_RATE (reserves per second while measuring),
// IDEMKV_SCALE_BATCH and IDEMKV_SCALE_SHARE (sweeper BatchLimit and Share) change the
// run.
func TestSweepScale(t *testing.T) {
	if os.Getenv("IDEMKV_SCALE") != "1" {
		t.Skip("a scale run of several minutes; set IDEMKV_SCALE=1 to run it")
	}
	total := envInt(t, "IDEMKV_SCALE_RECORDS", 1_000_000)
	rate := envInt(t, "IDEMKV_SCALE_RATE", 500)
	sweepCfg := expiry.DefaultConfig()
	sweepCfg.BatchLimit = envInt(t, "IDEMKV_SCALE_BATCH", sweepCfg.BatchLimit)
	if v := os.Getenv("IDEMKV_SCALE_SHARE"); v != "" {
		share, err := strconv.ParseFloat(v, 64)
		if err != nil || share <= 0 || share > 1 {
			t.Fatalf("IDEMKV_SCALE_SHARE=%q: want a fraction in (0, 1]", v)
		}
		sweepCfg.Share = share
	}
	expired := total / 10

	clock := newTestClock(time.Now())
	var logger *slog.Logger
	c := testcluster.Start(t, 1, testcluster.WithConfig(func(i int, cfg *node.Config) {
		// Production settings, but for snapshots: a snapshot of a million records
		// takes seconds of CPU, and one that lands in a single window would measure
		// the snapshot, not the sweep.
		d := node.DefaultConfig()
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = d.HeartbeatTimeout, d.ElectionTimeout, d.LeaderLeaseTimeout
		cfg.SnapshotThreshold = 1 << 40
		cfg.SnapshotInterval = time.Hour
		cfg.TrailingLogs = d.TrailingLogs
		cfg.Sweep.Disabled = true
		cfg.Now, cfg.Monotonic = clock.Now, clock.Elapsed
		logger = cfg.Logger
	}))
	n := c.Node(0)
	m := c.Metrics(0)

	start := time.Now()
	load(t, n, total, func(i int) time.Duration {
		if i%10 == 0 {
			return time.Minute
		}
		return 24 * time.Hour
	})
	loadTook := time.Since(start)
	t.Logf("loaded %d records (%d expiring) in %s: %.0f reserves/s", total, expired, loadTook.Round(time.Millisecond),
		float64(total)/loadTook.Seconds())
	t.Logf("sweeper: batch limit %d, share %.2f; reserves at %d/s", sweepCfg.BatchLimit, sweepCfg.Share, rate)
	waitIdle(t)

	baseline := reserveAtRate(t, n, "baseline", rate, 20*time.Second, nil)
	t.Logf("%-13s %s", "nothing due", summarize(baseline))

	clock.Advance(2 * time.Minute)
	if count, _, _ := n.Backlog(); count != expired {
		t.Fatalf("backlog %d, want %d", count, expired)
	}
	entries := &timedProposer{n: n}
	sweeper := expiry.New(sweepCfg, entries, m, logger)
	const window = 3 * time.Second
	var windows []timeWindow
	var sweeping time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		for metricValue(t, m.Swept) < float64(expired) {
			ctx, cancel := context.WithTimeout(context.Background(), window)
			w := timeWindow{from: time.Now()}
			err := sweeper.Round(ctx)
			w.to = time.Now()
			cancel()
			windows = append(windows, w)
			sweeping += w.to.Sub(w.from)
			if err != nil && ctx.Err() == nil {
				t.Errorf("sweep round: %v", err)
				return
			}
			time.Sleep(window) // the rest window: the point of the exercise
		}
	}()
	samples := reserveAtRate(t, n, "interleaved", rate, time.Hour, done)
	var during, rest []latencySample
	for _, s := range samples {
		if inWindow(windows, s.due) {
			during = append(during, s)
		} else {
			rest = append(rest, s)
		}
	}
	ld, lr, lb := summarize(during), summarize(rest), summarize(baseline)
	t.Logf("%-13s %s", "no sweep", lr)
	t.Logf("%-13s %s", "during sweep", ld)

	if count, _, _ := n.Backlog(); count != 0 {
		t.Errorf("backlog after the sweep: %d", count)
	}
	if got := metricValue(t, m.Swept); got != float64(expired) {
		t.Errorf("swept %v records, want %d", got, expired)
	}
	t.Logf("swept %d records in %d windows, %s of sweeping: %.0f records/s", expired, len(windows),
		sweeping.Round(time.Millisecond), float64(expired)/sweeping.Seconds())
	t.Logf("sweep entries, proposal to answer: %s", summarize(entries.took))
	if os.Getenv("IDEMKV_SCALE_DEBUG") != "" {
		for _, s := range during {
			if s.latency > 5*lr.p99 {
				for i, w := range windows {
					if inWindow([]timeWindow{w}, s.due) {
						t.Logf("slow: window %d +%s: %s", i, s.due.Sub(w.from).Round(time.Millisecond), s.latency.Round(time.Millisecond))
					}
				}
			}
		}
		for _, s := range entries.took {
			if s.latency > 20*time.Millisecond {
				t.Logf("slow entry at %s: %s", s.due.Format("15:04:05.000"), s.latency.Round(time.Millisecond))
			}
		}
	}
	t.Logf("reserve p99 during the sweep is %.2fx p99 without one (target <= 2x); %.2fx p99 before anything was due",
		float64(ld.p99)/float64(lr.p99), float64(ld.p99)/float64(lb.p99))
	if ld.p99 > 2*lr.p99 {
		t.Errorf("reserve p99 during the sweep %s exceeds twice p99 without one (%s)", ld.p99, lr.p99)
	}
	if err := n.CheckExpiryIndex(); err != nil {
		t.Error(err)
	}
}

// waitIdle waits until this process is nearly idle, so that the baseline does not
// measure the compactions the load left behind.
func waitIdle(t *testing.T) {
	t.Helper()
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start := time.Now()
	for time.Since(start) < 5*time.Minute {
		before := cpu()
		time.Sleep(2 * time.Second) // measuring idleness takes an interval of idleness
		if used := cpu() - before; used < 100*time.Millisecond {
			t.Logf("settled after %s (%s of CPU in the last 2s)", time.Since(start).Round(time.Second), used)
			return
		}
	}
	t.Logf("still busy after %s; measuring anyway", time.Since(start).Round(time.Second))
}

// timedProposer is the node, as the sweeper sees it, timing each sweep entry.
type timedProposer struct {
	n    *node.Node
	mu   sync.Mutex
	took []latencySample
}

func (p *timedProposer) Sweep(ctx context.Context, limit int) (int, bool, error) {
	start := time.Now()
	swept, more, err := p.n.Sweep(ctx, limit)
	p.mu.Lock()
	p.took = append(p.took, latencySample{due: start, latency: time.Since(start)})
	p.mu.Unlock()
	return swept, more, err
}

func (p *timedProposer) Backlog() (int, idemkv.Timestamp, idemkv.Timestamp) { return p.n.Backlog() }

type timeWindow struct{ from, to time.Time }

func inWindow(ws []timeWindow, at time.Time) bool {
	for _, w := range ws {
		if !at.Before(w.from) && at.Before(w.to) {
			return true
		}
	}
	return false
}

func envInt(tb testing.TB, name string, def int) int {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		tb.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

func scaleReq(prefix string, i int) *idemkv.ReserveRequest {
	return &idemkv.ReserveRequest{
		Tenant:      fmt.Sprintf("tenant-%02d", i%16),
		Key:         fmt.Sprintf("%s:conv_%07d:approval_%03d:create_ticket", prefix, i, i%997),
		Tool:        "create_ticket",
		Actor:       "worker-" + strconv.Itoa(i%64),
		Fingerprint: fmt.Sprintf("sha256:%064x", i),
	}
}

// load reserves total keys through the node from many concurrent callers, so Raft
// batches them as it would under a busy fleet of agents.
func load(t *testing.T, n *node.Node, total int, ttl func(i int) time.Duration) {
	t.Helper()
	const callers = 256
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	progress := time.Now()
	var progressMu sync.Mutex
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= total {
					return
				}
				req := scaleReq("load", i)
				req.TTLMs = ttl(i).Milliseconds()
				res, err := n.Reserve(ctx, req)
				if err == nil && res.Decision != idemkv.DecisionExecute {
					err = fmt.Errorf("reserve %d: %s", i, res.Decision)
				}
				if err != nil {
					errs <- err
					return
				}
				if i%100_000 == 0 && i > 0 {
					progressMu.Lock()
					t.Logf("loaded %d (last 100k in %s)", i, time.Since(progress).Round(time.Millisecond))
					progress = time.Now()
					progressMu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

type latencySample struct {
	due     time.Time
	latency time.Duration
}

type latencies struct {
	n             int
	p50, p99, max time.Duration
}

func summarize(samples []latencySample) latencies {
	if len(samples) == 0 {
		return latencies{}
	}
	all := make([]time.Duration, len(samples))
	for i, s := range samples {
		all[i] = s.latency
	}
	slices.Sort(all)
	pct := func(p float64) time.Duration { return all[min(len(all)-1, int(p*float64(len(all))))] }
	return latencies{n: len(all), p50: pct(0.50), p99: pct(0.99), max: all[len(all)-1]}
}

func (l latencies) String() string {
	return fmt.Sprintf("%6d reserves: p50 %8s  p99 %8s  max %8s", l.n,
		l.p50.Round(time.Microsecond), l.p99.Round(time.Microsecond), l.max.Round(time.Microsecond))
}

var phaseSeq atomic.Int64

// reserveAtRate issues reserves of new keys at a fixed rate from several callers until
// d has passed or stop is closed. Latency counts from the moment a reserve was due,
// not from when it was sent: a caller held up by a slow answer sends late, and the
// wait it was made to do counts against the store (no coordinated omission).
func reserveAtRate(t *testing.T, n *node.Node, name string, rate int, d time.Duration, stop <-chan struct{}) []latencySample {
	t.Helper()
	const callers = 32
	seq := phaseSeq.Add(1)
	interval := time.Duration(float64(time.Second) * callers / float64(rate))
	begin := time.Now().Add(10 * time.Millisecond)
	end := begin.Add(d)
	var mu sync.Mutex
	var all []latencySample
	var count atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	ctx := context.Background()
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []latencySample
			defer func() {
				mu.Lock()
				all = append(all, mine...)
				mu.Unlock()
			}()
			due := begin.Add(interval * time.Duration(w) / callers)
			for ; due.Before(end); due = due.Add(interval) {
				select {
				case <-stop:
					return
				default:
				}
				time.Sleep(time.Until(due))
				i := int(count.Add(1))
				res, err := n.Reserve(ctx, scaleReq(fmt.Sprintf("%s-%d", name, seq), i))
				if err == nil && res.Decision != idemkv.DecisionExecute {
					err = fmt.Errorf("reserve: %s", res.Decision)
				}
				if err != nil {
					errs <- err
					return
				}
				mine = append(mine, latencySample{due: due, latency: time.Since(due)})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("%s: %v", name, err)
	}
	if len(all) == 0 {
		t.Fatalf("%s: no reserve measured", name)
	}
	return all
}
