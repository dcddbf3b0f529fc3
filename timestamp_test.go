package idemkv

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// formatted is what TimeFormat says a Timestamp is, by the standard library's hand.
func formatted(ts Timestamp) string { return ts.Time().Format(TimeFormat) }

// TestTimestampTextIsTimeFormat: the hand-written formatting writes exactly what
// time.Format writes with TimeFormat, at the edges of its range (years 0 and 9999,
// the first and last millisecond of a day, leap days), beyond them (negative and
// five-digit years, which fall back to AppendFormat), at the int64 extremes and at
// random instants.
func TestTimestampTextIsTimeFormat(t *testing.T) {
	const (
		year0    = Timestamp(-62167219200000) // 0000-01-01T00:00:00.000Z
		year10k  = Timestamp(253402300800000) // 10000-01-01T00:00:00.000Z
		leap2024 = Timestamp(1709164800000)   // 2024-02-29T00:00:00.000Z
	)
	cases := []Timestamp{
		0, 1, 999, 1000, -1, -1000, 1764633600123, 1767225599999, 1767225600000,
		leap2024, leap2024 - 1, leap2024 + 86399999,
		year0, year0 - 1, year0 + 1, year10k, year10k - 1, year10k + 1,
		math.MaxInt64, math.MinInt64, math.MaxInt64 / 2, math.MinInt64 / 2,
	}
	r := rand.New(rand.NewPCG(1, 27))
	for range 20000 {
		cases = append(cases, Timestamp(r.Int64N(int64(year10k-year0)+int64(1e12))+int64(year0)-5e11))
	}
	for _, ts := range cases {
		if got, want := ts.String(), formatted(ts); got != want {
			t.Fatalf("Timestamp(%d).String() = %q, time.Format says %q", int64(ts), got, want)
		}
		b, err := json.Marshal(ts)
		if err != nil {
			t.Fatal(err)
		}
		if want := `"` + formatted(ts) + `"`; string(b) != want {
			t.Fatalf("json.Marshal(Timestamp(%d)) = %s, want %s", int64(ts), b, want)
		}
	}
}

// TestTimestampJSON: a Timestamp travels as the quoted text, is left out when zero
// under omitempty, reads back to the same millisecond, and refuses a number.
func TestTimestampJSON(t *testing.T) {
	type doc struct {
		At    Timestamp `json:"at"`
		Maybe Timestamp `json:"maybe,omitempty"`
	}
	b, err := json.Marshal(doc{At: 1764633600123})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"at":"2025-12-02T00:00:00.123Z"}`; string(b) != want {
		t.Fatalf("json.Marshal = %s, want %s", b, want)
	}
	var back doc
	if err := json.Unmarshal([]byte(`{"at":"2025-12-02T00:00:00.123Z","maybe":"2025-12-02T01:00:00.5+01:00"}`), &back); err != nil {
		t.Fatal(err)
	}
	if back.At != 1764633600123 || back.Maybe != 1764633600500 {
		t.Fatalf("read back %+v", back)
	}
	if err := json.Unmarshal([]byte(`{"at":1764633600123}`), &back); err == nil || !strings.Contains(err.Error(), "RFC 3339 string") {
		t.Fatalf("a number as a timestamp: %v, want refused as not an RFC 3339 string", err)
	}
}

func FuzzTimestampText(f *testing.F) {
	f.Add(int64(0))
	f.Add(int64(1764633600123))
	f.Add(int64(-62167219200001))
	f.Fuzz(func(t *testing.T, ms int64) {
		ts := Timestamp(ms)
		if got, want := ts.String(), formatted(ts); got != want {
			t.Fatalf("Timestamp(%d).String() = %q, time.Format says %q", ms, got, want)
		}
	})
}
