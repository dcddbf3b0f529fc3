package workload

import (
	"fmt"
	"sort"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

// AnomalyLeaseCutShort: an attempt was granted a key, by execute or recover, before
// the lease of the holder before it could have run out in real time, and that holder
// had sent nothing that could end its lease. CheckLeases judges leases by the times
// the state machine stamped, which a leader whose clock runs ahead moves forward for
// everyone: every stamp agrees with every other and the lease still ends while its
// holder runs (issue 12, defect 5). This check holds the stamps to the harness's own
// clock.
const AnomalyLeaseCutShort = "lease-cut-short"

// realTimeSlack absorbs the millisecond rounding of stamps and the difference between
// the nodes' wall clock and the harness's monotonic one; a lease cut short by more
// than this and the slew below was cut short.
const realTimeSlack = 50 * time.Millisecond

// leaseSpan is one acknowledged grant or heartbeat of a fence: the state machine
// clock, when it stamped the answer (no earlier than call), was dur before the lease's
// end.
type leaseSpan struct {
	call, ret int64
	dur       time.Duration
	op        int64
}

// CheckLeasesRealTime finds every grant of the short-lease workload, execute or
// recover, that came back before the previous holder's lease could have ended in
// real time. The previous holder is the greatest fence below the grant's that an
// answer showed: fences are Raft indexes, so its grant and every heartbeat of it that
// was answered applied before this grant, whatever the order of the answers. This
// grant needed the state machine clock past that lease's end (recover: the lease ran
// out; execute: the record expired, and a pending record outlives its lease), so the
// clock advanced at least dur from a stamp made after the span's request was sent to
// one made before this grant's answer came back. It advances at most (1+fsm.ClockSlew)
// times as fast as real time (fsm.BoundStamp), so a correct cluster cannot grant
// sooner than s.call + dur/(1+ClockSlew): a lease lasts at most a tenth shorter in
// real time. An attempt granted in between whose answer was lost changes nothing: it
// too had to wait for the lease.
// An end (commit, fail, release) the holder sent before this grant came back, unless
// it was refused, may have ended the lease early, and excuses it.
func CheckLeasesRealTime(ops []history.Op) []AgentAnomaly {
	type keyFence struct {
		key   string
		fence uint64
	}
	spans := map[keyFence][]leaseSpan{}
	ends := map[keyFence][]int64{}
	fences := map[string][]uint64{}
	var grants []*history.Op
	for i := range ops {
		op := &ops[i]
		if op.Workload != "lease" {
			continue
		}
		switch op.F {
		case history.FCommit, history.FFail, history.FRelease:
			// An end refused (fenced, not_found) certainly ended nothing: a holder
			// whose lease was cut short learns it so.
			if op.Type != history.Fail && (op.Type != history.OK || op.Out == nil || op.Out.Err == "") {
				kf := keyFence{op.Key, op.In.Fence}
				ends[kf] = append(ends[kf], op.Call)
			}
			continue
		}
		if op.Type != history.OK || op.Out == nil || op.Out.Err != "" || op.Out.Record == nil {
			continue
		}
		rec := op.Out.Record
		var fence uint64
		switch {
		case op.F == history.FReserve && (op.Out.Decision == string(idemkv.DecisionExecute) || op.Out.Decision == string(idemkv.DecisionRecover)):
			fence = op.Out.Grant
			grants = append(grants, op)
		case op.F == history.FHeartbeat && rec.Fence == op.In.Fence:
			fence = rec.Fence
		default:
			continue
		}
		if rec.LeaseExpiresAt <= rec.UpdatedAt {
			continue
		}
		kf := keyFence{op.Key, fence}
		if len(spans[kf]) == 0 {
			fences[op.Key] = append(fences[op.Key], fence)
		}
		spans[kf] = append(spans[kf], leaseSpan{call: op.Call, ret: op.Return,
			dur: time.Duration(rec.LeaseExpiresAt-rec.UpdatedAt) * time.Millisecond, op: op.ID})
	}
	for _, list := range fences {
		sort.Slice(list, func(i, j int) bool { return list[i] < list[j] })
	}
	var out []AgentAnomaly
	for _, b := range grants {
		var prev uint64
		for _, f := range fences[b.Key] {
			if f < b.Out.Grant {
				prev = f
			}
		}
		if prev == 0 {
			continue
		}
		kf := keyFence{b.Key, prev}
		ended := false
		for _, e := range ends[kf] {
			ended = ended || e < b.Return
		}
		if ended {
			continue
		}
		for _, s := range spans[kf] {
			elapsed := time.Duration(b.Return - s.call)
			short := time.Duration(s.call) + s.dur - time.Duration(b.Return)
			if short > realTimeSlack+time.Duration(fsm.ClockSlew*float64(max(elapsed, 0))) {
				out = append(out, AgentAnomaly{Kind: AnomalyLeaseCutShort, Key: b.Key,
					Detail: fmt.Sprintf("op %d was granted %s (fence %d) at %.3fs, %s before the %s lease of fence %d, asked for by op %d at %.3fs, could end (a tenth of %s allowed for clock slew)",
						b.ID, b.Out.Decision, b.Out.Grant, time.Duration(b.Return).Seconds(), short.Round(time.Millisecond), s.dur, prev, s.op,
						time.Duration(s.call).Seconds(), elapsed.Round(time.Millisecond))})
				break
			}
		}
	}
	return out
}
