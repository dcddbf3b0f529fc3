package fingerprint

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

var lim = DiffLimits{MaxEntries: 32, MaxValue: 256}

func diffStrings(t *testing.T, stored, received string, masks ...string) []Difference {
	t.Helper()
	s, err := Canonicalize([]byte(stored))
	if err != nil {
		t.Fatal(err)
	}
	if len(masks) > 0 {
		if s, err = Mask(s, masks); err != nil {
			t.Fatal(err)
		}
	}
	d, omitted, err := Diff(s, []byte(received), masks, lim)
	if err != nil {
		t.Fatal(err)
	}
	if omitted != 0 {
		t.Fatalf("omitted %d", omitted)
	}
	return d
}

func diff(path string, stored, received string) Difference {
	var s, r []byte
	if stored != "" {
		s = []byte(stored)
	}
	if received != "" {
		r = []byte(received)
	}
	return Difference{Path: path, Stored: s, Received: r}
}

func TestDiff(t *testing.T) {
	for _, tc := range []struct {
		name             string
		stored, received string
		masks            []string
		want             []Difference
	}{
		{name: "a changed member", stored: `{"amount":40,"order":17}`, received: `{"order":17,"amount":45}`,
			want: []Difference{diff("/amount", "40", "45")}},
		{name: "numbers compare by value: 1.0 is 1, 1e2 is 100", stored: `{"a":1,"b":100}`, received: `{"a":1.0,"b":1e2}`},
		{name: "a member only on one side is absent on the other", stored: `{"a":1}`, received: `{"b":null}`,
			want: []Difference{diff("/a", "1", ""), diff("/b", "", "null")}},
		{name: "nested, and arrays element by element", stored: `{"x":{"items":[1,2,3]}}`, received: `{"x":{"items":[1,5]}}`,
			want: []Difference{diff("/x/items/1", "2", "5"), diff("/x/items/2", "3", "")}},
		{name: "another type differs as a whole", stored: `{"a":{"b":1}}`, received: `{"a":[1]}`,
			want: []Difference{diff("/a", `{"b":1}`, `[1]`)}},
		{name: "the whole effect of another type", stored: `{"a":1}`, received: `"a"`,
			want: []Difference{diff("", `{"a":1}`, `"a"`)}},
		{name: "RFC 6901 escapes ~ and / in names", stored: `{"a/b":1,"m~n":2}`, received: `{"a/b":2,"m~n":3}`,
			want: []Difference{diff("/a~1b", "1", "2"), diff("/m~0n", "2", "3")}},
		{name: "strings come out canonical", stored: `{"s":"\u00e9"}`, received: `{"s":"e\u0301"}`,
			want: []Difference{diff("/s", "\"\u00e9\"", "\"e\u0301\"")}},
		{name: "a masked value is never shown, and differs only when nothing else does",
			stored: `{"card":"4111","amount":40}`, received: `{"card":"5500","amount":45}`, masks: []string{"/card"},
			want: []Difference{diff("/amount", "40", "45")}},
		{name: "effects that differ only under a mask name the masked path",
			stored: `{"card":"4111","amount":40}`, received: `{"card":"5500","amount":40}`, masks: []string{"/card"},
			want: []Difference{diff("/card", `"***"`, `"***"`)}},
		{name: "a wildcard masks every element", stored: `{"items":[{"tok":"a","n":1},{"tok":"b","n":2}]}`,
			received: `{"items":[{"tok":"c","n":1},{"tok":"d","n":3}]}`, masks: []string{"/items/*/tok"},
			want: []Difference{diff("/items/1/n", "2", "3")}},
		{name: "a masked subtree hides what is under it", stored: `{"secret":{"k":1}}`, received: `{"secret":{"k":2,"j":1},"x":1}`,
			masks: []string{"/secret"}, want: []Difference{diff("/x", "", "1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := diffStrings(t, tc.stored, tc.received, tc.masks...)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("diff\n got %s\nwant %s", show(got), show(tc.want))
			}
		})
	}
}

func show(ds []Difference) string {
	var b strings.Builder
	for _, d := range ds {
		b.WriteString(d.Path + " " + string(d.Stored) + " -> " + string(d.Received) + "; ")
	}
	return b.String()
}

// TestDiffRefusesWhatFingerprintsRefuse: a received effect with a duplicate member,
// invalid UTF-8 or a number a double does not keep is an error, never a diff that
// shows one reading of it.
func TestDiffRefusesWhatFingerprintsRefuse(t *testing.T) {
	stored := []byte(`{"a":1}`)
	for _, bad := range []string{`{"a":1,"a":2}`, "{\"a\":\"\xff\"}", `{"a":9007199254740993}`} {
		if _, _, err := Diff(stored, []byte(bad), nil, lim); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: err = %v, want ErrInvalid", bad, err)
		}
	}
	if _, _, err := Diff(stored, stored, []string{"card"}, lim); !errors.Is(err, ErrBadPointer) {
		t.Errorf("a mask without a leading slash: %v", err)
	}
	if _, err := Mask(stored, []string{"/a~2"}); !errors.Is(err, ErrBadPointer) {
		t.Errorf("a mask with ~2: %v", err)
	}
}

// TestDiffBounds: past MaxEntries the rest is counted, and a value longer than
// MaxValue is shown as a string naming its kind, size and fingerprint.
func TestDiffBounds(t *testing.T) {
	var s, r strings.Builder
	s.WriteString("{")
	r.WriteString("{")
	for i := range 40 {
		if i > 0 {
			s.WriteString(",")
			r.WriteString(",")
		}
		s.WriteString(`"k` + strconv.Itoa(i) + `":1`)
		r.WriteString(`"k` + strconv.Itoa(i) + `":2`)
	}
	s.WriteString("}")
	r.WriteString("}")
	d, omitted, err := Diff([]byte(s.String()), []byte(r.String()), nil, DiffLimits{MaxEntries: 32, MaxValue: 256})
	if err != nil || len(d) != 32 || omitted != 8 {
		t.Fatalf("%d entries, %d omitted, %v; want 32 and 8", len(d), omitted, err)
	}
	long := `{"a":"` + strings.Repeat("x", 300) + `"}`
	d, _, err = Diff([]byte(`{"a":"y"}`), []byte(long), nil, lim)
	if err != nil || len(d) != 1 || string(d[0].Stored) != `"y"` || !strings.HasPrefix(string(d[0].Received), `"(string of 302 bytes, sha256:`) {
		t.Fatalf("long value: %s %v", show(d), err)
	}
}

func TestMaskCanonical(t *testing.T) {
	got, err := Mask([]byte(`{ "b":[{"t":1},{"t":2}], "a":"x" }`), []string{"/b/1/t", "/a", "/nothing/here"})
	if err != nil || string(got) != `{"a":"***","b":[{"t":1},{"t":"***"}]}` {
		t.Fatalf("%s %v", got, err)
	}
}

// A path is as long as the chain of member names above it: past MaxPath it is cut,
// so that a diff's size stays bounded whatever names an effect uses.
func TestDiffPathsAreBounded(t *testing.T) {
	long := strings.Repeat("n", 2000)
	nest := func(leaf string) string {
		s := leaf
		for range 30 {
			s = `{"` + long + `":` + s + `}`
		}
		return s
	}
	diffs, _, err := Diff([]byte(nest(`{"a":1,"b":2}`)), []byte(nest(`{"a":3,"b":4}`)), nil, DiffLimits{MaxEntries: 32, MaxValue: 256, MaxPath: 512})
	if err != nil {
		t.Fatal(err)
	}
	if len(diffs) != 2 {
		t.Fatalf("%d differences, want 2", len(diffs))
	}
	for _, d := range diffs {
		if len(d.Path) > 512 || !strings.HasSuffix(d.Path, "bytes)") || !strings.HasPrefix(d.Path, "/"+long[:100]) {
			t.Errorf("path of %d bytes: %.80q…", len(d.Path), d.Path)
		}
	}
}
