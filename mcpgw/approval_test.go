package mcpgw_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	m3client "github.com/mark3labs/mcp-go/client"
	m3transport "github.com/mark3labs/mcp-go/client/transport"
	m3 "github.com/mark3labs/mcp-go/mcp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/mcpgw"
)

// approvalPolicy requires approval of place_order, asked in band when inBand.
func approvalPolicy(tenant string, inBand bool) string {
	return fmt.Sprintf(`tenant: %s
tools:
  place_order:
    approval: required
    approval_ttl: 1h
    approval_summary: "Place order {order_id}: {amount} {currency}"
    approval_in_band: %t
`, tenant, inBand)
}

// pendingOf checks that res is the gateway's approval_pending error and returns its
// details.
func pendingOf(t *testing.T, who string, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	if !res.IsError || meta(res, mcpgw.MetaError) != mcpgw.CodeApprovalPending || meta(res, mcpgw.MetaDecision) != string(idemkv.DecisionNeedsApproval) {
		t.Fatalf("%s: want an %s tool error, got %s", who, mcpgw.CodeApprovalPending, show(res))
	}
	d := details(t, res)
	for _, k := range []string{"approval_id", "tenant", "idempotency_key", "summary", "expires_at", "effect_fingerprint"} {
		if s, _ := d[k].(string); s == "" {
			t.Fatalf("%s: the pending approval's details lack %s: %s", who, k, show(res))
		}
	}
	decide, _ := d["decide"].(map[string]any)
	if cli, _ := decide["cli"].(string); !strings.HasPrefix(cli, "idemkv approvals approve --tenant ") || !strings.Contains(cli, d["approval_id"].(string)) {
		t.Fatalf("%s: the details do not say how to decide it: %v", who, d["decide"])
	}
	return d
}

// decide approves or denies the approval named in d through idemkv's API, as a
// person with the CLI would.
func (g *gw) decide(d map[string]any, verdict idemkv.ApprovalVerdict) *idemkv.Record {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := g.idem.DecideApproval(ctx, &idemkv.DecideApprovalRequest{
		Tenant: d["tenant"].(string), Key: d["idempotency_key"].(string), ApprovalID: d["approval_id"].(string),
		Fingerprint: d["effect_fingerprint"].(string), Decision: verdict, Approver: "ana", Reason: "checked the order",
	})
	if err != nil {
		g.t.Fatalf("%s: %v", verdict, err)
	}
	return rec
}

// Issue 25 point 5, out of band: a call whose tool requires approval is not run; it
// answers a tool error naming the approval, every retry names the same one, an
// approval through the API lets the next retry run the tool once, and a denial is
// answered to every retry without running it. Agents of both SDKs in both eras.
func TestApprovalOutOfBand(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newGoUpstream(false)
	const tenant = "ap-oob"
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t, false)), gwOptions{policy: approvalPolicy(tenant, false)})
	var agents []agent
	for _, era := range eras {
		agents = append(agents, goAgent("go-sdk "+era, g.connectGoEra("go-"+era, nil, era)))
		tr, err := m3transport.NewStreamableHTTP(g.url)
		if err != nil {
			t.Fatal(err)
		}
		agents = append(agents, m3AgentOn(t, "mcp-go "+era, tr, era))
	}
	for i, a := range agents {
		yes, no := fmt.Sprintf("o-yes-%d", i), fmt.Sprintf("o-no-%d", i)
		call := func(order string) *mcp.CallToolResult {
			return a.call(t, "place_order", map[string]any{"order_id": order, "amount": 40, "currency": "EUR"}, key(tenant+":"+order))
		}

		first := pendingOf(t, a.name, call(yes))
		if s := first["summary"]; s != `Place order "`+yes+`": 40 "EUR"` {
			t.Errorf("%s: summary %q", a.name, s)
		}
		again := pendingOf(t, a.name, call(yes))
		if again["approval_id"] != first["approval_id"] {
			t.Fatalf("%s: the retry asks approval %v, the first call %v: a second card", a.name, again["approval_id"], first["approval_id"])
		}
		page, err := g.idem.Approvals(context.Background(), &idemkv.ApprovalsRequest{Tenant: tenant})
		if err != nil {
			t.Fatal(err)
		}
		var listed *idemkv.Record
		for _, rec := range page.Approvals {
			if rec.Key == tenant+":"+yes {
				listed = rec
			}
		}
		if listed == nil || !strings.Contains(string(listed.Effect), `"order_id":"`+yes+`"`) || listed.Approval.ID != first["approval_id"] {
			t.Fatalf("%s: the waiting approvals do not show this one with its effect: %+v", a.name, listed)
		}
		if n := up.runs(yes); n != 0 {
			t.Fatalf("%s: place_order ran %d times before it was approved", a.name, n)
		}
		g.decide(first, idemkv.VerdictApprove)
		res := call(yes)
		if res.IsError || meta(res, mcpgw.MetaDecision) != "execute" {
			t.Fatalf("%s: after the approval: %s", a.name, show(res))
		}
		if res := call(yes); res.IsError || meta(res, mcpgw.MetaDecision) != "replay" {
			t.Fatalf("%s: the retry after it ran: %s", a.name, show(res))
		}
		if n := up.runs(yes); n != 1 {
			t.Fatalf("%s: place_order ran %d times for one approval, want 1", a.name, n)
		}

		d := pendingOf(t, a.name, call(no))
		g.decide(d, idemkv.VerdictDeny)
		for k := range 2 {
			res := call(no)
			if !res.IsError || meta(res, mcpgw.MetaError) != mcpgw.CodeApprovalDenied || meta(res, mcpgw.MetaDecision) != "replay" {
				t.Fatalf("%s: call %d after the denial: %s", a.name, k+1, show(res))
			}
			if !strings.Contains(text(res), "ana") || !strings.Contains(text(res), "checked the order") {
				t.Errorf("%s: the denial does not say who denied it and why: %s", a.name, text(res))
			}
		}
		if n := up.runs(no); n != 0 {
			t.Fatalf("%s: place_order ran %d times after its approval was denied", a.name, n)
		}
	}
}

// elicitations answers approval questions the way a person would, per order id in
// the question: approve o-yes, decline o-no, dismiss o-cancel; and counts them.
type elicitations struct {
	mu   sync.Mutex
	asks map[string]int
	msgs []string
}

func (e *elicitations) answer(message string) (action string, content map[string]any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.asks == nil {
		e.asks = map[string]int{}
	}
	e.msgs = append(e.msgs, message)
	for _, o := range []string{"o-yes", "o-no", "o-cancel", "o-false"} {
		if strings.Contains(message, `"`+o) {
			e.asks[o]++
			switch o {
			case "o-yes":
				return "accept", map[string]any{"approve": true, "reason": "my refund"}
			case "o-false":
				return "accept", map[string]any{"approve": false}
			case "o-no":
				return "decline", nil
			}
			return "cancel", nil
		}
	}
	return "cancel", nil
}

func (e *elicitations) count(order string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for k, v := range e.asks {
		if strings.HasPrefix(order, k) {
			n += v
		}
	}
	return n
}

func (e *elicitations) goHandler() func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	return func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		action, content := e.answer(req.Params.Message)
		return &mcp.ElicitResult{Action: action, Content: content}, nil
	}
}

type m3Elicit struct{ e *elicitations }

func (h m3Elicit) Elicit(_ context.Context, req m3.ElicitationRequest) (*m3.ElicitationResult, error) {
	action, content := h.e.answer(req.Params.Message)
	res := &m3.ElicitationResult{}
	res.Action = m3.ElicitationResponseAction(action)
	if content != nil {
		res.Content = content
	}
	return res, nil
}

// Issue 25 point 5, in band: with approval_in_band the gateway asks the agent's
// user, by the 2026-07-28 multi round-trip input_required result or by 2025-11-25
// elicitation; an approval runs the tool once, a decline (or approve: false) denies
// it for good, a dismissal leaves it to be decided out of band. Agents of both SDKs
// in both eras; the upstream counts its runs.
//
// On three nodes: the gateway's reserves and decisions reach the leader wherever
// they land.
func TestApprovalInBand(t *testing.T) {
	cluster := testcluster.Start(t, 3)
	up := newGoUpstream(false)
	const tenant = "ap-inband"
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t, false)), gwOptions{policy: approvalPolicy(tenant, true)})
	type inband struct {
		agent
		e *elicitations
	}
	var agents []inband
	for _, era := range eras {
		e := &elicitations{}
		agents = append(agents, inband{goAgent("go-sdk "+era, g.connectGoEra("go-"+era, &mcp.ClientOptions{ElicitationHandler: e.goHandler()}, era)), e})
		e = &elicitations{}
		tr, err := m3transport.NewStreamableHTTP(g.url)
		if err != nil {
			t.Fatal(err)
		}
		c := m3client.NewClient(tr, m3client.WithProtocolVersion(era), m3client.WithElicitationHandler(m3Elicit{e}))
		agents = append(agents, inband{m3Started(t, "mcp-go "+era, c, era), e})
	}
	for i, a := range agents {
		order := func(o string) string { return fmt.Sprintf("%s-%d", o, i) }
		call := func(o string) *mcp.CallToolResult {
			return a.call(t, "place_order", map[string]any{"order_id": order(o), "amount": 40, "currency": "EUR"}, key(tenant+":"+order(o)))
		}

		res := call("o-yes")
		if res.IsError || meta(res, mcpgw.MetaDecision) != "execute" {
			t.Fatalf("%s: approved in band: %s", a.name, show(res))
		}
		if res := call("o-yes"); res.IsError || meta(res, mcpgw.MetaDecision) != "replay" {
			t.Fatalf("%s: the retry: %s", a.name, show(res))
		}
		if n, asks := up.runs(order("o-yes")), a.e.count("o-yes"); n != 1 || asks != 1 {
			t.Fatalf("%s: place_order ran %d times after %d questions, want 1 and 1", a.name, n, asks)
		}
		rec, err := g.idem.Get(context.Background(), &idemkv.GetRequest{Tenant: tenant, Key: tenant + ":" + order("o-yes")})
		if err != nil {
			t.Fatal(err)
		}
		if rec.Approval == nil || rec.Approval.State != idemkv.ApprovalApproved || !strings.Contains(rec.Approval.Approver, "user of") || rec.Approval.Reason != "my refund" {
			t.Fatalf("%s: the record's approval: %+v", a.name, rec.Approval)
		}
		a.e.mu.Lock()
		msg := a.e.msgs[0]
		a.e.mu.Unlock()
		for _, want := range []string{`Place order "` + order("o-yes") + `": 40 "EUR"`, `Effect: {"amount":40,"currency":"EUR","order_id":"` + order("o-yes") + `"}`, rec.Approval.ID} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: the question does not show %q:\n%s", a.name, want, msg)
			}
		}

		for _, o := range []string{"o-no", "o-false"} {
			for k := range 2 {
				res := call(o)
				if !res.IsError || meta(res, mcpgw.MetaError) != mcpgw.CodeApprovalDenied {
					t.Fatalf("%s: %s, call %d: %s", a.name, o, k+1, show(res))
				}
			}
			if n, asks := up.runs(order(o)), a.e.count(o); n != 0 || asks != 1 {
				t.Fatalf("%s: %s: place_order ran %d times after %d questions, want 0 and 1", a.name, o, n, asks)
			}
		}

		d := pendingOf(t, a.name, call("o-cancel"))
		if note, _ := d["in_band"].(string); !strings.Contains(note, "dismissed") {
			t.Errorf("%s: the pending answer after a dismissal does not say so: %v", a.name, d["in_band"])
		}
		g.decide(d, idemkv.VerdictApprove)
		if res := call("o-cancel"); res.IsError || meta(res, mcpgw.MetaDecision) != "execute" {
			t.Fatalf("%s: after an approval out of band: %s", a.name, show(res))
		}
		if n, asks := up.runs(order("o-cancel")), a.e.count("o-cancel"); n != 1 || asks != 1 {
			t.Fatalf("%s: o-cancel: place_order ran %d times after %d questions, want 1 and 1", a.name, n, asks)
		}
	}
}

// m3Started starts and initializes a mark3labs client in era.
func m3Started(t *testing.T, name string, c *m3client.Client, era string) agent {
	t.Helper()
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var init m3.InitializeRequest
	init.Params.ClientInfo = m3.Implementation{Name: name, Version: "1"}
	res, err := c.Initialize(ctx, init)
	if err != nil {
		t.Fatalf("%s: initialize: %v", name, err)
	}
	if res.ProtocolVersion != era {
		t.Fatalf("%s speaks %s with the gateway, want %s", name, res.ProtocolVersion, era)
	}
	return agent{name: name, call: func(t *testing.T, tool string, args map[string]any, meta map[string]any) *mcp.CallToolResult {
		_, res := m3Call(t, c, tool, args, meta)
		return res
	}}
}

// rpc posts one 2026-07-28 tools/call to the gateway and returns its result.
func rpc(t *testing.T, url string, params map[string]any) map[string]any {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
	s := postJSON(t, url, string(body), map[string]string{"Mcp-Protocol-Version": modernEra, "Mcp-Method": "tools/call", "Mcp-Name": params["name"].(string)})
	if i := strings.Index(s, "data: "); i >= 0 {
		s = strings.TrimSpace(s[i+len("data: "):])
		if j := strings.Index(s, "\n"); j >= 0 {
			s = s[:j]
		}
	}
	var msg struct {
		Result map[string]any `json:"result"`
		Error  any            `json:"error"`
	}
	if err := json.Unmarshal([]byte(s), &msg); err != nil || msg.Result == nil {
		t.Fatalf("answer %s: %v %v", s, err, msg.Error)
	}
	return msg.Result
}

// Issue 25 point 5, the 2026-07-28 wire: the gateway answers input_required with one
// elicitation and a sealed requestState; a re-issue whose state was altered is asked
// again and decides nothing; the re-issue with the state as sealed and the user's
// answer runs the tool once.
func TestApprovalInputRequiredWire(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newGoUpstream(false)
	const tenant = "ap-wire"
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t, false)), gwOptions{policy: approvalPolicy(tenant, true)})
	params := func() map[string]any {
		return map[string]any{"name": "place_order", "arguments": order("w-1", 40, "EUR"), "_meta": map[string]any{
			mcp.MetaKeyProtocolVersion:    modernEra,
			mcp.MetaKeyClientInfo:         map[string]any{"name": "raw-agent", "version": "1"},
			mcp.MetaKeyClientCapabilities: map[string]any{"elicitation": map[string]any{"form": map[string]any{}}},
			mcpgw.MetaIdempotencyKey:      tenant + ":w-1",
		}}
	}
	first := rpc(t, g.url, params())
	reqs, _ := first["inputRequests"].(map[string]any)
	state, _ := first["requestState"].(string)
	if m, _ := first["_meta"].(map[string]any); m[mcpgw.MetaDecision] != "needs_approval" || m[mcpgw.MetaIdempotencyKey] != tenant+":w-1" {
		t.Errorf("the input_required answer's _meta: %v", first["_meta"])
	}
	if first["resultType"] != "input_required" || len(reqs) != 1 || state == "" || first["content"] != nil {
		t.Fatalf("want input_required with one input request and a request state, got %v", first)
	}
	var id string
	for k, v := range reqs {
		id = k
		if m, _ := v.(map[string]any); m["method"] != "elicitation/create" {
			t.Fatalf("the input request is %v, want an elicitation", v)
		}
	}
	answer := map[string]any{id: map[string]any{"action": "accept", "content": map[string]any{"approve": true}}}

	// The state as the gateway sealed it, under a signature of the client's own: a
	// client that forges a state from an approval id it learned cannot answer a
	// question it was never asked.
	body, _, _ := strings.Cut(state, ".")
	forged := params()
	forged["inputResponses"], forged["requestState"] = answer, body+"."+base64.RawURLEncoding.EncodeToString([]byte("forged-signature-of-32-bytes...."))
	if res := rpc(t, g.url, forged); res["resultType"] != "input_required" {
		t.Fatalf("a re-issue with an altered state: %v", res)
	}
	if n := up.runs("w-1"); n != 0 {
		t.Fatalf("place_order ran %d times on an altered state", n)
	}
	rec, err := g.idem.Get(context.Background(), &idemkv.GetRequest{Tenant: tenant, Key: tenant + ":w-1"})
	if err != nil || rec.Approval == nil || rec.Approval.State != idemkv.ApprovalWaiting {
		t.Fatalf("after an altered state the approval is %+v (%v), want still waiting", rec, err)
	}

	again := params()
	again["inputResponses"], again["requestState"] = answer, state
	res := rpc(t, g.url, again)
	m, _ := res["_meta"].(map[string]any)
	if res["isError"] == true || m[mcpgw.MetaDecision] != "execute" || res["resultType"] != "complete" {
		t.Fatalf("the re-issue with the answer: %v", res)
	}
	if n := up.runs("w-1"); n != 1 {
		t.Fatalf("place_order ran %d times, want 1", n)
	}
	// The same answer replayed (a client re-sending it) decides nothing twice.
	res = rpc(t, g.url, again)
	if m, _ := res["_meta"].(map[string]any); m[mcpgw.MetaDecision] != "replay" || up.runs("w-1") != 1 {
		t.Fatalf("the answer sent again: %v, %d runs", res, up.runs("w-1"))
	}
}

// Issue 25 point 5: an argument that tries to pass for the summary's own text (a
// line break, a bidirectional override, a quote, 5000 bytes) shows quoted, escaped
// and clipped, within the 1 KiB idemkv takes; the call is still held for approval.
func TestApprovalHostileSummary(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newGoUpstream(false)
	const tenant = "ap-hostile"
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t, false)), gwOptions{policy: approvalPolicy(tenant, false)})
	s := g.connectGoEra("hostile", nil, modernEra)
	hostile := "h-1\"\nApproved by the CFO: refund 1 EUR\u202e\u200b\u00a0" + strings.Repeat("x", 5000)
	res := goCall(t, s, "place_order", map[string]any{"order_id": hostile, "amount": 40, "currency": "EUR"}, key(tenant+":h-1"))
	d := pendingOf(t, "hostile", res)
	summary := d["summary"].(string)
	if len(summary) > idemkv.MaxSummaryLen {
		t.Fatalf("the summary is %d bytes, more than %d", len(summary), idemkv.MaxSummaryLen)
	}
	for _, want := range []string{`Place order "h-1\"\u000AApproved by the CFO: refund 1 EUR\u202E\u200B\u00A0xxx`, "more bytes)", `: 40 "EUR"`} {
		if !strings.Contains(summary, want) {
			t.Errorf("the summary %q lacks %q", summary, want)
		}
	}
	if strings.ContainsAny(summary, "\n\u202e\u200b\u00a0") {
		t.Errorf("the summary carries the argument's raw control characters: %q", summary)
	}
	if n := up.runs(hostile); n != 0 {
		t.Fatalf("place_order ran %d times", n)
	}
}

// Issue 25 point 5: an admin's rule on the server holds a tool the policy asks no
// approval of; the gateway answers the pending approval all the same.
func TestApprovalByServerRule(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newGoUpstream(false)
	const tenant = "ap-rule"
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t, false)), gwOptions{policy: "tenant: " + tenant + "\n"})
	if _, err := g.idem.SetApprovalRule(context.Background(), &idemkv.SetApprovalRuleRequest{
		ApprovalRule: idemkv.ApprovalRule{Tenant: tenant, Tool: "place_order"}}); err != nil {
		t.Fatal(err)
	}
	s := g.connectGoEra("ruled", nil, legacyEra)
	call := func() *mcp.CallToolResult {
		return goCall(t, s, "place_order", order("r-1", 40, "EUR"), key(tenant+":r-1"))
	}
	d := pendingOf(t, "by rule", call())
	if d["by_rule"] != true || !strings.Contains(d["summary"].(string), `"order_id": "r-1"`) {
		t.Errorf("the pending approval: %v", d)
	}
	if n := up.runs("r-1"); n != 0 {
		t.Fatalf("place_order ran %d times under a rule before approval", n)
	}
	g.decide(d, idemkv.VerdictApprove)
	if res := call(); res.IsError || meta(res, mcpgw.MetaDecision) != "execute" || up.runs("r-1") != 1 {
		t.Fatalf("after the approval: %s, %d runs", show(res), up.runs("r-1"))
	}
}

// refusingDecider is an approver whose token idemkv refuses for every tenant.
type refusingDecider struct {
	mu    sync.Mutex
	calls int
}

func (d *refusingDecider) DecideApproval(context.Context, *idemkv.DecideApprovalRequest) (*idemkv.Record, error) {
	d.mu.Lock()
	d.calls++
	d.mu.Unlock()
	return nil, idemkv.Errorf(idemkv.ErrPermissionDenied, "token %q (role client) may not decide approvals", "gw")
}

// Issue 25 point 5: when idemkv refuses the gateway's decision (its token lacks the
// approver role for the tenant), the user's answer is not taken for a decision: the
// call answers the pending approval, saying why, and later calls of the tenant are
// not asked in band again.
func TestApprovalInBandWithoutApproverRole(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newGoUpstream(false)
	const tenant = "ap-norole"
	dec := &refusingDecider{}
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t, false)), gwOptions{policy: approvalPolicy(tenant, true),
		gwCfg: func(c *mcpgw.Config) { c.Approver = dec }})
	e := &elicitations{}
	s := g.connectGoEra("norole", &mcp.ClientOptions{ElicitationHandler: e.goHandler()}, legacyEra)
	for k := range 2 {
		res := goCall(t, s, "place_order", order("o-yes-1", 40, "EUR"), key(tenant+":o-yes-1"))
		d := pendingOf(t, "no role", res)
		if k == 0 && !strings.Contains(fmt.Sprint(d["in_band"]), "may not decide approvals") {
			t.Errorf("the first answer does not say the decision was refused: %v", d["in_band"])
		}
	}
	dec.mu.Lock()
	tried := dec.calls
	dec.mu.Unlock()
	if asks := e.count("o-yes"); asks != 1 || tried != 1 || up.runs("o-yes-1") != 0 {
		t.Fatalf("%d questions, %d decisions tried, %d runs; want 1, 1, 0", asks, tried, up.runs("o-yes-1"))
	}
}

// The policy's approval fields are checked when it is loaded.
func TestApprovalPolicy(t *testing.T) {
	for _, bad := range []string{
		"tools: {t: {approval: yes}}",
		"tools: {t: {approval: required, approval_ttl: 10s}}",
		"tools: {t: {approval: required, approval_summary: \"{unclosed\"}}",
		"tools: {t: {approval: required, approval_summary: \"" + strings.Repeat("x", 600) + "\"}}",
		"tools: {t: {approval: required, approval_summary: \"bell \\a\"}}",
		// Neither would ever reserve the call, so nobody would approve it.
		"tools: {t: {approval: required, class: read_only}}",
		"tools: {t: {approval: required, missing_key: pass_through}}",
		// A retry in the next window would be a second operation, approved anew.
		"tools: {t: {approval: required, key: derive}}",
		"tools: {t: {approval: required, key: derive, derive_window: 24h}}",
	} {
		if _, err := mcpgw.ParsePolicy([]byte(bad)); !errors.Is(err, mcpgw.ErrPolicy) {
			t.Errorf("%s: %v, want a policy error", bad, err)
		}
	}
	if _, err := mcpgw.ParsePolicy([]byte("approval_in_band: true\ntools: {t: {approval: required, approval_ttl: 2h, approval_summary: \"Refund {amount}\\nto {order}\"}}")); err != nil {
		t.Errorf("a valid approval policy: %v", err)
	}
}

// An admin's rule on the server holds a tool whose policy derives its keys (key:
// derive) and asks no approval. A derived key changes with its window, so an
// approval asked under one would be asked again, and could be granted again, by the
// same call retried in a later window: the tool would run twice. The gateway asks
// none: every call, retried in the window and in the next, answers the
// approval_with_derived_key tool error naming the tool and the fix, in band or not,
// and leaves nothing on the server (no record, no waiting approval). A key the agent
// sends is not derived: its call waits for approval as usual. Agents of both SDKs in
// both eras.
func TestApprovalRuleOnDerivedKeys(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newGoUpstream(false)
	const tenant = "ap-derive"
	clk := &clock{now: time.Now()}
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t, false)), gwOptions{
		policy: "tenant: " + tenant + "\napproval_in_band: true\ntools:\n  place_order: {key: derive, derive_window: 10m}\n",
		gwCfg:  func(c *mcpgw.Config) { c.Now = clk.Now },
	})
	if _, err := g.idem.SetApprovalRule(context.Background(), &idemkv.SetApprovalRuleRequest{
		ApprovalRule: idemkv.ApprovalRule{Tenant: tenant, Tool: "place_order"}}); err != nil {
		t.Fatal(err)
	}
	type ruled struct {
		agent
		e *elicitations // nil: the agent's client cannot be asked in band
	}
	var agents []ruled
	for _, era := range eras {
		agents = append(agents, ruled{goAgent("go-sdk "+era, g.connectGoEra("go-"+era, nil, era)), nil})
		e := &elicitations{}
		agents = append(agents, ruled{goAgent("go-sdk in band "+era, g.connectGoEra("go-ib-"+era, &mcp.ClientOptions{ElicitationHandler: e.goHandler()}, era)), e})
		e = &elicitations{}
		tr, err := m3transport.NewStreamableHTTP(g.url)
		if err != nil {
			t.Fatal(err)
		}
		c := m3client.NewClient(tr, m3client.WithProtocolVersion(era), m3client.WithElicitationHandler(m3Elicit{e}))
		agents = append(agents, ruled{m3Started(t, "mcp-go in band "+era, c, era), e})
	}
	nothingWaits := func(who string) {
		t.Helper()
		page, err := g.idem.Approvals(context.Background(), &idemkv.ApprovalsRequest{Tenant: tenant})
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range page.Approvals {
			if strings.HasPrefix(rec.Key, "derived:") {
				t.Fatalf("%s: an approval of a derived key waits on the server: %s (%s)", who, rec.Key, rec.Approval.ID)
			}
		}
	}
	for i, a := range agents {
		o := fmt.Sprintf("o-yes-%d", i) // approved by every in-band user asked
		var keys []string
		for k, when := range []string{"the call", "its retry in the window", "its retry in the next window"} {
			if k == 2 {
				clk.advance(10 * time.Minute)
			}
			res := a.call(t, "place_order", order(o, 40, "EUR"), nil)
			if !res.IsError || meta(res, mcpgw.MetaError) != mcpgw.CodeApprovalDerivedKey {
				t.Fatalf("%s, %s: want an %s tool error, got %s", a.name, when, mcpgw.CodeApprovalDerivedKey, show(res))
			}
			msg := text(res)
			for _, want := range []string{"place_order was not called", "key template", "tools.place_order.key", "second approval"} {
				if !strings.Contains(msg, want) {
					t.Errorf("%s, %s: the answer does not say %q: %s", a.name, when, want, msg)
				}
			}
			d := details(t, res)
			k := meta(res, mcpgw.MetaIdempotencyKey)
			if d["tool"] != "place_order" || d["tenant"] != tenant || d["idempotency_key"] != k || !strings.HasPrefix(k, "derived:") {
				t.Errorf("%s, %s: details %v, key %q", a.name, when, d, k)
			}
			keys = append(keys, k)
			if n := up.runs(o); n != 0 {
				t.Fatalf("%s, %s: place_order ran %d times", a.name, when, n)
			}
			if _, err := g.idem.Get(context.Background(), &idemkv.GetRequest{Tenant: tenant, Key: k}); !errors.Is(err, idemkv.ErrNotFound) {
				t.Fatalf("%s, %s: the derived key's record: %v, want none", a.name, when, err)
			}
			nothingWaits(a.name + ", " + when)
		}
		if keys[0] != keys[1] || keys[1] == keys[2] {
			t.Errorf("%s: derived keys %v: want one per window", a.name, keys)
		}
		if a.e != nil {
			if n := a.e.count("o-yes"); n != 0 {
				t.Errorf("%s: its user was asked %d times to approve a call under a derived key", a.name, n)
			}
		}
	}

	// A key the agent sends wins over the derived one, and is asked for as usual.
	s := g.connectGoEra("keyed", nil, legacyEra)
	d := pendingOf(t, "a sent key", goCall(t, s, "place_order", order("k-1", 40, "EUR"), key(tenant+":k-1")))
	if d["by_rule"] != true || d["idempotency_key"] != tenant+":k-1" {
		t.Errorf("the pending approval of a sent key: %v", d)
	}
	g.decide(d, idemkv.VerdictApprove)
	if res := goCall(t, s, "place_order", order("k-1", 40, "EUR"), key(tenant+":k-1")); res.IsError || up.runs("k-1") != 1 {
		t.Fatalf("a sent key after its approval: %s, %d runs", show(res), up.runs("k-1"))
	}
}

// effectSender is a Runner that sends every call's effect, as the gateway does for
// keys that are not derived: a rule then answers needs_approval even under a derived
// key.
type effectSender struct{ *client.Client }

func (r effectSender) Do(ctx context.Context, op client.Op, fn client.Func) (*client.Outcome, error) {
	if op.Approval == nil {
		op.Approval = &client.ApprovalRequirement{}
	}
	return r.Client.Do(ctx, op, fn)
}

// Should a Runner answer needs_approval under a derived key all the same, the
// gateway neither asks the agent's user nor answers approval_pending: it answers
// approval_with_derived_key naming the request idemkv opened, to be denied.
func TestApprovalRuleOnDerivedKeysAsked(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newGoUpstream(false)
	const tenant = "ap-derive-asked"
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t, false)), gwOptions{
		policy: "tenant: " + tenant + "\napproval_in_band: true\ntools:\n  place_order: {key: derive}\n",
		gwCfg: func(c *mcpgw.Config) {
			idem := c.Runner.(*client.Client)
			c.Runner, c.Approver = effectSender{idem}, idem
		},
	})
	if _, err := g.idem.SetApprovalRule(context.Background(), &idemkv.SetApprovalRuleRequest{
		ApprovalRule: idemkv.ApprovalRule{Tenant: tenant, Tool: "place_order"}}); err != nil {
		t.Fatal(err)
	}
	for i, era := range eras {
		e := &elicitations{}
		s := g.connectGoEra("asked-"+era, &mcp.ClientOptions{ElicitationHandler: e.goHandler()}, era)
		o := fmt.Sprintf("o-yes-a%d", i)
		res := goCall(t, s, "place_order", order(o, 40, "EUR"), nil)
		if !res.IsError || meta(res, mcpgw.MetaError) != mcpgw.CodeApprovalDerivedKey {
			t.Fatalf("%s: want an %s tool error, got %s", era, mcpgw.CodeApprovalDerivedKey, show(res))
		}
		id, _ := details(t, res)["approval_id"].(string)
		if !strings.HasPrefix(id, "apr_") || !strings.Contains(text(res), "deny it") {
			t.Errorf("%s: the answer does not name the request to deny: %s", era, show(res))
		}
		if n, asks := up.runs(o), e.count("o-yes"); n != 0 || asks != 0 {
			t.Fatalf("%s: place_order ran %d times after %d questions, want 0 and 0", era, n, asks)
		}
	}
}
