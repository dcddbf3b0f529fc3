package mcpgw_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/idemkv/idemkv/internal/testcluster"
)

// The actor of a 2026-07-28 request is its own clientInfo: the era has no session, so
// each request names its client, and a derived key is the caller's. Over stdio the
// go-sdk keeps the first request's clientInfo as the session's, and the gateway read
// the actor there: a second client's identical call in the window got the first
// client's derived key, and with it the first client's result, its tool not run.
func TestEachModernRequestIsItsOwnClientsCall(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newGoUpstream(false)
	g := newGW(t, cluster, up.inMemory(t), gwOptions{policy: "tenant: actors\ntools:\n  place_order: {key: derive}\n"})
	w, r := stdioGateway(t, g.gw)
	lines := bufio.NewScanner(r)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	call := func(id int, client string) map[string]any {
		t.Helper()
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"place_order","arguments":{"order_id":"a-1","amount":5,"currency":"EUR"},`+
			`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":%q,"version":"1"},`+
			`"io.modelcontextprotocol/clientCapabilities":{}}}}`+"\n", id, client)
		for lines.Scan() {
			var msg struct {
				ID     int            `json:"id"`
				Result map[string]any `json:"result"`
				Error  any            `json:"error"`
			}
			if json.Unmarshal(lines.Bytes(), &msg) != nil || msg.ID != id {
				continue // a notification
			}
			if msg.Error != nil || msg.Result == nil {
				t.Fatalf("call %d: %s", id, lines.Bytes())
			}
			return msg.Result
		}
		t.Fatalf("call %d: no answer: %v", id, lines.Err())
		return nil
	}
	decision := func(res map[string]any) any { m, _ := res["_meta"].(map[string]any); return m["io.idemkv/decision"] }
	first, second := call(1, "agent-alice"), call(2, "agent-bob")
	if decision(first) != "execute" || decision(second) != "execute" || up.runs("a-1") != 2 {
		t.Fatalf("two clients' identical calls under key: derive: decisions %v and %v, place_order ran %d times; want two executes",
			decision(first), decision(second), up.runs("a-1"))
	}
}
