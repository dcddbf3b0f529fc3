package mcpgw

import (
	"context"
	"encoding/json"
	"io"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// scriptConn is a connection whose answers the test hands it.
type scriptConn struct{ in chan jsonrpc.Message }

func (c *scriptConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case m, ok := <-c.in:
		if !ok {
			return nil, io.EOF
		}
		return m, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
func (c *scriptConn) Write(context.Context, jsonrpc.Message) error { return nil }
func (c *scriptConn) Close() error                                 { return nil }
func (c *scriptConn) SessionID() string                            { return "" }

type scriptTransport struct{ conn *scriptConn }

func (t scriptTransport) Connect(context.Context) (mcp.Connection, error) { return t.conn, nil }

func toolsCall(t *testing.T, id int64, token string) *jsonrpc.Request {
	t.Helper()
	rid, err := jsonrpc.MakeID(float64(id))
	if err != nil {
		t.Fatal(err)
	}
	params, _ := json.Marshal(map[string]any{"name": "charge", "_meta": map[string]any{"progressToken": token}})
	return &jsonrpc.Request{ID: rid, Method: "tools/call", Params: params}
}

func answer(t *testing.T, id int64, text string) *jsonrpc.Response {
	t.Helper()
	rid, err := jsonrpc.MakeID(float64(id))
	if err != nil {
		t.Fatal(err)
	}
	res, _ := json.Marshal(map[string]any{"content": []any{map[string]any{"type": "text", "text": text}}})
	return &jsonrpc.Response{ID: rid, Result: res}
}

// A session the gateway dropped may still answer the calls it had in flight, with
// ids that the new session numbers from 1 again: such an answer must never become the
// receipt of the new session's call of the same id.
func TestTapKeepsEachSessionsIDsApart(t *testing.T) {
	ctx := context.Background()
	tp := newTap()
	oldConn, newConn := &scriptConn{in: make(chan jsonrpc.Message, 1)}, &scriptConn{in: make(chan jsonrpc.Message, 1)}
	oldC, err := tp.wrap(scriptTransport{oldConn}).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	newC, err := tp.wrap(scriptTransport{newConn}).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// The old session sent "slow" as id 5; its call gave up when the session dropped.
	tp.expect(progressTokenPrefix+"slow", nil)
	if err := oldC.Write(ctx, toolsCall(t, 5, progressTokenPrefix+"slow")); err != nil {
		t.Fatal(err)
	}
	tp.take(progressTokenPrefix + "slow")
	// The new session sends "charge" as id 5, and the old one answers its id 5 first.
	tp.expect(progressTokenPrefix+"charge", nil)
	if err := newC.Write(ctx, toolsCall(t, 5, progressTokenPrefix+"charge")); err != nil {
		t.Fatal(err)
	}
	oldConn.in <- answer(t, 5, "slow's answer")
	if _, err := oldC.Read(ctx); err != nil {
		t.Fatal(err)
	}
	newConn.in <- answer(t, 5, "charge's answer")
	if _, err := newC.Read(ctx); err != nil {
		t.Fatal(err)
	}
	raw, _ := tp.take(progressTokenPrefix + "charge")
	var got struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	if err := json.Unmarshal(raw, &got); err != nil || len(got.Content) != 1 || got.Content[0].Text != "charge's answer" {
		t.Fatalf("charge's raw answer = %s, want its own", raw)
	}
}
