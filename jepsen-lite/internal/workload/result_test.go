package workload

import (
	"bytes"
	"encoding/json"
	mrand "math/rand/v2"
	"strings"
	"testing"
)

// A result is valid JSON that the nodes' encoding (encoding/json's: compact, HTML
// escapes) leaves byte for byte as it is, so a replay must give back what the commit
// sent; and it holds what a canonicalization would rewrite.
func TestRandomResult(t *testing.T) {
	r := mrand.New(mrand.NewPCG(1, 2))
	for i := range 500 {
		raw := randomResult(r, "T-1")
		if !json.Valid(raw) {
			t.Fatalf("result %d is not JSON: %s", i, raw)
		}
		var c, h bytes.Buffer
		if err := json.Compact(&c, raw); err != nil {
			t.Fatal(err)
		}
		json.HTMLEscape(&h, c.Bytes())
		if !bytes.Equal(h.Bytes(), raw) {
			t.Fatalf("the nodes' encoding changes result %d:\n%s\n%s", i, raw, h.Bytes())
		}
		b, err := json.Marshal(struct {
			Result json.RawMessage `json:"result"`
		}{raw})
		if err != nil || !bytes.Contains(b, raw) {
			t.Fatalf("a request carrying result %d changes it: %s (%v)", i, b, err)
		}
		var v map[string]any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatal(err)
		}
		ticket, ok := v["ticket"].(map[string]any)
		if !ok || v["zid"] != "T-1" || ticket["n"] == nil || !strings.ContainsFunc(string(raw), func(c rune) bool { return c > 127 }) {
			t.Fatalf("result %d lacks nesting, a number or non-ASCII text: %s", i, raw)
		}
	}
}
