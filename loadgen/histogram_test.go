package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// reference is the exact quantile of sorted values by the same rank rule as Quantile.
func reference(sorted []time.Duration, q float64) time.Duration {
	rank := int(math.Ceil(q * float64(len(sorted))))
	rank = max(rank, 1)
	return sorted[rank-1]
}

func TestHistogramQuantilesMatchSortedReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	dists := map[string]func() time.Duration{
		// Loopback round trips: tens of microseconds.
		"uniform_us": func() time.Duration { return time.Duration(20_000 + rng.IntN(80_000)) },
		// Latencies with a long tail, from microseconds to seconds.
		"lognormal": func() time.Duration { return time.Duration(math.Exp(rng.NormFloat64()*2 + 13)) },
		// Small exact values, below the first log bucket.
		"tiny": func() time.Duration { return time.Duration(rng.IntN(300)) },
		// Two modes: fsync-bound and cache hits.
		"bimodal": func() time.Duration {
			if rng.IntN(10) == 0 {
				return time.Duration(2_000_000 + rng.IntN(500_000))
			}
			return time.Duration(50_000 + rng.IntN(10_000))
		},
	}
	for name, gen := range dists {
		t.Run(name, func(t *testing.T) {
			var h Histogram
			vals := make([]time.Duration, 50_000)
			for i := range vals {
				vals[i] = gen()
				h.Record(vals[i])
			}
			slices.Sort(vals)
			if h.Count() != uint64(len(vals)) {
				t.Fatalf("count %d, want %d", h.Count(), len(vals))
			}
			if h.Min() != vals[0] || h.Max() != vals[len(vals)-1] {
				t.Fatalf("min/max %v/%v, want %v/%v", h.Min(), h.Max(), vals[0], vals[len(vals)-1])
			}
			for _, q := range []float64{0, 0.001, 0.25, 0.5, 0.9, 0.99, 0.999, 0.9999, 1} {
				got, want := h.Quantile(q), reference(vals, q)
				// A bucket spans at most 1/subCount of its values; answering its middle
				// halves that.
				tol := math.Max(float64(want)/float64(2*subCount), 1)
				if math.Abs(float64(got-want)) > tol {
					t.Errorf("q%.4f: got %v, want %v ± %.0fns", q, got, want, tol)
				}
			}
		})
	}
}

func TestHistogramBucketsCoverEveryValueOnce(t *testing.T) {
	prevHi := int64(-1)
	for i := 0; i < 40*subCount; i++ {
		lo, width := bucketBounds(i)
		if lo != prevHi+1 {
			t.Fatalf("bucket %d starts at %d, previous ended at %d", i, lo, prevHi)
		}
		for _, v := range []int64{lo, lo + width/2, lo + width - 1} {
			if got := bucketOf(v); got != i {
				t.Fatalf("value %d in bucket %d, want %d", v, got, i)
			}
		}
		if i >= 2*subCount && float64(width)/float64(lo) > 1.0/subCount {
			t.Fatalf("bucket %d [%d,+%d) wider than 1/%d of its values", i, lo, width, subCount)
		}
		prevHi = lo + width - 1
	}
}

func TestHistogramMergeEqualsRecordingEverything(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var all, a, b Histogram
	for i := range 20_000 {
		d := time.Duration(rng.Int64N(int64(3 * time.Second)))
		all.Record(d)
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	var merged Histogram
	merged.Merge(&a)
	merged.Merge(&b)
	merged.Merge(&Histogram{})
	if merged.Count() != all.Count() || merged.Min() != all.Min() || merged.Max() != all.Max() {
		t.Fatalf("merged count/min/max %d/%v/%v, want %d/%v/%v", merged.Count(), merged.Min(), merged.Max(),
			all.Count(), all.Min(), all.Max())
	}
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		if merged.Quantile(q) != all.Quantile(q) {
			t.Errorf("q%v: merged %v, recorded %v", q, merged.Quantile(q), all.Quantile(q))
		}
	}
	if d := merged.Mean() - all.Mean(); d < -time.Microsecond || d > time.Microsecond {
		t.Errorf("mean %v, want %v", merged.Mean(), all.Mean())
	}
}

func TestHistogramEdges(t *testing.T) {
	var h Histogram
	if h.Quantile(0.99) != 0 || h.Mean() != 0 || h.Summarize().Count != 0 {
		t.Fatalf("empty histogram: %+v", h.Summarize())
	}
	h.Record(-5)
	h.Record(time.Hour)
	if h.Min() != 0 {
		t.Errorf("negative recorded as %v, want 0", h.Min())
	}
	if h.Quantile(1) != time.Hour {
		t.Errorf("max quantile %v, want 1h (clamped to the exact max)", h.Quantile(1))
	}
	s := h.Summarize()
	if s.Count != 2 || s.Max != float64(time.Hour/time.Millisecond) || s.P50 != 0 {
		t.Errorf("summary %+v", s)
	}
}
