package fsm

import (
	"testing"
	"time"
)

// TestBoundStamp: a wall clock that jumps forward or back moves stamps at most 10%
// faster or slower than real time; a correct one is followed exactly.
func TestBoundStamp(t *testing.T) {
	prev := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	sec := time.Second
	cases := []struct {
		name    string
		elapsed time.Duration
		wall    time.Time
		want    time.Time
		clamped bool
	}{
		{"correct clock", 10 * sec, prev.Add(10 * sec), prev.Add(10 * sec), false},
		{"correct clock, no time passed", 0, prev, prev, false},
		{"within the band", 10 * sec, prev.Add(10*sec + 500*time.Millisecond), prev.Add(10*sec + 500*time.Millisecond), false},
		// An hour fast: the stamp advances 11 s in 10 s, not an hour.
		{"forward jump", 10 * sec, prev.Add(time.Hour + 10*sec), prev.Add(11 * sec), true},
		// An hour slow (or a correct leader after one an hour fast): the stamp still
		// advances 9 s in 10 s instead of freezing for the hour.
		{"backward jump", 10 * sec, prev.Add(10*sec - time.Hour), prev.Add(9 * sec), true},
		{"backward, no time passed", 0, prev.Add(-time.Hour), prev, true},
		// Quiet for an hour with a correct clock: nothing to clamp.
		{"idle hour", time.Hour, prev.Add(time.Hour), prev.Add(time.Hour), false},
		{"nothing seen yet", 10 * sec, prev, prev, false},
	}
	for _, c := range cases {
		p := prev
		if c.name == "nothing seen yet" {
			p = time.Time{}
		}
		got, clamped := BoundStamp(p, c.elapsed, c.wall)
		if !got.Equal(c.want) || clamped != c.clamped {
			t.Errorf("%s: stamp %s clamped %v, want %s %v", c.name, got.Sub(prev), clamped, c.want.Sub(prev), c.clamped)
		}
	}
}
