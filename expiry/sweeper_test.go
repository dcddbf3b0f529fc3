package expiry

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/metrics"
)

// fakeProposer is the one fake of Proposer: each test sets the functions it needs.
type fakeProposer struct {
	sweep   func(ctx context.Context, limit int) (int, bool, error)
	backlog func() (int, idemkv.Timestamp, idemkv.Timestamp)
}

var _ Proposer = (*fakeProposer)(nil)

func (f *fakeProposer) Sweep(ctx context.Context, limit int) (int, bool, error) {
	return f.sweep(ctx, limit)
}

func (f *fakeProposer) Backlog() (int, idemkv.Timestamp, idemkv.Timestamp) { return f.backlog() }

// store models the state machine's side of a sweep: a backlog that each sweep entry
// shrinks by at most its limit. Every method is safe for the sweeper's goroutine.
type store struct {
	mu        sync.Mutex
	expired   int
	oldest    idemkv.Timestamp
	now       idemkv.Timestamp
	limits    []int
	backlogs  int
	failNext  error
	proposals int
}

func (s *store) proposer() *fakeProposer {
	return &fakeProposer{
		sweep: func(ctx context.Context, limit int) (int, bool, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.proposals++
			s.limits = append(s.limits, limit)
			if err := s.failNext; err != nil {
				s.failNext = nil
				return 0, false, err
			}
			n := min(limit, s.expired)
			s.expired -= n
			return n, s.expired > 0, nil
		},
		backlog: func() (int, idemkv.Timestamp, idemkv.Timestamp) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.backlogs++
			if s.expired == 0 {
				return 0, 0, s.now
			}
			return s.expired, s.oldest, s.now
		},
	}
}

func (s *store) set(expired int, oldest, now idemkv.Timestamp) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expired, s.oldest, s.now = expired, oldest, now
}

func (s *store) counts() (expired, proposals, backlogs int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.expired, s.proposals, s.backlogs
}

func value(tb testing.TB, c prometheus.Metric) float64 {
	tb.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		tb.Fatal(err)
	}
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	tb.Fatalf("unexpected metric %v", &m)
	return 0
}

func eventually(tb testing.TB, what string, f func() error) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: %v", what, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// running starts s.Run and returns a function that stops it and waits for it to return.
func running(tb testing.TB, s *Sweeper) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx)
	}()
	stopped := false
	stop = func() {
		tb.Helper()
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			tb.Fatal("Run did not return after its context ended")
		}
	}
	tb.Cleanup(stop)
	return stop
}

const t0 idemkv.Timestamp = 1_800_000_000_000

func TestRoundSweepsUntilTheBacklogIsGone(t *testing.T) {
	st := &store{}
	st.set(2500, t0, t0+5000)
	m := metrics.New()
	s := New(Config{BatchLimit: 1000}, st.proposer(), m, testlog.New(t))
	if err := s.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left, proposals, _ := st.counts(); left != 0 || proposals != 3 {
		t.Fatalf("after a round: %d left after %d proposals, want 0 after 3", left, proposals)
	}
	for i, l := range st.limits {
		if l != 1000 {
			t.Errorf("proposal %d asked for %d records, want the configured 1000", i, l)
		}
	}
	if got := value(t, m.Swept); got != 2500 {
		t.Errorf("swept counter = %v, want 2500", got)
	}
	if got := value(t, m.SweepDuration); got != 1 {
		t.Errorf("sweep duration observed %v times, want once per round", got)
	}
}

func TestRoundWithNothingToSweepRecordsNoDuration(t *testing.T) {
	st := &store{}
	m := metrics.New()
	s := New(Config{}, st.proposer(), m, testlog.New(t))
	if err := s.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := value(t, m.SweepDuration); got != 0 {
		t.Errorf("an empty round observed a sweep duration (%v samples)", got)
	}
	if len(st.limits) != 1 || st.limits[0] != DefaultConfig().BatchLimit {
		t.Errorf("limits asked for %v, want one proposal with the default %d", st.limits, DefaultConfig().BatchLimit)
	}
}

func TestRoundStopsAtTheFirstError(t *testing.T) {
	st := &store{}
	st.set(300, t0, t0)
	m := metrics.New()
	p := st.proposer()
	calls := 0
	inner := p.sweep
	p.sweep = func(ctx context.Context, limit int) (int, bool, error) {
		calls++
		if calls == 2 {
			return 0, false, fmt.Errorf("proposing: %w", idemkv.ErrNotLeader)
		}
		return inner(ctx, limit)
	}
	s := New(Config{BatchLimit: 100}, p, m, testlog.New(t))
	err := s.Round(context.Background())
	if !errors.Is(err, idemkv.ErrUnavailable) {
		t.Fatalf("round error = %v, want one wrapping ErrUnavailable", err)
	}
	if calls != 2 {
		t.Errorf("round went on after an error: %d proposals", calls)
	}
	if got := value(t, m.Swept); got != 100 {
		t.Errorf("swept counter = %v, want the 100 of the proposal that landed", got)
	}
}

func TestRoundStopsWhenItsContextEnds(t *testing.T) {
	st := &store{}
	st.set(10_000, t0, t0)
	p := st.proposer()
	inner := p.sweep
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p.sweep = func(c context.Context, limit int) (int, bool, error) {
		cancel() // leadership lost while the entry was in flight
		return inner(c, limit)
	}
	s := New(Config{BatchLimit: 10}, p, metrics.New(), testlog.New(t))
	if err := s.Round(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("round error = %v, want context.Canceled", err)
	}
	if _, proposals, _ := st.counts(); proposals != 1 {
		t.Errorf("%d proposals after the context ended, want 1", proposals)
	}
}

// An idle cluster must not grow its log: without a backlog the sweeper proposes
// nothing, however many intervals pass; once records expire it sweeps them all.
func TestRunProposesOnlyWhenThereIsABacklog(t *testing.T) {
	st := &store{}
	m := metrics.New()
	s := New(Config{Interval: time.Millisecond, BatchLimit: 7}, st.proposer(), m, testlog.New(t))
	running(t, s)
	eventually(t, "backlog checked repeatedly", func() error {
		if _, _, b := st.counts(); b < 20 {
			return fmt.Errorf("%d backlog checks", b)
		}
		return nil
	})
	if _, proposals, _ := st.counts(); proposals != 0 {
		t.Fatalf("%d sweeps proposed with nothing expired", proposals)
	}
	st.set(50, t0, t0+90_000)
	eventually(t, "backlog swept", func() error {
		if left, _, _ := st.counts(); left != 0 {
			return fmt.Errorf("%d left", left)
		}
		if got := value(t, m.Swept); got != 50 {
			return fmt.Errorf("swept counter %v", got)
		}
		return nil
	})
	if _, proposals, _ := st.counts(); proposals != 8 {
		t.Errorf("%d proposals for 50 records in entries of 7, want 8", proposals)
	}
	eventually(t, "gauges back to zero once swept", func() error {
		if b, o := value(t, m.SweepBacklog), value(t, m.OldestOverdue); b != 0 || o != 0 {
			return fmt.Errorf("backlog %v, oldest overdue %v", b, o)
		}
		return nil
	})
}

func TestRunReportsTheBacklogAndClearsItOnStop(t *testing.T) {
	st := &store{}
	m := metrics.New()
	p := st.proposer()
	// Sweeps fail, so the backlog stays and the gauges show it.
	p.sweep = func(context.Context, int) (int, bool, error) {
		return 0, false, idemkv.ErrNotLeader
	}
	st.set(1234, t0, t0+90_500)
	stop := running(t, New(Config{Interval: time.Millisecond}, p, m, testlog.New(t)))
	eventually(t, "gauges show the backlog", func() error {
		if b, o := value(t, m.SweepBacklog), value(t, m.OldestOverdue); b != 1234 || o != 90.5 {
			return fmt.Errorf("backlog %v, oldest overdue %v s", b, o)
		}
		return nil
	})
	stop()
	if b, o := value(t, m.SweepBacklog), value(t, m.OldestOverdue); b != 0 || o != 0 {
		t.Errorf("after stopping: backlog %v, oldest overdue %v; a former leader must report none", b, o)
	}
}

func TestRunRetriesAfterAFailedRound(t *testing.T) {
	st := &store{}
	st.set(40, t0, t0+1)
	st.failNext = fmt.Errorf("applying: %w", idemkv.ErrUnavailable)
	m := metrics.New()
	running(t, New(Config{Interval: time.Millisecond, BatchLimit: 100}, st.proposer(), m, testlog.New(t)))
	eventually(t, "swept after the failure", func() error {
		if left, _, _ := st.counts(); left != 0 {
			return fmt.Errorf("%d left", left)
		}
		return nil
	})
	if got := value(t, m.Swept); got != 40 {
		t.Errorf("swept counter = %v, want 40", got)
	}
	if _, proposals, _ := st.counts(); proposals != 2 {
		t.Errorf("%d proposals, want the failed one and one that swept everything", proposals)
	}
}

func TestDisabledSweeperDoesNothing(t *testing.T) {
	st := &store{}
	st.set(5, t0, t0+1)
	s := New(Config{Disabled: true, Interval: time.Millisecond}, st.proposer(), metrics.New(), testlog.New(t))
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(context.Background())
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a disabled sweeper kept running")
	}
	if left, proposals, backlogs := st.counts(); left != 5 || proposals != 0 || backlogs != 0 {
		t.Errorf("disabled sweeper: %d left, %d proposals, %d backlog checks", left, proposals, backlogs)
	}
}

func TestPauseKeepsTheRoundToItsShare(t *testing.T) {
	for _, c := range []struct {
		share float64
		took  time.Duration
		want  time.Duration
	}{
		{1, 10 * time.Millisecond, 0},
		{0.5, 10 * time.Millisecond, 10 * time.Millisecond},
		{0.25, 10 * time.Millisecond, 30 * time.Millisecond},
		{0.8, 8 * time.Millisecond, 2 * time.Millisecond},
	} {
		s := New(Config{Share: c.share}, (&store{}).proposer(), metrics.New(), testlog.New(t))
		if got := s.pauseAfter(c.took); got != c.want {
			t.Errorf("share %.2f, entry of %s: pause %s, want %s", c.share, c.took, got, c.want)
		}
	}
	for _, share := range []float64{0, -1, 1.5} {
		if got := New(Config{Share: share}, nil, metrics.New(), testlog.New(t)).cfg.Share; got != DefaultConfig().Share {
			t.Errorf("share %v became %v, want the default %v", share, got, DefaultConfig().Share)
		}
	}
}

// A paced round really waits between entries, and stops waiting when its context ends.
func TestRoundPausesBetweenEntries(t *testing.T) {
	st := &store{}
	st.set(40, t0, t0)
	p := st.proposer()
	inner := p.sweep
	const entry = 10 * time.Millisecond
	p.sweep = func(ctx context.Context, limit int) (int, bool, error) {
		time.Sleep(entry)
		return inner(ctx, limit)
	}
	s := New(Config{BatchLimit: 10, Share: 0.5}, p, metrics.New(), testlog.New(t))
	start := time.Now()
	if err := s.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Four entries of at least 10 ms, and a pause at least as long after each of the
	// first three.
	if took := time.Since(start); took < 7*entry {
		t.Errorf("a round of 4 entries of %s at share 0.5 took %s, want at least %s", entry, took, 7*entry)
	}

	st.set(1000, t0, t0)
	slow := New(Config{BatchLimit: 10, Share: 0.001}, p, metrics.New(), testlog.New(t))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- slow.Round(ctx) }()
	eventually(t, "the first entry", func() error {
		if _, proposals, _ := st.counts(); proposals < 5 {
			return fmt.Errorf("%d proposals", proposals)
		}
		return nil
	})
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("round cancelled in its pause: %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a round in a ten-second pause did not return when its context ended")
	}
}

// During a long round the gauges follow the backlog down instead of showing the
// round's start until it ends.
func TestLongRoundRefreshesTheGauges(t *testing.T) {
	st := &store{}
	st.set(200, t0, t0+1000)
	p := st.proposer()
	inner := p.sweep
	p.sweep = func(ctx context.Context, limit int) (int, bool, error) {
		time.Sleep(time.Millisecond)
		return inner(ctx, limit)
	}
	m := metrics.New()
	s := New(Config{Interval: time.Millisecond, BatchLimit: 1, Share: 1}, p, m, testlog.New(t))
	if err := s.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	// 200 entries of at least 1 ms, a count at least every 10 ms.
	if _, _, backlogs := st.counts(); backlogs < 2 {
		t.Fatalf("%d backlog counts during a round of 200 entries", backlogs)
	}
	if b := value(t, m.SweepBacklog); b <= 0 || b >= 200 {
		t.Errorf("backlog gauge after the round = %v, want the count of a refresh during it", b)
	}
}

// A batch above MaxBatchLimit, up to the largest int (which overflowed the state
// machine's look-ahead: every sweep deleted nothing), is taken as the most, so that a
// node upgraded with an earlier release's setting still starts and sweeps.
func TestBatchLimitAboveTheMostIsTheMost(t *testing.T) {
	for _, asked := range []int{MaxBatchLimit + 1, math.MaxInt} {
		st := &store{}
		st.set(MaxBatchLimit+10, t0, t0+5000)
		s := New(Config{BatchLimit: asked}, st.proposer(), metrics.New(), testlog.New(t))
		if err := s.Round(context.Background()); err != nil {
			t.Fatal(err)
		}
		if left, _, _ := st.counts(); left != 0 {
			t.Fatalf("batch %d: %d records left after a round", asked, left)
		}
		if len(st.limits) == 0 || st.limits[0] != MaxBatchLimit {
			t.Fatalf("batch %d: the proposals asked for %v, want %d first", asked, st.limits, MaxBatchLimit)
		}
	}
}
