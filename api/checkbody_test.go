package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemkv/idemkv"
)

// The single-pass checkBody must refuse exactly what encoding/json would misread, for
// every body the decoder accepts. The oracle below finds both by other means: it lets
// encoding/json decode the body and looks at what came out. A lone surrogate comes
// out as U+FFFD (so the oracle cannot judge a body that holds U+FFFD in any form),
// and two names are the same member when bytes.EqualFold says so, which is how
// encoding/json matches them.

// oracle reports the first top-level member whose name or value decoded to U+FFFD,
// and the first top-level name that repeats one before it. sure is false when the
// body itself holds U+FFFD, literally or escaped.
func oracle(body []byte) (lone, dup string, hasLone, hasDup, sure bool) {
	if bytes.ContainsRune(body, utf8.RuneError) || bytes.Contains(bytes.ToLower(body), []byte(`\ufffd`)) {
		return "", "", false, false, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", "", false, false, false
	}
	var names []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", "", false, false, false
		}
		name, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return "", "", false, false, false
		}
		var value any
		if err := json.Unmarshal(raw, &value); err != nil {
			return "", "", false, false, false
		}
		if !hasLone && (strings.ContainsRune(name, utf8.RuneError) || holdsReplacement(value)) {
			lone, hasLone = name, true
		}
		for _, prev := range names {
			if !hasDup && bytes.EqualFold([]byte(prev), []byte(name)) {
				dup, hasDup = name, true
			}
		}
		names = append(names, name)
		// An object a struct field takes (not a raw effect or result) is read by
		// names the same way.
		if raw := bytes.TrimLeft(raw, " \t\r\n"); !hasDup && len(raw) > 0 && raw[0] == '{' &&
			!strings.EqualFold(name, "effect") && !strings.EqualFold(name, "result") {
			if d, ok := repeatedName(raw); ok {
				dup, hasDup = d, true
			}
		}
	}
	return lone, dup, hasLone, hasDup, true
}

// repeatedName is the first name of the object raw that repeats one before it, as
// encoding/json matches names.
func repeatedName(raw []byte) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil {
		return "", false
	}
	var names []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		name, _ := tok.(string)
		for _, prev := range names {
			if bytes.EqualFold([]byte(prev), []byte(name)) {
				return name, true
			}
		}
		names = append(names, name)
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return "", false
		}
	}
	return "", false
}

func holdsReplacement(v any) bool {
	switch v := v.(type) {
	case string:
		return strings.ContainsRune(v, utf8.RuneError)
	case []any:
		for _, e := range v {
			if holdsReplacement(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range v {
			if strings.ContainsRune(k, utf8.RuneError) || holdsReplacement(e) {
				return true
			}
		}
	}
	return false
}

// wellFormedObject says whether encoding/json reads body as exactly one object.
func wellFormedObject(body []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	var v map[string]json.RawMessage
	if err := dec.Decode(&v); err != nil {
		return false
	}
	_, err := dec.Token()
	return errors.Is(err, io.EOF)
}

func fieldOf(err error) (string, bool) {
	if err == nil {
		return "", false
	}
	var e *idemkv.Error
	if !errors.As(err, &e) {
		return "", true
	}
	return e.Field, true
}

func checkAgainstOracle(t *testing.T, body []byte) {
	t.Helper()
	got := checkBody(body)
	if got != nil {
		var e *idemkv.Error
		if !errors.As(got, &e) || e.Code != idemkv.CodeInvalidArgument || e.Message == "" {
			t.Fatalf("checkBody(%q) refused with %#v, want an invalid_argument with a message", body, got)
		}
	}
	if !utf8.Valid(body) {
		if got == nil {
			t.Fatalf("checkBody accepted invalid UTF-8 in %q", body)
		}
		return
	}
	if !wellFormedObject(body) {
		return // the decoder refuses it and says why
	}
	lone, dup, hasLone, hasDup, sure := oracle(body)
	if !sure {
		return
	}
	field, _ := fieldOf(got)
	switch {
	case !hasLone && !hasDup && got != nil:
		t.Fatalf("checkBody(%q) = %v; encoding/json reads it without loss", body, got)
	case (hasLone || hasDup) && got == nil:
		t.Fatalf("checkBody(%q) accepted it; lone surrogate in %q (%v), repeated name %q (%v)", body, lone, hasLone, dup, hasDup)
	case hasLone && !hasDup && field != lone:
		t.Fatalf("checkBody(%q) named %q, the lone surrogate is in %q", body, field, lone)
	case hasDup && !hasLone && field != dup:
		t.Fatalf("checkBody(%q) named %q, the repeated name is %q", body, field, dup)
	}
}

var checkBodySeeds = []string{
	`{"tenant":"acme","idempotency_key":"k","tool":"t","effect_fingerprint":"f"}`,
	`{"tenant":"acme","tenant":"other"}`,
	`{"tenant":"acme","TENANT":"other"}`,
	`{"idempotency_key":"k","idempotency_` + "\u212a" + `ey":"j"}`,
	`{"s":1,"` + "\u017f" + `":2}`,
	`{"\u0074enant":"a","tenant":"b"}`,
	`{"tenant":"a","\u0054ENANT":"b"}`,
	`{"a":{"x":1,"x":2},"b":[{"y":1,"y":2}]}`,
	`{"approval":{"required":true,"Required":false},"tool":"t"}`,
	`{"error":{"code":"a","CODE":"b","details":{"k":1,"K":2}}}`,
	`{"effect":{"a":1,"A":2},"result":{"b":1,"B":2},"approval":{"summary":"s"}}`,
	`{"effect":{"a":{"x":1,"X":2}},"tenant":"t","Tenant":"u"}`,
	`{"a":"{\"b\":1,","b":2}`,
	`{"a":"\"","a\"":1}`,
	`{"k":"\ud83d\ude00","j":"\ud800"}`,
	`{"k":"\udcff"}`,
	`{"k":"x\\","k2":"\\\"k\""}`,
	`[{"a":1,"a":2}]`,
	`{"a" : 1 , "A"	:2}`,
	`{"a":[1,2,{"a":3}],"b":"a:"}`,
	`{"` + strings.Repeat("x", 300) + `":1,"` + strings.Repeat("X", 300) + `":2}`,
	"{\"a\":\"inv\xff\"}",
	`{"a":1,"a":2,"b":"\ud800"}`,
	`{"a":"\ufffd","a":1}`,
}

func TestCheckBodyAgreesWithTheOracle(t *testing.T) {
	for _, s := range checkBodySeeds {
		checkAgainstOracle(t, []byte(s))
	}
	// Many members, past the slice into the map, with and without a repeat.
	var b strings.Builder
	b.WriteString("{")
	for i := range 3 * memberNamesLinear {
		fmt.Fprintf(&b, `"m%d":%d,`, i, i)
	}
	distinct := b.String() + `"last":0}`
	checkAgainstOracle(t, []byte(distinct))
	if err := checkBody([]byte(distinct)); err != nil {
		t.Fatalf("distinct members refused: %v", err)
	}
	for _, dup := range []string{`"M3"`, `"m80"`, `"M95"`} {
		body := b.String() + dup + `:0}`
		checkAgainstOracle(t, []byte(body))
		if f, _ := fieldOf(checkBody([]byte(body))); f != strings.Trim(dup, `"`) {
			t.Fatalf("repeat %s among %d members: got field %q", dup, 3*memberNamesLinear, f)
		}
	}
}

// ASCII names are folded by upper-casing, without Unicode tables: that must be what
// foldName gives for every ASCII byte.
func TestASCIIFoldIsFoldName(t *testing.T) {
	for c := range byte(utf8.RuneSelf) {
		var m memberNames
		if err := m.add([]byte{c}, false); err != nil {
			t.Fatal(err)
		}
		if want := foldName(string(rune(c))); string(m.folded) != want {
			t.Fatalf("byte %q folds to %q, foldName says %q", c, m.folded, want)
		}
	}
}

func FuzzCheckBody(f *testing.F) {
	for _, s := range checkBodySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkAgainstOracle(t, body)
	})
}

// The decode of an accepted body is what encoding/json alone gives.
func TestCheckBodyLeavesAcceptedBodiesToTheDecoder(t *testing.T) {
	body := []byte(`{"tenant":"acme","idempotency_key":"k\u00e9","tool":"t","effect_fingerprint":"f","ttl_ms":86400000}`)
	var got, want idemkv.ReserveRequest
	if err := decodeJSON(body, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(body, &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}
