package loadgen

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkv/idemkv"
)

// Config describes one run. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// Target is the store under load. Required.
	Target Target
	// Name labels the target in the report ("idemkv", "etcd", "postgres").
	Name string
	// Concurrency is the number of workers, each with one operation in flight.
	Concurrency int
	// Duration bounds the measured phase; Ops, when positive, bounds it too.
	Duration time.Duration
	Ops      int64
	// Warmup runs the mix unmeasured first, so connections, caches and the Go heap
	// are warm when measuring starts. Negative disables it.
	Warmup time.Duration
	// Keys is the number of committed keys that replays and conflicts draw from,
	// written before the run. HotKeys is the number of pending keys that in-progress
	// operations contend for.
	Keys    int
	HotKeys int
	Mix     Mix
	// Seed makes the sequence of kinds each worker draws repeatable.
	Seed uint64
	// RunID prefixes every key, so that runs against the same store never collide.
	// Empty: random.
	RunID string
	// Tool is the tool name of every operation.
	Tool string
	// Progress, when set, gets a progress line every ProgressInterval. ProgressTTY
	// rewrites one line in place instead of printing a line each time.
	Progress         io.Writer
	ProgressInterval time.Duration
	ProgressTTY      bool
	Logger           *slog.Logger
	// Measuring, when set, is called as the measured phase begins (after the warm-up)
	// and Measured as it ends, before the report is built: a caller that samples
	// something over the measured window alone (the CPU time of the store's
	// processes) samples there.
	Measuring, Measured func()
}

// DefaultConfig returns the defaults: 16 workers for 10 s after 2 s of warm-up, the
// default mix over 1000 committed keys and 8 contended pending keys.
func DefaultConfig() Config {
	return Config{
		Concurrency:      16,
		Duration:         10 * time.Second,
		Warmup:           2 * time.Second,
		Keys:             1000,
		HotKeys:          8,
		Mix:              DefaultMix(),
		Seed:             1,
		Tool:             "create_ticket",
		ProgressInterval: time.Second,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Concurrency == 0 {
		c.Concurrency = d.Concurrency
	}
	if c.Duration == 0 {
		c.Duration = d.Duration
	}
	if c.Warmup == 0 {
		c.Warmup = d.Warmup
	}
	if c.Keys == 0 {
		c.Keys = d.Keys
	}
	if c.HotKeys == 0 {
		c.HotKeys = d.HotKeys
	}
	if c.Mix == (Mix{}) {
		c.Mix = d.Mix
	}
	if c.Seed == 0 {
		c.Seed = d.Seed
	}
	if c.Tool == "" {
		c.Tool = d.Tool
	}
	if c.ProgressInterval == 0 {
		c.ProgressInterval = d.ProgressInterval
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.RunID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.RunID = hex.EncodeToString(b[:])
	}
	return c
}

// Validate reports a config that cannot run.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Target == nil:
		return idemkv.Invalid("target", "a target is required")
	case c.Concurrency < 0:
		return idemkv.Invalid("concurrency", "concurrency must be positive")
	case c.Duration < 0:
		return idemkv.Invalid("duration", "duration must be positive")
	case c.Ops < 0:
		return idemkv.Invalid("ops", "ops must not be negative")
	case c.Keys < 0:
		return idemkv.Invalid("keys", "keys must be positive")
	case c.HotKeys < 0:
		return idemkv.Invalid("hot_keys", "hot keys must be positive")
	}
	return c.Mix.Validate()
}

// errUnexpected marks an answer the workload did not expect (a replay for a new key,
// say): the store got the decision table wrong, or another run touched the keys.
var errUnexpected = errors.New("unexpected decision")

// workerKey carries, in the context of each operation, the index of the worker that
// runs it, so that a target can keep each worker on one node (HTTPConfig.Pinned).
type workerKey struct{}

// Worker returns the index of the worker whose operation ctx belongs to, if Run
// started it.
func Worker(ctx context.Context) (int, bool) {
	w, ok := ctx.Value(workerKey{}).(int)
	return w, ok
}

// worker is the state one goroutine keeps across phases; only it touches it.
type worker struct {
	id    int
	rng   *mrand.Rand
	seq   uint64
	stats [numStats]stat
}

// Stats beyond the kinds: the two steps of a new operation, timed on their own since
// reserve latency is what a runtime waits for before it may act.
const (
	statNewReserve = int(numKinds) + iota
	statNewCommit
	numStats
)

var statNames = [numStats]string{"new", "replay", "conflict", "in_progress", "new.reserve", "new.commit"}

type stat struct {
	hist   Histogram
	errors map[string]uint64
	// samples keeps the first message of each code: a count alone does not say
	// whether "unavailable" was a timeout, an election or a refused connection.
	samples map[string]string
}

func (s *stat) fail(err error) {
	if s.errors == nil {
		s.errors = make(map[string]uint64)
		s.samples = make(map[string]string)
	}
	code := idemkv.CodeOf(err)
	if errors.Is(err, errUnexpected) {
		code = err.Error()
	}
	if s.errors[code] == 0 {
		s.samples[code] = err.Error()
	}
	s.errors[code]++
}

// runner is one Run in progress.
type runner struct {
	cfg     Config
	seeds   []string // committed keys
	hot     []string // pending keys held by another attempt
	started atomic.Int64
	done    [numKinds]atomic.Uint64
	failed  atomic.Uint64
}

// Run writes the keys that replays, conflicts and contention need, warms up, then
// measures the mix until the duration or the op count is reached, or ctx ends.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg.withDefaults()}
	cfg = r.cfg
	workers := make([]*worker, cfg.Concurrency)
	for i := range workers {
		workers[i] = &worker{id: i, rng: mrand.New(mrand.NewPCG(cfg.Seed, uint64(i)))}
	}
	if err := r.setup(ctx, workers); err != nil {
		return nil, err
	}
	if cfg.Warmup > 0 {
		cfg.Logger.Info("warming up", "target", cfg.Name, "duration", cfg.Warmup)
		r.phase(ctx, workers, cfg.Warmup, 0, "warm-up")
		for _, w := range workers {
			w.stats = [numStats]stat{}
		}
		for k := range r.done {
			r.done[k].Store(0)
		}
		r.failed.Store(0)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	cfg.Logger.Info("measuring", "target", cfg.Name, "concurrency", cfg.Concurrency, "duration", cfg.Duration, "mix", cfg.Mix.String())
	if cfg.Measuring != nil {
		cfg.Measuring()
	}
	elapsed := r.phase(ctx, workers, cfg.Duration, cfg.Ops, "")
	if cfg.Measured != nil {
		cfg.Measured()
	}
	return r.report(workers, elapsed), nil
}

// setup commits the keys replays and conflicts draw from and reserves the keys that
// in-progress operations contend for, spreading the writes over all workers.
func (r *runner) setup(ctx context.Context, workers []*worker) error {
	cfg := r.cfg
	if cfg.Mix.Replay > 0 || cfg.Mix.Conflict > 0 {
		r.seeds = make([]string, cfg.Keys)
		for i := range r.seeds {
			r.seeds[i] = cfg.RunID + "/seed/" + strconv.Itoa(i)
		}
	}
	if cfg.Mix.InProgress > 0 {
		r.hot = make([]string, cfg.HotKeys)
		for i := range r.hot {
			r.hot[i] = cfg.RunID + "/hot/" + strconv.Itoa(i)
		}
	}
	if len(r.seeds)+len(r.hot) == 0 {
		return nil
	}
	start := time.Now()
	var next atomic.Int64
	errs := make([]error, len(workers))
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			wctx := context.WithValue(ctx, workerKey{}, w.id)
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				var err error
				switch {
				case i < len(r.seeds):
					err = r.commitNew(wctx, r.seeds[i], nil)
				case i < len(r.seeds)+len(r.hot):
					err = r.holdPending(wctx, r.hot[i-len(r.seeds)])
				default:
					return
				}
				if err != nil {
					errs[w.id] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("loadgen: setup of %s: %w", cfg.Name, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("loadgen: setup of %s: %w", cfg.Name, err)
	}
	cfg.Logger.Info("setup done", "target", cfg.Name, "committed", len(r.seeds), "pending", len(r.hot), "took", time.Since(start))
	return nil
}

// holdPending reserves key for an attempt that never finishes within the run: the
// longest lease the protocol allows.
func (r *runner) holdPending(ctx context.Context, key string) error {
	res, err := r.cfg.Target.Reserve(ctx, &Reserve{Key: key, Tool: r.cfg.Tool, Fingerprint: fingerprint(key),
		AttemptID: key + "/holder", LeaseTTLMs: time.Hour.Milliseconds()})
	if err != nil {
		return err
	}
	if res.Decision != idemkv.DecisionExecute {
		return fmt.Errorf("%w: %s for pending key %s", errUnexpected, res.Decision, key)
	}
	return nil
}

// phase runs the workers until d has passed or ops operations have started (ops > 0),
// and returns how long they ran. label marks its progress lines.
func (r *runner) phase(ctx context.Context, workers []*worker, d time.Duration, ops int64, label string) time.Duration {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	r.started.Store(0)
	stopProgress := r.progress(start, label)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			wctx := context.WithValue(ctx, workerKey{}, w.id)
			for ctx.Err() == nil {
				if ops > 0 && r.started.Add(1) > ops {
					return
				}
				r.one(wctx, w)
			}
		})
	}
	wg.Wait()
	// The window is the phase's duration at most: what finished after it is not
	// counted (one), and waiting for the operations cut off at its end (they end as
	// soon as their worker runs again, which on a loaded machine takes a while) is
	// not part of it.
	elapsed := min(time.Since(start), d)
	stopProgress()
	return elapsed
}

// one runs one operation of a randomly drawn kind and records it.
func (r *runner) one(ctx context.Context, w *worker) {
	kind := r.cfg.Mix.pick(w.rng.IntN(r.cfg.Mix.total()))
	t0 := time.Now()
	var err error
	switch kind {
	case KindNew:
		w.seq++
		key := r.cfg.RunID + "/new/" + strconv.Itoa(w.id) + "/" + strconv.FormatUint(w.seq, 10)
		err = r.commitNew(ctx, key, &w.stats)
	case KindReplay, KindConflict:
		key := r.seeds[w.rng.IntN(len(r.seeds))]
		fp := fingerprint(key)
		if kind == KindConflict {
			fp = fingerprint(key + "/other")
		}
		err = r.expect(ctx, kind, &Reserve{Key: key, Tool: r.cfg.Tool, Fingerprint: fp,
			AttemptID: attemptID(r.cfg.RunID, w)})
	case KindInProgress:
		key := r.hot[w.rng.IntN(len(r.hot))]
		err = r.expect(ctx, kind, &Reserve{Key: key, Tool: r.cfg.Tool, Fingerprint: fingerprint(key),
			AttemptID: attemptID(r.cfg.RunID, w)})
	}
	took := time.Since(t0)
	if ended(ctx) {
		// The phase ended under the operation: neither a result nor a failure.
		return
	}
	if err != nil {
		w.stats[kind].fail(err)
		r.failed.Add(1)
		return
	}
	w.stats[kind].hist.Record(took)
	r.done[kind].Add(1)
}

// commitNew reserves key, expecting to execute, and commits it. With stats set it
// times both steps.
func (r *runner) commitNew(ctx context.Context, key string, stats *[numStats]stat) error {
	fp := fingerprint(key)
	t0 := time.Now()
	res, err := r.cfg.Target.Reserve(ctx, &Reserve{Key: key, Tool: r.cfg.Tool, Fingerprint: fp, AttemptID: key + "/1"})
	if err == nil && res.Decision != idemkv.DecisionExecute {
		err = fmt.Errorf("%w: %s", errUnexpected, res.Decision)
	}
	if err != nil {
		if stats != nil && !ended(ctx) {
			stats[statNewReserve].fail(err)
		}
		return err
	}
	t1 := time.Now()
	err = r.cfg.Target.Commit(ctx, &Commit{Key: key, Fingerprint: fp, Reservation: res,
		RemoteSystem: "bench", RemoteID: "R-" + strconv.FormatUint(res.Fence, 10)})
	if stats == nil {
		return err
	}
	if err != nil {
		if !ended(ctx) {
			stats[statNewCommit].fail(err)
		}
		return err
	}
	stats[statNewReserve].hist.Record(t1.Sub(t0))
	stats[statNewCommit].hist.Record(time.Since(t1))
	return nil
}

func (r *runner) expect(ctx context.Context, kind Kind, req *Reserve) error {
	res, err := r.cfg.Target.Reserve(ctx, req)
	if err != nil {
		return err
	}
	if res.Decision != kind.expected() {
		return fmt.Errorf("%w: %s", errUnexpected, res.Decision)
	}
	return nil
}

// ended reports whether the phase is over. Drivers such as pgx turn the context's
// deadline into a socket deadline, whose timeout can surface a moment before the
// context itself reports that it is done.
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

func attemptID(run string, w *worker) string {
	w.seq++
	return run + "/a/" + strconv.Itoa(w.id) + "/" + strconv.FormatUint(w.seq, 10)
}

// fingerprint stands in for the fingerprint of the key's effect: the same key always
// has the same effect, in the real shape (sha256:<64 hex>).
func fingerprint(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}
