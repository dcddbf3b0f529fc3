package mcpgw_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/mcpgw"
)

var (
	buildOnce sync.Once
	serverBin string
	buildErr  error
)

func TestMain(m *testing.M) {
	if os.Getenv(m3StdioEnv) != "" {
		// The test binary started as the mark3labs upstream of a stdio test.
		if err := serveM3Stdio(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	if serverBin != "" {
		os.RemoveAll(filepath.Dir(serverBin))
	}
	os.Exit(code)
}

// ticketServer builds examples/mcp/ticketserver once per test binary.
func ticketServer(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "ticketserver-")
		if err != nil {
			buildErr = err
			return
		}
		serverBin = filepath.Join(dir, "ticketserver")
		out, err := exec.Command("go", "build", "-o", serverBin, "github.com/idemkv/idemkv/examples/mcp/ticketserver").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ticketserver: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return serverBin
}

// env is a gateway in front of a real ticketserver process, backed by a real idemkv
// node, served over streamable HTTP on loopback.
type env struct {
	t      *testing.T
	idem   *client.Client
	gw     *mcpgw.Gateway
	url    string
	state  string // the ticketserver's state file
	crash  string // create it to make the next create_ticket die before answering
	tenant string
	era    string
	mu     sync.Mutex
	procs  []*exec.Cmd // upstream processes, in start order
}

type envOptions struct {
	policy string        // YAML
	delay  time.Duration // how long create_ticket takes
	tp     trace.TracerProvider
	// brokenRestart: every upstream start after the first fails, as if the binary
	// were gone.
	brokenRestart bool
	// era is the MCP revision connect's agents speak; default: the newest.
	era string
}

func newEnv(t *testing.T, cluster *testcluster.Cluster, o envOptions) *env {
	t.Helper()
	bin := ticketServer(t)
	dir := t.TempDir()
	e := &env{t: t, state: filepath.Join(dir, "tickets.json"), crash: filepath.Join(dir, "crash"), era: o.era}

	policy, err := mcpgw.ParsePolicy([]byte(o.policy))
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	e.tenant = policy.Tenant
	idem, err := client.New(client.Config{
		Endpoints:      cluster.Endpoints(),
		Logger:         testlog.NewLevel(t, "client: ", slog.LevelDebug),
		TracerProvider: o.tp,
		Propagator:     propagation.TraceContext{},
		Run:            client.RunConfig{PollWait: 2 * time.Second, BackoffMax: 200 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { idem.Close() })
	e.idem = idem

	stderr := testlog.NewWriter(t, "ticketserver: ")
	args := []string{"--state", e.state, "--crash-after-create", e.crash, "--delay", o.delay.String()}
	up := mcpgw.NewUpstream(func() mcp.Transport {
		e.mu.Lock()
		defer e.mu.Unlock()
		path := bin
		if o.brokenRestart && len(e.procs) > 0 {
			path = filepath.Join(dir, "no-such-server")
		}
		cmd := exec.Command(path, args...)
		e.procs = append(e.procs, cmd)
		cmd.Stderr = stderr
		return &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}
	}, &mcp.Implementation{Name: "idemkv-mcp-gateway-test"}, testlog.NewLevel(t, "upstream: ", slog.LevelDebug))

	cfg := mcpgw.DefaultConfig()
	cfg.Upstream = up
	cfg.Runner = idem
	cfg.Policy = policy
	cfg.Logger = testlog.NewLevel(t, "gateway: ", slog.LevelDebug)
	cfg.TracerProvider = o.tp
	cfg.Propagator = propagation.TraceContext{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gw, err := mcpgw.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := up.Close(); err != nil {
			t.Logf("closing the upstream: %v", err)
		}
	})
	t.Cleanup(func() { _ = gw.Close() })
	e.gw = gw

	srv := httptest.NewServer(gw.HTTPHandler(nil))
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return e
}

// spawned is how many times the upstream was started.
func (e *env) spawned() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.procs)
}

// killUpstream kills the running upstream process and waits until it is gone.
func (e *env) killUpstream() {
	e.t.Helper()
	e.mu.Lock()
	cmd := e.procs[len(e.procs)-1]
	e.mu.Unlock()
	if err := cmd.Process.Kill(); err != nil {
		e.t.Fatal(err)
	}
	if err := testcluster.Eventually(10*time.Second, func() error {
		if err := cmd.Process.Signal(syscall.Signal(0)); err == nil {
			return fmt.Errorf("pid %d still running", cmd.Process.Pid)
		}
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
}

// connect opens an MCP session to the gateway with the go-sdk's own client.
func (e *env) connect(name string) *mcp.ClientSession {
	e.t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: name, Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: e.url, DisableStandaloneSSE: true, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: e.era})
	if err != nil {
		e.t.Fatalf("connecting to the gateway: %v", err)
	}
	if e.era != "" && sess.InitializeResult().ProtocolVersion != e.era {
		e.t.Fatalf("the agent speaks %s with the gateway, want %s", sess.InitializeResult().ProtocolVersion, e.era)
	}
	e.t.Cleanup(func() { _ = sess.Close() })
	return sess
}

// call calls a tool; meta may be nil. A protocol error fails the test.
func (e *env) call(sess *mcp.ClientSession, tool string, args map[string]any, meta mcp.Meta) *mcp.CallToolResult {
	e.t.Helper()
	res, err := e.callErr(sess, tool, args, meta)
	if err != nil {
		e.t.Fatalf("%s: %v", tool, err)
	}
	return res
}

func (e *env) callErr(sess *mcp.ClientSession, tool string, args map[string]any, meta mcp.Meta) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return sess.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args, Meta: meta})
}

// upstreamState is the ticketserver's own record of what happened, read from its
// state file: the ground truth of how many tickets exist.
type upstreamState struct {
	CreateCalls int `json:"create_calls"`
	Tickets     []struct {
		TicketID   string `json:"ticket_id"`
		IncidentID string `json:"incident_id"`
		Title      string `json:"title"`
	} `json:"tickets"`
	Comments []struct {
		TicketID string `json:"ticket_id"`
	} `json:"comments"`
}

func (e *env) upstream() upstreamState {
	e.t.Helper()
	var st upstreamState
	data, err := os.ReadFile(e.state)
	if os.IsNotExist(err) {
		return st
	}
	if err != nil {
		e.t.Fatal(err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		e.t.Fatalf("state file: %v", err)
	}
	return st
}

// sc is a result's structured content as a map.
func sc(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	m, ok := res.StructuredContent.(map[string]any)
	if !ok {
		t.Fatalf("structured content is %T, want an object; result: %s", res.StructuredContent, show(res))
	}
	return m
}

// details is the JSON the gateway put in _meta with its own tool error.
func details(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	m, ok := res.Meta[mcpgw.MetaDetails].(map[string]any)
	if !ok {
		t.Fatalf("_meta[%s] is %T, want an object; result: %s", mcpgw.MetaDetails, res.Meta[mcpgw.MetaDetails], show(res))
	}
	return m
}

func meta(res *mcp.CallToolResult, key string) string {
	s, _ := res.Meta[key].(string)
	return s
}

func show(res *mcp.CallToolResult) string {
	b, _ := json.Marshal(res)
	return string(b)
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	return strings.Join(parts, "\n")
}
