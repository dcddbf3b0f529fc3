// Package fingerprint computes effect fingerprints (docs/protocol.md section 5):
// "sha256:" + hex(sha256(JCS(effect))), where JCS is the RFC 8785 JSON
// Canonicalization Scheme.
//
// The server (for the effect field of a reserve) and every Go client use this one
// implementation, and testdata/fingerprint/vectors.json at the repository root pins
// its bytes so that clients in other languages can prove they agree. It must stay standard-library only: the server and
// the light client both import it.
package fingerprint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Prefix starts every fingerprint this package computes.
const Prefix = "sha256:"

// ErrInvalid is wrapped by every error about input that is not I-JSON: malformed
// JSON, invalid UTF-8, lone surrogates, duplicate member names, numbers outside the
// range of an IEEE 754 double or whose value its shortest form does not keep
// (9007199254740993), nesting deeper than MaxDepth.
var ErrInvalid = errors.New("fingerprint: invalid JSON")

// ErrBadPath is wrapped by errors about a drop path that cannot name a field.
var ErrBadPath = errors.New("fingerprint: invalid drop path")

// MaxDepth bounds the nesting of arrays and objects. An effect is a handful of
// business fields; the bound keeps a hostile input from exhausting the stack.
const MaxDepth = 1000

// SyntaxError locates why input was rejected.
type SyntaxError struct {
	Offset int // byte offset in the input
	Msg    string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("fingerprint: invalid JSON at byte %d: %s", e.Offset, e.Msg)
}

func (e *SyntaxError) Unwrap() error { return ErrInvalid }

// Canonicalize returns the RFC 8785 canonical form of one JSON value: no
// insignificant whitespace, object members sorted by the UTF-16 code units of their
// names, strings with minimal escaping, numbers in the ECMAScript shortest form.
func Canonicalize(data []byte) ([]byte, error) {
	v, err := parse(data)
	if err != nil {
		return nil, err
	}
	return v.appendTo(make([]byte, 0, len(data))), nil
}

// CanonicalizeWithout is Canonicalize after removing the fields that drop names.
//
// A path is dot-separated member names from the top-level object; "*" stands for any
// member of an object or any element of an array ("items.*.trace_id"). Paths that
// match nothing are ignored, since volatile fields are often optional. A member
// whose name contains "." cannot be named.
func CanonicalizeWithout(data []byte, drop ...string) ([]byte, error) {
	return canonicalizeWithout(&parser{data: data}, drop)
}

func canonicalizeWithout(p *parser, drop []string) ([]byte, error) {
	paths, err := splitPaths(drop)
	if err != nil {
		return nil, err
	}
	v, err := p.all()
	if err != nil {
		return nil, err
	}
	for _, path := range paths {
		v.drop(path)
	}
	return v.appendTo(make([]byte, 0, len(p.data))), nil
}

// Check reports why data is not one JSON value that every parser reads alike, or
// nil: it must be valid UTF-8, escape no lone surrogate and name no member twice in
// any object (compared after unescaping), the rules Canonicalize holds it to, but
// for numbers, which need only follow the grammar (a number a double does not keep
// is read alike as long as nobody converts it). Check suits JSON that is decoded,
// not fingerprinted whole: encoding/json would read such input silently, turning
// the bad text into U+FFFD and keeping the last of two members.
func Check(data []byte) error {
	_, err := (&parser{data: data, anyNumber: true}).all()
	return err
}

// replacedText returns the offset in data, the output of encoding/json, of the first
// \ufffd escape (what encoding/json writes for an invalid UTF-8 byte; it writes a
// valid U+FFFD as itself), or -1.
func replacedText(data []byte) int {
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' || i+1 >= len(data) {
			continue
		}
		if data[i+1] == 'u' && i+6 <= len(data) && strings.EqualFold(string(data[i+2:i+6]), "fffd") {
			return i
		}
		i++ // the escaped byte: \\ must not start another escape
	}
	return -1
}

// Sum returns the fingerprint of bytes that are already canonical.
func Sum(canonical []byte) string {
	h := sha256.Sum256(canonical)
	return Prefix + hex.EncodeToString(h[:])
}

// Of returns the fingerprint of an effect given as JSON.
func Of(effect []byte) (string, error) {
	c, err := Canonicalize(effect)
	if err != nil {
		return "", err
	}
	return Sum(c), nil
}

// OfValue returns the fingerprint of v as encoding/json marshals it, without the
// volatile fields that drop names (see CanonicalizeWithout). A number of magnitude 2^53
// or more is refused with ErrInvalid, as the Python and TypeScript clients refuse it
// in a value: a float64 there may have lost digits already (json.Unmarshal into any
// reads 1234567890123456789 and 1234567890123456790 as one float64), and two
// operations on different identifiers would share a fingerprint, the second replaying
// the first's receipt. Send such identifiers as strings, or the effect as JSON text
// (json.RawMessage, fingerprinted as written). So is a string (or a map
// key) that is not valid UTF-8: encoding/json writes each invalid byte as U+FFFD, so
// that "a\xff" and "a\xfe" would share a fingerprint. (A json.Marshaler or
// json.RawMessage in v that escapes U+FFFD as \ufffd is refused too: it reads as that
// replacement; write U+FFFD as itself.)
func OfValue(v any, drop ...string) (string, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("fingerprint: marshal effect: %w", err)
	}
	if at := replacedText(data); at >= 0 {
		return "", &SyntaxError{Offset: at, Msg: "a string that is not valid UTF-8 (encoding/json wrote U+FFFD for its " +
			"invalid bytes, so different effects would share a fingerprint); pass text as valid UTF-8, and bytes encoded (base64, hex)"}
	}
	c, err := canonicalizeWithout(&parser{data: data, fromValue: true}, drop)
	if err != nil {
		return "", err
	}
	return Sum(c), nil
}

func splitPaths(drop []string) ([][]string, error) {
	paths := make([][]string, 0, len(drop))
	for _, d := range drop {
		segs := strings.Split(d, ".")
		for _, s := range segs {
			if s == "" {
				return nil, fmt.Errorf("%w: %q has an empty segment", ErrBadPath, d)
			}
		}
		paths = append(paths, segs)
	}
	return paths, nil
}

// drop removes the members that path names below v.
func (v *value) drop(path []string) {
	seg, rest := path[0], path[1:]
	switch v.kind {
	case kindObject:
		kept := v.members[:0]
		for _, m := range v.members {
			if seg != "*" && m.name != seg {
				kept = append(kept, m)
				continue
			}
			if len(rest) == 0 {
				continue
			}
			m.val.drop(rest)
			kept = append(kept, m)
		}
		v.members = kept
	case kindArray:
		if seg != "*" {
			return
		}
		if len(rest) == 0 {
			v.elems = v.elems[:0]
			return
		}
		for _, e := range v.elems {
			e.drop(rest)
		}
	}
}
