package fsm

import (
	"time"
)

// ClockSlew bounds how much faster or slower than real time the state machine clock may
// run while a leader stamps it: a tenth. Its stamps follow its wall clock only within
// that band around the real time its monotonic clock measured since the last
// state-machine time it saw.
//
// The state machine clock is the maximum stamp applied, and Apply must not read a
// clock, so it cannot tell a leader an hour fast from an hour of quiet; the stamping
// node can, with a monotonic clock that wall-clock jumps do not move. Without the
// bound a leader an hour fast expired every live lease at once (handing out recover
// while holders still ran), and once replaced stopped every lease and TTL from
// expiring for an hour, since stamps of a correct clock stayed below the maximum
// (issue 12, defect 5). With it, a wrong clock can make a lease last at most 10%
// shorter or longer in real time, and the state machine clock converges to a correct
// leader's at 10% of the elapsed time (a clock an hour off within ten hours).
const ClockSlew = 0.1

// BoundStamp returns the stamp a node puts on its next command: wall, kept within
// [prev + elapsed·(1−ClockSlew), prev + elapsed·(1+ClockSlew)], where prev is the latest
// state-machine time the node has seen (its own previous stamp, or the clock of an
// entry it applied) and elapsed is what its monotonic clock measured since. clamped
// reports that wall was outside the band. A zero prev (nothing stamped yet) bounds
// nothing.
func BoundStamp(prev time.Time, elapsed time.Duration, wall time.Time) (stamp time.Time, clamped bool) {
	if prev.IsZero() {
		return wall, false
	}
	elapsed = max(elapsed, 0)
	lo := prev.Add(time.Duration(float64(elapsed) * (1 - ClockSlew)))
	hi := prev.Add(time.Duration(float64(elapsed) * (1 + ClockSlew)))
	switch {
	case wall.Before(lo):
		return lo, true
	case wall.After(hi):
		return hi, true
	}
	return wall, false
}
