package mcpgw_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	m3client "github.com/mark3labs/mcp-go/client"
	m3transport "github.com/mark3labs/mcp-go/client/transport"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/mcpgw"
)

// What a person approves is what runs: the effect of a tool asked approval of is
// every argument it is called with but the policy's volatile ones, which the question
// names as not shown and not bound.

// argsUpstream is a go-sdk upstream whose tools (transfer, payout) take any
// arguments and keep those of every run, per order id.
type argsUpstream struct {
	srv  *mcp.Server
	mu   sync.Mutex
	seen map[string][]map[string]any
}

func newArgsUpstream() *argsUpstream {
	u := &argsUpstream{seen: map[string][]map[string]any{}}
	u.srv = mcp.NewServer(&mcp.Implementation{Name: "go-payments", Version: "1"}, nil)
	f := false
	for _, name := range []string{"transfer", "payout"} {
		u.srv.AddTool(&mcp.Tool{Name: name, InputSchema: map[string]any{"type": "object"}, Annotations: &mcp.ToolAnnotations{DestructiveHint: &f}},
			func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				var args map[string]any
				if err := json.Unmarshal(req.Params.Arguments, &args); err != nil {
					return nil, err
				}
				order, _ := args["order_id"].(string)
				u.mu.Lock()
				u.seen[order] = append(u.seen[order], args)
				n := len(u.seen[order])
				u.mu.Unlock()
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("%s %s run %d", name, order, n)}}}, nil
			})
	}
	return u
}

// runs returns the arguments of every run of the order.
func (u *argsUpstream) runs(order string) []map[string]any {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]map[string]any(nil), u.seen[order]...)
}

func (u *argsUpstream) serveHTTP(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return u.srv },
		&mcp.StreamableHTTPOptions{Stateless: true}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// inBandAgent is an agent whose MCP client asks its user (e), or cannot (e nil).
type inBandAgent struct {
	agent
	e *elicitations
}

// inBandAgents are agents of both SDKs in both eras whose clients answer approval
// questions as e does, and, with plain, go-sdk agents that cannot be asked.
func inBandAgents(t *testing.T, g *gw, plain bool) []inBandAgent {
	var agents []inBandAgent
	for _, era := range eras {
		if plain {
			agents = append(agents, inBandAgent{goAgent("go-sdk "+era, g.connectGoEra("go-"+era, nil, era)), nil})
		}
		e := &elicitations{}
		agents = append(agents, inBandAgent{goAgent("go-sdk in band "+era, g.connectGoEra("go-ib-"+era, &mcp.ClientOptions{ElicitationHandler: e.goHandler()}, era)), e})
		e = &elicitations{}
		tr, err := m3transport.NewStreamableHTTP(g.url)
		if err != nil {
			t.Fatal(err)
		}
		c := m3client.NewClient(tr, m3client.WithProtocolVersion(era), m3client.WithElicitationHandler(m3Elicit{e}))
		agents = append(agents, inBandAgent{m3Started(t, "mcp-go in band "+era, c, era), e})
	}
	return agents
}

// (1) A policy that requires approval of a tool and limits its effect to some of
// its arguments is refused when it loads, saying why and what to do; so is a
// summary that shows an argument the volatile paths drop.
func TestApprovalPolicyRefusesEffectSubset(t *testing.T) {
	for _, tc := range []struct{ policy, path string }{
		{"tools: {refund: {key: \"r:{order_id}\", approval: required, effect: [order_id]}}", "tools.refund"},
		{"tools: {refund: {key: \"r:{order_id}\", approval: required, effect: [order_id, amount, currency], volatile: [trace_id]}}", "tools.refund"},
		{"approval_in_band: true\ntools:\n  a: {}\n  wire:\n    key: \"w:{order_id}\"\n    approval: required\n    effect: [order_id]\n", "tools.wire"},
	} {
		_, err := mcpgw.ParsePolicy([]byte(tc.policy))
		if !errors.Is(err, mcpgw.ErrPolicy) {
			t.Fatalf("policy %q: %v, want it refused", tc.policy, err)
		}
		for _, want := range []string{tc.path, "approval: required cannot take effect: [order_id", "the approver would see", "remove effect", "under volatile"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("policy %q: the error does not say %q: %v", tc.policy, want, err)
			}
		}
	}
	// A Policy built in code is held to the same when the gateway validates it.
	p := &mcpgw.Policy{Tools: map[string]*mcpgw.ToolPolicy{"refund": {Key: "r:{order_id}", Approval: mcpgw.ApprovalRequired, Effect: []string{"order_id"}}}}
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "under volatile") {
		t.Errorf("a Policy with approval: required and an effect: %v", err)
	}

	for _, bad := range []string{
		"tools: {t: {approval: required, volatile: [trace_id], approval_summary: \"Pay {amount} ({trace_id})\"}}",
		"tools: {t: {approval: required, volatile: [meta.trace_id], approval_summary: \"Pay {amount} {meta}\"}}",
		"tools: {t: {approval: required, volatile: [\"items.*.note\"], approval_summary: \"Ship {items.0.note}\"}}",
		"tools: {t: {approval: required, volatile: [note], approval_summary: \"Ship {arguments.note}\"}}",
	} {
		_, err := mcpgw.ParsePolicy([]byte(bad))
		if !errors.Is(err, mcpgw.ErrPolicy) || !strings.Contains(err.Error(), "does not bind") {
			t.Errorf("policy %q: %v, want it refused for showing a volatile argument", bad, err)
		}
	}

	for _, good := range []string{
		"tools: {refund: {key: \"r:{order_id}\", approval: required, volatile: [trace_id, \"items.*.note\"], approval_summary: \"Refund {amount} on {order_id} for {tenant}\"}}",
		// Without approval: required an effect subset stays what it was (a rule on the
		// server never asks approval of it: TestApprovalRuleOnEffectSubset).
		"tools: {create_ticket: {key: \"t:{incident_id}\", effect: [incident_id, title], volatile: [trace_id]}}",
	} {
		if _, err := mcpgw.ParsePolicy([]byte(good)); err != nil {
			t.Errorf("policy %q: %v", good, err)
		}
	}
}

// transferArgs are the arguments of a transfer: trace_id and context.session are
// volatile in boundPolicy, everything else is bound.
func transferArgs(order string, amount int, account, trace string) map[string]any {
	return map[string]any{"order_id": order, "amount": amount, "to_account": account, "trace_id": trace,
		"context": map[string]any{"channel": "web", "session": "s-" + trace}}
}

const boundPolicyFmt = `tenant: %s
tools:
  transfer:
    key: "{tenant}:{order_id}:transfer"
    volatile: [trace_id, context.session]
    approval: required
    approval_in_band: true
  payout:
    key: "{tenant}:{order_id}:payout"
    volatile: [trace_id, context.session]
    approval: required
`

// (2) A tool that requires approval, with volatile fields: the approver sees every
// other argument (in the question, the record and the default summary), the question
// names what it does not show and the approval does not bind, the call runs with the
// arguments it was approved for, and a retry, or a 2026-07-28 re-issue carrying the
// user's answer, that changes a bound argument after the approval does not run
// under it: a conflict. Agents of both SDKs in both eras, in band and out of band.
func TestApprovalBindsEveryArgument(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newArgsUpstream()
	const tenant = "ap-bound"
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t)), gwOptions{policy: fmt.Sprintf(boundPolicyFmt, tenant)})
	const account, other = "DE89370400440532013000", "GB33BUKB20201555555555"
	for i, a := range inBandAgents(t, g, false) {
		// In band: the question shows every bound argument and names the volatile
		// ones it does not show.
		o := fmt.Sprintf("o-yes-%d", i)
		res := a.call(t, "transfer", transferArgs(o, 40, account, "t-1"), nil)
		if res.IsError || meta(res, mcpgw.MetaDecision) != "execute" {
			t.Fatalf("%s: approved in band: %s", a.name, show(res))
		}
		a.e.mu.Lock()
		msg := a.e.msgs[len(a.e.msgs)-1]
		a.e.mu.Unlock()
		effect := `Effect: {"amount":40,"context":{"channel":"web"},"order_id":"` + o + `","to_account":"` + account + `"}`
		for _, want := range []string{effect, "Not shown, not bound: trace_id, context.session", `Call "transfer" with {"amount": 40, "context": {"channel": "web"}, "order_id": "` + o + `", "to_account": "` + account + `"}`} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: the question does not show %q:\n%s", a.name, want, msg)
			}
		}
		if strings.Contains(msg, "t-1") {
			t.Errorf("%s: the question shows a volatile value as if it were approved:\n%s", a.name, msg)
		}
		runs := up.runs(o)
		if len(runs) != 1 || runs[0]["to_account"] != account || runs[0]["amount"] != float64(40) || runs[0]["trace_id"] != "t-1" {
			t.Fatalf("%s: transfer ran with %v, want once with the approved arguments", a.name, runs)
		}

		// Out of band: the approver reads every bound argument; after the approval a
		// retry with another amount or account is a conflict and does not run, and
		// the call as approved runs once, whatever its volatile arguments.
		o = fmt.Sprintf("o-oob-%d", i)
		k := tenant + ":" + o + ":payout"
		d := pendingOf(t, a.name, a.call(t, "payout", transferArgs(o, 40, account, "t-1"), nil))
		if s := d["summary"].(string); strings.Contains(s, "t-1") || !strings.Contains(s, `"to_account": "`+account+`"`) || !strings.Contains(s, `"amount": 40`) {
			t.Errorf("%s: the summary %q", a.name, s)
		}
		rec, err := g.idem.Get(context.Background(), &idemkv.GetRequest{Tenant: tenant, Key: k})
		if err != nil {
			t.Fatal(err)
		}
		if want := `{"amount":40,"context":{"channel":"web"},"order_id":"` + o + `","to_account":"` + account + `"}`; string(rec.Effect) != want {
			t.Fatalf("%s: the approver is shown %s, want %s", a.name, rec.Effect, want)
		}
		g.decide(d, idemkv.VerdictApprove)
		for _, changed := range []map[string]any{transferArgs(o, 4000, account, "t-1"), transferArgs(o, 40, other, "t-1")} {
			res := a.call(t, "payout", changed, nil)
			if !res.IsError || meta(res, mcpgw.MetaError) != mcpgw.CodeConflict {
				t.Fatalf("%s: a retry with %v after the approval: %s, want a conflict", a.name, changed, show(res))
			}
		}
		if runs := up.runs(o); len(runs) != 0 {
			t.Fatalf("%s: payout ran %v under an approval of other arguments", a.name, runs)
		}
		if res := a.call(t, "payout", transferArgs(o, 40, account, "t-2"), nil); res.IsError || meta(res, mcpgw.MetaDecision) != "execute" {
			t.Fatalf("%s: the call as approved (another trace id): %s", a.name, show(res))
		}
		if runs := up.runs(o); len(runs) != 1 || runs[0]["amount"] != float64(40) || runs[0]["to_account"] != account {
			t.Fatalf("%s: payout ran with %v, want once as approved", a.name, runs)
		}
	}

	// The 2026-07-28 wire: the user answers the question for the transfer shown, and
	// the re-issue carrying that answer asks for another amount. The answer is
	// recorded for what was shown; the re-issue does not run under it.
	params := func(amount int) map[string]any {
		return map[string]any{"name": "transfer", "arguments": transferArgs("w-1", amount, account, "t-1"), "_meta": map[string]any{
			mcp.MetaKeyProtocolVersion:    modernEra,
			mcp.MetaKeyClientInfo:         map[string]any{"name": "raw-agent", "version": "1"},
			mcp.MetaKeyClientCapabilities: map[string]any{"elicitation": map[string]any{"form": map[string]any{}}},
		}}
	}
	first := rpc(t, g.url, params(40))
	reqs, _ := first["inputRequests"].(map[string]any)
	state, _ := first["requestState"].(string)
	if first["resultType"] != "input_required" || len(reqs) != 1 || state == "" {
		t.Fatalf("want input_required, got %v", first)
	}
	var id string
	for k := range reqs {
		id = k
	}
	reissue := params(4000)
	reissue["inputResponses"] = map[string]any{id: map[string]any{"action": "accept", "content": map[string]any{"approve": true}}}
	reissue["requestState"] = state
	res := rpc(t, g.url, reissue)
	if m, _ := res["_meta"].(map[string]any); res["isError"] != true || m[mcpgw.MetaError] != mcpgw.CodeConflict {
		t.Fatalf("a re-issue for another amount after its answer: %v, want a conflict", res)
	}
	if runs := up.runs("w-1"); len(runs) != 0 {
		t.Fatalf("transfer ran %v under an approval of another amount", runs)
	}
	res = rpc(t, g.url, params(40))
	if m, _ := res["_meta"].(map[string]any); res["isError"] == true || m[mcpgw.MetaDecision] != "execute" {
		t.Fatalf("the call as approved: %v", res)
	}
	if runs := up.runs("w-1"); len(runs) != 1 || runs[0]["amount"] != float64(40) {
		t.Fatalf("transfer ran %v, want once with amount 40", runs)
	}
}

// (3) An admin's rule on the server holds a tool whose policy limits its effect to
// some arguments (effect: [order_id]). The approver would see the order id alone
// and approve a call whose amount and account they never saw, so the gateway asks
// no approval: every call answers approval_with_effect_subset naming the tool and
// the fix, is not run, is not asked in band, and leaves nothing on the server (no
// record, no waiting approval anyone could grant). Agents of both SDKs in both eras.
// A rule that only stores effects does not hold the tool: it runs.
func TestApprovalRuleOnEffectSubset(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newArgsUpstream()
	const tenant = "ap-subset"
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t)), gwOptions{
		policy: "tenant: " + tenant + "\napproval_in_band: true\ntools:\n  transfer: {key: \"{tenant}:{order_id}:transfer\", effect: [order_id], volatile: [trace_id]}\n",
	})
	if _, err := g.idem.SetApprovalRule(context.Background(), &idemkv.SetApprovalRuleRequest{
		ApprovalRule: idemkv.ApprovalRule{Tenant: tenant, Tool: "transfer"}}); err != nil {
		t.Fatal(err)
	}
	for i, a := range inBandAgents(t, g, true) {
		o := fmt.Sprintf("o-yes-%d", i) // approved by every in-band user asked
		k := tenant + ":" + o + ":transfer"
		for _, when := range []string{"the call", "its retry"} {
			res := a.call(t, "transfer", transferArgs(o, 40, "DE89370400440532013000", "t-1"), nil)
			if !res.IsError || meta(res, mcpgw.MetaError) != mcpgw.CodeApprovalEffectSubset {
				t.Fatalf("%s, %s: want an %s tool error, got %s", a.name, when, mcpgw.CodeApprovalEffectSubset, show(res))
			}
			msg := text(res)
			for _, want := range []string{"transfer was not called", "tools.transfer.effect: [order_id]", "Remove tools.transfer.effect", "tools.transfer.volatile"} {
				if !strings.Contains(msg, want) {
					t.Errorf("%s, %s: the answer does not say %q: %s", a.name, when, want, msg)
				}
			}
			d := details(t, res)
			if d["tool"] != "transfer" || d["tenant"] != tenant || d["idempotency_key"] != k || d["reason"] != "approval_rule" || fmt.Sprint(d["effect"]) != "[order_id]" {
				t.Errorf("%s, %s: details %v", a.name, when, d)
			}
			if runs := up.runs(o); len(runs) != 0 {
				t.Fatalf("%s, %s: transfer ran %v", a.name, when, runs)
			}
			if _, err := g.idem.Get(context.Background(), &idemkv.GetRequest{Tenant: tenant, Key: k}); !errors.Is(err, idemkv.ErrNotFound) {
				t.Fatalf("%s, %s: the key's record: %v, want none", a.name, when, err)
			}
		}
		if a.e != nil {
			if n := a.e.count("o-yes"); n != 0 {
				t.Errorf("%s: its user was asked %d times to approve part of a call", a.name, n)
			}
		}
	}
	page, err := g.idem.Approvals(context.Background(), &idemkv.ApprovalsRequest{Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Approvals) != 0 {
		t.Fatalf("%d approvals wait on the server, the first of %s", len(page.Approvals), page.Approvals[0].Key)
	}

	// A rule that only stores effects holds nothing: the tool runs (its reserve
	// carries the fingerprint alone, so nothing is stored).
	no := false
	if _, err := g.idem.SetApprovalRule(context.Background(), &idemkv.SetApprovalRuleRequest{
		ApprovalRule: idemkv.ApprovalRule{Tenant: tenant, Tool: "transfer", RequireApproval: &no, StoreEffect: true}}); err != nil {
		t.Fatal(err)
	}
	s := g.connectGoEra("stored", nil, legacyEra)
	if res := goCall(t, s, "transfer", transferArgs("s-1", 40, "DE89370400440532013000", "t-1"), nil); res.IsError || meta(res, mcpgw.MetaDecision) != "execute" || len(up.runs("s-1")) != 1 {
		t.Fatalf("under a rule that only stores effects: %s, %v", show(res), up.runs("s-1"))
	}
}

// Should the store answer needs_approval for a tool whose policy names an effect
// subset all the same (a Runner of one's own that sends the effect), the gateway
// neither asks the agent's user nor answers approval_pending: it answers
// approval_with_effect_subset naming the request idemkv opened, to be denied.
func TestApprovalRuleOnEffectSubsetAsked(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newArgsUpstream()
	const tenant = "ap-subset-asked"
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t)), gwOptions{
		policy: "tenant: " + tenant + "\napproval_in_band: true\ntools:\n  transfer: {key: \"{tenant}:{order_id}:transfer\", effect: [order_id]}\n",
		gwCfg: func(c *mcpgw.Config) {
			idem := c.Runner.(*client.Client)
			c.Runner, c.Approver = effectSender{idem}, idem
		},
	})
	if _, err := g.idem.SetApprovalRule(context.Background(), &idemkv.SetApprovalRuleRequest{
		ApprovalRule: idemkv.ApprovalRule{Tenant: tenant, Tool: "transfer"}}); err != nil {
		t.Fatal(err)
	}
	e := &elicitations{}
	s := g.connectGoEra("asked", &mcp.ClientOptions{ElicitationHandler: e.goHandler()}, legacyEra)
	res := goCall(t, s, "transfer", transferArgs("o-yes-1", 40, "DE89370400440532013000", "t-1"), nil)
	if !res.IsError || meta(res, mcpgw.MetaError) != mcpgw.CodeApprovalEffectSubset || meta(res, mcpgw.MetaDecision) != string(idemkv.DecisionNeedsApproval) {
		t.Fatalf("want an %s tool error, got %s", mcpgw.CodeApprovalEffectSubset, show(res))
	}
	d := details(t, res)
	id, _ := d["approval_id"].(string)
	if id == "" || !strings.Contains(text(res), "deny it, do not approve it") || !strings.Contains(text(res), "idemkv approvals deny") {
		t.Errorf("the answer does not name the request to deny: %s", show(res))
	}
	if n := e.count("o-yes"); n != 0 || len(up.runs("o-yes-1")) != 0 {
		t.Fatalf("its user was asked %d times, transfer ran %v", n, up.runs("o-yes-1"))
	}
}

// (4) An effect longer than an in-band question shows whole is not asked in band:
// the user would approve what they could not read. The call answers approval_pending
// saying so and where the effect is shown whole; approved there, it runs once.
// Agents of both SDKs in both eras.
func TestApprovalInBandEffectTooLong(t *testing.T) {
	cluster := testcluster.Start(t, 1)
	up := newArgsUpstream()
	const tenant = "ap-long"
	g := newGW(t, cluster, httpUpstream(up.serveHTTP(t)), gwOptions{policy: fmt.Sprintf(boundPolicyFmt, tenant)})
	long := strings.Repeat("pay the remaining balance to the account below; ", 100) // ~4.9 KB
	for i, a := range inBandAgents(t, g, false) {
		o := fmt.Sprintf("o-yes-%d", i) // approved by any user asked
		args := transferArgs(o, 40, "DE89370400440532013000", "t-1")
		args["z_instructions"] = long // after the order id: a clipped question would still show it
		res := a.call(t, "transfer", args, nil)
		d := pendingOf(t, a.name, res)
		note, _ := d["in_band"].(string)
		for _, want := range []string{"was not asked", "more than an in-band question shows (4096)", "/ui/record?tenant=" + tenant + "&key=", "idemkv approvals ls --tenant " + tenant} {
			if !strings.Contains(note, want) || !strings.Contains(text(res), want) {
				t.Errorf("%s: the answer does not say %q: %s", a.name, want, show(res))
			}
		}
		if n := a.e.count("o-yes"); n != 0 || len(up.runs(o)) != 0 {
			t.Fatalf("%s: its user was asked %d times about an effect the question clips; transfer ran %v", a.name, n, up.runs(o))
		}
		g.decide(d, idemkv.VerdictApprove)
		if res := a.call(t, "transfer", args, nil); res.IsError || meta(res, mcpgw.MetaDecision) != "execute" {
			t.Fatalf("%s: after the approval out of band: %s", a.name, show(res))
		}
		if runs := up.runs(o); len(runs) != 1 || runs[0]["z_instructions"] != long {
			t.Fatalf("%s: transfer ran %d times, want once as approved", a.name, len(runs))
		}
	}
}
