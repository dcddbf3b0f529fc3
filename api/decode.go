package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/idemkv/idemkv"
)

// decode reads the body of r, at most idemkv.MaxRequestBytes, into v. It returns the
// raw bytes too: a follower forwards exactly what it received.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) ([]byte, error) {
	if r.ContentLength > idemkv.MaxRequestBytes {
		return nil, tooLarge(r.ContentLength)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, idemkv.MaxRequestBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge(-1)
		}
		return nil, idemkv.Errorf(idemkv.ErrInvalidArgument, "reading the request body: %v", err)
	}
	return body, decodeJSON(body, v)
}

func tooLarge(n int64) error {
	if n < 0 {
		return idemkv.Errorf(idemkv.ErrPayloadTooLarge, "the request body exceeds %d bytes", idemkv.MaxRequestBytes)
	}
	return idemkv.Errorf(idemkv.ErrPayloadTooLarge, "the request body is %d bytes; the limit is %d", n, idemkv.MaxRequestBytes)
}

// decodeJSON decodes exactly one JSON object from body into v, refusing unknown fields.
// Its errors are invalid_argument naming the field at fault wherever it can be known.
// Every request body goes through it, so it alone owns what a body may be.
func decodeJSON(body []byte, v any) error {
	if fastDecode(body, v) {
		return nil
	}
	return decodeGeneral(body, v)
}

// decodeGeneral is decodeJSON for any body: the checks of scanBody, then encoding/json.
func decodeGeneral(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return idemkv.Invalid("", "the request body must be a JSON object")
	}
	// encoding/json would rewrite invalid UTF-8 and lone surrogates to U+FFFD, so
	// that keys "inv\xff" and "inv\xfe" name one record, and a result would be stored
	// that no JSON parser reads back. Refuse them before decoding.
	named, err := scanBody(body)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return describeDecodeError(body, reflect.TypeOf(v), err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return idemkv.Invalid("", "the request body must hold exactly one JSON object; more data follows it")
	}
	return refuseExplicitZero(named, v)
}

// refuseExplicitZero refuses a time the body gives that decodes to the zero Timestamp,
// which the request types read as "not given": "expires_at":"1970-01-01T00:00:00Z"
// (or any instant in its first millisecond) used to get the default TTL. Every such
// time is decades outside any TTL range, so it is refused like one, naming the field.
func refuseExplicitZero(named bodyNames, v any) error {
	if q, ok := v.(*idemkv.ReserveRequest); ok && named.expiresAt && q.ExpiresAt == 0 {
		return idemkv.Invalid("expires_at", "expires_at %s is outside the TTL range (it is the zero time, which idemkv does not read as an expiry); "+
			"give a time within the TTL range from now, or leave expires_at out for the default TTL", idemkv.Timestamp(0))
	}
	return nil
}

// checkBody refuses, in one pass over the body, what encoding/json would accept but
// misread. Malformed JSON is left to the decoder to describe.
//
//   - Text that is not valid UTF-8, or that escapes a lone UTF-16 surrogate (\ud800
//     without its pair): encoding/json would rewrite both to U+FFFD, so that keys
//     "inv\xff" and "inv\xfe" name one record, and a result would be stored that no
//     JSON parser reads back.
//   - A member named twice at the top level, or in an object a request's struct
//     takes (approval, error): encoding/json lets the last one win, matching names
//     without regard to case, while a proxy in front may read the first;
//     {"tenant":"a","Tenant":"b"} must not mean two tenants to two readers, nor
//     {"approval":{"required":true,"Required":false}} an approval asked for to one.
//
// Every request body passes through here before encoding/json, so it is on the path
// of every write: it reads the body once and folds ASCII names without Unicode tables.
func checkBody(body []byte) error {
	_, err := scanBody(body)
	return err
}

// bodyNames says which of the top-level members that decodeJSON must know about, beyond
// what encoding/json tells it, a body names (as encoding/json matches names).
type bodyNames struct {
	expiresAt bool
}

// scanBody is checkBody, reporting the names too.
func scanBody(body []byte) (bodyNames, error) {
	if !utf8.Valid(body) {
		off := 0
		for off < len(body) {
			r, size := utf8.DecodeRune(body[off:])
			if r == utf8.RuneError && size <= 1 {
				break
			}
			off += size
		}
		field := memberAt(body, off)
		return bodyNames{}, idemkv.Invalid(field, "%s is not valid UTF-8 (byte %d of the body)", orBody(field), off)
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	object := len(trimmed) > 0 && trimmed[0] == '{'
	var (
		folded [256]byte
		ends   [memberNamesLinear]int
		raw    [memberNamesLinear][]byte
	)
	names := memberNames{folded: folded[:0], ends: ends[:0], raw: raw[:0]}
	// The object that is the value of the last top-level member, when encoding/json
	// decodes it into a struct as well (approval, error): its names are checked the
	// same way. Raw members (effect, result) keep what they hold, and the fingerprint
	// refuses a name twice in an effect; a name cased two ways there is two names.
	var (
		lastTop []byte // folded, in names.folded
		nested  *memberNames
	)
	depth := 0
	for i := 0; i < len(body); i++ {
		switch body[i] {
		case '{', '[':
			depth++
			if object && depth == 2 && body[i] == '{' && string(lastTop) != foldedEffect && string(lastTop) != foldedResult {
				nested = &memberNames{}
			}
		case '}', ']':
			depth--
			if depth < 2 {
				nested = nil
			}
		case '"':
			end, escaped, err := scanString(body, i)
			if err != nil || end < 0 {
				return bodyNames{}, err // end < 0: the string never ends, which the decoder reports
			}
			if object && depth == 1 && followedByColon(body, end+1) {
				before := len(names.folded)
				if err := names.add(body[i+1:end], escaped); err != nil {
					return bodyNames{}, err
				}
				lastTop = names.folded[before:]
			}
			if nested != nil && depth == 2 && followedByColon(body, end+1) {
				if err := nested.add(body[i+1:end], escaped); err != nil {
					return bodyNames{}, err
				}
			}
			i = end
		}
	}
	return names.named, nil
}

// The raw members of requests, folded as memberNames folds.
const (
	foldedEffect = "EFFECT"
	foldedResult = "RESULT"
)

// scanString reads the JSON string whose opening quote is at body[start] and returns
// the index of its closing quote (-1 if there is none) and whether it holds an escape.
// It refuses an escaped lone surrogate.
func scanString(body []byte, start int) (end int, escaped bool, err error) {
	for i := start + 1; i < len(body); i++ {
		switch body[i] {
		case '"':
			return i, escaped, nil
		case '\\':
			escaped = true
			if i+1 >= len(body) {
				return -1, true, nil
			}
			if body[i+1] != 'u' {
				i++ // a one-character escape, \" included
				continue
			}
			r1, ok := hex4(body, i+2)
			if !ok || !utf16.IsSurrogate(r1) {
				i++
				continue
			}
			// A high surrogate must be followed by an escaped low one.
			if r1 < 0xdc00 && i+11 < len(body) && body[i+6] == '\\' && body[i+7] == 'u' {
				if r2, ok := hex4(body, i+8); ok && r2 >= 0xdc00 && r2 <= 0xdfff {
					i += 11
					continue
				}
			}
			field := memberAt(body, i)
			return 0, true, idemkv.Invalid(field, "%s escapes a lone UTF-16 surrogate (byte %d of the body), which has no UTF-8 form", orBody(field), i)
		}
	}
	return -1, escaped, nil
}

// followedByColon says whether the next byte of body from i that is not JSON
// whitespace is a colon: the string before it was a member name.
func followedByColon(body []byte, i int) bool {
	for ; i < len(body); i++ {
		switch body[i] {
		case ' ', '\t', '\r', '\n':
			continue
		case ':':
			return true
		}
		return false
	}
	return false
}

// memberAt names the top-level member whose value holds byte off of body, or "".
func memberAt(body []byte, off int) string {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		name, _ := tok.(string)
		if int(dec.InputOffset()) > off {
			return name // the byte is in the name itself
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return ""
		}
		if int(dec.InputOffset()) > off {
			return name
		}
	}
	return ""
}

func orBody(field string) string {
	if field == "" {
		return "the request body"
	}
	return field
}

func hex4(b []byte, at int) (rune, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[at:at+4]), 16, 32)
	return rune(n), err == nil
}

// memberNames holds the top-level member names seen so far, folded as encoding/json
// matches them, and refuses one that repeats. A few names (every request has) are
// compared in a slice; a hostile body with many gets a map.
type memberNames struct {
	folded []byte // the folded names, end to end
	ends   []int  // where each folded name ends in folded
	raw    [][]byte
	byName map[string]int
	named  bodyNames
}

// foldedExpiresAt is "expires_at" folded as memberNames folds (every letter's orbit
// has its upper case as its smallest rune).
const foldedExpiresAt = "EXPIRES_AT"

const memberNamesLinear = 32

func (m *memberNames) add(raw []byte, escaped bool) error {
	start := len(m.folded)
	if !escaped && isASCII(raw) {
		for _, c := range raw {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			m.folded = append(m.folded, c)
		}
	} else {
		name, ok := unquoteName(raw, escaped)
		if !ok {
			return nil // a malformed name: the decoder describes it
		}
		m.folded = append(m.folded, foldName(name)...)
	}
	key := m.folded[start:]
	if string(key) == foldedExpiresAt {
		m.named.expiresAt = true
	}
	first := -1
	if m.byName != nil {
		if j, dup := m.byName[string(key)]; dup {
			first = j
		}
	} else {
		prev := 0
		for j, end := range m.ends {
			if bytes.Equal(m.folded[prev:end], key) {
				first = j
				break
			}
			prev = end
		}
	}
	if first >= 0 {
		name, _ := unquoteName(raw, escaped)
		firstName, _ := unquoteName(m.raw[first], true)
		return idemkv.Invalid(name, "member %q appears twice in the request body (as %q and %q)", name, firstName, name)
	}
	m.ends = append(m.ends, len(m.folded))
	m.raw = append(m.raw, raw)
	switch {
	case m.byName != nil:
		m.byName[string(key)] = len(m.ends) - 1
	case len(m.ends) > memberNamesLinear:
		m.byName = make(map[string]int, 2*len(m.ends))
		prev := 0
		for j, end := range m.ends {
			m.byName[string(m.folded[prev:end])] = j
			prev = end
		}
	}
	return nil
}

func isASCII(b []byte) bool {
	for _, c := range b {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// unquoteName decodes the text between a name's quotes.
func unquoteName(raw []byte, escaped bool) (string, bool) {
	if !escaped {
		return string(raw), true
	}
	quoted := make([]byte, 0, len(raw)+2)
	quoted = append(append(append(quoted, '"'), raw...), '"')
	var name string
	if err := json.Unmarshal(quoted, &name); err != nil {
		return "", false
	}
	return name, true
}

// foldName maps every rune to the smallest of its Unicode case-folding orbit, so that
// two names are equal under it exactly when bytes.EqualFold, which encoding/json
// matches field names with, says so ("K", "k" and the Kelvin sign are one letter).
func foldName(name string) string {
	var b strings.Builder
	for _, r := range name {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}

func describeDecodeError(body []byte, t reflect.Type, err error) error {
	// Type assertions, not errors.As: an UnmarshalTypeError wrapped by a field's own
	// UnmarshalJSON (a timestamp given as a number) carries no field, and the search
	// below names it better.
	if syn, ok := err.(*json.SyntaxError); ok {
		return idemkv.Invalid("", "malformed JSON at byte %d: %v", syn.Offset, syn)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return idemkv.Invalid("", "malformed JSON: the body ends inside a value")
	}
	if typ, ok := err.(*json.UnmarshalTypeError); ok {
		if typ.Field == "" {
			return idemkv.Invalid("", "the request body must be a JSON object, not %s", typ.Value)
		}
		return idemkv.Invalid(typ.Field, "%s must be %s, not %s", typ.Field, jsonKind(typ.Type), typ.Value)
	}
	// What is left is an unknown field (DisallowUnknownFields reports it as a plain
	// error) or the error of a field's own UnmarshalJSON: find the member by decoding
	// the body member by member.
	field, unknown := fieldAtFault(body, t, "")
	switch {
	case unknown:
		return idemkv.Invalid(field, "unknown field %q", field)
	case field != "":
		return idemkv.Invalid(field, "%s: %v", field, err)
	}
	return idemkv.Invalid("", "malformed request body: %v", err)
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// fieldAtFault walks the JSON object data in document order, as encoding/json does, and
// returns the dotted path of the first member that t has no field for (unknown true)
// or whose value does not decode into its field. It returns "" when it finds nothing.
func fieldAtFault(data []byte, t reflect.Type, prefix string) (field string, unknown bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || reflect.PointerTo(t).Implements(unmarshalerType) {
		return "", false
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		name, _ := tok.(string)
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return "", false
		}
		path := prefix + name
		ft, ok := jsonFieldType(t, name)
		if !ok {
			return path, true
		}
		if f, unk := fieldAtFault(value, ft, path+"."); f != "" {
			return f, unk
		}
		if err := json.Unmarshal(value, reflect.New(ft).Interface()); err != nil {
			return path, false
		}
	}
	return "", false
}

// jsonFieldType finds the field of struct t that encoding/json decodes the member name
// into, matching names case-insensitively as encoding/json does.
func jsonFieldType(t reflect.Type, name string) (reflect.Type, bool) {
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		tag, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		switch tag {
		case "-":
			continue
		case "":
			tag = sf.Name
		}
		if strings.EqualFold(tag, name) {
			return sf.Type, true
		}
	}
	return nil, false
}

// jsonKind names what JSON value a Go type takes, for error messages.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return fmt.Sprintf("an integer between 0 and %d", uint64(math.MaxUint64)>>(64-t.Bits()))
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "a value of type " + t.String()
}

func parseQuery(r *http.Request) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, idemkv.Invalid("", "malformed query string: %v", err)
	}
	return q, nil
}

// waitParam reads wait_ms. It checks the range before converting, because a huge
// number of milliseconds would overflow a time.Duration into a valid-looking one.
func waitParam(q url.Values) (time.Duration, error) {
	v := q.Get("wait_ms")
	if v == "" {
		return 0, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 || ms > idemkv.MaxWait.Milliseconds() {
		return 0, idemkv.Invalid("wait_ms", "wait_ms must be an integer between 0 and %d", idemkv.MaxWait.Milliseconds())
	}
	return time.Duration(ms) * time.Millisecond, nil
}

func limitParam(q url.Values) (int, error) {
	v := q.Get("limit")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, idemkv.Invalid("limit", "limit must be an integer between 1 and %d", idemkv.MaxListLimit)
	}
	return n, nil
}

// inDoubtParam reads in_doubt (true: list only the records marked in doubt).
func inDoubtParam(q url.Values) (bool, error) { return boolParam(q, "in_doubt") }

// boolParam reads a flag of the query: absent or "false", or "true"; anything else
// is a 400 naming it.
func boolParam(q url.Values, name string) (bool, error) {
	switch q.Get(name) {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	}
	return false, idemkv.Invalid(name, "%s must be true or false", name)
}

// pageParams reads what every list shares: where the page starts (after), its size
// (limit) and whether it may be read stale (consistency).
func pageParams(q url.Values) (after string, limit int, stale bool, err error) {
	after = q.Get("after")
	if limit, err = limitParam(q); err == nil {
		stale, err = staleParam(q)
	}
	return after, limit, stale, err
}

// staleParam reads the consistency of a list, with the values and the default of a get.
func staleParam(q url.Values) (bool, error) {
	switch idemkv.Consistency(q.Get("consistency")) {
	case "", idemkv.Linearizable:
		return false, nil
	case idemkv.Stale:
		return true, nil
	}
	return false, idemkv.Invalid("consistency", "consistency must be linearizable or stale")
}
