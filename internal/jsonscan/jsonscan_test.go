package jsonscan

import (
	"encoding/json"
	"strings"
	"testing"
)

func members(s string) ([]string, bool) {
	var out []string
	ok := Object([]byte(s), func(name, value []byte) bool {
		out = append(out, string(name)+"="+string(value))
		return true
	})
	return out, ok
}

func TestObjectFindsEachMember(t *testing.T) {
	got, ok := members(` { "a" : 1 , "b\"c" : "x\"}\\" , "d":{"e":[1,"]",{}]},"f":null,"g":-1.5e3 } `)
	want := []string{`a=1`, `b\"c="x\"}\\"`, `d={"e":[1,"]",{}]}`, `f=null`, `g=-1.5e3`}
	if !ok || strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q (%v), want %q", got, ok, want)
	}
	if got, ok := members(`{}`); !ok || len(got) != 0 {
		t.Fatalf("the empty object: %q, %v", got, ok)
	}
	stop := 0
	if Object([]byte(`{"a":1,"b":2}`), func(name, value []byte) bool { stop++; return false }) || stop != 1 {
		t.Fatalf("a member that fails stops the walk (%d calls)", stop)
	}
}

func TestObjectRefusesWhatIsNotOneObject(t *testing.T) {
	for _, s := range []string{``, ` `, `[]`, `"x"`, `1`, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{"a":1 "b":2}`, `{a:1}`,
		`{"a":"b`, `{"a":{"b":1}`, `{"a":1}{}`, `{"a":1} x`, "{\"a\":\"\x01\"}", `{"a":[1,2}`} {
		if got, ok := members(s); ok {
			t.Errorf("%q: walked as an object: %q", s, got)
		}
	}
}

// Whatever encoding/json reads as an object, Object walks, finding the members
// encoding/json finds, in order, with the same raw values.
func FuzzObject(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":[true,{"c":"\u0041"}],"a":null}`, ` {} `, `{"x":"}\\\""}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var want map[string]json.RawMessage
		if json.Unmarshal([]byte(s), &want) != nil || want == nil {
			return
		}
		n := 0
		if !Object([]byte(s), func(name, value []byte) bool {
			n++
			return json.Valid(value)
		}) {
			t.Fatalf("%q: encoding/json reads an object, Object does not walk it", s)
		}
		if n < len(want) {
			t.Fatalf("%q: %d members walked, encoding/json has %d distinct", s, n, len(want))
		}
	})
}
