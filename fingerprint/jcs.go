package fingerprint

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

type kind uint8

const (
	kindNull kind = iota
	kindTrue
	kindFalse
	kindNumber
	kindString
	kindArray
	kindObject
)

// value is a parsed JSON value. Numbers hold their canonical text already, strings
// their decoded content: equal values always serialize to equal bytes.
type value struct {
	kind    kind
	text    string
	elems   []*value
	members []member
}

type member struct {
	name string
	val  *value
}

type parser struct {
	data []byte
	pos  int
	// anyNumber takes every number the grammar allows as it is written, without
	// the round trip through a double (Check).
	anyNumber bool
	// fromValue refuses every number of magnitude 2^53 or more (OfValue): such a
	// number may be a double that already lost digits before it was marshaled.
	fromValue bool
}

func parse(data []byte) (*value, error) {
	return (&parser{data: data}).all()
}

// maxExactInteger is 2^53: every integer below it in magnitude is exactly one double;
// from it on, neighbouring integers share one.
const maxExactInteger = 1 << 53

func (p *parser) all() (*value, error) {
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.data) {
		return nil, p.errorf("unexpected data after the value")
	}
	return v, nil
}

func (p *parser) errorf(msg string) error {
	return &SyntaxError{Offset: p.pos, Msg: msg}
}

// skipSpace skips the four whitespace bytes of RFC 8259, nothing else.
func (p *parser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) value(depth int) (*value, error) {
	if p.pos >= len(p.data) {
		return nil, p.errorf("unexpected end of input")
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		s, err := p.string()
		if err != nil {
			return nil, err
		}
		return &value{kind: kindString, text: s}, nil
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case c == 't':
		return p.literal("true", kindTrue)
	case c == 'f':
		return p.literal("false", kindFalse)
	case c == 'n':
		return p.literal("null", kindNull)
	default:
		return nil, p.errorf("invalid character " + strconv.QuoteRune(rune(c)))
	}
}

func (p *parser) literal(word string, k kind) (*value, error) {
	if len(p.data)-p.pos < len(word) || string(p.data[p.pos:p.pos+len(word)]) != word {
		return nil, p.errorf("invalid literal")
	}
	p.pos += len(word)
	return &value{kind: k}, nil
}

func (p *parser) array(depth int) (*value, error) {
	if depth > MaxDepth {
		return nil, p.errorf("nesting too deep")
	}
	p.pos++ // [
	v := &value{kind: kindArray}
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return v, nil
	}
	for {
		p.skipSpace()
		e, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		v.elems = append(v.elems, e)
		p.skipSpace()
		if p.pos >= len(p.data) {
			return nil, p.errorf("unterminated array")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return v, nil
		default:
			return nil, p.errorf("expected , or ] in array")
		}
	}
}

func (p *parser) object(depth int) (*value, error) {
	if depth > MaxDepth {
		return nil, p.errorf("nesting too deep")
	}
	p.pos++ // {
	v := &value{kind: kindObject}
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return v, nil
	}
	seen := make(map[string]struct{})
	for {
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return nil, p.errorf("expected a member name")
		}
		at := p.pos
		name, err := p.string()
		if err != nil {
			return nil, err
		}
		// Names are compared after unescaping: "a" and "\u0061" are the same member.
		if _, dup := seen[name]; dup {
			return nil, &SyntaxError{Offset: at, Msg: "duplicate member name " + strconv.Quote(name)}
		}
		seen[name] = struct{}{}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return nil, p.errorf("expected : after a member name")
		}
		p.pos++
		p.skipSpace()
		val, err := p.value(depth)
		if err != nil {
			return nil, err
		}
		v.members = append(v.members, member{name: name, val: val})
		p.skipSpace()
		if p.pos >= len(p.data) {
			return nil, p.errorf("unterminated object")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return v, nil
		default:
			return nil, p.errorf("expected , or } in object")
		}
	}
}

// string decodes a JSON string starting at its opening quote. It rejects what
// I-JSON (RFC 7493) forbids and encoding/json silently replaces: invalid UTF-8 and
// escaped surrogates that do not form a pair.
func (p *parser) string() (string, error) {
	p.pos++ // "
	buf := make([]byte, 0, 16)
	for {
		if p.pos >= len(p.data) {
			return "", p.errorf("unterminated string")
		}
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.pos++
			return string(buf), nil
		case c < 0x20:
			return "", p.errorf("control character in string")
		case c == '\\':
			r, err := p.escape()
			if err != nil {
				return "", err
			}
			buf = utf8.AppendRune(buf, r)
		case c < utf8.RuneSelf:
			buf = append(buf, c)
			p.pos++
		default:
			r, size := utf8.DecodeRune(p.data[p.pos:])
			if r == utf8.RuneError && size == 1 {
				return "", p.errorf("invalid UTF-8 in string")
			}
			buf = append(buf, p.data[p.pos:p.pos+size]...)
			p.pos += size
		}
	}
}

func (p *parser) escape() (rune, error) {
	if p.pos+1 >= len(p.data) {
		return 0, p.errorf("unterminated escape")
	}
	c := p.data[p.pos+1]
	p.pos += 2
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
	default:
		p.pos -= 2
		return 0, p.errorf("invalid escape")
	}
	at := p.pos - 2
	hi, ok := p.hex4()
	if !ok {
		return 0, p.errorf("invalid \\u escape")
	}
	switch {
	case utf16.IsSurrogate(hi) && hi < 0xDC00:
		if p.pos+1 < len(p.data) && p.data[p.pos] == '\\' && p.data[p.pos+1] == 'u' {
			p.pos += 2
			lo, ok := p.hex4()
			if !ok {
				return 0, p.errorf("invalid \\u escape")
			}
			if r := utf16.DecodeRune(hi, lo); r != utf8.RuneError {
				return r, nil
			}
		}
		return 0, &SyntaxError{Offset: at, Msg: "lone high surrogate"}
	case utf16.IsSurrogate(hi):
		return 0, &SyntaxError{Offset: at, Msg: "lone low surrogate"}
	}
	return hi, nil
}

func (p *parser) hex4() (rune, bool) {
	if len(p.data)-p.pos < 4 {
		return 0, false
	}
	var r rune
	for _, c := range p.data[p.pos : p.pos+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	p.pos += 4
	return r, true
}

// number checks the RFC 8259 grammar (which strconv does not: it takes "0x1p3",
// "inf", "1_000") and converts the literal to its canonical text.
func (p *parser) number() (*value, error) {
	start := p.pos
	d := p.data
	if p.pos < len(d) && d[p.pos] == '-' {
		p.pos++
	}
	switch {
	case p.pos < len(d) && d[p.pos] == '0':
		p.pos++
	case p.pos < len(d) && d[p.pos] >= '1' && d[p.pos] <= '9':
		p.digits()
	default:
		return nil, p.errorf("invalid number")
	}
	if p.pos < len(d) && d[p.pos] == '.' {
		p.pos++
		if p.digits() == 0 {
			return nil, p.errorf("invalid number: no digits after the decimal point")
		}
	}
	if p.pos < len(d) && (d[p.pos] == 'e' || d[p.pos] == 'E') {
		p.pos++
		if p.pos < len(d) && (d[p.pos] == '+' || d[p.pos] == '-') {
			p.pos++
		}
		if p.digits() == 0 {
			return nil, p.errorf("invalid number: no digits in the exponent")
		}
	}
	if p.anyNumber {
		return &value{kind: kindNumber, text: string(d[start:p.pos])}, nil
	}
	f, err := strconv.ParseFloat(string(d[start:p.pos]), 64)
	if err != nil {
		// The grammar was checked, so the only failure left is overflow to ±Inf,
		// which has no JSON form. Underflow rounds to zero, as in ECMAScript.
		return nil, &SyntaxError{Offset: start, Msg: "number out of the range of a double"}
	}
	lit := string(d[start:p.pos])
	if p.fromValue && math.Abs(f) >= maxExactInteger {
		return nil, &SyntaxError{Offset: start, Msg: fmt.Sprintf(
			"number %s is 2^53 or more in magnitude, where a float64 holds only some integers: decoded into one "+
				"(json.Unmarshal into any), two different identifiers read alike and would share a fingerprint; "+
				"send it as a string, or the whole effect as JSON text (Op.Effect a json.RawMessage)", lit)}
	}
	text := formatNumber(f)
	if !sameDecimal(lit, text) {
		return nil, &SyntaxError{Offset: start, Msg: fmt.Sprintf(
			"number %s does not survive a round trip through an IEEE 754 double (it would read as %s), "+
				"so two different effects could share a fingerprint; send it as a string", lit, text)}
	}
	return &value{kind: kindNumber, text: text}, nil
}

func (p *parser) digits() int {
	n := 0
	for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
		p.pos++
		n++
	}
	return n
}

func (v *value) appendTo(b []byte) []byte {
	switch v.kind {
	case kindNull:
		return append(b, "null"...)
	case kindTrue:
		return append(b, "true"...)
	case kindFalse:
		return append(b, "false"...)
	case kindNumber:
		return append(b, v.text...)
	case kindString:
		return appendString(b, v.text)
	case kindArray:
		b = append(b, '[')
		for i, e := range v.elems {
			if i > 0 {
				b = append(b, ',')
			}
			b = e.appendTo(b)
		}
		return append(b, ']')
	default:
		members := slices.Clone(v.members)
		slices.SortFunc(members, func(x, y member) int { return compareUTF16(x.name, y.name) })
		b = append(b, '{')
		for i, m := range members {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, m.name)
			b = append(b, ':')
			b = m.val.appendTo(b)
		}
		return append(b, '}')
	}
}

const hexDigits = "0123456789abcdef"

// appendString writes s with the escaping of RFC 8785 section 3.2.2.2: the two
// mandatory escapes, the five short control escapes, \u00xx for the other controls,
// and every other character as itself (no "\/", no escaped U+2028, no HTML escapes).
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			b = append(b, '\\', '"')
		case '\\':
			b = append(b, '\\', '\\')
		case '\b':
			b = append(b, '\\', 'b')
		case '\f':
			b = append(b, '\\', 'f')
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		default:
			if c < 0x20 {
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			} else {
				b = append(b, c)
			}
		}
	}
	return append(b, '"')
}

// compareUTF16 orders member names by their UTF-16 code units, as RFC 8785 section
// 3.2.3 requires. It differs from byte (code point) order only when a character
// above U+FFFF meets one in U+E000–U+FFFF: the former's high surrogate sorts first.
func compareUTF16(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			ua, ub := firstUnit(ra), firstUnit(rb)
			if ua != ub {
				return int(ua) - int(ub)
			}
			// Same high surrogate: the low surrogates order as the runes do.
			return int(ra) - int(rb)
		}
		a, b = a[na:], b[nb:]
	}
	return len(a) - len(b)
}

func firstUnit(r rune) rune {
	if r >= 0x10000 {
		hi, _ := utf16.EncodeRune(r)
		return hi
	}
	return r
}
