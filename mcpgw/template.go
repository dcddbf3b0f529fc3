package mcpgw

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/idemkv/idemkv/fingerprint"
)

// ErrTemplate is wrapped by errors about a key or probe template: one that does not
// parse, or a placeholder a call cannot fill.
var ErrTemplate = errors.New("mcpgw: template")

// Template is a key or argument template: literal text with placeholders in braces,
// "{tenant}:{incident_id}:create_ticket". A placeholder is
//
//   - {tenant}: the call's tenant;
//   - {tool}: the tool's name;
//   - {name} or {a.b.c}: an argument, by dot path into the arguments object;
//   - {arguments.name}: an argument, even one called tenant or tool.
//
// "{{" and "}}" stand for literal braces. An argument must be a string, a number or a
// boolean: objects, arrays and null cannot name an operation. A number is written
// as fingerprint.KeyText writes it: 17, 17.0 and 1.7e1 are all "17", so that one order
// named by an equal number never makes two keys.
type Template struct {
	src   string
	parts []tmplPart
}

type tmplPart struct {
	lit  string
	name string // "" for a literal
}

// ParseTemplate parses src.
func ParseTemplate(src string) (*Template, error) {
	t := &Template{src: src}
	var lit strings.Builder
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch {
		case c == '{' && i+1 < len(src) && src[i+1] == '{':
			lit.WriteByte('{')
			i++
		case c == '}' && i+1 < len(src) && src[i+1] == '}':
			lit.WriteByte('}')
			i++
		case c == '{':
			end := strings.IndexByte(src[i+1:], '}')
			if end < 0 {
				return nil, fmt.Errorf("%w %q: unclosed {", ErrTemplate, src)
			}
			name := strings.TrimSpace(src[i+1 : i+1+end])
			if err := validPath(name); err != nil {
				return nil, fmt.Errorf("%w %q: %w", ErrTemplate, src, err)
			}
			if lit.Len() > 0 {
				t.parts = append(t.parts, tmplPart{lit: lit.String()})
				lit.Reset()
			}
			t.parts = append(t.parts, tmplPart{name: name})
			i += end + 1
		case c == '}':
			return nil, fmt.Errorf("%w %q: lone } (write }} for a literal brace)", ErrTemplate, src)
		default:
			lit.WriteByte(c)
		}
	}
	if lit.Len() > 0 {
		t.parts = append(t.parts, tmplPart{lit: lit.String()})
	}
	return t, nil
}

// String returns the template as written.
func (t *Template) String() string { return t.src }

// single returns the placeholder when the template is nothing but one placeholder, so
// that a probe argument keeps the argument's JSON type.
func (t *Template) single() (string, bool) {
	if len(t.parts) == 1 && t.parts[0].name != "" {
		return t.parts[0].name, true
	}
	return "", false
}

// scope is what placeholders are filled from.
type scope struct {
	tenant string
	tool   string
	args   any // decoded with UseNumber
}

func (s scope) lookup(name string) (any, error) {
	switch {
	case name == "tenant":
		return s.tenant, nil
	case name == "tool":
		return s.tool, nil
	}
	v, ok := lookupPath(s.args, strings.TrimPrefix(name, "arguments."))
	if !ok {
		return nil, fmt.Errorf("%w: the call has no argument %q", ErrTemplate, name)
	}
	return v, nil
}

// Expand fills the placeholders.
func (t *Template) expand(s scope) (string, error) {
	var b strings.Builder
	for _, p := range t.parts {
		if p.name == "" {
			b.WriteString(p.lit)
			continue
		}
		v, err := s.lookup(p.name)
		if err != nil {
			return "", err
		}
		str, err := templateText(v)
		if err != nil {
			return "", fmt.Errorf("%w: argument %q: %w", ErrTemplate, p.name, err)
		}
		b.WriteString(str)
	}
	return b.String(), nil
}

// value fills the template as a JSON value: a lone placeholder keeps its type.
func (t *Template) value(s scope) (any, error) {
	if name, ok := t.single(); ok {
		return s.lookup(name)
	}
	return t.expand(s)
}

// templateText is an argument as a template writes it: scalarString, with a number as
// fingerprint.KeyText writes it.
func templateText(v any) (string, error) {
	n, ok := v.(json.Number)
	if !ok {
		return scalarString(v)
	}
	return fingerprint.KeyText(string(n))
}

// scalarString is a string, number or boolean as text, a number as it was written.
func scalarString(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case json.Number:
		return v.String(), nil
	case bool:
		return strconv.FormatBool(v), nil
	case nil:
		return "", errors.New("is null")
	default:
		return "", errors.New("is not a string, number or boolean")
	}
}

func validPath(p string) error {
	if p == "" {
		return errors.New("empty placeholder")
	}
	for _, seg := range strings.Split(p, ".") {
		if seg == "" {
			return fmt.Errorf("placeholder %q has an empty segment", p)
		}
	}
	return nil
}

// lookupPath follows a dot path through JSON objects.
func lookupPath(v any, path string) (any, bool) {
	if path == "" {
		return v, true
	}
	for _, seg := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[seg]; !ok {
			return nil, false
		}
	}
	return v, true
}

// truthy is JavaScript's idea of truth, which is what a "found" field in a probe's
// answer usually means: present, not false, not zero, not empty.
func truthy(v any) bool {
	switch v := v.(type) {
	case nil:
		return false
	case bool:
		return v
	case string:
		return v != ""
	case json.Number:
		f, err := v.Float64()
		return err != nil || f != 0
	case float64:
		return v != 0
	case []any:
		return len(v) > 0
	case map[string]any:
		return len(v) > 0
	}
	return true
}
