package fingerprint

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"
)

type vector struct {
	Name        string   `json:"name"`
	Input       string   `json:"input"`
	InputHex    string   `json:"input_hex"`
	Drop        []string `json:"drop"`
	Canonical   *string  `json:"canonical"`
	Fingerprint string   `json:"fingerprint"`
	Invalid     bool     `json:"invalid"`
	// InexactNumber marks an input refused for a number a double does not keep.
	InexactNumber bool `json:"inexact_number"`
}

func loadVectors(t *testing.T) []vector {
	t.Helper()
	data, err := os.ReadFile("../testdata/fingerprint/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Vectors []vector `json:"vectors"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Vectors) < 50 {
		t.Fatalf("only %d vectors loaded", len(doc.Vectors))
	}
	return doc.Vectors
}

func (v vector) input(t *testing.T) []byte {
	if v.InputHex != "" {
		b, err := hex.DecodeString(v.InputHex)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return []byte(v.Input)
}

func TestVectors(t *testing.T) {
	for _, v := range loadVectors(t) {
		t.Run(v.Name, func(t *testing.T) {
			in := v.input(t)
			got, err := CanonicalizeWithout(in, v.Drop...)
			if v.Invalid {
				if err == nil {
					t.Fatalf("accepted invalid input %q as %q", in, got)
				}
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("error %v does not wrap ErrInvalid", err)
				}
				if _, err := Of(in); !errors.Is(err, ErrInvalid) {
					t.Fatalf("Of: error %v does not wrap ErrInvalid", err)
				}
				if said := strings.Contains(err.Error(), "send it as a string"); said != v.InexactNumber {
					t.Fatalf("inexact_number %v, but the error says %q", v.InexactNumber, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("canonicalize %q: %v", in, err)
			}
			if v.Canonical == nil {
				t.Fatal("vector has neither canonical nor invalid")
			}
			if string(got) != *v.Canonical {
				t.Fatalf("canonical\n got %s\nwant %s", got, *v.Canonical)
			}
			// The vector's fingerprint must be plain SHA-256 of the canonical bytes,
			// so that the file stands on its own for other languages.
			h := sha256.Sum256([]byte(*v.Canonical))
			if want := "sha256:" + hex.EncodeToString(h[:]); v.Fingerprint != want {
				t.Fatalf("vector fingerprint %s, sha256 of its canonical bytes is %s", v.Fingerprint, want)
			}
			if fp := Sum(got); fp != v.Fingerprint {
				t.Fatalf("fingerprint %s, want %s", fp, v.Fingerprint)
			}
			if len(v.Drop) == 0 {
				fp, err := Of(in)
				if err != nil || fp != v.Fingerprint {
					t.Fatalf("Of = %s, %v; want %s", fp, err, v.Fingerprint)
				}
			}
		})
	}
}

// The number table of RFC 8785 appendix B, by IEEE 754 bit pattern.
func TestFormatNumberRFC8785AppendixB(t *testing.T) {
	cases := []struct {
		bits uint64
		want string
	}{
		{0x0000000000000000, "0"},
		{0x8000000000000000, "0"},
		{0x0000000000000001, "5e-324"},
		{0x8000000000000001, "-5e-324"},
		{0x7fefffffffffffff, "1.7976931348623157e+308"},
		{0xffefffffffffffff, "-1.7976931348623157e+308"},
		{0x4340000000000000, "9007199254740992"},
		{0xc340000000000000, "-9007199254740992"},
		{0x4430000000000000, "295147905179352830000"},
		{0x44b52d02c7e14af5, "9.999999999999997e+22"},
		{0x44b52d02c7e14af6, "1e+23"},
		{0x44b52d02c7e14af7, "1.0000000000000001e+23"},
		{0x444b1ae4d6e2ef4e, "999999999999999700000"},
		{0x444b1ae4d6e2ef4f, "999999999999999900000"},
		{0x444b1ae4d6e2ef50, "1e+21"},
		{0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
		{0x3eb0c6f7a0b5ed8d, "0.000001"},
		{0x41b3de4355555553, "333333333.3333332"},
		{0x41b3de4355555554, "333333333.33333325"},
		{0x41b3de4355555555, "333333333.3333333"},
		{0x41b3de4355555556, "333333333.3333334"},
		{0x41b3de4355555557, "333333333.33333343"},
		{0xbecbf647612f3696, "-0.0000033333333333333333"},
		{0x43143ff3c1cb0959, "1424953923781206.2"},
	}
	for _, c := range cases {
		if got := formatNumber(math.Float64frombits(c.bits)); got != c.want {
			t.Errorf("%#016x: got %s, want %s", c.bits, got, c.want)
		}
	}
}

// encoding/json formats float64 "as if by ES6 number to string conversion" (except
// that it keeps the sign of -0), which makes it an independent oracle for random
// bit patterns; ParseFloat proves every output round-trips.
func TestFormatNumberRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200000; i++ {
		f := math.Float64frombits(r.Uint64())
		if math.IsNaN(f) || math.IsInf(f, 0) || f == 0 {
			continue
		}
		got := formatNumber(f)
		want, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		if got != string(want) {
			t.Fatalf("%v (%#016x): got %s, encoding/json %s", f, math.Float64bits(f), got, want)
		}
		back, err := parse([]byte(got))
		if err != nil || back.text != got {
			t.Fatalf("%s does not re-canonicalize to itself: %v", got, err)
		}
	}
}

func TestSortUTF16AgainstEncode(t *testing.T) {
	alphabet := []rune{'a', 'b', 'Z', 0x7f, 0xe9, 0x20ac, 0xd7ff, 0xe000, 0xfb33, 0xffff, 0x10000, 0x1f600, 0x10ffff}
	r := rand.New(rand.NewPCG(3, 4))
	randString := func() string {
		rs := make([]rune, r.IntN(4))
		for i := range rs {
			rs[i] = alphabet[r.IntN(len(alphabet))]
		}
		return string(rs)
	}
	for i := 0; i < 20000; i++ {
		a, b := randString(), randString()
		want := slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
		got := compareUTF16(a, b)
		if sign(got) != want {
			t.Fatalf("compare(%q, %q) = %d, UTF-16 order says %d", a, b, got, want)
		}
	}
}

func sign(n int) int {
	switch {
	case n < 0:
		return -1
	case n > 0:
		return 1
	}
	return 0
}

func TestOfValueDropsVolatileFields(t *testing.T) {
	type meta struct {
		TraceID     string `json:"trace_id"`
		RequestedAt string `json:"requested_at"`
		Source      string `json:"source"`
	}
	type ticket struct {
		Tenant   string `json:"tenant"`
		Title    string `json:"title"`
		Severity string `json:"severity"`
		Customer int64  `json:"customer_id"`
		Wording  string `json:"model_wording"`
		Meta     meta   `json:"meta"`
	}
	a := ticket{"t42", "Outage <X>", "sev1", 9, "I will create the ticket now.", meta{"abc", "13:00", "pager"}}
	b := a
	b.Wording = "Creating it."
	b.Meta.TraceID, b.Meta.RequestedAt = "def", "13:05"
	drop := []string{"model_wording", "meta.trace_id", "meta.requested_at"}

	fa, err := OfValue(a, drop...)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := OfValue(b, drop...)
	if err != nil {
		t.Fatal(err)
	}
	if fa != fb {
		t.Fatalf("volatile fields changed the fingerprint: %s vs %s", fa, fb)
	}
	want, err := Of([]byte(`{"meta":{"source":"pager"},"customer_id":9,"severity":"sev1","title":"Outage <X>","tenant":"t42"}`))
	if err != nil {
		t.Fatal(err)
	}
	if fa != want {
		t.Fatalf("OfValue = %s, the same effect as JSON gives %s", fa, want)
	}
	c := a
	c.Severity = "sev2"
	if fc, _ := OfValue(c, drop...); fc == fa {
		t.Fatal("a business field did not change the fingerprint")
	}
	if full, _ := OfValue(a); full == fa {
		t.Fatal("dropping fields did not change the fingerprint")
	}
	if !strings.HasPrefix(fa, Prefix) || len(fa) != len(Prefix)+64 {
		t.Fatalf("malformed fingerprint %q", fa)
	}
}

func TestOfValueErrors(t *testing.T) {
	if _, err := OfValue(map[string]any{"a": 1}, "a..b"); !errors.Is(err, ErrBadPath) {
		t.Fatalf("empty path segment: %v", err)
	}
	if _, err := OfValue(map[string]any{"a": 1}, ""); !errors.Is(err, ErrBadPath) {
		t.Fatalf("empty path: %v", err)
	}
	if _, err := OfValue(make(chan int)); err == nil || errors.Is(err, ErrInvalid) {
		t.Fatalf("unmarshalable value: %v", err)
	}
}

func TestDropWildcards(t *testing.T) {
	in := []byte(`{"a":{"x":1,"y":{"ts":2,"k":3}},"b":{"ts":4},"list":[{"ts":5},7,[{"ts":6}]],"ts":8}`)
	cases := []struct {
		drop []string
		want string
	}{
		{[]string{"*.ts"}, `{"a":{"x":1,"y":{"k":3,"ts":2}},"b":{},"list":[{"ts":5},7,[{"ts":6}]],"ts":8}`},
		{[]string{"a.*.ts"}, `{"a":{"x":1,"y":{"k":3}},"b":{"ts":4},"list":[{"ts":5},7,[{"ts":6}]],"ts":8}`},
		{[]string{"list.*.ts"}, `{"a":{"x":1,"y":{"k":3,"ts":2}},"b":{"ts":4},"list":[{},7,[{"ts":6}]],"ts":8}`},
		{[]string{"list.*"}, `{"a":{"x":1,"y":{"k":3,"ts":2}},"b":{"ts":4},"list":[],"ts":8}`},
		{[]string{"*"}, `{}`},
		{[]string{"list.ts"}, `{"a":{"x":1,"y":{"k":3,"ts":2}},"b":{"ts":4},"list":[{"ts":5},7,[{"ts":6}]],"ts":8}`},
	}
	for _, c := range cases {
		got, err := CanonicalizeWithout(in, c.drop...)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != c.want {
			t.Errorf("drop %v:\n got %s\nwant %s", c.drop, got, c.want)
		}
	}
	// Dropping must not change the caller's data.
	if orig, _ := Canonicalize(in); !bytes.Contains(orig, []byte(`"ts":8`)) {
		t.Fatal("input was modified")
	}
}

func TestDepthLimit(t *testing.T) {
	nest := func(n int) []byte {
		return []byte(strings.Repeat("[", n) + strings.Repeat("]", n))
	}
	if _, err := Canonicalize(nest(MaxDepth)); err != nil {
		t.Fatalf("depth %d: %v", MaxDepth, err)
	}
	_, err := Canonicalize(nest(MaxDepth + 1))
	var se *SyntaxError
	if !errors.As(err, &se) || se.Offset != MaxDepth {
		t.Fatalf("depth %d: %v", MaxDepth+1, err)
	}
}

func TestSyntaxErrorOffset(t *testing.T) {
	_, err := Canonicalize([]byte(`{"a":1,"b":"\ud800"}`))
	var se *SyntaxError
	if !errors.As(err, &se) {
		t.Fatalf("got %v", err)
	}
	if se.Offset != 12 {
		t.Fatalf("offset %d, want 12 (the escape)", se.Offset)
	}
}

// FuzzCanonicalize checks what must hold for any input: canonical output is valid
// JSON, canonicalizing it again changes nothing, it means what the input meant, and
// nothing encoding/json rejects is accepted.
func FuzzCanonicalize(f *testing.F) {
	f.Add([]byte(`{"b":[1,2.50,{"d":null,"c":true}],"a":"\u00e9\ud83d\ude00"}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := Canonicalize(in)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if !json.Valid(in) {
			t.Fatalf("accepted %q, which encoding/json rejects", in)
		}
		if !json.Valid(out) {
			t.Fatalf("output %q is not valid JSON", out)
		}
		again, err := Canonicalize(out)
		if err != nil {
			t.Fatalf("output %q rejected: %v", out, err)
		}
		if !bytes.Equal(again, out) {
			t.Fatalf("not idempotent:\n once  %q\n twice %q", out, again)
		}
		var vin, vout any
		if err := json.Unmarshal(in, &vin); err != nil {
			t.Fatalf("encoding/json cannot decode accepted input %q: %v", in, err)
		}
		if err := json.Unmarshal(out, &vout); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(vin, vout) {
			t.Fatalf("meaning changed: %q -> %q", in, out)
		}
	})
}

// TestOfValueRefusesIntegersADoubleDoesNotKeep: a uint64 identifier beyond 2^53 gave
// two different effects one fingerprint, so the Go client's Do replayed the first
// effect's receipt for the second (issue 13, defect 5).
func TestOfValueRefusesIntegersADoubleDoesNotKeep(t *testing.T) {
	a, errA := OfValue(map[string]any{"amount": uint64(9007199254740993)})
	b, errB := OfValue(map[string]any{"amount": uint64(9007199254740992)})
	if errA == nil {
		t.Fatalf("9007199254740993 accepted: %s (and 9007199254740992: %s, %v)", a, b, errB)
	}
	if !errors.Is(errA, ErrInvalid) || !strings.Contains(errA.Error(), "send it as a string") {
		t.Errorf("error %v: want ErrInvalid saying to send it as a string", errA)
	}
	if errB == nil {
		t.Errorf("2^53 accepted in a value (%s): as a float64 it is also what 2^53 + 1 decodes to", b)
	}
	if _, err := OfValue(map[string]any{"amount": "9007199254740993"}); err != nil {
		t.Errorf("as a string: %v", err)
	}
}

// TestOfValueRefusesWhatAFloat64MayHaveRounded: arguments decoded the usual Go way
// (json.Unmarshal into map[string]any) hold numbers as float64, and two identifiers
// beyond 2^53 decode to one float64: OfValue gave both one fingerprint, and Do
// replayed the first channel's receipt for the second (the tool ran once for two
// channels). Every number of magnitude 2^53 or more is refused in a value, as Python
// and TypeScript refuse it; the JSON text itself is fingerprinted as written.
func TestOfValueRefusesWhatAFloat64MayHaveRounded(t *testing.T) {
	for _, text := range []string{
		`{"channel_id":1234567890123456789,"text":"deploy"}`, `{"channel_id":1234567890123456790,"text":"deploy"}`,
		`{"n":9007199254740992}`, `{"n":-9007199254740993}`, `{"n":1e21}`, `{"n":1e300}`, `{"n":18446744073709551615}`,
	} {
		var v any
		if err := json.Unmarshal([]byte(text), &v); err != nil {
			t.Fatal(err)
		}
		if fp, err := OfValue(v); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s decoded into any: %s, %v; want ErrInvalid", text, fp, err)
		}
	}
	for _, v := range []any{int64(1) << 53, uint64(1) << 62, float32(1 << 24 * 1 << 30)} {
		if fp, err := OfValue([]any{v}); !errors.Is(err, ErrInvalid) {
			t.Errorf("%T %v: %s, %v; want ErrInvalid", v, v, fp, err)
		}
	}
	for _, v := range []any{int64(1)<<53 - 1, -(int64(1)<<53 - 1), 0.1, 1e-300, 123456789.125} {
		if _, err := OfValue([]any{v}); err != nil {
			t.Errorf("%T %v: %v", v, v, err)
		}
	}
	a, errA := Of([]byte(`{"channel_id":1234567890123456789}`))
	b, errB := Of([]byte(`{"channel_id":1234567890123456790}`))
	if errA == nil && errB == nil && a == b {
		t.Errorf("the text path aliases them too: %s", a)
	}
}

// The shared vectors through the Go client's value path, as a runtime gets there:
// the input decoded by encoding/json (into float64s, or json.Numbers), then OfValue.
// Each valid vector gives its fingerprint, or is refused only for a number of
// magnitude 2^53 or more (which a float64 may have rounded). The vectors were run
// through the text path alone.
func TestVectorsThroughOfValue(t *testing.T) {
	refusedFor := map[string]bool{}
	for _, v := range loadVectors(t) {
		if v.Invalid {
			continue
		}
		big := false
		{
			dec := json.NewDecoder(bytes.NewReader(v.input(t)))
			dec.UseNumber()
			for {
				tok, err := dec.Token()
				if err != nil {
					break
				}
				if n, ok := tok.(json.Number); ok {
					f, _ := n.Float64()
					big = big || math.Abs(f) >= 1<<53
				}
			}
		}
		for _, useNumber := range []bool{false, true} {
			dec := json.NewDecoder(bytes.NewReader(v.input(t)))
			if useNumber {
				dec.UseNumber()
			}
			var val any
			if err := dec.Decode(&val); err != nil {
				t.Fatalf("%s: encoding/json cannot decode a valid vector: %v", v.Name, err)
			}
			fp, err := OfValue(val, v.Drop...)
			switch {
			case err != nil && big:
				refusedFor[v.Name] = true
			case err != nil:
				t.Errorf("%s (UseNumber %v): refused: %v", v.Name, useNumber, err)
			case big:
				t.Errorf("%s (UseNumber %v): a number of 2^53 or more accepted in a value: %s", v.Name, useNumber, fp)
			case fp != v.Fingerprint:
				t.Errorf("%s (UseNumber %v): %s, want %s", v.Name, useNumber, fp, v.Fingerprint)
			}
		}
	}
	t.Logf("refused on the value path for a number of 2^53 or more: %v", slices.Sorted(maps.Keys(refusedFor)))
}
