package api

import (
	"context"
	"errors"
	"net/http"

	"github.com/idemkv/idemkv"
)

// ApprovalStore is what the approval endpoints need from a node (docs/protocol.md
// "Approvals"); Store includes it.
type ApprovalStore interface {
	// DecideApproval approves or denies the approval a record waits for; the answer is
	// the record.
	DecideApproval(ctx context.Context, req *idemkv.DecideApprovalRequest) (*idemkv.Record, error)
	// Approvals pages through a tenant's waiting approvals, oldest first.
	Approvals(ctx context.Context, req *idemkv.ApprovalsRequest) (*idemkv.ApprovalsResult, error)
	// SetApprovalRule sets or removes a rule; the answer is the tenant's rules.
	SetApprovalRule(ctx context.Context, req *idemkv.SetApprovalRuleRequest) (*idemkv.ApprovalRules, error)
	// ApprovalRules lists a tenant's rules.
	ApprovalRules(ctx context.Context, tenant string) (*idemkv.ApprovalRules, error)
}

// Routes of the approval endpoints.
const (
	approvalPattern     = "POST /v1/approvals/{tenant}/{key...}"
	approvalsPattern    = "GET /v1/approvals"
	setRulePattern      = "POST /v1/approval-rules"
	approvalRulePattern = "GET /v1/approval-rules"
)

func (s *Server) approvalRoutes() {
	s.handle(approvalPattern, http.HandlerFunc(s.decideApproval))
	s.handle(approvalsPattern, http.HandlerFunc(s.listApprovals))
	s.handle(setRulePattern, leaderWrite(s, (*idemkv.SetApprovalRuleRequest).Validate, s.store.SetApprovalRule, nil))
	s.handle(approvalRulePattern, http.HandlerFunc(s.approvalRules))
}

// decideApproval is a leader write whose tenant and key come from the path, as a
// record's do (already unescaped once by the mux). The approver it records names the
// token that decided as well as the person the body names (idemkv.RecordedApprover).
func (s *Server) decideApproval(w http.ResponseWriter, r *http.Request) {
	tenant, key := r.PathValue("tenant"), r.PathValue("key")
	token := callerIdentity(r.Context())
	leaderWrite(s, func(q *idemkv.DecideApprovalRequest) error {
		q.Tenant, q.Key = tenant, key
		if err := q.Validate(); err != nil {
			return err
		}
		q.Approver = idemkv.RecordedApprover(q.Approver, token)
		return nil
	}, s.store.DecideApproval, s.logApproval).ServeHTTP(w, r)
}

// logApproval logs a decision the store took: who approved what stays in the record,
// and in the log of the node that served it. The node that proposed it counts it.
func (s *Server) logApproval(_ context.Context, req *idemkv.DecideApprovalRequest, rec *idemkv.Record) {
	s.log.Info("approval decided", "tenant", req.Tenant, "key", req.Key, "approval_id", req.ApprovalID,
		"decision", string(req.Decision), "approver", req.Approver, "tool", rec.Tool)
}

// listApprovals pages through the waiting approvals of ?tenant=, oldest first, with
// the paging and consistency parameters of a list.
func (s *Server) listApprovals(w http.ResponseWriter, r *http.Request) {
	var req idemkv.ApprovalsRequest
	q, err := parseQuery(r)
	var stale bool
	if err == nil {
		req.Tenant = q.Get("tenant")
		req.After, req.Limit, stale, err = pageParams(q)
	}
	if err == nil {
		err = req.Validate()
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	req.EnsureDefaults()
	if stale {
		req.Consistency = idemkv.Stale
	}
	if !stale && s.forwardIfFollower(w, r, nil, 0) {
		return
	}
	res, err := s.store.Approvals(r.Context(), &req)
	if errors.Is(err, idemkv.ErrNotLeader) {
		s.forwardToLeader(w, r, nil, 0)
		return
	}
	if err == nil && res != nil && res.Approvals == nil {
		res.Approvals = []*idemkv.Record{}
	}
	answer(s, w, r, res, err)
}

// approvalRules lists the rules of ?tenant=, read linearizably on the leader.
func (s *Server) approvalRules(w http.ResponseWriter, r *http.Request) {
	q, err := parseQuery(r)
	tenant := ""
	if err == nil {
		tenant = q.Get("tenant")
		err = idemkv.ValidTenant(tenant)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if s.forwardIfFollower(w, r, nil, 0) {
		return
	}
	res, err := s.store.ApprovalRules(r.Context(), tenant)
	if errors.Is(err, idemkv.ErrNotLeader) {
		s.forwardToLeader(w, r, nil, 0)
		return
	}
	answer(s, w, r, res, err)
}
