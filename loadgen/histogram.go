package loadgen

import (
	"math"
	"math/bits"
	"time"
)

// subBits sets the precision of a Histogram: every power-of-two range of values is split
// into 2^subBits equal buckets, so a recorded value is known to within 1/2^subBits of
// itself (0.8%), from nanoseconds to hours, in a few tens of kilobytes.
const (
	subBits  = 7
	subCount = 1 << subBits
)

// Histogram records latencies in log-linear buckets, in the manner of HdrHistogram.
// Values below 2*subCount ns are exact. The zero value is ready to use. A Histogram is
// not safe for concurrent use: each worker records into its own and they are merged.
type Histogram struct {
	counts []uint64 // grown on demand: most runs never see values above a second
	total  uint64
	sum    float64 // nanoseconds, for the mean
	min    int64
	max    int64
}

// bucketOf maps v >= 0 to its bucket. Below 2*subCount the bucket is the value itself;
// above, it keeps the top subBits+1 bits of v and counts how many were shifted out.
func bucketOf(v int64) int {
	u := uint64(v)
	shift := bits.Len64(u) - (subBits + 1)
	if shift < 0 {
		shift = 0
	}
	return shift*subCount + int(u>>uint(shift))
}

// bucketBounds returns the smallest value of bucket i and the bucket's width.
func bucketBounds(i int) (lo, width int64) {
	if i < 2*subCount {
		return int64(i), 1
	}
	shift := i/subCount - 1
	mantissa := int64(i - shift*subCount)
	return mantissa << uint(shift), 1 << uint(shift)
}

// Record adds one observation. Negative durations count as zero.
func (h *Histogram) Record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	i := bucketOf(v)
	if i >= len(h.counts) {
		grown := make([]uint64, i+1+subCount)
		copy(grown, h.counts)
		h.counts = grown
	}
	h.counts[i]++
	if h.total == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.total++
	h.sum += float64(v)
}

// Merge adds every observation of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.total == 0 {
		return
	}
	if len(o.counts) > len(h.counts) {
		grown := make([]uint64, len(o.counts))
		copy(grown, h.counts)
		h.counts = grown
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.total == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.total += o.total
	h.sum += o.sum
}

// Count is the number of observations.
func (h *Histogram) Count() uint64 { return h.total }

// Min and Max are exact.
func (h *Histogram) Min() time.Duration { return time.Duration(h.min) }
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Mean is exact up to float rounding.
func (h *Histogram) Mean() time.Duration {
	if h.total == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.total))
}

// Quantile returns the value below or at which a fraction q of the observations lie:
// the observation of rank ceil(q*n), known to within the bucket precision. It is 0 for
// an empty histogram.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.total)))
	// The extremes are known exactly.
	if rank <= 1 {
		return time.Duration(h.min)
	}
	if rank >= h.total {
		return time.Duration(h.max)
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen < rank {
			continue
		}
		lo, width := bucketBounds(i)
		// The middle of the bucket halves the worst-case error; min and max are exact,
		// so the answer never leaves the range actually observed.
		v := lo + width/2
		v = max(v, h.min)
		v = min(v, h.max)
		return time.Duration(v)
	}
	return time.Duration(h.max)
}

// Summary is a histogram reduced to the figures a report shows, in milliseconds.
type Summary struct {
	Count uint64  `json:"count"`
	Min   float64 `json:"min_ms"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p99_9_ms"`
	Max   float64 `json:"max_ms"`
}

// Summarize reduces h to a Summary.
func (h *Histogram) Summarize() Summary {
	return Summary{
		Count: h.total,
		Min:   ms(h.Min()),
		Mean:  ms(h.Mean()),
		P50:   ms(h.Quantile(0.50)),
		P90:   ms(h.Quantile(0.90)),
		P99:   ms(h.Quantile(0.99)),
		P999:  ms(h.Quantile(0.999)),
		Max:   ms(h.Max()),
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
