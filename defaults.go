package idemkv

import "time"

// Defaulting is a step of its own, after Validate, as Pebble's Options.EnsureDefaults
// and raft's ValidateConfig split them: Validate only reports, so the HTTP layer can
// check a request without rewriting what it forwards, and the node fills the request
// from the limits it owns (node.Config.Limits) just before proposing it. Each method
// is idempotent and leaves every field the caller set as it was.

// EnsureDefaults fills the lease and, when neither ttl_ms nor expires_at is given,
// the TTL from l, and drops an effect of JSON null (Validate counts it as absent).
// The wait of an approval is WithApprovalWait's.
func (r *ReserveRequest) EnsureDefaults(l Limits) {
	l = l.WithDefaults()
	if string(r.Effect) == "null" {
		r.Effect = nil
	}
	if r.LeaseTTLMs == 0 {
		r.LeaseTTLMs = l.DefaultLeaseTTL.Milliseconds()
	}
	if r.TTLMs == 0 && r.ExpiresAt == 0 {
		r.TTLMs = l.DefaultTTL.Milliseconds()
	}
	// An approval's wait is left as asked: when the request names none, the rule of
	// its tool (if any) names it, and only the node that proposes the reserve reads
	// the rules (WithApprovalWait).
}

// WithApprovalWait fills the wait of an approval the request asks for without naming
// one: ruleTTL (the wait of the rule that requires approval of its tool, 0 for none),
// else DefaultApprovalTTL.
func (r *ReserveRequest) WithApprovalWait(ruleTTL time.Duration) {
	if r.Approval == nil || !r.Approval.Required || r.Approval.TTLMs != 0 {
		return
	}
	// A copy: the caller's ask is shared by every copy of the request.
	a := *r.Approval
	a.TTLMs = DefaultApprovalTTL.Milliseconds()
	if ruleTTL > 0 {
		a.TTLMs = ruleTTL.Milliseconds()
	}
	r.Approval = &a
}

// EnsureDefaults fills the wait of a rule that requires approval (DefaultApprovalTTL).
func (r *ApprovalRule) EnsureDefaults() {
	if r.TTLMs == 0 && r.RequiresApproval() {
		r.TTLMs = DefaultApprovalTTL.Milliseconds()
	}
}

// EnsureDefaults fills the page size and the consistency, as a list's.
func (r *ApprovalsRequest) EnsureDefaults() { pageDefaults(&r.Limit, &r.Consistency) }

// EnsureDefaults fills the lease from l.
func (r *HeartbeatRequest) EnsureDefaults(l Limits) {
	if r.LeaseTTLMs == 0 {
		r.LeaseTTLMs = l.WithDefaults().DefaultLeaseTTL.Milliseconds()
	}
}

// EnsureDefaults makes a read linearizable unless it asks for stale.
func (r *GetRequest) EnsureDefaults() {
	if r.Consistency == "" {
		r.Consistency = Linearizable
	}
}

// EnsureDefaults fills the page size (DefaultListLimit) and the consistency.
func (r *ListRequest) EnsureDefaults() { pageDefaults(&r.Limit, &r.Consistency) }

// EnsureDefaults fills the page size and the consistency, as a list's.
func (r *InDoubtRequest) EnsureDefaults() { pageDefaults(&r.Limit, &r.Consistency) }

// pageDefaults fills the page size (DefaultListLimit) and the consistency of a listing.
func pageDefaults(limit *int, c *Consistency) {
	if *limit == 0 {
		*limit = DefaultListLimit
	}
	if *c == "" {
		*c = Linearizable
	}
}
