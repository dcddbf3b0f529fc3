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
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/idemkv/idemkv"
)

// The single-pass checkBody must refuse exactly what the straightforward checks built
// on encoding/json's tokenizer refuse, for every body the decoder would accept. The
// oracle below is that straightforward version (which the server ran before): it
// re-reads the body with a json.Decoder and folds every name through Unicode.

func oracleCheck(body []byte) error {
	if !utf8.Valid(body) {
		return idemkv.Invalid("", "invalid UTF-8")
	}
	inString := false
	for i := 0; i < len(body); i++ {
		switch c := body[i]; {
		case c == '"':
			inString = !inString
		case c == '\\' && inString && i+1 < len(body):
			if body[i+1] != 'u' {
				i++
				continue
			}
			r1, ok := hex4(body, i+2)
			if !ok || !utf16.IsSurrogate(r1) {
				i++
				continue
			}
			if r1 < 0xdc00 && i+11 < len(body) && body[i+6] == '\\' && body[i+7] == 'u' {
				if r2, ok := hex4(body, i+8); ok && r2 >= 0xdc00 && r2 <= 0xdfff {
					i += 11
					continue
				}
			}
			return idemkv.Invalid(memberAt(body, i), "lone surrogate")
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		name, _ := tok.(string)
		var folded strings.Builder
		for _, r := range name {
			least := r
			for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
				least = min(least, f)
			}
			folded.WriteRune(least)
		}
		if seen[folded.String()] {
			return idemkv.Invalid(name, "duplicate")
		}
		seen[folded.String()] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
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
	got, want := checkBody(body), oracleCheck(body)
	if !utf8.Valid(body) || !wellFormedObject(body) {
		// The decoder refuses these anyway; only text errors must still be caught,
		// so that they are named rather than described as a syntax error.
		if want != nil && !utf8.Valid(body) && got == nil {
			t.Fatalf("checkBody accepted invalid UTF-8 in %q", body)
		}
		return
	}
	gf, gerr := fieldOf(got)
	wf, werr := fieldOf(want)
	if gerr != werr || gf != wf {
		t.Fatalf("checkBody(%q) = %v, the oracle says %v", body, got, want)
	}
	if got != nil {
		var e *idemkv.Error
		if !errors.As(got, &e) || e.Code != idemkv.CodeInvalidArgument || e.Message == "" {
			t.Fatalf("checkBody(%q) refused with %#v, want an invalid_argument with a message", body, got)
		}
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
