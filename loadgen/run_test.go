package loadgen

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testlog"
)

// funcTarget is a Target whose methods are fields, for answers memStore never gives.
type funcTarget struct {
	reserve func(context.Context, *Reserve) (Reservation, error)
	commit  func(context.Context, *Commit) error
}

var _ Target = (*funcTarget)(nil)

func (f *funcTarget) Reserve(ctx context.Context, r *Reserve) (Reservation, error) {
	return f.reserve(ctx, r)
}
func (f *funcTarget) Commit(ctx context.Context, c *Commit) error { return f.commit(ctx, c) }
func (f *funcTarget) Close() error                                { return nil }

func TestParseMix(t *testing.T) {
	good := map[string]Mix{
		"new=50,replay=40,conflict=5,inprogress=5": {50, 40, 5, 5},
		"new=1":                        {New: 1},
		" replay = 3 , in_progress=1 ": {Replay: 3, InProgress: 1},
		DefaultMix().String():          DefaultMix(),
	}
	for in, want := range good {
		got, err := ParseMix(in)
		if err != nil || got != want {
			t.Errorf("ParseMix(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "new", "new=x", "new=-1", "delete=3", "new=0,replay=0"} {
		if _, err := ParseMix(in); !errors.Is(err, idemkv.ErrInvalidArgument) {
			t.Errorf("ParseMix(%q) = %v, want invalid argument", in, err)
		}
	}
}

func TestRunFollowsMixProportions(t *testing.T) {
	store := newMemStore()
	mix := Mix{New: 50, Replay: 30, Conflict: 15, InProgress: 5}
	const ops = 20_000
	rep, err := Run(t.Context(), Config{Target: store, Name: "mem", Concurrency: 4, Ops: ops,
		Duration: time.Minute, Warmup: -1, Keys: 100, HotKeys: 3, Mix: mix, Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Ops != ops || rep.Errors != 0 {
		t.Fatalf("ops %d errors %d, want %d and 0", rep.Ops, rep.Errors, ops)
	}
	for k := range numKinds {
		kr := rep.Kind(k.String())
		if kr == nil {
			t.Fatalf("no report for %s", k)
		}
		share := float64(kr.Ops) / ops
		want := float64(mix.weight(k)) / float64(mix.total())
		if math.Abs(share-want) > 0.015 {
			t.Errorf("%s: share %.3f, want %.3f", k, share, want)
		}
		if kr.Latency.Count != kr.Ops || kr.Latency.P99 <= 0 && kr.Ops > 0 {
			t.Errorf("%s: latency %+v for %d ops", k, kr.Latency, kr.Ops)
		}
	}
	// Every reserve reached the store as the kind says: setup wrote the seeds and hot
	// keys once, then replays and conflicts hit seeds and in-progress hit hot keys.
	newOps, reserve, commit := rep.Kind("new").Ops, rep.Kind("new.reserve").Ops, rep.Kind("new.commit").Ops
	if reserve != newOps || commit != newOps {
		t.Errorf("new %d, new.reserve %d, new.commit %d: want equal", newOps, reserve, commit)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if got, want := store.reserves["seed"], 100+int(rep.Kind("replay").Ops+rep.Kind("conflict").Ops); got != want {
		t.Errorf("reserves of seed keys %d, want %d", got, want)
	}
	if got, want := store.reserves["hot"], 3+int(rep.Kind("in_progress").Ops); got != want {
		t.Errorf("reserves of hot keys %d, want %d", got, want)
	}
	if got, want := store.commits.Load(), int64(100+newOps); got != want {
		t.Errorf("commits %d, want %d", got, want)
	}
}

func TestRunLeavesWarmupOutOfTheReport(t *testing.T) {
	store := newMemStore()
	rep, err := Run(t.Context(), Config{Target: store, Concurrency: 2, Ops: 500, Duration: time.Minute,
		Warmup: 100 * time.Millisecond, Mix: Mix{New: 1}, Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	store.mu.Lock()
	reserves := store.reserves["new"]
	store.mu.Unlock()
	if rep.Ops != 500 {
		t.Fatalf("measured %d ops, want 500", rep.Ops)
	}
	if reserves <= 500 {
		t.Fatalf("store saw %d new reserves: warm-up did not run", reserves)
	}
	if got := rep.Kind("replay"); got != nil {
		t.Errorf("report has replays %+v though the mix has none", got)
	}
}

func TestRunCountsWrongDecisionsAndStoreErrors(t *testing.T) {
	var mu sync.Mutex
	n := 0
	target := &funcTarget{
		reserve: func(context.Context, *Reserve) (Reservation, error) {
			mu.Lock()
			defer mu.Unlock()
			n++
			switch n % 3 {
			case 0:
				return Reservation{Decision: idemkv.DecisionReplay}, nil
			case 1:
				return Reservation{}, idemkv.Errorf(idemkv.ErrUnavailable, "no leader")
			}
			return Reservation{Decision: idemkv.DecisionExecute, Fence: uint64(n)}, nil
		},
		commit: func(context.Context, *Commit) error {
			return idemkv.Errorf(idemkv.ErrFenced, "newer attempt")
		},
	}
	rep, err := Run(t.Context(), Config{Target: target, Concurrency: 1, Ops: 300, Duration: time.Minute,
		Warmup: -1, Mix: Mix{New: 1}, Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Ops != 0 || rep.Errors != 300 {
		t.Fatalf("ops %d errors %d, want 0 and 300", rep.Ops, rep.Errors)
	}
	want := map[string]uint64{"unexpected decision: replay": 100, idemkv.CodeUnavailable: 100, idemkv.CodeFenced: 100}
	for code, count := range want {
		if got := rep.Kind("new").Errors[code]; got != count {
			t.Errorf("new errors[%s] = %d, want %d (all: %v)", code, got, count, rep.Kind("new").Errors)
		}
	}
	if msg := rep.Kind("new.reserve").ErrorSamples[idemkv.CodeUnavailable]; !strings.Contains(msg, "no leader") {
		t.Errorf("sample of unavailable: %q, want the store's message", msg)
	}
	if got := rep.Kind("new.commit").Errors[idemkv.CodeFenced]; got != 100 {
		t.Errorf("new.commit fenced = %d, want 100", got)
	}
	if got := rep.Kind("new.reserve").Errors[idemkv.CodeUnavailable]; got != 100 {
		t.Errorf("new.reserve unavailable = %d, want 100", got)
	}
}

func TestRunFailsWhenSetupGetsAnotherDecision(t *testing.T) {
	target := &funcTarget{
		reserve: func(context.Context, *Reserve) (Reservation, error) {
			return Reservation{Decision: idemkv.DecisionInProgress}, nil
		},
		commit: func(context.Context, *Commit) error { return nil },
	}
	_, err := Run(t.Context(), Config{Target: target, Concurrency: 2, Warmup: -1, HotKeys: 2,
		Mix: Mix{InProgress: 1}, Logger: testlog.New(t)})
	if !errors.Is(err, errUnexpected) {
		t.Fatalf("Run = %v, want the unexpected decision of setup", err)
	}
}

func TestRunStopsAtDurationAndWhenCancelled(t *testing.T) {
	slow := &funcTarget{
		reserve: func(ctx context.Context, _ *Reserve) (Reservation, error) {
			select {
			case <-ctx.Done():
				return Reservation{}, idemkv.Errorf(idemkv.ErrUnavailable, "%v", ctx.Err())
			case <-time.After(time.Millisecond):
				return Reservation{Decision: idemkv.DecisionExecute, Fence: 1}, nil
			}
		},
		commit: func(context.Context, *Commit) error { return nil },
	}
	start := time.Now()
	rep, err := Run(t.Context(), Config{Target: slow, Concurrency: 3, Duration: 200 * time.Millisecond,
		Warmup: -1, Mix: Mix{New: 1}, Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 200*time.Millisecond || took > 5*time.Second {
		t.Errorf("run took %v for a 200ms duration", took)
	}
	if rep.Elapsed < 0.2 || rep.Ops == 0 || rep.Errors != 0 {
		t.Errorf("elapsed %.3fs ops %d errors %d: operations cut by the end of the run count as neither", rep.Elapsed, rep.Ops, rep.Errors)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := Run(ctx, Config{Target: slow, Warmup: -1, Mix: Mix{New: 1}}); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a cancelled context = %v, want context.Canceled", err)
	}
}

// syncBuffer is a bytes.Buffer the progress goroutine and the test can share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestRunPrintsProgress(t *testing.T) {
	for _, tty := range []bool{false, true} {
		var out syncBuffer
		store := newMemStore()
		// Workers that wait on the store, as they do on a network, leave the CPU to the
		// progress ticker even on a loaded machine.
		paced := &funcTarget{
			reserve: func(ctx context.Context, r *Reserve) (Reservation, error) {
				time.Sleep(200 * time.Microsecond)
				return store.Reserve(ctx, r)
			},
			commit: store.Commit,
		}
		_, err := Run(t.Context(), Config{Target: paced, Name: "mem", Concurrency: 2,
			Duration: 500 * time.Millisecond, Warmup: 150 * time.Millisecond, Keys: 10, Mix: Mix{New: 1, Replay: 1},
			Progress: &out, ProgressInterval: 50 * time.Millisecond, ProgressTTY: tty, Logger: testlog.New(t)})
		if err != nil {
			t.Fatal(err)
		}
		s := out.String()
		if n := strings.Count(s, "total "); n < 2 {
			t.Errorf("tty=%v: %d progress lines in %q, want at least 2", tty, n, s)
		}
		if !strings.Contains(s, "(warm-up)") {
			t.Errorf("tty=%v: no warm-up line in %q", tty, s)
		}
		if !strings.Contains(s, "mem ") || !strings.Contains(s, "replay ") || strings.Contains(s, "conflict") {
			t.Errorf("tty=%v: progress %q should name the target and only the kinds in the mix", tty, s)
		}
		if tty != strings.Contains(s, "\r\x1b[K") || tty == strings.Contains(s, "\n") {
			t.Errorf("tty=%v: progress %q", tty, s)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []Config{
		{},
		{Target: newMemStore(), Concurrency: -1},
		{Target: newMemStore(), Ops: -1},
		{Target: newMemStore(), Mix: Mix{New: -1, Replay: 2}},
	}
	for _, c := range bad {
		if err := c.Validate(); !errors.Is(err, idemkv.ErrInvalidArgument) {
			t.Errorf("Validate(%+v) = %v, want invalid argument", c, err)
		}
	}
	if err := (Config{Target: newMemStore()}).Validate(); err != nil {
		t.Errorf("defaults do not validate: %v", err)
	}
}
