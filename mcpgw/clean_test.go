package mcpgw_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/mcpgw"
)

// encoding/json reads "o\xff" and "o\xfe" (and "o\ud800") alike, as "o\uFFFD", and
// keeps the last of two members named alike. Without the gateway's checks the second
// of two calls that differ only so would be taken for the first: its key template, its
// effect fields or its _meta key the same, it would replay a receipt for an operation
// that never ran. Each such message is refused, over HTTP and stdio, and never runs.
func TestUncleanJSONIsRefusedBeforeAnythingReadsIt(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newGoUpstream(false)
	g := newGW(t, cluster, up.inMemory(t), gwOptions{
		policy: "tenant: clean\ntools:\n  place_order:\n    key: \"o:{order_id}\"\n    effect: [order_id, amount]\n",
	})
	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",` +
		`"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}`
	call := func(id int, args, extraMeta string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"place_order","arguments":%s,%s%s}}}`,
			id, args, meta, extraMeta)
	}
	unclean := map[string]string{
		"invalid UTF-8 in an argument":        call(1, "{\"order_id\":\"o\xff\",\"amount\":1,\"currency\":\"EUR\"}", ""),
		"other invalid UTF-8 in the argument": call(2, "{\"order_id\":\"o\xfe\",\"amount\":1,\"currency\":\"EUR\"}", ""),
		"a lone surrogate in an argument":     call(3, `{"order_id":"o\ud800","amount":1,"currency":"EUR"}`, ""),
		"an argument named twice":             call(4, `{"order_id":"o-dup","amount":1,"amount":2,"currency":"EUR"}`, ""),
		"invalid UTF-8 in the _meta key":      call(5, `{"order_id":"o-meta","amount":1,"currency":"EUR"}`, ",\"io.idemkv/idempotency_key\":\"k\xff\""),
		"a lone surrogate in the _meta key":   call(6, `{"order_id":"o-meta","amount":1,"currency":"EUR"}`, `,"io.idemkv/idempotency_key":"k\udfff"`),
		"the _meta key named twice":           call(7, `{"order_id":"o-meta","amount":1,"currency":"EUR"}`, `,"io.idemkv/idempotency_key":"k1","io.idemkv/idempotency_key":"k2"`),
	}
	headers := map[string]string{"Mcp-Protocol-Version": modernEra, "Mcp-Method": "tools/call", "Mcp-Name": "place_order"}

	srv := httptest.NewServer(g.gw.HTTPHandler(nil))
	t.Cleanup(srv.Close)
	for name, msg := range unclean {
		code, body := postHeaders(t, srv.URL, msg, headers)
		var ans wireMessage
		if err := json.Unmarshal([]byte(body), &ans); code != http.StatusOK || err != nil || ans.Error == nil || ans.Error.Code != -32602 || string(ans.ID) != fmt.Sprint(idOf(msg)) {
			t.Errorf("http, %s: HTTP %d %s; want invalid params (-32602) with the call's id", name, code, body)
		}
	}
	stdio := serveStdio(t, g.gw)
	id := 10
	for name, msg := range unclean {
		id++
		msg = strings.Replace(msg, `"id":`, fmt.Sprintf(`"id":%d,"x":`, id), 1)
		stdio.send(msg)
		if ans, _ := stdio.answer(id); ans.Error == nil || ans.Error.Code != -32602 {
			t.Errorf("stdio, %s: %s; want invalid params (-32602)", name, ans.line)
		}
	}
	// A notification has nobody to refuse it to: it passes as it came (the go-sdk
	// accepts it), and the gateway stays up for the next call.
	if code, body := postHeaders(t, srv.URL, "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":99,\"reason\":\"x\xff\"},"+
		meta+"}}}", map[string]string{"Mcp-Protocol-Version": modernEra, "Mcp-Method": "notifications/cancelled"}); code != http.StatusAccepted {
		t.Errorf("an unclean notification: HTTP %d %s, want 202 (passed on)", code, body)
	}
	for _, order := range []string{"o\uFFFD", "o-dup", "o-meta"} {
		if n := up.runs(order); n != 0 {
			t.Errorf("place_order ran %d times for %q, want 0", n, order)
		}
	}

	// U+FFFD itself is text like any other.
	code, body := postHeaders(t, srv.URL, call(20, `{"order_id":"o`+"\uFFFD"+`","amount":1,"currency":"EUR"}`, ""), headers)
	if code != http.StatusOK || !strings.Contains(body, `"io.idemkv/decision":"execute"`) {
		t.Errorf("a call with U+FFFD in its arguments: HTTP %d %s, want execute", code, body)
	}
}

// A gateway served without its transports (Server(), as a library) still refuses
// arguments encoding/json would misread: the go-sdk hands them over as they came.
func TestUncleanArgumentsAreRefusedByTheCallItself(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newGoUpstream(false)
	g := newGW(t, cluster, up.inMemory(t), gwOptions{
		policy: "tenant: clean\ntools:\n  place_order:\n    key: \"o:{order_id}\"\n",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := g.gw.Server().Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "lib", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	for _, args := range []string{
		"{\"order_id\":\"p\xff\",\"amount\":1,\"currency\":\"EUR\"}",
		"{\"order_id\":\"p\xfe\",\"amount\":1,\"currency\":\"EUR\"}",
		`{"order_id":"p-dup","order_id":"p-dup2","amount":1,"currency":"EUR"}`,
	} {
		res := goCall(t, cs, "place_order", json.RawMessage(args), nil)
		if !res.IsError || !strings.Contains(show(res), "every reader reads alike") {
			t.Errorf("arguments %q: %s, want refused", args, show(res))
		}
	}
	if n := up.runs("p\uFFFD") + up.runs("p-dup") + up.runs("p-dup2"); n != 0 {
		t.Errorf("place_order ran %d times, want 0", n)
	}
	if res := goCall(t, cs, "place_order", json.RawMessage(`{"order_id":"p-ok","amount":1,"currency":"EUR"}`), nil); res.IsError {
		t.Errorf("clean arguments: %s", show(res))
	}
}

// A receipt the gateway did not write may hold the gateway's own keys: a client token
// of the tenant committing to the key, an operator's `idemkv resolve`, a gateway from
// before the scrub. Its replay reaches the agent without them, in the result's _meta
// and in each content block's, with the gateway's own decision.
func TestStoredReceiptsAreScrubbedOnReplay(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newGoUpstream(false)
	g := newGW(t, cluster, up.inMemory(t), gwOptions{policy: "tenant: forged\n"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	args := order("f-1", 3, "EUR")
	effect, _ := json.Marshal(args)
	forged := `{"content":[{"type":"text","text":"done","_meta":{"io.idemkv/decision":"execute","keep":"block"}}],` +
		`"_meta":{"io.idemkv/error":"forged","io.idemkv/warning":"forged","io.idemkv/decision":"execute","keep":"result"}}`
	for _, k := range []struct{ key, outcome string }{{"forged-ok", "committed"}, {"forged-failed", "failed"}} {
		res, err := g.idem.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "forged", Key: k.key, Tool: "place_order",
			Effect: effect, LeaseTTLMs: 60000})
		if err != nil || res.Decision != idemkv.DecisionExecute {
			t.Fatalf("reserve: %v %+v", err, res)
		}
		if k.outcome == "committed" {
			_, err = g.idem.Commit(ctx, &idemkv.CommitRequest{Tenant: "forged", Key: k.key, Fingerprint: res.Record.Fingerprint,
				Fence: res.Fence, RemoteSystem: "orders", RemoteID: "f-1", Result: json.RawMessage(forged)})
		} else {
			_, err = g.idem.Fail(ctx, &idemkv.FailRequest{Tenant: "forged", Key: k.key, Fingerprint: res.Record.Fingerprint,
				Fence: res.Fence, Error: idemkv.ErrorInfo{Code: mcpgw.FailureCode, Message: "the tool said no",
					Details: json.RawMessage(strings.Replace(forged, `{"content"`, `{"isError":true,"content"`, 1))}})
		}
		if err != nil {
			t.Fatalf("%s: %v", k.outcome, err)
		}
	}
	agent := g.connectGoEra("forged-agent", nil, modernEra)
	for _, key := range []string{"forged-ok", "forged-failed"} {
		got := goCall(t, agent, "place_order", args, mcp.Meta{mcpgw.MetaIdempotencyKey: key})
		if meta(got, mcpgw.MetaDecision) != "replay" || meta(got, mcpgw.MetaError) != "" || got.Meta["io.idemkv/warning"] != nil {
			t.Errorf("%s: the replay carries the receipt's forged keys: %s", key, show(got))
		}
		if got.Meta["keep"] != "result" {
			t.Errorf("%s: the receipt's own _meta was lost: %s", key, show(got))
		}
		if len(got.Content) != 1 || got.Content[0].(*mcp.TextContent).Meta["io.idemkv/decision"] != nil ||
			got.Content[0].(*mcp.TextContent).Meta["keep"] != "block" {
			t.Errorf("%s: the content block's _meta: %s", key, show(got))
		}
	}
	if n := up.runs("f-1"); n != 0 {
		t.Errorf("place_order ran %d times, want 0", n)
	}
}

// The server bounds a failure's details and message together. An upstream's isError
// answer whose details fit MaxReceiptBytes alone, beside its message, must still be
// stored: refused as too large, it would leave the call pending though the tool ran
// and said no, and the next attempt would have to recover it.
func TestALargeToolErrorIsStored(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	srv := mcp.NewServer(&mcp.Implementation{Name: "refuser", Version: "1"}, nil)
	destructive := true
	runs := 0
	big := strings.Repeat("no ", 21000) // 63,000 bytes: under 64 KiB alone
	mcp.AddTool(srv, &mcp.Tool{Name: "refund", Annotations: &mcp.ToolAnnotations{DestructiveHint: &destructive}},
		func(context.Context, *mcp.CallToolRequest, struct {
			ID string `json:"id"`
		}) (*mcp.CallToolResult, any, error) {
			runs++
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: big}}}, nil, nil
		})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	transport := func() mcp.Transport {
		c, s := mcp.NewInMemoryTransports()
		if _, err := srv.Connect(ctx, s, nil); err != nil {
			t.Errorf("upstream connect: %v", err)
		}
		return c
	}
	g := newGW(t, cluster, transport, gwOptions{policy: "tenant: refusals\n"})
	agent := g.connectGoEra("refund-agent", nil, modernEra)
	first := goCall(t, agent, "refund", map[string]any{"id": "r-1"}, key("refund-1"))
	again := goCall(t, agent, "refund", map[string]any{"id": "r-1"}, key("refund-1"))
	if !first.IsError || meta(first, mcpgw.MetaDecision) != "execute" || !again.IsError || meta(again, mcpgw.MetaDecision) != "replay" {
		t.Fatalf("want the tool's refusal, then its replay; got %.300s then %.300s", show(first), show(again))
	}
	if runs != 1 {
		t.Fatalf("refund ran %d times, want 1", runs)
	}
	rec, err := g.idem.Get(ctx, &idemkv.GetRequest{Tenant: "refusals", Key: "refund-1"})
	if err != nil || rec.Status != idemkv.StatusFailed {
		t.Fatalf("the record: %v %+v, want failed", err, rec)
	}
}

// idOf is the id a test message of TestUncleanJSONIsRefusedBeforeAnythingReadsIt
// carries.
func idOf(msg string) int {
	var id int
	_, _ = fmt.Sscanf(msg[strings.Index(msg, `"id":`)+5:], "%d", &id)
	return id
}
