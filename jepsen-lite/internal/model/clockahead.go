package model

import (
	"fmt"
	"sort"
	"time"

	"github.com/idemkv/idemkv/fsm"
	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

// AnomalyClockAhead: a record the nodes answered carried a stamp further ahead of the
// harness's own wall clock than a correct cluster can stamp.
const AnomalyClockAhead = "clock-ahead"

// clockAheadSlack is what ClockAheadBound allows at the start of the run: the state
// machine clock is the maximum stamp, and a leader whose clock is right stamps no
// later than the moment it stamps, so it starts at most a millisecond (the stamps'
// unit) ahead. The rest absorbs a step of the machine's wall clock during the run:
// the harness turns its monotonic run time into wall time from one reading at the
// start, the nodes read the wall clock each time.
const clockAheadSlack = time.Second

// ClockAheadBound is how far ahead of real time the state machine clock may be at run
// time t. A node stamps at most prev + elapsed·(1+fsm.ClockSlew), prev being a stamp it
// saw and elapsed its monotonic time since it saw it (fsm.BoundStamp); it saw it no
// earlier than it was stamped, so each stamp is at most fsm.ClockSlew·elapsed further
// ahead of real time than the one it grew from. A stamp only gains on real time while
// the leader's clock reads ahead of the state machine's (a nemesis offset it forward),
// and at most by fsm.ClockSlew of the real time: the whole run's, at the most. The
// nodes and the harness read the same machine's clock; the nemeses move the nodes'
// through a test hook, which fsm.BoundStamp must bound.
func ClockAheadBound(t time.Duration) time.Duration {
	return clockAheadSlack + time.Duration(fsm.ClockSlew*float64(max(t, 0)))
}

// AheadAnomaly is a key whose answers showed the state machine clock beyond
// ClockAheadBound: the furthest ahead of them, and how many there were.
type AheadAnomaly struct {
	Key      string
	Op       int64
	Workload string
	// At is the run time of the answer; Stamp its updated_at (Unix milliseconds).
	At    time.Duration
	Stamp int64
	Ahead time.Duration
	Bound time.Duration
	// Answers counts the answers on the key beyond the bound.
	Answers int
}

func (a AheadAnomaly) String() string {
	return fmt.Sprintf("%d answers on the key stamped beyond the bound; the furthest: %s op %d answered at %.3fs with updated_at %d, %s ahead of the harness's clock (bound %s)",
		a.Answers, a.Workload, a.Op, a.At.Seconds(), a.Stamp, a.Ahead.Round(time.Millisecond), a.Bound.Round(time.Millisecond))
}

// CheckClockAhead holds every record stamp the nodes answered to the harness's own
// clock: an answer's updated_at, the state machine time of the record's latest write,
// may be at most ClockAheadBound(t) ahead of the harness's wall clock at t, the moment
// the answer came back (start is the wall time at run time 0). The stamp was made
// before that moment, so the answer's lateness only makes the stamp look less ahead.
// updated_at is the only stamp the history keeps that is not the stamp plus a
// duration: lease_expires_at is a write's stamp plus a lease, and that write is the
// record's latest or an earlier one, so its stamp is no later than updated_at.
//
// The other clock checks compare stamps with stamps (CheckClock, CheckLeases): a
// leader whose clock runs minutes ahead, and stamps as it reads, moves every stamp
// alike and passes them all, while every live lease ends at once.
func CheckClockAhead(ops []history.Op, start time.Time) []AheadAnomaly {
	startMs := start.UnixMilli()
	byKey := map[string]*AheadAnomaly{}
	for i := range ops {
		op := &ops[i]
		if op.Type != history.OK || op.Out == nil || op.Out.Record == nil || op.Out.Record.UpdatedAt == 0 {
			continue
		}
		at := time.Duration(op.Return)
		ahead := time.Duration(op.Out.Record.UpdatedAt-(startMs+at.Milliseconds())) * time.Millisecond
		bound := ClockAheadBound(at)
		if ahead <= bound {
			continue
		}
		a := byKey[op.Key]
		if a == nil {
			a = &AheadAnomaly{Key: op.Key}
			byKey[op.Key] = a
		}
		a.Answers++
		if a.Answers == 1 || ahead-bound > a.Ahead-a.Bound {
			a.Op, a.Workload, a.At, a.Stamp, a.Ahead, a.Bound = op.ID, op.Workload, at, op.Out.Record.UpdatedAt, ahead, bound
		}
	}
	out := make([]AheadAnomaly, 0, len(byKey))
	for _, a := range byKey {
		out = append(out, *a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}
