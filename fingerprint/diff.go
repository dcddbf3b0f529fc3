package fingerprint

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Masked is the JSON string that Mask puts in place of a masked value.
const Masked = `"***"`

// ErrBadPointer is wrapped by errors about a mask that is not a JSON Pointer.
var ErrBadPointer = fmt.Errorf("fingerprint: invalid JSON Pointer")

// pointer splits a JSON Pointer (RFC 6901) into its unescaped segments.
func pointer(p string) ([]string, error) {
	if p == "" || p[0] != '/' {
		return nil, fmt.Errorf("%w: %q does not start with \"/\"", ErrBadPointer, p)
	}
	segs := strings.Split(p[1:], "/")
	for i, s := range segs {
		for j := 0; j < len(s); j++ {
			if s[j] == '~' && (j+1 == len(s) || (s[j+1] != '0' && s[j+1] != '1')) {
				return nil, fmt.Errorf("%w: %q has a \"~\" that is not ~0 or ~1", ErrBadPointer, p)
			}
		}
		// ~1 first, then ~0, as RFC 6901 section 4 orders it: "~01" is "~1".
		segs[i] = strings.ReplaceAll(strings.ReplaceAll(s, "~1", "/"), "~0", "~")
	}
	return segs, nil
}

// escapeSegment escapes one member name or index for a JSON Pointer.
func escapeSegment(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// Mask returns the canonical form of data with the value under each mask replaced by
// the string "***". A mask is a JSON Pointer whose segment "*" matches any member or
// element (so a member named "*" alone cannot be masked: its siblings go with it,
// which errs towards hiding). Masks that match nothing are ignored.
func Mask(data []byte, masks []string) ([]byte, error) {
	v, err := parse(data)
	if err != nil {
		return nil, err
	}
	paths, err := pointers(masks)
	if err != nil {
		return nil, err
	}
	for _, p := range paths {
		v.mask(p)
	}
	return v.appendTo(make([]byte, 0, len(data))), nil
}

func pointers(masks []string) ([][]string, error) {
	paths := make([][]string, 0, len(masks))
	for _, m := range masks {
		p, err := pointer(m)
		if err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

var maskedValue = &value{kind: kindString, text: "***"}

func (v *value) mask(path []string) {
	seg, rest := path[0], path[1:]
	switch v.kind {
	case kindObject:
		for i, m := range v.members {
			if seg != "*" && m.name != seg {
				continue
			}
			if len(rest) == 0 {
				v.members[i].val = maskedValue
			} else {
				m.val.mask(rest)
			}
		}
	case kindArray:
		for i, e := range v.elems {
			if seg != "*" && seg != strconv.Itoa(i) {
				continue
			}
			if len(rest) == 0 {
				v.elems[i] = maskedValue
			} else {
				e.mask(rest)
			}
		}
	}
}

// Difference is one place where two JSON values differ: Path is a JSON Pointer,
// Stored and Received the canonical JSON there (nil where the member or element is
// absent on that side).
type Difference struct {
	Path     string
	Stored   []byte
	Received []byte
}

// DiffLimits bound a diff: at most MaxEntries differences, in path order (the rest
// only counted), values longer than MaxValue bytes replaced by a string naming their
// type, size and fingerprint, and paths longer than MaxPath cut.
type DiffLimits struct {
	MaxEntries int
	MaxValue   int
	// MaxPath bounds a Path: one longer (a chain of long member names) is cut and says
	// how long it was. Zero: no bound.
	MaxPath int
}

// Diff lists where received differs from stored, two effects whose fingerprints
// differ (the effects of a conflict), both parsed as Canonicalize parses
// them (so invalid UTF-8, duplicate member names and numbers a double does not keep
// are refused, and 1.0 equals 1). Objects are compared member by member, arrays
// element by element; a value of another type differs as a whole. Values under masks
// are "***" on both sides: stored is expected masked already (Mask), received is
// masked here, so a diff never shows a masked value, and two masked values never
// count as different. When the fingerprints differ only under masks, each masked path
// present on either side is listed with "***" on both sides, so that the diff is
// never empty for effects that differ. omitted counts the differences past the limit.
func Diff(stored, received []byte, masks []string, lim DiffLimits) (diffs []Difference, omitted int, err error) {
	sv, err := parse(stored)
	if err != nil {
		return nil, 0, fmt.Errorf("stored effect: %w", err)
	}
	rv, err := parse(received)
	if err != nil {
		return nil, 0, fmt.Errorf("received effect: %w", err)
	}
	paths, err := pointers(masks)
	if err != nil {
		return nil, 0, err
	}
	for _, p := range paths {
		sv.mask(p)
	}
	for _, p := range paths {
		rv.mask(p)
	}
	d := differ{lim: lim}
	d.walk("", sv, rv)
	if len(d.diffs) == 0 && d.omitted == 0 && len(paths) > 0 {
		// Equal once masked, yet the effects' fingerprints differ (the caller only
		// diffs a conflict): what differs is under a mask.
		seen := map[string]bool{}
		for _, p := range paths {
			for _, at := range append(matches(sv, p, ""), matches(rv, p, "")...) {
				if !seen[at] {
					seen[at] = true
					d.add(Difference{Path: at, Stored: []byte(Masked), Received: []byte(Masked)})
				}
			}
		}
		slices.SortFunc(d.diffs, func(a, b Difference) int { return strings.Compare(a.Path, b.Path) })
	}
	return d.diffs, d.omitted, nil
}

// matches lists the pointers under v that path names.
func matches(v *value, path []string, at string) []string {
	if len(path) == 0 {
		return []string{at}
	}
	seg, rest := path[0], path[1:]
	var out []string
	switch v.kind {
	case kindObject:
		for _, m := range v.members {
			if seg == "*" || m.name == seg {
				out = append(out, matches(m.val, rest, at+"/"+escapeSegment(m.name))...)
			}
		}
	case kindArray:
		for i, e := range v.elems {
			if seg == "*" || seg == strconv.Itoa(i) {
				out = append(out, matches(e, rest, at+"/"+strconv.Itoa(i))...)
			}
		}
	}
	return out
}

type differ struct {
	lim     DiffLimits
	diffs   []Difference
	omitted int
}

func (d *differ) add(x Difference) {
	if len(d.diffs) >= d.lim.MaxEntries {
		d.omitted++
		return
	}
	x.Stored, x.Received = d.clip(x.Stored), d.clip(x.Received)
	x.Path = clipPath(x.Path, d.lim.MaxPath)
	d.diffs = append(d.diffs, x)
}

// clipPath cuts a path longer than limit (on a character boundary) and says how long it
// was: "/a/bbbb…(70000 bytes)".
func clipPath(p string, limit int) string {
	if limit <= 0 || len(p) <= limit {
		return p
	}
	suffix := fmt.Sprintf("…(%d bytes)", len(p))
	keep := max(limit-len(suffix), 0)
	for keep > 0 && !utf8.RuneStart(p[keep]) {
		keep--
	}
	return p[:keep] + suffix
}

// clip replaces a value longer than MaxValue by a string that says what it was.
func (d *differ) clip(b []byte) []byte {
	if b == nil || len(b) <= d.lim.MaxValue {
		return b
	}
	what := map[byte]string{'{': "object", '[': "array", '"': "string"}[b[0]]
	if what == "" {
		what = "number"
	}
	return appendString(nil, fmt.Sprintf("(%s of %d bytes, %s)", what, len(b), Sum(b)))
}

// walk compares s and r at the pointer at. Members go in the order of their names'
// UTF-16 code units, as canonical JSON writes them, so the diff is deterministic.
func (d *differ) walk(at string, s, r *value) {
	switch {
	case s == nil && r == nil:
		return
	case s == nil:
		d.add(Difference{Path: at, Received: r.appendTo(nil)})
		return
	case r == nil:
		d.add(Difference{Path: at, Stored: s.appendTo(nil)})
		return
	}
	if s.kind != r.kind || (s.kind != kindObject && s.kind != kindArray) {
		sb, rb := s.appendTo(nil), r.appendTo(nil)
		if string(sb) != string(rb) {
			d.add(Difference{Path: at, Stored: sb, Received: rb})
		}
		return
	}
	if s.kind == kindArray {
		for i := range max(len(s.elems), len(r.elems)) {
			var se, re *value
			if i < len(s.elems) {
				se = s.elems[i]
			}
			if i < len(r.elems) {
				re = r.elems[i]
			}
			d.walk(at+"/"+strconv.Itoa(i), se, re)
		}
		return
	}
	names := map[string][2]*value{}
	for _, m := range s.members {
		names[m.name] = [2]*value{m.val, nil}
	}
	for _, m := range r.members {
		names[m.name] = [2]*value{names[m.name][0], m.val}
	}
	keys := make([]string, 0, len(names))
	for k := range names {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareUTF16)
	for _, k := range keys {
		pair := names[k]
		d.walk(at+"/"+escapeSegment(k), pair[0], pair[1])
	}
}
