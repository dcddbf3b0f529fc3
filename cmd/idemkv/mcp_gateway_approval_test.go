package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/auth"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/mcpgw"
)

const approvalGatewayPolicy = `
tenant: cmdtest
tools:
  create_ticket:
    key: "{tenant}:{incident_id}:create_ticket"
    volatile: [trace_id]
    approval: required
    approval_summary: "Open a {severity} ticket: {title}"
    approval_in_band: true
`

// Issue 25 point 5 on real processes with real tokens: `idemkv serve` with a client
// token and an approver token of the tenant; a gateway given only the client token
// cannot record its agent's in-band answer (idemkv refuses it) and answers the
// pending approval; a gateway given the approver token with --approver-token-file
// records it, and the ticket is created once.
func TestMCPGatewayApproverToken(t *testing.T) {
	bin, ts := idemkvBinary(t), buildTicketServer(t)
	dir := t.TempDir()
	tokens := auth.File{Tokens: []auth.Token{
		{Name: "gw", Hash: auth.HashToken("gw-client-token"), Role: auth.RoleClient, Tenants: []string{"cmdtest"}},
		{Name: "ana", Hash: auth.HashToken("ana-approver-token"), Role: auth.RoleApprover, Tenants: []string{"cmdtest"}},
	}}
	authFile := filepath.Join(dir, "tokens.json")
	b, _ := json.Marshal(tokens)
	approverFile, policy := filepath.Join(dir, "approver-token"), filepath.Join(dir, "policy.yaml")
	for name, data := range map[string]string{authFile: string(b), approverFile: "ana-approver-token\n", policy: approvalGatewayPolicy} {
		if err := os.WriteFile(name, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	node := &opsProc{t: t, id: "n1", httpAddr: freePort(t), raftAddr: freePort(t), bin: bin}
	node.args = append(fastServeArgs("n1", filepath.Join(dir, "n1"), node.httpAddr, node.raftAddr), "--auth-file", authFile)
	node.start()
	waitFor(t, 30*time.Second, "n1 ready", func() error { return readyPlain(node.httpAddr) })

	state := filepath.Join(dir, "tickets.json")
	gateway := func(name string, extra ...string) string {
		addr, upAddr := freePort(t), freePort(t)
		up := exec.Command(ts, "--state", state, "--listen", upAddr)
		up.Stderr = newLineLog(t, name+" ticketserver: ")
		args := append([]string{"mcp-gateway", "--upstream-url", "http://" + upAddr + "/mcp", "--listen", addr,
			"--policy", policy, "--endpoint", node.httpAddr, "--token", "gw-client-token"}, extra...)
		gw := exec.Command(bin, args...)
		gw.Stderr = newLineLog(t, name+": ")
		for _, c := range []*exec.Cmd{up, gw} {
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = c.Process.Kill()
				_ = c.Wait()
			})
			if c == up {
				waitFor(t, 20*time.Second, name+" ticketserver", func() error {
					resp, err := http.Post("http://"+upAddr+"/mcp", "application/json", strings.NewReader("{}"))
					if err == nil {
						resp.Body.Close()
					}
					return err
				})
			}
		}
		waitFor(t, 20*time.Second, name+" listening", func() error {
			resp, err := http.Get("http://" + addr + "/healthz")
			if err != nil {
				return err
			}
			resp.Body.Close()
			return nil
		})
		return "http://" + addr + "/mcp"
	}
	withoutApprover := gateway("gw-client-only")
	withApprover := gateway("gw-approver", "--approver-token-file", approverFile)

	var (
		mu   sync.Mutex
		asks int
	)
	agent := func(url string) *mcp.ClientSession {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := mcp.NewClient(&mcp.Implementation{Name: "desk-agent", Version: "1"}, &mcp.ClientOptions{
			ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				mu.Lock()
				asks++
				mu.Unlock()
				return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"approve": true}}, nil
			}})
		sess, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: -1},
			&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sess.Close() })
		return sess
	}
	create := func(sess *mcp.ClientSession, incident string) *mcp.CallToolResult {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "create_ticket", Arguments: map[string]any{
			"incident_id": incident, "title": "db down", "severity": "high", "trace_id": "t"}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	res := create(agent(withoutApprover), "INC-1")
	if !res.IsError || res.Meta[mcpgw.MetaError] != mcpgw.CodeApprovalPending ||
		!strings.Contains(fmt.Sprint(res.Meta[mcpgw.MetaDetails]), "may not decide approvals") {
		t.Fatalf("through the gateway with the client token only: %+v %v", res.Meta, res.Content)
	}
	if _, err := os.Stat(state); err == nil {
		t.Fatalf("a ticket was created before the approval: %s", must(os.ReadFile(state)))
	}

	sess := agent(withApprover)
	for k, want := range []string{"execute", "replay"} {
		res := create(sess, "INC-1")
		if res.IsError || res.Meta[mcpgw.MetaDecision] != want {
			t.Fatalf("through the gateway with the approver token, call %d: %+v %v", k+1, res.Meta, res.Content)
		}
	}
	if n := ticketCount(t, state); n != 1 {
		t.Fatalf("%d tickets, want 1", n)
	}
	mu.Lock()
	n := asks
	mu.Unlock()
	if n != 2 {
		t.Errorf("the agent's user was asked %d times, want 2 (once per gateway)", n)
	}
	ana, err := client.New(client.Config{Endpoints: []string{node.httpAddr}, Token: "ana-approver-token"})
	if err != nil {
		t.Fatal(err)
	}
	defer ana.Close()
	rec, err := ana.Get(context.Background(), &idemkv.GetRequest{Tenant: "cmdtest", Key: "cmdtest:INC-1:create_ticket"})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Approval == nil || rec.Approval.State != idemkv.ApprovalApproved || !strings.HasPrefix(rec.Approval.Approver, "user of desk-agent") ||
		rec.Approval.Summary != `Open a "high" ticket: "db down"` {
		t.Fatalf("the record's approval: %+v", rec.Approval)
	}
}

func must(b []byte, _ error) string { return string(b) }
