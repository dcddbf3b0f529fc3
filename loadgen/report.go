package loadgen

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// Report is the outcome of one run.
type Report struct {
	Target      string  `json:"target"`
	Concurrency int     `json:"concurrency"`
	Mix         Mix     `json:"mix"`
	Keys        int     `json:"keys"`
	Elapsed     float64 `json:"elapsed_s"`
	// Ops counts agent operations that got the expected answer (a new operation counts
	// once, for its reserve and commit); Errors counts the others.
	Ops        uint64  `json:"ops"`
	Errors     uint64  `json:"errors"`
	Throughput float64 `json:"ops_per_sec"`
	// Kinds holds one entry per kind in the mix, then the two steps of new operations.
	Kinds []KindReport `json:"kinds"`
	// Fsync is the machine's fsync latency, when a probe ran (see ProbeFsync).
	Fsync *Summary `json:"fsync,omitempty"`
}

// KindReport is the throughput and latency of one kind of operation.
type KindReport struct {
	Kind       string            `json:"kind"`
	Ops        uint64            `json:"ops"`
	Throughput float64           `json:"ops_per_sec"`
	Errors     map[string]uint64 `json:"errors,omitempty"`
	// ErrorSamples holds one message for each error code.
	ErrorSamples map[string]string `json:"error_samples,omitempty"`
	Latency      Summary           `json:"latency"`
}

// Kind returns the report of the named kind ("new", "replay", "conflict",
// "in_progress", "new.reserve", "new.commit"), or nil.
func (r *Report) Kind(name string) *KindReport {
	for i := range r.Kinds {
		if r.Kinds[i].Kind == name {
			return &r.Kinds[i]
		}
	}
	return nil
}

func (r *runner) report(workers []*worker, elapsed time.Duration) *Report {
	rep := &Report{Target: r.cfg.Name, Concurrency: r.cfg.Concurrency, Mix: r.cfg.Mix,
		Keys: r.cfg.Keys, Elapsed: elapsed.Seconds()}
	for s := range numStats {
		kind := Kind(s)
		if s >= int(numKinds) {
			kind = KindNew
		}
		if r.cfg.Mix.weight(kind) == 0 {
			continue
		}
		kr := KindReport{Kind: statNames[s]}
		var hist Histogram
		for _, w := range workers {
			st := &w.stats[s]
			hist.Merge(&st.hist)
			for code, n := range st.errors {
				if kr.Errors == nil {
					kr.Errors = make(map[string]uint64)
					kr.ErrorSamples = make(map[string]string)
				}
				kr.Errors[code] += n
				if _, ok := kr.ErrorSamples[code]; !ok {
					kr.ErrorSamples[code] = st.samples[code]
				}
			}
		}
		kr.Ops = hist.Count()
		kr.Throughput = float64(kr.Ops) / elapsed.Seconds()
		kr.Latency = hist.Summarize()
		if s < int(numKinds) {
			rep.Ops += kr.Ops
			for _, n := range kr.Errors {
				rep.Errors += n
			}
		}
		rep.Kinds = append(rep.Kinds, kr)
	}
	rep.Throughput = float64(rep.Ops) / elapsed.Seconds()
	return rep
}

// WriteText prints r as a table for people.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d workers, %.1f s, mix %s, %d keys\n", r.Target, r.Concurrency, r.Elapsed, r.Mix, r.Keys)
	fmt.Fprintf(&b, "%-12s %10s %10s %9s %9s %9s %9s %9s  %s\n", "kind", "ops", "ops/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms", "errors")
	for _, k := range r.Kinds {
		l := k.Latency
		fmt.Fprintf(&b, "%-12s %10d %10.0f %9.3f %9.3f %9.3f %9.3f %9.3f  %s\n", k.Kind, k.Ops, k.Throughput,
			l.P50, l.P90, l.P99, l.P999, l.Max, formatErrors(k.Errors))
	}
	fmt.Fprintf(&b, "%-12s %10d %10.0f  errors %d\n", "total", r.Ops, r.Throughput, r.Errors)
	if r.Fsync != nil {
		fmt.Fprintf(&b, "fsync (append 4 KiB + fdatasync, %d samples): p50 %.3f ms, p99 %.3f ms\n", r.Fsync.Count, r.Fsync.P50, r.Fsync.P99)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func formatErrors(errs map[string]uint64) string {
	if len(errs) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(errs))
	for _, code := range slices.Sorted(maps.Keys(errs)) {
		parts = append(parts, fmt.Sprintf("%s=%d", code, errs[code]))
	}
	return strings.Join(parts, " ")
}

// progress prints a line every interval until the returned function is called; the
// function waits for the last line to be written.
func (r *runner) progress(start time.Time, label string) (stop func()) {
	out := r.cfg.Progress
	if out == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(r.cfg.ProgressInterval)
		defer tick.Stop()
		var last [numKinds]uint64
		lastAt := start
		for {
			select {
			case <-done:
				if r.cfg.ProgressTTY {
					fmt.Fprint(out, "\r\x1b[K")
				}
				return
			case now := <-tick.C:
				fmt.Fprint(out, r.progressLine(label, now.Sub(start), now.Sub(lastAt), &last))
				lastAt = now
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// progressLine formats the rates since the previous line and updates last.
func (r *runner) progressLine(label string, since, interval time.Duration, last *[numKinds]uint64) string {
	var b strings.Builder
	if r.cfg.ProgressTTY {
		b.WriteString("\r\x1b[K")
	}
	fmt.Fprintf(&b, "%s %5.0fs", r.cfg.Name, since.Seconds())
	if label != "" {
		fmt.Fprintf(&b, " (%s)", label)
	}
	var total float64
	for k := range numKinds {
		if r.cfg.Mix.weight(k) == 0 {
			continue
		}
		n := r.done[k].Load()
		rate := float64(n-last[k]) / interval.Seconds()
		last[k] = n
		total += rate
		fmt.Fprintf(&b, "  %s %.0f/s", k, rate)
	}
	fmt.Fprintf(&b, "  total %.0f/s  errors %d", total, r.failed.Load())
	if !r.cfg.ProgressTTY {
		b.WriteByte('\n')
	}
	return b.String()
}
