package mcpgw_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/mcpgw"
)

// An upstream that connects but never answers tools/list held New for good: the
// gateway's own context (the command's) has no deadline, and nothing else bounded the
// listing, so the gateway never started and said nothing. The listing is bounded as
// a call is, by the policy's timeout.
func TestAnUpstreamThatNeverListsItsToolsIsAnError(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := &rawUpstream{tools: `{"tools":[]}`}
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if bytes.Contains(body, []byte(`"tools/list"`)) {
			select {
			case <-r.Context().Done():
			case <-stop:
			}
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		up.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	idem, err := client.New(client.Config{Endpoints: cluster.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idem.Close() })
	u := mcpgw.NewUpstream(httpUpstream(srv.URL), &mcp.Implementation{Name: "idemkv-mcp-gateway-test"}, testlog.NewLevel(t, "upstream: ", slog.LevelDebug))
	t.Cleanup(func() { _ = u.Close() })
	// First of the cleanups: the upstream's session and srv.Close both wait for the
	// listing to end.
	t.Cleanup(func() { close(stop) })
	policy, err := mcpgw.ParsePolicy([]byte("timeout: 1s\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := mcpgw.DefaultConfig()
	cfg.Upstream, cfg.Runner, cfg.Policy = u, idem, policy
	done := make(chan error, 1)
	go func() {
		g, err := mcpgw.New(context.Background(), cfg)
		if err == nil {
			_ = g.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("New succeeded without the upstream's tools")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("New still waits for an upstream that never lists its tools after 5 s (policy timeout 1 s)")
	}
}
