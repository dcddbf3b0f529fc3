package fingerprint

import (
	"strings"
	"testing"
)

func TestKeyText(t *testing.T) {
	for _, tc := range []struct{ lit, want, err string }{
		{lit: "17", want: "17"},
		{lit: "17.0", want: "17"},
		{lit: "1.7e1", want: "17"},
		{lit: "170e-1", want: "17"},
		{lit: "1700E-2", want: "17"},
		{lit: "-17", want: "-17"},
		{lit: "0", want: "0"},
		{lit: "-0", want: "0"},
		{lit: "0.000", want: "0"},
		{lit: "0e99999999999", want: "0"},
		{lit: "1e21", want: "1000000000000000000000"},
		{lit: "9007199254740993", want: "9007199254740993"},
		{lit: "12345678901234567891", want: "12345678901234567891"},
		{lit: "12345678901234567891.000", want: "12345678901234567891"},
		{lit: "1234567890123456789012345678901234567890", want: "1234567890123456789012345678901234567890"},
		{lit: "0.5", want: "0.5"},
		{lit: "5e-1", want: "0.5"},
		{lit: "1.5e-7", want: "1.5e-7"},
		{lit: "-2.25", want: "-2.25"},
		{lit: "12345678901234567890123456789012345678901", err: "more than 40 digits"},
		{lit: "1e41", err: "more than 40 digits"},
		{lit: "0.1", want: "0.1"},
		{lit: "0.10000000000000001", err: "0.1"}, // its double reads 0.1: refused, as its fingerprint is
		{lit: "1e99999999999", err: "exponent"},
		{lit: "01", err: ""},
		{lit: "1.", err: ""},
		{lit: "+1", err: ""},
		{lit: "\"1\"", err: ""},
		{lit: "1 ", err: ""},
		{lit: "", err: ""},
	} {
		got, err := KeyText(tc.lit)
		switch {
		case tc.want != "":
			if err != nil || got != tc.want {
				t.Errorf("KeyText(%q) = %q, %v; want %q", tc.lit, got, err, tc.want)
			}
		case err == nil:
			t.Errorf("KeyText(%q) = %q; want an error", tc.lit, got)
		case !strings.Contains(err.Error(), tc.err):
			t.Errorf("KeyText(%q): %v; want it to say %q", tc.lit, err, tc.err)
		}
	}
}

// Integers and other numbers never share a text: every text of a number that is not
// an integer holds "." or "e-".
func TestKeyTextKeepsIntegersApart(t *testing.T) {
	for _, lit := range []string{"0.5", "1e-7", "123.25", "-0.001", "4.5e-300", "2.5", "1.25e-5"} {
		got, err := KeyText(lit)
		if err != nil {
			t.Fatalf("KeyText(%q): %v", lit, err)
		}
		if !strings.Contains(got, ".") && !strings.Contains(got, "e-") {
			t.Errorf("KeyText(%q) = %q reads as an integer", lit, got)
		}
	}
}

// Zero is zero whatever its exponent, as every parser (and the other clients) reads it.
func TestZeroWithAnyExponent(t *testing.T) {
	for _, lit := range []string{`{"n":0e99999999999}`, `{"n":-0e-99999999999}`, `{"n":0.0e1073741825}`} {
		got, err := Canonicalize([]byte(lit))
		if err != nil || string(got) != `{"n":0}` {
			t.Errorf("Canonicalize(%s) = %s, %v; want {\"n\":0}", lit, got, err)
		}
	}
	if _, err := Canonicalize([]byte(`{"n":1e99999999999}`)); err == nil {
		t.Error("1e99999999999 was accepted")
	}
}
