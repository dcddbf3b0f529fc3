package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
)

// TestApprovalsCommands: an admin sets a rule with idemkv approvals rule, an approver
// lists what waits with approvals ls and decides it with approve and deny, naming the
// approval id and the fingerprint ls showed; a decision naming another effect is
// refused and changes nothing (issue 25, point 4).
func TestApprovalsCommands(t *testing.T) {
	ep, cl, ctx := oneNode(t)

	if _, err := cli(t, "approvals", "rule", "set", "--endpoint", ep, "--tenant", "shop", "--tool", "refund", "--ttl", "1h"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli(t, "approvals", "rule", "set", "--endpoint", ep, "--tenant", "shop", "--tool", "refund", "--ttl", "10s"); err == nil {
		t.Error("a rule's wait of 10 s (below the 1 min minimum) was accepted")
	}
	out, err := cli(t, "approvals", "rule", "ls", "--endpoint", ep, "--tenant", "shop")
	var rules idemkv.ApprovalRules
	if err != nil || json.Unmarshal([]byte(out), &rules) != nil || len(rules.Rules) != 1 ||
		rules.Rules[0].Tool != "refund" || rules.Rules[0].TTLMs != time.Hour.Milliseconds() {
		t.Fatalf("rule ls: %v %s", err, out)
	}

	// Two refunds wait: the rule asks for approval whatever the client says.
	reserve := func(key, amount, attempt string) *idemkv.ReserveResult {
		t.Helper()
		res, err := cl.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "shop", Key: key, Tool: "refund",
			Effect: json.RawMessage(`{"amount":` + amount + `}`), AttemptID: attempt})
		if err != nil {
			t.Fatalf("reserve %s: %v", key, err)
		}
		return res
	}
	for _, k := range []string{"order-1:refund", "order-2:refund"} {
		if res := reserve(k, "10", "a1"); res.Decision != idemkv.DecisionNeedsApproval {
			t.Fatalf("reserve %s under the rule: %s, want needs_approval", k, res.Decision)
		}
	}
	out, err = cli(t, "approvals", "ls", "--endpoint", ep, "--tenant", "shop", "--limit", "1", "--all")
	var page approvalPage
	if err != nil || json.Unmarshal([]byte(out), &page) != nil || len(page.Approvals) != 2 {
		t.Fatalf("approvals ls --all, a page of one: %v %s", err, out)
	}
	first := page.Approvals[0]
	if first.Key != "order-1:refund" || first.Tool != "refund" || first.ApprovalID == "" || !first.ByRule ||
		!strings.HasPrefix(first.Fingerprint, "sha256:") || compactJSON(t, first.Effect) != `{"amount":10}` {
		t.Fatalf("approvals ls, the first: %+v", first)
	}

	decide := func(verb, key, id, fp string) error {
		_, err := cli(t, "approvals", verb, "--endpoint", ep, "--tenant", "shop", "--key", key, "--id", id,
			"--fingerprint", fp, "--approver", "ana", "--reason", "customer called")
		return err
	}
	if err := decide("approve", first.Key, first.ApprovalID, "sha256:"+strings.Repeat("0", 64)); err == nil ||
		!strings.Contains(err.Error(), "fingerprint_mismatch") {
		t.Fatalf("approve naming another effect: %v, want fingerprint_mismatch", err)
	}
	if res := reserve(first.Key, "10", "a1"); res.Decision != idemkv.DecisionNeedsApproval {
		t.Fatalf("after a refused approve: %s, want still needs_approval", res.Decision)
	}
	if err := decide("approve", first.Key, first.ApprovalID, first.Fingerprint); err != nil {
		t.Fatal(err)
	}
	if err := decide("approve", first.Key, first.ApprovalID, first.Fingerprint); err == nil {
		t.Error("a second decision of the same approval was accepted")
	}
	if res := reserve(first.Key, "10", "a1"); res.Decision != idemkv.DecisionExecute {
		t.Fatalf("after approve: %s, want execute", res.Decision)
	}

	second := page.Approvals[1]
	if err := decide("deny", second.Key, second.ApprovalID, second.Fingerprint); err != nil {
		t.Fatal(err)
	}
	res := reserve(second.Key, "10", "a2")
	if res.Decision != idemkv.DecisionReplay || res.Record == nil || res.Record.Error == nil || res.Record.Error.Code != "approval_denied" {
		t.Fatalf("after deny: %+v, want a replay of approval_denied", res)
	}

	out, err = cli(t, "approvals", "ls", "--endpoint", ep, "--tenant", "shop")
	if err != nil || json.Unmarshal([]byte(out), &page) != nil || len(page.Approvals) != 0 {
		t.Fatalf("approvals ls once both are decided: %v %s", err, out)
	}
	if _, err := cli(t, "approvals", "rule", "rm", "--endpoint", ep, "--tenant", "shop", "--tool", "refund"); err != nil {
		t.Fatal(err)
	}
	if res := reserve("order-3:refund", "10", "a1"); res.Decision != idemkv.DecisionExecute {
		t.Fatalf("after rule rm: %s, want execute", res.Decision)
	}
}

func compactJSON(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	return b.String()
}
