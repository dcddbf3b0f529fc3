package node

import (
	"context"
	"fmt"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/fsm"
)

// effectToKeep returns the canonical JSON of r's effect when its record must keep it:
// the reserve asks for approval or store_effect, or rule (its tenant and tool's, when
// ruled, read from this node's state) requires an approval or stores effects (an
// approval rule set since is caught by the state machine, which refuses the reserve
// without its effect, and the retry carries it; a storing rule set since only misses
// this reserve's effect). Otherwise the log carries the fingerprint alone, as it
// always has. What the rule masks is masked here already, so that the log, which
// every replica keeps, never holds it either; the state machine masks again with the
// rule it reads in the entry's batch (a rule set since the proposal).
func (n *Node) effectToKeep(r *idemkv.ReserveRequest, rule idemkv.ApprovalRule, ruled bool) ([]byte, error) {
	why := "is kept for its approver"
	switch {
	case r.Approval != nil && r.Approval.Required:
	case r.StoreEffect:
		why = "is stored (store_effect)"
	default:
		if !ruled || (!rule.RequiresApproval() && !rule.StoreEffect) {
			return nil, nil
		}
		if len(r.Effect) == 0 {
			if !rule.RequiresApproval() {
				// A rule that stores effects cannot refuse a reserve that names its
				// effect by fingerprint: it has nothing to store, and no diff later.
				return nil, nil
			}
			return nil, idemkv.Invalid("effect", "tool %q of tenant %q requires approval: the reserve must carry the effect itself, not only its fingerprint", r.Tool, r.Tenant)
		}
		if !rule.RequiresApproval() {
			why = "is stored (a rule of its tool)"
		}
	}
	canonical, err := fingerprint.Canonicalize(r.Effect)
	if err != nil {
		return nil, idemkv.Invalid("effect", "effect: %v", err)
	}
	if max := n.cfg.Limits.WithDefaults().MaxPayloadBytes; len(canonical) > max {
		return nil, &idemkv.Error{Code: idemkv.CodePayloadTooLarge, Field: "effect",
			Message: fmt.Sprintf("an effect that %s is %d bytes; the limit is %d", why, len(canonical), max)}
	}
	if ruled && len(rule.Mask) > 0 {
		masked, err := fingerprint.Mask(canonical, rule.Mask)
		if err != nil {
			// The rule's masks were validated when it was set.
			return nil, fmt.Errorf("node: masking the effect with the rule of %s/%s: %w", r.Tenant, r.Tool, err)
		}
		return masked, nil
	}
	return canonical, nil
}

// explain adds to a conflict the difference between the effect its record keeps and
// the one req carried (docs/protocol.md "History and explained conflicts"). It runs
// on the answer, outside the state machine, on whichever node answers; a record that
// keeps no effect, a reserve that sent only a fingerprint, or one for another tool
// leave the conflict as it was. res is the caller's to change: every path builds it
// fresh.
func explain(res *idemkv.ReserveResult, req *idemkv.ReserveRequest) *idemkv.ReserveResult {
	if res == nil || res.Conflict == nil || res.Record == nil || len(res.Record.Effect) == 0 ||
		len(req.Effect) == 0 || string(req.Effect) == "null" || res.Conflict.Reason != idemkv.ReasonDifferentEffect {
		return res
	}
	diffs, omitted, err := fingerprint.Diff(res.Record.Effect, req.Effect, res.Record.EffectMask,
		fingerprint.DiffLimits{MaxEntries: idemkv.MaxDiffEntries, MaxValue: idemkv.MaxDiffValue, MaxPath: idemkv.MaxDiffPath})
	if err != nil {
		// The reserve's effect was fingerprinted, the record's is canonical: neither
		// fails to parse. A conflict without a diff is still the right answer.
		return res
	}
	c := *res.Conflict
	c.Diff = make([]idemkv.DiffEntry, len(diffs))
	for i, d := range diffs {
		c.Diff[i] = idemkv.DiffEntry{Path: d.Path, Stored: d.Stored, Received: d.Received}
	}
	c.DiffOmitted = omitted
	out := *res
	out.Conflict = &c
	return &out
}

// DecideApproval approves or denies the approval a record waits for; the answer is
// the record after the decision.
func (n *Node) DecideApproval(ctx context.Context, req *idemkv.DecideApprovalRequest) (*idemkv.Record, error) {
	r := *req
	if err := r.Validate(); err != nil {
		return nil, err
	}
	res, err := n.propose(ctx, &fsm.Command{Op: fsm.OpDecideApproval, Approval: &r})
	if err != nil {
		return nil, err
	}
	n.metrics.ApprovalDecisions.WithLabelValues(n.metrics.Tools.Value(r.Tenant, res.Record.Tool), string(r.Decision)).Inc()
	return res.Record, nil
}

// Approvals pages through a tenant's waiting approvals, oldest first, read as List
// reads: linearizably unless stale.
func (n *Node) Approvals(ctx context.Context, req *idemkv.ApprovalsRequest) (*idemkv.ApprovalsResult, error) {
	r := *req
	if err := r.Validate(); err != nil {
		return nil, err
	}
	r.EnsureDefaults()
	if err := n.readAt(ctx, r.Consistency); err != nil {
		return nil, err
	}
	return n.fsm.Approvals(&r, n.now())
}

// SetApprovalRule sets or removes an approval rule and answers the tenant's rules.
func (n *Node) SetApprovalRule(ctx context.Context, req *idemkv.SetApprovalRuleRequest) (*idemkv.ApprovalRules, error) {
	r := *req
	if err := r.Validate(); err != nil {
		return nil, err
	}
	op := fsm.OpSetApprovalRule
	if r.Remove {
		op = fsm.OpRemoveApprovalRule
	}
	rule := r.ApprovalRule
	if _, err := n.propose(ctx, &fsm.Command{Op: op, Rule: &rule}); err != nil {
		return nil, err
	}
	// Applied on this node, the leader: the read sees the change.
	return n.rules(r.Tenant)
}

// ApprovalRules lists a tenant's approval rules, linearizably.
func (n *Node) ApprovalRules(ctx context.Context, tenant string) (*idemkv.ApprovalRules, error) {
	if err := idemkv.ValidTenant(tenant); err != nil {
		return nil, err
	}
	if err := n.readIndex(ctx); err != nil {
		return nil, err
	}
	return n.rules(tenant)
}

func (n *Node) rules(tenant string) (*idemkv.ApprovalRules, error) {
	rules, err := n.fsm.ApprovalRules(tenant)
	if err != nil {
		return nil, err
	}
	return &idemkv.ApprovalRules{Rules: rules}, nil
}
