package fingerprint

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// formatNumber serializes a finite double as ECMAScript's Number::toString does
// (ECMA-262, section 6.1.6.1.20), which RFC 8785 section 3.2.2.3 adopts.
//
// ECMAScript asks for the shortest digit string s and exponent n such that
// s × 10^(n−k) rounds to the value, the closest one when several are shortest. That is
// exactly what strconv's shortest formatting produces; only the layout differs.
func formatNumber(f float64) string {
	if f == 0 {
		return "0" // both zeros
	}
	var b strings.Builder
	if f < 0 {
		b.WriteByte('-')
		f = -f
	}
	// "d.ddddde±xx": the digits and the exponent of the first digit.
	e := strconv.FormatFloat(f, 'e', -1, 64)
	mant, exp, _ := strings.Cut(e, "e")
	digits := strings.Replace(mant, ".", "", 1)
	x, _ := strconv.Atoi(exp)
	k := len(digits)
	n := x + 1 // the value is 0.digits × 10^n

	switch {
	case k <= n && n <= 21:
		// An integer below 10^21: all digits, then zeros.
		b.WriteString(digits)
		b.WriteString(strings.Repeat("0", n-k))
	case 0 < n && n <= 21:
		b.WriteString(digits[:n])
		b.WriteByte('.')
		b.WriteString(digits[n:])
	case -6 < n && n <= 0:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", -n))
		b.WriteString(digits)
	default:
		b.WriteByte(digits[0])
		if k > 1 {
			b.WriteByte('.')
			b.WriteString(digits[1:])
		}
		b.WriteByte('e')
		if n-1 >= 0 {
			b.WriteByte('+')
		} else {
			b.WriteByte('-')
			x = -x
		}
		b.WriteString(strconv.Itoa(x))
	}
	return b.String()
}

// sameDecimal reports whether two JSON number texts denote the same decimal value.
// RFC 8785 writes every number as the shortest form of the nearest double, so a
// literal whose value that form does not keep (9007199254740993 reads as
// 9007199254740992) would share its fingerprint with another effect; such literals are
// refused. Both zeros are one value, as JCS writes them both "0".
func sameDecimal(a, b string) bool {
	an, ad, ae, aok := decimalOf(a)
	bn, bd, be, bok := decimalOf(b)
	return aok && bok && ad == bd && (ad == "" || (an == bn && ae == be))
}

// decimalOf splits a JSON number text into its sign, its significant digits (no
// leading or trailing zeros; "" for zero) and the exponent e of 0.digits × 10^e. It
// reports false for an exponent too long to hold, which no double survives anyway.
func decimalOf(s string) (neg bool, digits string, exp int, ok bool) {
	s, neg = strings.CutPrefix(s, "-")
	mant, e, hasExp := strings.Cut(strings.ToLower(s), "e")
	whole, frac, _ := strings.Cut(mant, ".")
	digits = whole + frac
	exp = len(whole)
	for len(digits) > 0 && digits[0] == '0' {
		digits = digits[1:]
		exp--
	}
	digits = strings.TrimRight(digits, "0")
	if digits == "" {
		// Zero, whatever its exponent (0e99999999999 is 0 to every parser).
		return false, "", 0, true
	}
	if hasExp {
		x, err := strconv.Atoi(e)
		if err != nil || x > 1<<30 || x < -(1<<30) {
			return false, "", 0, false
		}
		exp += x
	}
	return neg, digits, exp, true
}

// MaxKeyDigits bounds the integers KeyText writes out: an identifier, not a quantity.
const MaxKeyDigits = 40

// KeyText is the text that names an operation when a key is made from the JSON number
// lit (the MCP gateway's key templates; the Python and TypeScript clients write a key
// argument that is a number the same way). Numbers that are equal are one text, and
// numbers that differ are two:
//
//   - an integer is its exact digits (17, 17.0, 1.7e1 and 170e-1 are all "17"; 1e21 is
//     "1000000000000000000000"; 12345678901234567891 keeps every digit), refused past
//     MaxKeyDigits digits;
//   - any other number is its RFC 8785 form ("0.5", "1.5e-7"), which always holds a
//     "." or an "e-", so it never reads as an integer; one whose digits its double does
//     not keep (0.10000000000000001, which reads as 0.1) is refused, as its fingerprint
//     is.
func KeyText(lit string) (string, error) {
	if lit == "" || (lit[0] != '-' && !isDigit(lit[0])) || !isDigit(lit[len(lit)-1]) {
		return "", fmt.Errorf("%w: %s is not a JSON number", ErrKeyText, strconv.Quote(lit))
	}
	if err := Check([]byte(lit)); err != nil {
		return "", fmt.Errorf("%w: %w", ErrKeyText, err)
	}
	neg, digits, exp, ok := decimalOf(lit)
	switch {
	case !ok:
		return "", fmt.Errorf("%w: the number %s has an exponent too large to hold", ErrKeyText, lit)
	case digits == "":
		return "0", nil
	case exp >= len(digits):
		if exp > MaxKeyDigits {
			return "", fmt.Errorf("%w: the number %s has more than %d digits: send it as a string", ErrKeyText, lit, MaxKeyDigits)
		}
		sign := ""
		if neg {
			sign = "-"
		}
		return sign + digits + strings.Repeat("0", exp-len(digits)), nil
	}
	c, err := Canonicalize([]byte(lit))
	if err != nil {
		return "", fmt.Errorf("%w: the number %s does not keep its digits in a double (send it as a string): %w", ErrKeyText, lit, err)
	}
	return string(c), nil
}

// ErrKeyText is wrapped by every error of KeyText.
var ErrKeyText = errors.New("fingerprint: no key text")

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
