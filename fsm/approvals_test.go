package fsm

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"

	"github.com/idemkv/idemkv"
)

func askCmd(now idemkv.Timestamp, k, attempt string, mod ...func(*idemkv.ReserveRequest)) *Command {
	return reserveCmd(now, tenant, k, attempt, append([]func(*idemkv.ReserveRequest){func(r *idemkv.ReserveRequest) {
		r.Tool = "refund"
		r.Effect = json.RawMessage(effectA)
		r.Approval = &idemkv.ApprovalAsk{Required: true, TTLMs: approvalTTL, Summary: "refund " + k}
	}}, mod...)...)
}

func decideCmd(now idemkv.Timestamp, k, id string, v idemkv.ApprovalVerdict) *Command {
	return &Command{Op: OpDecideApproval, Now: now, Approval: &idemkv.DecideApprovalRequest{Tenant: tenant, Key: k,
		ApprovalID: id, Fingerprint: fpA, Decision: v, Approver: "ana"}}
}

// TestApprovalLifeThroughApply drives approvals through the state machine and Pebble:
// the waiting index lists what waits oldest first, a decision takes it off, the
// approved reserve executes once, and a snapshot restored elsewhere holds the same.
func TestApprovalLifeThroughApply(t *testing.T) {
	h := newHarness(t)
	rs := h.apply(askCmd(t0, "k2", "a"), askCmd(t0+1, "k1", "b"), askCmd(t0+2, "k3", "c"))
	mustOK(t, rs...)
	ids := map[string]string{}
	for i, k := range []string{"k2", "k1", "k3"} {
		if rs[i].Reserve.Decision != idemkv.DecisionNeedsApproval || !rs[i].Asked {
			t.Fatalf("%s: %+v", k, rs[i].Reserve)
		}
		ids[k] = rs[i].Reserve.Approval.ID
	}
	// A retry: the same id, nothing asked.
	again := h.apply(askCmd(t0+3, "k2", "z"))[0]
	if again.Reserve.Approval.ID != ids["k2"] || again.Asked {
		t.Fatalf("retry answered %+v asked=%v, want the same approval %s", again.Reserve.Approval, again.Asked, ids["k2"])
	}
	page, err := h.f.Approvals(&idemkv.ApprovalsRequest{Tenant: tenant, Limit: 2}, t0+10)
	if err != nil {
		t.Fatal(err)
	}
	if got := keysOf(page.Approvals); len(got) != 2 || got[0] != tenant+"/k2" || got[1] != tenant+"/k1" || page.Next == "" {
		t.Fatalf("first page %v next %q, want [k2 k1] oldest first and a next", got, page.Next)
	}
	if string(page.Approvals[0].Effect) != effectA || page.Approvals[0].Approval.Summary != "refund k2" {
		t.Fatalf("listed approval lacks its effect or summary: %+v", page.Approvals[0])
	}
	page2, err := h.f.Approvals(&idemkv.ApprovalsRequest{Tenant: tenant, After: page.Next}, t0+10)
	if err != nil || len(page2.Approvals) != 1 || page2.Approvals[0].Key != "k3" || page2.Next != "" {
		t.Fatalf("second page %+v, %v", page2, err)
	}
	if n, oldest := h.f.WaitingApprovals(t0 + 10); n != 3 || oldest != t0 {
		t.Fatalf("waiting = %d oldest %s, want 3 at %s", n, oldest, t0)
	}

	rs = h.apply(decideCmd(t0+20, "k2", ids["k2"], idemkv.VerdictApprove),
		decideCmd(t0+21, "k1", ids["k1"], idemkv.VerdictDeny),
		decideCmd(t0+22, "k2", ids["k2"], idemkv.VerdictDeny))
	mustOK(t, rs[:2]...)
	if !errors.Is(rs[2].Err, idemkv.ErrNotPending) {
		t.Fatalf("second decision: %+v, want not_pending", rs[2])
	}
	if n, _ := h.f.WaitingApprovals(t0 + 30); n != 1 {
		t.Fatalf("waiting after two decisions = %d, want 1", n)
	}
	rs = h.apply(askCmd(t0+30, "k2", "w1"), askCmd(t0+31, "k2", "w2"), askCmd(t0+32, "k1", "w3"))
	if d := rs[0].Reserve.Decision; d != idemkv.DecisionExecute || rs[0].Reserve.Fence == 0 {
		t.Fatalf("approved reserve: %+v", rs[0].Reserve)
	}
	if d := rs[1].Reserve.Decision; d != idemkv.DecisionInProgress {
		t.Fatalf("second worker on a consumed approval: %s, want in_progress", d)
	}
	if r := rs[2].Reserve; r.Decision != idemkv.DecisionReplay || r.Receipt.Error == nil || r.Receipt.Error.Code != idemkv.CodeApprovalDenied {
		t.Fatalf("denied reserve: %+v", r)
	}
	if err := h.f.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}

	// A lapsed approval leaves the list and the count, and the next reserve asks anew.
	late := idemkv.Timestamp(t0 + approvalTTL + 5)
	if n, _ := h.f.WaitingApprovals(late); n != 0 {
		t.Fatalf("lapsed approval still counted: %d", n)
	}
	rs = h.apply(decideCmd(late, "k3", ids["k3"], idemkv.VerdictApprove), askCmd(late+1, "k3", "d"))
	if !errors.Is(rs[0].Err, idemkv.ErrNotPending) {
		t.Fatalf("decision on a lapsed approval: %+v", rs[0])
	}
	if r := rs[1].Reserve; r.Decision != idemkv.DecisionNeedsApproval || r.Approval.ID == ids["k3"] || !rs[1].Asked {
		t.Fatalf("reserve after the lapse: %+v, want a new request", r)
	}
	if err := h.f.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}

	snap, want := snapshotBytes(t, h)
	other := newHarness(t)
	if err := other.f.Restore(io.NopCloser(bytes.NewReader(snap))); err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, other.f); got.hash != want.hash {
		t.Fatalf("restored state differs")
	}
	rec, err := other.f.Get(tenant, "k3", late+2)
	if err != nil || rec.Approval == nil || rec.Approval.State != idemkv.ApprovalWaiting || string(rec.Effect) != effectA {
		t.Fatalf("restored record %+v, %v", rec, err)
	}
	if n, _ := other.f.WaitingApprovals(late + 2); n != 1 {
		t.Fatalf("restored waiting count = %d, want 1", n)
	}
}

// TestApprovalRuleCannotBeSwitchedOff: with a rule for the tool, a reserve that asks
// for nothing still needs approval; without the effect it is refused; another tool is
// not held; removing the rule frees the tool.
func TestApprovalRuleCannotBeSwitchedOff(t *testing.T) {
	h := newHarness(t)
	rule := &Command{Op: OpSetApprovalRule, Now: t0, Rule: &idemkv.ApprovalRule{Tenant: tenant, Tool: "refund"}}
	plain := func(now idemkv.Timestamp, k, tool string, effect bool) *Command {
		return reserveCmd(now, tenant, k, "a", func(r *idemkv.ReserveRequest) {
			r.Tool = tool
			if effect {
				r.Effect = json.RawMessage(effectA)
			}
		})
	}
	rs := h.apply(rule, plain(t0+1, "r1", "refund", true), plain(t0+2, "r2", "refund", false), plain(t0+3, "t1", "create_ticket", false),
		plain(t0+4, "r3", "refund", true).withAsk(&idemkv.ApprovalAsk{Required: false, Summary: "say so"}))
	mustOK(t, rs[0])
	if r := rs[1].Reserve; r == nil || r.Decision != idemkv.DecisionNeedsApproval || !r.Approval.ByRule ||
		r.Approval.ExpiresAt != t0+1+idemkv.Timestamp(idemkv.DefaultApprovalTTL.Milliseconds()) {
		t.Fatalf("reserve under a rule: %+v", rs[1])
	}
	if !errors.Is(rs[2].Err, idemkv.ErrInvalidArgument) {
		t.Fatalf("reserve under a rule without its effect: %+v, want invalid_argument", rs[2])
	}
	if r := rs[3].Reserve; r == nil || r.Decision != idemkv.DecisionExecute {
		t.Fatalf("another tool: %+v", rs[3])
	}
	if r := rs[4].Reserve; r == nil || r.Decision != idemkv.DecisionNeedsApproval || r.Approval.Summary != "say so" {
		t.Fatalf("required: false under a rule: %+v, want needs_approval with the request's summary", rs[4])
	}
	rules, err := h.f.ApprovalRules(tenant)
	if err != nil || len(rules) != 1 || rules[0].TTLMs != idemkv.DefaultApprovalTTL.Milliseconds() {
		t.Fatalf("rules = %+v, %v", rules, err)
	}
	rs = h.apply(&Command{Op: OpRemoveApprovalRule, Now: t0 + 5, Rule: &idemkv.ApprovalRule{Tenant: tenant, Tool: "refund"}},
		plain(t0+6, "r4", "refund", false))
	mustOK(t, rs...)
	if r := rs[1].Reserve; r.Decision != idemkv.DecisionExecute {
		t.Fatalf("after the rule's removal: %s", r.Decision)
	}
}

func (c *Command) withAsk(a *idemkv.ApprovalAsk) *Command { c.Reserve.Approval = a; return c }
