package fingerprint

import (
	"encoding/json"
	"errors"
	"testing"
)

// encoding/json writes every invalid UTF-8 byte as U+FFFD, so without a check two
// effects that differ only in such bytes would share a fingerprint, and the second
// operation would replay the first's receipt.
func TestOfValueRefusesTextThatIsNotUTF8(t *testing.T) {
	for _, v := range []any{
		map[string]any{"title": "a\xff"},
		map[string]any{"title": "a\xfe"},
		map[string]any{"a\xff": 1},
		[]string{"ok", "\xed\xa0\x80"}, // a surrogate encoded in UTF-8
		struct{ Title string }{"x\xc3"},
	} {
		fp, err := OfValue(v)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("OfValue(%q) = %q, %v; want ErrInvalid", v, fp, err)
		}
	}
	// U+FFFD itself is text like any other, and backslashes before "ufffd" escape
	// themselves.
	a, err := OfValue(map[string]any{"title": "a\uFFFD"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := OfValue(map[string]any{"title": `a\ufffd`})
	if err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Fatal("U+FFFD and the six characters \\ufffd share a fingerprint")
	}
	want, _ := Of([]byte(`{"title":"a\\ufffd"}`))
	if b != want {
		t.Fatalf("OfValue of a backslash text = %s, want %s", b, want)
	}
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{`{"a":1,"b":[{"c":"d"}]}`, true},
		{`{"id":123456789012345678901234567890,"f":1e400}`, true}, // numbers need only the grammar
		{`"\ud83d\ude00"`, true},
		{"{\"a\":\"\xef\xbf\xbd\"}", true}, // U+FFFD itself
		{"{\"a\":\"x\xff\"}", false},
		{"{\"a\xfe\":1}", false},
		{`{"a":"\ud800"}`, false},
		{`{"a":"\udc00x"}`, false},
		{`{"a":1,"a":2}`, false},
		{`{"a":1,"\u0061":2}`, false},
		{`{"x":{"approval":{"required":true,"required":false}}}`, false},
		{`[{"k":1},{"k":2}]`, true},
		{`{"a":01}`, false},
		{`{"a":1} x`, false},
		{``, false},
	} {
		err := Check([]byte(tc.in))
		if (err == nil) != tc.ok {
			t.Errorf("Check(%q) = %v, want ok %v", tc.in, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("Check(%q) = %v, not ErrInvalid", tc.in, err)
		}
		if tc.ok && json.Valid([]byte(tc.in)) != tc.ok {
			t.Errorf("Check takes %q, which encoding/json does not", tc.in)
		}
	}
	if _, err := Canonicalize([]byte(`{"id":123456789012345678901234567890}`)); err == nil {
		t.Fatal("Canonicalize took a number a double does not keep: Check's leniency leaked into it")
	}
}
