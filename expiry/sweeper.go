// Package expiry runs the TTL sweeper: on the leader only, it proposes sweep commands
// stamped with the leader's time until no expired record is left.
//
// It never deletes anything itself and never reads a clock to decide expiry: the state
// machine decides, from the stamped time, which records are past expires_at, and it
// removes a bounded number per log entry so a large backlog never stalls the log.
package expiry

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/metrics"
)

// Proposer is what the sweeper needs from the node.
type Proposer interface {
	// Sweep replicates one sweep entry deleting at most limit expired records.
	Sweep(ctx context.Context, limit int) (swept int, more bool, err error)
	// Backlog counts expired records not yet swept, the expiry of the oldest, and the
	// time it measured against.
	Backlog() (count int, oldest, now idemkv.Timestamp)
}

// Config tunes the sweeper. Zero fields take the defaults.
type Config struct {
	// Interval between sweep rounds (default 1 s).
	Interval time.Duration
	// BatchLimit is the most records one log entry deletes (default 64). Every
	// command applied after a sweep entry waits for it, and so does every
	// linearizable read that started while it was in flight: the limit bounds that
	// wait (a sweep entry of 64 records takes about 3 ms on 2 CPUs, 512 up to 40).
	BatchLimit int
	// Share is the largest fraction of time a round spends with a sweep entry in
	// flight (default 0.25; 1 proposes back to back). After an entry that took d from
	// proposal to answer, the sweeper waits d*(1-Share)/Share before the next, so
	// client writes never queue behind a train of sweep entries, and a busy node,
	// whose entries take longer, is swept more gently.
	Share float64
	// Disabled turns the sweeper off (records past expires_at stay invisible but
	// keep their space).
	Disabled bool
}

// MaxBatchLimit bounds Config.BatchLimit: every write and linearizable read waits for a
// sweep entry in flight, and one of this many records takes a few hundred ms. A larger
// limit is taken as this one (a limit near the largest int overflowed the state
// machine's look-ahead, and every sweep deleted nothing), not refused: a setting that
// an earlier release took must not stop an upgraded node from starting.
const MaxBatchLimit = 4096

// Validate refuses what withDefaults would not take for a default: a negative field, a
// share above 1.
func (c Config) Validate() error {
	switch {
	case c.Interval < 0:
		return fmt.Errorf("expiry: the sweep interval must not be negative, not %s", c.Interval)
	case c.BatchLimit < 0:
		return fmt.Errorf("expiry: the sweep batch must not be negative (0: the default), not %d", c.BatchLimit)
	case c.Share < 0 || c.Share > 1:
		return fmt.Errorf("expiry: the sweep share must be in (0, 1] (0: the default), not %g", c.Share)
	}
	return nil
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config { return Config{Interval: time.Second, BatchLimit: 64, Share: 0.25} }

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Interval <= 0 {
		c.Interval = d.Interval
	}
	if c.BatchLimit <= 0 {
		c.BatchLimit = d.BatchLimit
	}
	c.BatchLimit = min(c.BatchLimit, MaxBatchLimit)
	if c.Share <= 0 || c.Share > 1 {
		c.Share = d.Share
	}
	return c
}

// Sweeper deletes expired records through the log.
type Sweeper struct {
	cfg     Config
	p       Proposer
	metrics *metrics.Metrics
	log     *slog.Logger
}

// New returns a sweeper; Run starts it.
func New(cfg Config, p Proposer, m *metrics.Metrics, logger *slog.Logger) *Sweeper {
	s := &Sweeper{cfg: cfg.withDefaults(), p: p, metrics: m, log: logger.With("component", "sweeper")}
	if cfg.BatchLimit > MaxBatchLimit {
		s.log.Warn("sweep batch above the most one entry may delete; taking the most", "asked", cfg.BatchLimit, "batch_limit", MaxBatchLimit)
	}
	return s
}

// Run sweeps every interval until ctx is done. The node calls it when it becomes
// leader and cancels ctx when it stops being leader, so exactly one node sweeps.
func (s *Sweeper) Run(ctx context.Context) {
	if s.cfg.Disabled {
		return
	}
	s.log.Info("sweeper started", "interval", s.cfg.Interval, "batch_limit", s.cfg.BatchLimit, "share", s.cfg.Share)
	defer func() {
		// Only the leader knows the backlog it is working off; a node that stopped
		// sweeping must not keep reporting the figures of its last round, or a
		// dashboard summing the cluster would count the backlog twice.
		s.metrics.SweepBacklog.Set(0)
		s.metrics.OldestOverdue.Set(0)
		s.log.Info("sweeper stopped")
	}()
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		// An idle cluster must not grow its log: propose only when the expiry index
		// (read locally, at bounded cost) shows work.
		if s.observeBacklog() > 0 {
			if err := s.Round(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("sweep round failed", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Round proposes sweeps until no expired record is left or ctx ends.
func (s *Sweeper) Round(ctx context.Context) error {
	start := time.Now()
	total := 0
	defer func() {
		if total > 0 {
			s.metrics.SweepDuration.Observe(time.Since(start).Seconds())
			s.log.Debug("swept", "records", total, "took", time.Since(start))
		}
	}()
	observed := start
	for ctx.Err() == nil {
		begin := time.Now()
		swept, more, err := s.p.Sweep(ctx, s.cfg.BatchLimit)
		if err != nil {
			return err
		}
		total += swept
		s.metrics.Swept.Add(float64(swept))
		if !more {
			return nil
		}
		// A large backlog takes minutes: refresh the gauges now and then, or they
		// would show the round's start all along. Not every interval: counting costs
		// a scan of the remaining backlog.
		if time.Since(observed) >= refreshEvery*s.cfg.Interval {
			s.observeBacklog()
			observed = time.Now()
		}
		if err := s.pause(ctx, time.Since(begin)); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// refreshEvery is how many intervals pass between two counts of the backlog while a
// round is under way.
const refreshEvery = 10

// pauseAfter is how long to wait after an entry that took d, to keep the round's
// share of time at cfg.Share.
func (s *Sweeper) pauseAfter(d time.Duration) time.Duration {
	return time.Duration(math.Round(float64(d) * (1 - s.cfg.Share) / s.cfg.Share))
}

func (s *Sweeper) pause(ctx context.Context, d time.Duration) error {
	wait := s.pauseAfter(d)
	if wait <= 0 {
		return nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (s *Sweeper) observeBacklog() int {
	count, oldest, now := s.p.Backlog()
	s.metrics.SweepBacklog.Set(float64(count))
	overdue := 0.0
	if count > 0 && oldest < now {
		overdue = float64(now-oldest) / 1000
	}
	s.metrics.OldestOverdue.Set(overdue)
	return count
}
