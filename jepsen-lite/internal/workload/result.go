package workload

import (
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strings"
)

// The receipts the workloads commit carry a result and a remote URL, so that the
// checkers can hold every replay to the bytes first acknowledged: a result dropped,
// cut or re-encoded on some path (a follower's local replay, a snapshot restore, a
// fast encoder) is another digest in the history.
//
// A result is compact JSON that any canonicalization would change: members out of
// order, numbers written as no encoder writes them (1.50, 2E+3, -0, integers past
// 2^53), escapes where a literal would do (\u00e9, \/), and multi-byte UTF-8 from two
// to four bytes. It holds none of <, >, &, U+2028 and U+2029, which the nodes escape as
// encoding/json does (the same JSON text, other bytes), so what a commit sends is
// exactly what every answer must give back.

// resultStrings are the string values a result draws from: each is already JSON text
// (the inside of a string literal).
var resultStrings = []string{
	`Zürich`, `日本語のチケット`, `naïve café ✓`, `🎫 ticket 🧾`, `\u00e9t\u00e9`, `line\nbreak\ttab`,
	`quote \" backslash \\ slash \/`, `plain`, `Ωμέγα`, `\ud83d\ude00 escaped pair`,
}

var resultKeys = []string{"z", "ticket", "état", "a", "items", "meta", "n", "Ω", "owner", "b2", "amount", "tags"}

// resultNumber returns a JSON number in one of the forms an encoder would rewrite.
func resultNumber(r *mrand.Rand) string {
	switch r.IntN(7) {
	case 0:
		return fmt.Sprint(r.Int64N(2_000_000) - 1_000_000)
	case 1:
		return fmt.Sprintf("%d.%d0", r.IntN(1000), r.IntN(10))
	case 2:
		return fmt.Sprintf("%dE+%d", 1+r.IntN(9), 1+r.IntN(20))
	case 3:
		return fmt.Sprintf("%de-%d", 1+r.IntN(9), 1+r.IntN(9))
	case 4:
		return "-0"
	case 5:
		return fmt.Sprint(uint64(1)<<53 + 1 + r.Uint64N(1<<40))
	default:
		return fmt.Sprintf("0.%03d", r.IntN(1000))
	}
}

// resultValue appends a random JSON value at most depth levels deep.
func resultValue(b *strings.Builder, r *mrand.Rand, depth int) {
	n := r.IntN(7)
	if depth <= 0 {
		n = 2 + r.IntN(5)
	}
	switch n {
	case 0:
		resultObject(b, r, depth-1, nil)
	case 1:
		b.WriteByte('[')
		for i := range 1 + r.IntN(3) {
			if i > 0 {
				b.WriteByte(',')
			}
			resultValue(b, r, depth-1)
		}
		b.WriteByte(']')
	case 2, 3:
		b.WriteString(`"` + resultStrings[r.IntN(len(resultStrings))] + `"`)
	case 4, 5:
		b.WriteString(resultNumber(r))
	default:
		b.WriteString([]string{"true", "false", "null"}[r.IntN(3)])
	}
}

// resultObject appends an object of one to four members in random order, after the
// members given first.
func resultObject(b *strings.Builder, r *mrand.Rand, depth int, first [][2]string) {
	b.WriteByte('{')
	for i, m := range first {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"` + m[0] + `":` + m[1])
	}
	written, want := len(first), len(first)+1+r.IntN(4)
	for _, k := range r.Perm(len(resultKeys)) {
		if written == want {
			break
		}
		if slices.ContainsFunc(first, func(m [2]string) bool { return m[0] == resultKeys[k] }) {
			continue // member names are unique: a node refuses duplicates
		}
		if written > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"` + resultKeys[k] + `":`)
		resultValue(b, r, depth)
		written++
	}
	b.WriteByte('}')
}

// randomResult is a result for the receipt of remoteID: always an object nested at
// least two deep, with a number and a non-ASCII string in it.
func randomResult(r *mrand.Rand, remoteID string) json.RawMessage {
	var inner strings.Builder
	resultObject(&inner, r, 2, [][2]string{
		{"n", resultNumber(r)},
		{"title", `"` + resultStrings[r.IntN(4)] + `"`},
	})
	var b strings.Builder
	resultObject(&b, r, 1, [][2]string{{"zid", `"` + remoteID + `"`}, {"ticket", inner.String()}})
	return json.RawMessage(b.String())
}

// remoteURL is a URL for the receipt of remoteID, with a path, a query and a fragment.
func remoteURL(r *mrand.Rand, system, remoteID string) string {
	return fmt.Sprintf("https://%s.example/t/%s?view=%d&lang=de-CH#c%d", system, remoteID, r.IntN(100), r.IntN(1000))
}
