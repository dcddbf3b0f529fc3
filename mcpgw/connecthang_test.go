package mcpgw

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mute is a connection to an upstream that takes every message and never answers.
type mute struct {
	once sync.Once
	done chan struct{}
}

func (c *mute) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case <-c.done:
		return nil, errors.New("closed")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
func (c *mute) Write(context.Context, jsonrpc.Message) error { return nil }
func (c *mute) Close() error                                 { c.once.Do(func() { close(c.done) }); return nil }
func (c *mute) SessionID() string                            { return "" }

type muteTransport struct{}

func (muteTransport) Connect(context.Context) (mcp.Connection, error) {
	return &mute{done: make(chan struct{})}, nil
}

// An upstream that never answers initialize holds up a caller no longer than its own
// deadline, even while another caller (the tool-list watcher, whose context has no
// deadline) is still connecting.
func TestConnectingHoldsNobodyPastTheirDeadline(t *testing.T) {
	u := NewUpstream(func() mcp.Transport { return muteTransport{} }, &mcp.Implementation{Name: "t", Version: "1"}, nil)
	t.Cleanup(func() { _ = u.Close() })
	watcher, stop := context.WithCancel(context.Background())
	defer stop()
	go func() { _, _ = u.Tools(watcher) }()
	time.Sleep(100 * time.Millisecond) // the watcher is connecting

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := u.CallTool(ctx, &mcp.CallToolParams{Name: "charge"})
		done <- err
	}()
	select {
	case err := <-done:
		var ce *callError
		if !errors.As(err, &ce) || ce.sent {
			t.Fatalf("CallTool: %v; want an error saying nothing was sent", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a call with a 300 ms deadline still waits after 10 s for another caller's connection")
	}
}
