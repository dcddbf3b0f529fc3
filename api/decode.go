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
func decodeJSON(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return idemkv.Invalid("", "the request body must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return describeDecodeError(body, reflect.TypeOf(v), err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return idemkv.Invalid("", "the request body must hold exactly one JSON object; more data follows it")
	}
	return nil
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
