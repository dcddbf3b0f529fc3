package client

import (
	"context"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
)

// DecideApproval decides as the state machine does; the approval tests of Do run
// against real nodes (approval_test.go), this keeps the fake a complete api.Store.
func (m *memStore) DecideApproval(ctx context.Context, req *idemkv.DecideApprovalRequest) (*idemkv.Record, error) {
	return op(m, "decide_approval", func(now idemkv.Timestamp) (*idemkv.Record, error) {
		if err := req.Validate(); err != nil {
			return nil, err
		}
		next, err := fsm.DecideApproval(m.recs[rkey(req.Tenant, req.Key)], req, now)
		m.put(rkey(req.Tenant, req.Key), next)
		return next, err
	})
}

// The fake keeps no waiting-approval index nor rules: the real node's are tested in
// fsm, storage and node.
func (s *apiStore) Approvals(context.Context, *idemkv.ApprovalsRequest) (*idemkv.ApprovalsResult, error) {
	return nil, idemkv.Errorf(idemkv.ErrUnavailable, "memStore lists no approvals")
}

func (s *apiStore) SetApprovalRule(context.Context, *idemkv.SetApprovalRuleRequest) (*idemkv.ApprovalRules, error) {
	return nil, idemkv.Errorf(idemkv.ErrUnavailable, "memStore keeps no approval rules")
}

func (s *apiStore) ApprovalRules(context.Context, string) (*idemkv.ApprovalRules, error) {
	return nil, idemkv.Errorf(idemkv.ErrUnavailable, "memStore keeps no approval rules")
}
