// Package jsonscan walks a JSON object's members without decoding them: it finds where
// each name and value begins and ends, so that a caller decodes only the members it
// wants, itself. The API's fast path for request bodies and the load generator's reading
// of answers both use it.
//
// It checks the object's outline (braces, member names, colons, commas, nothing after
// the object) and finds the extent of every value, following strings and their escapes
// and the brackets of nested values, but not the grammar inside them: a caller that
// takes a value decodes or checks it.
package jsonscan

// Object calls member with the name (the bytes between its quotes, as written, escapes
// and all) and the raw value of each member of the JSON object that is the whole of b
// but for whitespace, in order. It reports whether b is such an object and member
// returned true for every member; it stops at the first false.
func Object(b []byte, member func(name, value []byte) bool) bool {
	i := Space(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = Space(b, i+1)
	if i < len(b) && b[i] == '}' {
		return Space(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return false
		}
		end := StringEnd(b, i)
		if end < 0 {
			return false
		}
		name := b[i+1 : end-1]
		if i = Space(b, end); i >= len(b) || b[i] != ':' {
			return false
		}
		i = Space(b, i+1)
		if end = ValueEnd(b, i); end < 0 || !member(name, b[i:end]) {
			return false
		}
		switch i = Space(b, end); {
		case i < len(b) && b[i] == ',':
			i = Space(b, i+1)
		case i < len(b) && b[i] == '}':
			return Space(b, i+1) == len(b)
		default:
			return false
		}
	}
}

// Space returns the index of the first byte of b at or after i that is not JSON
// whitespace.
func Space(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// StringEnd returns the index just past the closing quote of the string that opens at
// b[i], or -1 if it never closes or holds a control character (JSON allows none
// unescaped).
func StringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '\\':
			j++
		case c == '"':
			return j + 1
		case c < 0x20:
			return -1
		}
	}
	return -1
}

// ValueEnd returns the index just past the value that starts at b[i], or -1: a
// string, an object or array (to its matching bracket), or a scalar (to the next
// delimiter or whitespace).
func ValueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return StringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end := StringEnd(b, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && !endsScalar(b[j]) {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

func endsScalar(c byte) bool {
	switch c {
	case ',', '}', ']', ' ', '\t', '\r', '\n':
		return true
	}
	return false
}
