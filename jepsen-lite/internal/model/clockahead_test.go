package model

import (
	"testing"
	"time"

	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

func TestClockAheadBound(t *testing.T) {
	for at, want := range map[time.Duration]time.Duration{
		0:                time.Second,
		10 * time.Second: 2 * time.Second,
		time.Minute:      7 * time.Second,
	} {
		if got := ClockAheadBound(at); got != want {
			t.Errorf("ClockAheadBound(%s) = %s, want %s", at, got, want)
		}
	}
}

func TestCheckClockAhead(t *testing.T) {
	start := time.UnixMilli(1_800_000_000_000)
	startMs := start.UnixMilli()
	s := time.Second
	// answer returns at run time at with a record stamped ahead of the harness's clock.
	answer := func(id int64, key string, at, ahead time.Duration) history.Op {
		return history.Op{ID: id, Workload: "lease", F: history.FReserve, Key: key, Type: history.OK, Call: int64(at - 5*time.Millisecond), Return: int64(at),
			Out: &history.Output{Decision: "execute", Record: &history.Record{UpdatedAt: startMs + (at + ahead).Milliseconds()}}}
	}
	cases := []struct {
		name string
		ops  []history.Op
		want map[string]int // key -> answers beyond the bound
	}{
		{"stamps of a right clock", []history.Op{answer(1, "a", s, 0), answer(2, "a", 2*s, -3*time.Millisecond)}, nil},
		{"a stamp behind", []history.Op{answer(1, "a", 5*s, -40*s)}, nil},
		{"within the bound at the start", []history.Op{answer(1, "a", 0, 900*time.Millisecond)}, nil},
		{"beyond it at the start", []history.Op{answer(1, "a", 0, 1200*time.Millisecond)}, map[string]int{"a": 1}},
		// After 10 s of a leader fast by more than that, the state machine clock may
		// be 1 s ahead of where it started from: 2 s with the slack.
		{"a fast leader's bounded stamps", []history.Op{answer(1, "a", 10*s, 1900*time.Millisecond)}, nil},
		{"a fast leader's unbounded stamps", []history.Op{answer(1, "a", 10*s, 2200*time.Millisecond)}, map[string]int{"a": 1}},
		// The audit's run: a clock jump of 240 s taken whole.
		{"a clock jump taken whole", []history.Op{answer(1, "a", 1120*time.Millisecond, 240*s), answer(2, "a", 1190*time.Millisecond, 240*s),
			answer(3, "b", 3*s, 210*s), answer(4, "b", 29*s, 0)}, map[string]int{"a": 2, "b": 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := CheckClockAhead(c.ops, start)
			if len(got) != len(c.want) {
				t.Fatalf("anomalies %+v, want %v", got, c.want)
			}
			for _, a := range got {
				if c.want[a.Key] != a.Answers {
					t.Fatalf("key %s: %d answers, want %d (%s)", a.Key, a.Answers, c.want[a.Key], a)
				}
			}
		})
	}
	// What is not an answer is not judged: an unknown outcome, a failure, a stamp of 0.
	info := answer(1, "a", s, time.Hour)
	info.Type = history.Info
	fail := answer(2, "a", s, time.Hour)
	fail.Type = history.Fail
	zero := answer(3, "a", s, 0)
	zero.Out.Record.UpdatedAt = 0
	if got := CheckClockAhead([]history.Op{info, fail, zero}, start); len(got) != 0 {
		t.Fatalf("anomalies %+v from no answer", got)
	}
	// The furthest beyond its bound is the one reported.
	got := CheckClockAhead([]history.Op{answer(1, "a", s, 5*s), answer(2, "a", 2*s, 300*s), answer(3, "a", 3*s, 10*s)}, start)
	if len(got) != 1 || got[0].Op != 2 || got[0].Answers != 3 || got[0].Ahead != 300*s {
		t.Fatalf("got %+v, want op 2 of 3, 300 s ahead", got)
	}
}
