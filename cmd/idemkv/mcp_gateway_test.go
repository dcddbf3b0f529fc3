package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/mcpgw"
)

// The tests in this file run `idemkv mcp-gateway` as a process in front of the example
// ticketserver process, and talk to it with the go-sdk's own client.

// lineLog sends a process's output to t.Log until the test ends.
type lineLog struct {
	mu     sync.Mutex
	t      *testing.T
	prefix string
	done   bool
}

func newLineLog(t *testing.T, prefix string) *lineLog {
	l := &lineLog{t: t, prefix: prefix}
	t.Cleanup(func() {
		l.mu.Lock()
		l.done = true
		l.mu.Unlock()
	})
	return l
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.t.Log(l.prefix + strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func buildTicketServer(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ticketserver")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/idemkv/idemkv/examples/mcp/ticketserver").CombinedOutput()
	if err != nil {
		t.Fatalf("go build ticketserver: %v\n%s", err, out)
	}
	return bin
}

const gatewayTestPolicy = `
tenant: cmdtest
tools:
  create_ticket:
    key: "{tenant}:{incident_id}:create_ticket"
    volatile: [trace_id]
    remote_id: ticket_id
    probe: {tool: find_ticket, arguments: {incident_id: "{incident_id}"}, found: found, result: ticket}
`

func writePolicy(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(p, []byte(gatewayTestPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func ticketCount(t *testing.T, state string) int {
	t.Helper()
	var st struct {
		Tickets []json.RawMessage `json:"tickets"`
	}
	data, err := os.ReadFile(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	return len(st.Tickets)
}

// createTwice sends the same create_ticket call twice (the retry with another trace
// id) and checks the second is the first's replay.
func createTwice(t *testing.T, sess *mcp.ClientSession, state string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var results []*mcp.CallToolResult
	for _, trace := range []string{"a", "b"} {
		res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "create_ticket", Arguments: map[string]any{
			"incident_id": "INC-1", "title": "db down", "severity": "high", "trace_id": trace}})
		if err != nil {
			t.Fatal(err)
		}
		if res.IsError {
			t.Fatalf("create_ticket failed: %+v", res.Content)
		}
		results = append(results, res)
	}
	if d0, d1 := results[0].Meta[mcpgw.MetaDecision], results[1].Meta[mcpgw.MetaDecision]; d0 != "execute" || d1 != "replay" {
		t.Fatalf("decisions %v then %v, want execute then replay", d0, d1)
	}
	if !reflect.DeepEqual(results[0].StructuredContent, results[1].StructuredContent) {
		t.Fatalf("the replay differs: %v vs %v", results[0].StructuredContent, results[1].StructuredContent)
	}
	if n := ticketCount(t, state); n != 1 {
		t.Fatalf("the upstream holds %d tickets, want 1", n)
	}
}

func TestMCPGatewayStdio(t *testing.T) {
	bin, ts := idemkvBinary(t), buildTicketServer(t)
	cluster := testcluster.Start(t, 1)
	state := filepath.Join(t.TempDir(), "tickets with space.json")
	cmd := exec.Command(bin, "mcp-gateway",
		"--upstream-cmd", ts+" --state '"+state+"'",
		"--policy", writePolicy(t),
		"--endpoint", cluster.Endpoint(0))
	cmd.Stderr = newLineLog(t, "gateway: ")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sess, err := mcp.NewClient(&mcp.Implementation{Name: "agent"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	tools, err := sess.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tools.Tools) != 5 {
		t.Fatalf("the gateway lists %d tools, want the ticketserver's 5", len(tools.Tools))
	}
	createTwice(t, sess, state)
}

func TestMCPGatewayStreamableHTTP(t *testing.T) {
	bin, ts := idemkvBinary(t), buildTicketServer(t)
	cluster := testcluster.Start(t, 1)
	state := filepath.Join(t.TempDir(), "tickets.json")
	upAddr, gwAddr := freePort(t), freePort(t)

	start := func(name string, c *exec.Cmd) {
		c.Stderr = newLineLog(t, name+": ")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = c.Process.Kill()
			_ = c.Wait()
		})
	}
	start("ticketserver", exec.Command(ts, "--state", state, "--listen", upAddr))
	waitFor(t, 20*time.Second, "ticketserver listening", func() error {
		conn, err := net.Dial("tcp", upAddr)
		if err == nil {
			conn.Close()
		}
		return err
	})
	tokenFile := filepath.Join(t.TempDir(), "listen-token")
	if err := os.WriteFile(tokenFile, []byte("gw-s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gateway := exec.Command(bin, "mcp-gateway", "--upstream-url", "http://"+upAddr+"/mcp",
		"--listen", gwAddr, "--listen-token-file", tokenFile, "--policy", writePolicy(t), "--endpoint", cluster.Endpoint(0))
	start("gateway", gateway)
	waitFor(t, 20*time.Second, "gateway listening", func() error {
		resp, err := http.Get("http://" + gwAddr + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("healthz %d", resp.StatusCode)
		}
		return nil
	})
	url := "http://" + gwAddr + "/mcp"
	if resp, err := http.Post(url, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a request without the --listen-token-file token got %d, want 401", resp.StatusCode)
	}

	// Issue 23 point 6 as it was found: one 400 MB POST raised the gateway from 33 MB
	// to 911 MB before its 400. Now it reads at most --max-body-bytes (4 MiB).
	hwm := func() int64 {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", gateway.Process.Pid))
		if err != nil {
			t.Skipf("no /proc: %v", err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				var kb int64
				fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(v), " kB"), &kb)
				return kb << 10
			}
		}
		t.Fatal("no VmHWM")
		return 0
	}
	before := hwm()
	req, _ := http.NewRequest(http.MethodPost, url, io.LimitReader(zeros{}, 400<<20))
	req.Header.Set("Authorization", "Bearer gw-s3cret")
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("a 400 MB body got %d, want 413", resp.StatusCode)
		}
	}
	after := hwm()
	t.Logf("gateway peak RSS %d MiB before a 400 MB POST, %d MiB after", before>>20, after>>20)
	if after-before > 64<<20 {
		t.Errorf("a 400 MB POST raised the gateway's peak RSS from %d to %d MiB", before>>20, after>>20)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sess, err := mcp.NewClient(&mcp.Implementation{Name: "agent"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: url, DisableStandaloneSSE: true, MaxRetries: -1,
			HTTPClient: &http.Client{Transport: withBearer{"gw-s3cret"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	createTwice(t, sess, state)
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

type withBearer struct{ token string }

func (b withBearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// countingLog is a lineLog that also counts the lines holding a phrase.
type countingLog struct {
	*lineLog
	phrase string
	mu     sync.Mutex
	n      int
}

func (c *countingLog) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.n += strings.Count(string(p), c.phrase)
	c.mu.Unlock()
	return c.lineLog.Write(p)
}

func (c *countingLog) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// Issue 14 point 5 as it was found: the gateway's --endpoint points at an address
// where nothing listens. Every mutating call answers store_unavailable within
// --store-wait (it used to hang for good), the upstream is not called, and the outage
// is logged once.
func TestMCPGatewayDeadEndpoint(t *testing.T) {
	bin, ts := idemkvBinary(t), buildTicketServer(t)
	state := filepath.Join(t.TempDir(), "tickets.json")
	cmd := exec.Command(bin, "mcp-gateway",
		"--upstream-cmd", ts+" --state '"+state+"'",
		"--policy", writePolicy(t),
		"--endpoint", freePort(t), "--store-wait", "2s", "--timeout", "1s")
	stderr := &countingLog{lineLog: newLineLog(t, "gateway: "), phrase: "idemkv is unreachable"}
	cmd.Stderr = stderr
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sess, err := mcp.NewClient(&mcp.Implementation{Name: "agent"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	for i := range 3 {
		start := time.Now()
		res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "create_ticket", Arguments: map[string]any{
			"incident_id": "INC-1", "title": "db down", "severity": "high"}})
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		// --store-wait, one --timeout, and slack for a loaded machine.
		if code := res.Meta[mcpgw.MetaError]; !res.IsError || code != mcpgw.CodeStoreUnavailable || took > 2*time.Second+time.Second+3*time.Second {
			t.Fatalf("call %d: %v after %s, want %s within the bound", i+1, res.Meta, took, mcpgw.CodeStoreUnavailable)
		}
		t.Logf("call %d: %s after %s", i+1, mcpgw.CodeStoreUnavailable, took.Round(time.Millisecond))
	}
	if _, err := os.Stat(state); err == nil {
		if n := ticketCount(t, state); n != 0 {
			t.Fatalf("the upstream created %d tickets without a reservation", n)
		}
	}
	if n := stderr.count(); n != 1 {
		t.Fatalf("the outage was logged %d times for 3 calls, want once", n)
	}
}

func TestSplitCommand(t *testing.T) {
	for in, want := range map[string][]string{
		`server --state tickets.json`:       {"server", "--state", "tickets.json"},
		`  a   b  `:                         {"a", "b"},
		`srv --title 'two words' "x \"y\""`: {"srv", "--title", "two words", `x "y"`},
		`a\ b c`:                            {"a b", "c"},
		`a''b ""`:                           {"ab", ""},
		`'$HOME' "$HOME"`:                   {"$HOME", "$HOME"},
	} {
		got, err := splitCommand(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("splitCommand(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "   ", `a 'open`, `a "open`, `a\`} {
		if got, err := splitCommand(in); err == nil {
			t.Errorf("splitCommand(%q) = %q, want an error", in, got)
		}
	}
}

// As serve refuses an API beyond loopback without --auth-file, the gateway refuses
// to serve MCP beyond loopback without its listen token: anyone who reached the port
// would call tools with the gateway's idemkv token.
func TestMCPGatewayRefusesAnOpenListenWithoutAToken(t *testing.T) {
	_, err := cli(t, "mcp-gateway", "--upstream-url", "http://127.0.0.1:1/mcp", "--listen", "0.0.0.0:0",
		"--endpoint", "http://127.0.0.1:1")
	if err == nil || !strings.Contains(err.Error(), "--listen-token-file") {
		t.Fatalf("--listen 0.0.0.0:0 without a token: %v, want a refusal naming --listen-token-file", err)
	}
}
