package node

import (
	"context"
	"fmt"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/fsm"
)

// effectToKeep returns the canonical JSON of r's effect when its record must keep it:
// the reserve asks for approval, or a rule of its tenant and tool requires one (read
// from this node's state; a rule set since is caught by the state machine, which
// refuses the reserve without its effect, and the retry carries it). Otherwise the
// log carries the fingerprint alone, as it always has.
func (n *Node) effectToKeep(r *idemkv.ReserveRequest) ([]byte, error) {
	if r.Approval == nil || !r.Approval.Required {
		_, ruled, err := n.fsm.ApprovalRule(r.Tenant, r.Tool)
		if err != nil || !ruled {
			return nil, err
		}
		if len(r.Effect) == 0 {
			return nil, idemkv.Invalid("effect", "tool %q of tenant %q requires approval: the reserve must carry the effect itself, not only its fingerprint", r.Tool, r.Tenant)
		}
	}
	canonical, err := fingerprint.Canonicalize(r.Effect)
	if err != nil {
		return nil, idemkv.Invalid("effect", "effect: %v", err)
	}
	if max := n.cfg.Limits.WithDefaults().MaxPayloadBytes; len(canonical) > max {
		return nil, &idemkv.Error{Code: idemkv.CodePayloadTooLarge, Field: "effect",
			Message: fmt.Sprintf("an effect kept for its approver is %d bytes; the limit is %d", len(canonical), max)}
	}
	return canonical, nil
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
