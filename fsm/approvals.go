package fsm

import (
	"fmt"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/storage"
)

// withRule returns cmd with the rule of its tenant and tool folded into the reserve:
// a rule that requires an approval does so whatever the request says, so a client
// cannot switch it off, and it is read here, in the entry's own batch, so that no
// reserve decided after the rule's entry escapes it. The wait is the request's when it
// names one, else the rule's. A rule's masks apply to whatever effect the reserve
// keeps (the proposer keeps it for an approval, store_effect or a rule that stores
// effects): the values under them are replaced here, before anything is stored, so no
// record ever holds them. cmd itself is not changed (the proposer still holds it).
func withRule(b *storage.Batch, cmd *Command) (*Command, error) {
	r := cmd.Reserve
	rule, ok, err := b.ApprovalRule(r.Tenant, r.Tool)
	if err != nil || !ok {
		return cmd, err
	}
	rr := *r
	if rule.RequiresApproval() {
		ask := idemkv.ApprovalAsk{Required: true, TTLMs: rule.TTLMs, ByRule: true}
		if r.Approval != nil {
			ask.Summary = r.Approval.Summary
			if r.Approval.Required && r.Approval.TTLMs > 0 {
				ask.TTLMs = r.Approval.TTLMs
			}
		}
		if ask.TTLMs <= 0 {
			ask.TTLMs = idemkv.DefaultApprovalTTL.Milliseconds()
		}
		rr.Approval = &ask
	}
	if len(rule.Mask) > 0 && len(rr.Effect) > 0 {
		rr.Effect, rr.EffectMask = nil, nil
		// The proposer canonicalised the effect and the rule's masks were validated
		// when it was set, so this cannot fail on a log of this binary's; if it did,
		// the effect is not kept at all (an approval then refuses the reserve), never
		// kept unmasked.
		if masked, err := fingerprint.Mask(r.Effect, rule.Mask); err == nil {
			rr.Effect, rr.EffectMask = masked, rule.Mask
		}
	}
	c := *cmd
	c.Reserve = &rr
	return &c, nil
}

// errNoEffect refuses a reserve that needs an approval but carries no effect to show:
// a proposer that did not know of a rule set just before it dropped the effect. A
// retry carries it, since the proposer then knows the rule.
func errNoEffect(r *idemkv.ReserveRequest) error {
	return idemkv.Invalid("effect", "tool %q of tenant %q requires approval: the reserve must carry the effect itself, not only its fingerprint", r.Tool, r.Tenant)
}

// applyRule sets or removes an approval rule and answers the tenant's rules as the
// batch leaves them.
func applyRule(b *storage.Batch, cmd *Command) (*Result, error) {
	r := *cmd.Rule
	if idemkv.ValidTenant(r.Tenant) != nil || r.Tool == "" {
		return &Result{Err: idemkv.Invalid("tool", "an approval rule needs a tenant and a tool")}, nil
	}
	var err error
	if cmd.Op == OpRemoveApprovalRule {
		err = b.DeleteApprovalRule(r.Tenant, r.Tool)
	} else {
		r.EnsureDefaults()
		err = b.PutApprovalRule(r)
	}
	return &Result{}, err
}

// Approvals returns one page of the tenant's waiting approvals, oldest requested_at
// first; approvals that lapsed at max(now, Clock()) are left out. req is validated.
func (f *FSM) Approvals(req *idemkv.ApprovalsRequest, now idemkv.Timestamp) (*idemkv.ApprovalsResult, error) {
	if err := f.readable(); err != nil {
		return nil, err
	}
	now = max(now, f.Clock())
	page := *req
	page.EnsureDefaults()
	var after *idemkv.ApprovalPosition
	if req.After != "" {
		p, err := idemkv.ParseApprovalPosition(req.After)
		if err != nil {
			return nil, err
		}
		after = &p
	}
	recs, more, err := f.st.WaitingApprovals(req.Tenant, after, page.Limit, now)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", idemkv.ErrInternal, err)
	}
	res := &idemkv.ApprovalsResult{Approvals: make([]*idemkv.Record, 0, len(recs))}
	for _, rec := range recs {
		if !Expired(rec, now) {
			res.Approvals = append(res.Approvals, rec)
		}
	}
	if more && len(recs) > 0 {
		last := recs[len(recs)-1]
		res.Next = idemkv.ApprovalPosition{RequestedAt: last.Approval.RequestedAt, Key: last.Key}.String()
	}
	return res, nil
}

// ApprovalRule returns the committed approval rule of (tenant, tool), if any.
func (f *FSM) ApprovalRule(tenant, tool string) (idemkv.ApprovalRule, bool, error) {
	if err := f.readable(); err != nil {
		return idemkv.ApprovalRule{}, false, err
	}
	rule, ok, err := f.st.ApprovalRule(tenant, tool)
	if err != nil {
		return rule, false, fmt.Errorf("%w: %v", idemkv.ErrInternal, err)
	}
	return rule, ok, nil
}

// ApprovalRules returns the tenant's approval rules in tool order.
func (f *FSM) ApprovalRules(tenant string) ([]idemkv.ApprovalRule, error) {
	if err := f.readable(); err != nil {
		return nil, err
	}
	rules, err := f.st.ApprovalRules(tenant)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", idemkv.ErrInternal, err)
	}
	return rules, nil
}

// WaitingApprovals reports how many approvals wait at max(now, Clock()), in every
// tenant, and the earliest requested_at among them (0 if none).
func (f *FSM) WaitingApprovals(now idemkv.Timestamp) (count int, oldest idemkv.Timestamp) {
	count, oldest, err := f.st.ApprovalStats(max(now, f.Clock()))
	if err != nil {
		f.logger.Error("reading the waiting-approval index", logKeyErr, err)
	}
	return count, oldest
}
