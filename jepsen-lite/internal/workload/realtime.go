package workload

import (
	"fmt"
	"sort"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

// AnomalyLeaseCutShort: an attempt was granted recover on a key before the lease of
// the holder it recovered from could have run out in real time. CheckLeases judges
// leases by the times the state machine stamped, which a leader whose clock runs
// ahead moves forward for everyone: every stamp agrees with every other and the
// lease still ends while its holder runs (issue 12, defect 5). This check holds the
// stamps to the harness's own clock.
const AnomalyLeaseCutShort = "lease-cut-short"

// realTimeSlack absorbs the millisecond rounding of stamps and the difference between
// the nodes' wall clock and the harness's monotonic one; a lease cut short by more
// than this was cut short.
const realTimeSlack = 50 * time.Millisecond

// leaseSpan is one acknowledged grant or heartbeat of a fence: the holder's lease
// lasts at least from the moment it asked (Call) for the duration the answer names.
type leaseSpan struct {
	call, ret int64
	dur       time.Duration
	op        int64
}

// CheckLeasesRealTime finds every recover of the short-lease workload that came back
// before the previous holder's lease could have ended in real time. With clocks in
// step no correct node can do that: a grant is stamped no earlier than its request
// was sent, so its lease_expires_at is at least that moment plus the lease, and a
// recover needs the state machine's clock, no later than the moment the recover
// answer came back, past it.
func CheckLeasesRealTime(ops []history.Op) []AgentAnomaly {
	type keyFence struct {
		key   string
		fence uint64
	}
	spans := map[keyFence][]leaseSpan{}
	ends := map[keyFence][]int64{}
	fences := map[string][]uint64{}
	var recovers []*history.Op
	for i := range ops {
		op := &ops[i]
		if op.Workload != "lease" {
			continue
		}
		switch op.F {
		case history.FCommit, history.FFail, history.FRelease:
			if op.Type != history.Fail {
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
			if op.Out.Decision == string(idemkv.DecisionRecover) {
				recovers = append(recovers, op)
			}
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
	var out []AgentAnomaly
	for _, b := range recovers {
		// The holder recovered from is the greatest fence below b's that was granted.
		list := fences[b.Key]
		sort.Slice(list, func(i, j int) bool { return list[i] < list[j] })
		var prev uint64
		for _, f := range list {
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
			// Only leases known before b was asked for count.
			if s.ret >= b.Call {
				continue
			}
			until := s.call + int64(s.dur)
			if short := time.Duration(until - b.Return); short > realTimeSlack {
				out = append(out, AgentAnomaly{Kind: AnomalyLeaseCutShort, Key: b.Key,
					Detail: fmt.Sprintf("op %d recovered fence %d at %.3fs, %s before the %s lease op %d granted fence %d at %.3fs could end",
						b.ID, prev, time.Duration(b.Return).Seconds(), short.Round(time.Millisecond), s.dur, s.op, prev,
						time.Duration(s.call).Seconds())})
				break
			}
		}
	}
	return out
}
