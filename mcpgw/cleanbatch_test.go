package mcpgw

import (
	"encoding/json"
	"fmt"
	"testing"
)

// A batch (which the go-sdk takes from a 2025-era client) is no way around the check:
// every tools/call in a batch that is not clean is refused, with its id.
func TestUncleanBatchIsRefused(t *testing.T) {
	call := func(id int, key string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"t","arguments":{},"_meta":{"io.idemkv/idempotency_key":"%s"}}}`, id, key)
	}
	note := "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":1,\"reason\":\"x\xff\"}}"
	for name, tc := range map[string]struct {
		batch string
		ids   []string
	}{
		"one unclean call":              {batch: "[" + call(1, "k\xff") + "]", ids: []string{"1"}},
		"an unclean and a clean call":   {batch: "[" + call(1, "k\xfe") + "," + call(2, "k2") + "]", ids: []string{"1", "2"}},
		"a name twice":                  {batch: `[{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"t","name":"u"}}]`, ids: []string{"3"}},
		"a ping beside an unclean call": {batch: "[" + call(1, "k\xff") + `,{"jsonrpc":"2.0","id":9,"method":"ping"}]`, ids: []string{"1", "9"}},
		"a clean batch":                 {batch: "[" + call(1, "k1") + "," + call(2, "k2") + "]"},
		"an unclean notification":       {batch: "[" + note + "]"},
	} {
		ans := uncleanAnswer([]byte(tc.batch))
		if tc.ids == nil {
			if ans != nil {
				t.Errorf("%s: answered %s, want it passed on", name, ans)
			}
			continue
		}
		var got []struct {
			ID    json.RawMessage     `json:"id"`
			Error *struct{ Code int } `json:"error"`
		}
		if err := json.Unmarshal(ans, &got); err != nil || len(got) != len(tc.ids) {
			t.Errorf("%s: answered %s, want an error for each of %v", name, ans, tc.ids)
			continue
		}
		for i, a := range got {
			if a.Error == nil || a.Error.Code != -32602 || string(a.ID) != tc.ids[i] {
				t.Errorf("%s: answer %d = %+v, want invalid params for id %s", name, i, a, tc.ids[i])
			}
		}
	}
}
