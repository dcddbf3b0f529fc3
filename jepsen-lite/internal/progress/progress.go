// Package progress judges whether a jepsen-lite run made progress. A history with no
// anomaly proves nothing if the cluster did nothing: a build whose every write failed
// would pass every safety checker. So the verdict also requires, from the history
// alone:
//
//   - acknowledged writes in every phase without a fault (no-progress otherwise), and
//   - after each fault heals, write throughput back to a quarter of the baseline
//     within the recovery limit (slow-recovery otherwise).
//
// The baseline for a fault is the median of acknowledged writes per second over the
// whole seconds without a fault before it heals, which is what the nemesis can see
// when it waits for recovery (see Recovered), so the wait and the verdict agree.
package progress

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
	"github.com/idemkv/idemkv/jepsen-lite/internal/nemesis"
)

// Anomaly kinds.
const (
	// AnomalyNoProgress: a phase without a fault acknowledged no write.
	AnomalyNoProgress = "no-progress"
	// AnomalySlowRecovery: write throughput did not come back within the limit after
	// a fault healed.
	AnomalySlowRecovery = "slow-recovery"
)

// Config states what recovery means.
type Config struct {
	// Limit is how long after a heal throughput must be back.
	Limit time.Duration
	// Threshold is the fraction of the baseline one second must reach.
	Threshold float64
}

// DefaultConfig: a quarter of the baseline within 15 s. Elections take about a second
// here (500 ms timeouts), a node restart a second or two, and clients back off for up
// to a second; 15 s leaves room for a loaded machine.
func DefaultConfig() Config { return Config{Limit: 15 * time.Second, Threshold: 0.25} }

// Window is one phase of the run: a fault (or faults that overlapped) or the quiet
// time between faults.
type Window struct {
	// Faults names the fault kinds in force; empty for a quiet window.
	Faults []string `json:"faults"`
	Start  float64  `json:"start_s"`
	End    float64  `json:"end_s"`
	// Writes attempted and acknowledged in the window (by completion time).
	Writes int `json:"writes"`
	Acked  int `json:"acked"`
	// Availability is Acked / Writes; null when no write completed in the window.
	Availability *float64 `json:"availability"`
	// Rate is acknowledged writes per second; Relative is Rate over the baseline.
	Rate     float64  `json:"acked_per_s"`
	Relative *float64 `json:"relative_to_baseline,omitempty"`
	// For a fault window: the baseline it was judged against, and how long after the
	// heal throughput came back (null when it did not, or could not be judged).
	Baseline    float64  `json:"baseline_per_s,omitempty"`
	RecoveredIn *float64 `json:"recovered_in_s,omitempty"`
	// Judged says why a window was not judged ("" when it was).
	NotJudged string `json:"not_judged,omitempty"`
}

// Anomaly is a phase without progress.
type Anomaly struct {
	Kind   string `json:"kind"`
	Detail string `json:"detail"`
}

// Result is the progress verdict.
type Result struct {
	Limit     float64   `json:"recovery_limit_s"`
	Threshold float64   `json:"threshold"`
	Windows   []Window  `json:"windows"`
	Anomalies []Anomaly `json:"anomalies"`
}

// group is a set of faults whose windows overlap.
type group struct {
	start, end int64
	kinds      []string
}

func groups(faults []nemesis.Fault) []group {
	fs := append([]nemesis.Fault(nil), faults...)
	sort.Slice(fs, func(i, j int) bool { return fs[i].Start < fs[j].Start })
	var out []group
	for _, f := range fs {
		end := max(f.End, f.Start)
		if n := len(out); n > 0 && f.Start <= out[n-1].end {
			out[n-1].end = max(out[n-1].end, end)
			out[n-1].kinds = append(out[n-1].kinds, f.Kind)
			continue
		}
		out = append(out, group{start: f.Start, end: end, kinds: []string{f.Kind}})
	}
	return out
}

// quietSecond reports whether second s of the run overlaps no fault window.
func quietSecond(gs []group, s int) bool {
	lo, hi := int64(s)*int64(time.Second), int64(s+1)*int64(time.Second)
	for _, g := range gs {
		if g.start < hi && g.end > lo {
			return false
		}
	}
	return true
}

// Baseline is the median of acknowledged writes per second over the whole seconds
// before `before` (nanoseconds into the run) that overlap no fault.
func Baseline(acked []int, faults []nemesis.Fault, before int64) float64 {
	gs := groups(faults)
	var xs []int
	for s := range acked {
		if int64(s+1)*int64(time.Second) > before {
			break
		}
		if quietSecond(gs, s) {
			xs = append(xs, acked[s])
		}
	}
	if len(xs) == 0 {
		return 0
	}
	sort.Ints(xs)
	if len(xs)%2 == 1 {
		return float64(xs[len(xs)/2])
	}
	return float64(xs[len(xs)/2-1]+xs[len(xs)/2]) / 2
}

// Recovered looks for the first whole second starting at or after heal in which the
// acknowledged writes reach the threshold of the baseline (at least one write). It
// returns how long after heal that second ended, and decided = true once it found one
// or the series covers the whole limit without one.
func Recovered(acked []int, faults []nemesis.Fault, heal int64, cfg Config) (after time.Duration, ok, decided bool) {
	need := max(1, int(math.Ceil(cfg.Threshold*Baseline(acked, faults, heal))))
	sec := int64(time.Second)
	for s := int((heal + sec - 1) / sec); ; s++ {
		end := time.Duration(int64(s+1)*sec - heal)
		if end > cfg.Limit {
			return 0, false, true
		}
		// The last entry of a live series is the second still running.
		if s >= len(acked)-1 {
			return 0, false, false
		}
		if acked[s] >= need {
			return end, true, true
		}
	}
}

// Check judges the progress of a run that lasted `end` nanoseconds (the workload's
// time; the final reads are not part of it).
func Check(ops []history.Op, faults []nemesis.Fault, end int64, cfg Config) Result {
	n := int((end + int64(time.Second) - 1) / int64(time.Second))
	acked := history.AckedPerSecond(ops, n+1)
	gs := groups(faults)
	res := Result{Limit: cfg.Limit.Seconds(), Threshold: cfg.Threshold, Windows: []Window{}, Anomalies: []Anomaly{}}

	// Phases in order: quiet, fault group, quiet, ..., quiet.
	type phase struct {
		start, end int64
		g          *group
		afterFault bool
	}
	var phases []phase
	at := int64(0)
	for i := range gs {
		g := &gs[i]
		if g.start > at {
			phases = append(phases, phase{start: at, end: min(g.start, end), afterFault: i > 0})
		}
		phases = append(phases, phase{start: g.start, end: g.end, g: g})
		at = max(at, g.end)
	}
	if at < end {
		phases = append(phases, phase{start: at, end: end, afterFault: len(gs) > 0})
	}

	writes := make([]int, len(phases))
	acks := make([]int, len(phases))
	for i := range ops {
		op := &ops[i]
		if !op.Write() || op.Type == history.Invoke {
			continue
		}
		for p := range phases {
			if op.Return >= phases[p].start && (op.Return < phases[p].end || p == len(phases)-1 && op.Return <= end) {
				writes[p]++
				if op.AckedWrite() {
					acks[p]++
				}
				break
			}
		}
	}
	secs := func(ns int64) float64 { return float64(ns) / 1e9 }
	// recoveredAt is when throughput was back after the last fault (0: not yet known).
	var recoveredAt int64
	for p, ph := range phases {
		w := Window{Faults: []string{}, Start: secs(ph.start), End: secs(ph.end), Writes: writes[p], Acked: acks[p]}
		if d := secs(ph.end - ph.start); d > 0 {
			w.Rate = float64(acks[p]) / d
		}
		if writes[p] > 0 {
			a := float64(acks[p]) / float64(writes[p])
			w.Availability = &a
		}
		if ph.g == nil {
			// A quiet window right after a fault starts with the recovery, which the
			// fault's own verdict judges; from the moment throughput was back (or the
			// recovery limit, if it never was) it must show progress.
			from := ph.start
			if ph.afterFault {
				from += int64(cfg.Limit)
				if recoveredAt > 0 {
					from = max(ph.start, recoveredAt)
				}
			}
			if ph.end-from < int64(time.Second) {
				w.NotJudged = "shorter than a second past the recovery"
			} else if countAcked(ops, from, ph.end) == 0 {
				res.Anomalies = append(res.Anomalies, Anomaly{Kind: AnomalyNoProgress,
					Detail: fmt.Sprintf("no acknowledged write from %.1f s to %.1f s without a fault (%d writes attempted)",
						secs(from), secs(ph.end), writes[p])})
			}
			res.Windows = append(res.Windows, w)
			continue
		}
		w.Faults = ph.g.kinds
		w.Baseline = Baseline(acked, faults, ph.g.end)
		if w.Baseline > 0 {
			rel := w.Rate / w.Baseline
			w.Relative = &rel
		}
		recoveredAt = 0
		switch after, ok, _ := Recovered(acked, faults, ph.g.end, cfg); {
		case ok:
			s := after.Seconds()
			w.RecoveredIn = &s
			recoveredAt = ph.g.end + int64(after)
		case ph.g.end+int64(cfg.Limit) > end:
			w.NotJudged = "the run ended within the recovery limit"
		case p+1 < len(phases) && phases[p+1].g != nil || p+2 < len(phases) && phases[p+2].start < ph.g.end+int64(cfg.Limit):
			w.NotJudged = "the next fault began within the recovery limit"
		default:
			res.Anomalies = append(res.Anomalies, Anomaly{Kind: AnomalySlowRecovery,
				Detail: fmt.Sprintf("%v healed at %.1f s; no second within %s reached %.0f%% of the baseline %.1f acknowledged writes/s",
					ph.g.kinds, secs(ph.g.end), cfg.Limit, 100*cfg.Threshold, w.Baseline)})
		}
		res.Windows = append(res.Windows, w)
	}
	return res
}

func countAcked(ops []history.Op, from, to int64) int {
	n := 0
	for i := range ops {
		if ops[i].AckedWrite() && ops[i].Return >= from && ops[i].Return < to {
			n++
		}
	}
	return n
}
