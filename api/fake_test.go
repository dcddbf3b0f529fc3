package api_test

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
)

var _ api.Store = (*FakeStore)(nil)

// FakeStore is a Store whose every method is a function field. A method whose field is
// nil fails with an error that wraps no sentinel, so a test that reaches it unexpectedly
// sees a 500. Calls counts the data methods (everything but Leader and Ready), which
// tests use to prove a bad request never reached the store. ReserveLocal, which only
// asks whether the node's own state settles a reserve, counts in LocalCalls instead; a
// nil ReserveLocalFunc answers "no", as a node does for anything but a replay or a
// conflict against a settled record.
type FakeStore struct {
	ReserveFunc         func(context.Context, *idemkv.ReserveRequest) (*idemkv.ReserveResult, error)
	ReserveLocalFunc    func(*idemkv.ReserveRequest) (*idemkv.ReserveResult, bool)
	CommitFunc          func(context.Context, *idemkv.CommitRequest) (*idemkv.Receipt, error)
	FailFunc            func(context.Context, *idemkv.FailRequest) (*idemkv.Record, error)
	ReleaseFunc         func(context.Context, *idemkv.ReleaseRequest) (*idemkv.ReleaseResult, error)
	HeartbeatFunc       func(context.Context, *idemkv.HeartbeatRequest) (*idemkv.Record, error)
	DoubtFunc           func(context.Context, *idemkv.DoubtRequest) (*idemkv.Record, error)
	ResolveFunc         func(context.Context, *idemkv.ResolveRequest) (*idemkv.ResolveResult, error)
	GetFunc             func(context.Context, *idemkv.GetRequest) (*idemkv.Record, error)
	ListFunc            func(context.Context, *idemkv.ListRequest) (*idemkv.ListResult, error)
	ListInDoubtFunc     func(context.Context, *idemkv.InDoubtRequest) (*idemkv.ListResult, error)
	ClusterFunc         func(context.Context) (*idemkv.ClusterInfo, error)
	JoinFunc            func(context.Context, *idemkv.JoinRequest) (*idemkv.ClusterInfo, error)
	RemoveFunc          func(context.Context, *idemkv.RemoveRequest) (*idemkv.ClusterInfo, error)
	DecideApprovalFunc  func(context.Context, *idemkv.DecideApprovalRequest) (*idemkv.Record, error)
	ApprovalsFunc       func(context.Context, *idemkv.ApprovalsRequest) (*idemkv.ApprovalsResult, error)
	SetApprovalRuleFunc func(context.Context, *idemkv.SetApprovalRuleRequest) (*idemkv.ApprovalRules, error)
	ApprovalRulesFunc   func(context.Context, string) (*idemkv.ApprovalRules, error)
	LeaderFunc          func() (string, bool)
	ReadyFunc           func() error
	// LimitsValue is what Limits reports; the zero value means the defaults.
	LimitsValue idemkv.Limits

	calls      atomic.Int64
	localCalls atomic.Int64
}

// Calls is how many times a data method was called.
func (f *FakeStore) Calls() int64 { return f.calls.Load() }

// LocalCalls is how many times ReserveLocal was called.
func (f *FakeStore) LocalCalls() int64 { return f.localCalls.Load() }

func notStubbed(method string) error { return fmt.Errorf("fake store: %s is not stubbed", method) }

// Reserve answers from the local state first, as a node's does: what ReserveLocalFunc
// settles is answered (counted in LocalCalls, and noted with idemkv.NoteLocalAnswer),
// the rest reaches ReserveFunc.
func (f *FakeStore) Reserve(ctx context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
	if f.ReserveLocalFunc != nil {
		if res, ok := f.ReserveLocal(req); ok {
			idemkv.NoteLocalAnswer(ctx)
			return res, nil
		}
	}
	f.calls.Add(1)
	if f.ReserveFunc == nil {
		return nil, notStubbed("Reserve")
	}
	return f.ReserveFunc(ctx, req)
}

func (f *FakeStore) ReserveLocal(req *idemkv.ReserveRequest) (*idemkv.ReserveResult, bool) {
	f.localCalls.Add(1)
	if f.ReserveLocalFunc == nil {
		return nil, false
	}
	return f.ReserveLocalFunc(req)
}

func (f *FakeStore) Commit(ctx context.Context, req *idemkv.CommitRequest) (*idemkv.Receipt, error) {
	f.calls.Add(1)
	if f.CommitFunc == nil {
		return nil, notStubbed("Commit")
	}
	return f.CommitFunc(ctx, req)
}

func (f *FakeStore) Fail(ctx context.Context, req *idemkv.FailRequest) (*idemkv.Record, error) {
	f.calls.Add(1)
	if f.FailFunc == nil {
		return nil, notStubbed("Fail")
	}
	return f.FailFunc(ctx, req)
}

func (f *FakeStore) Release(ctx context.Context, req *idemkv.ReleaseRequest) (*idemkv.ReleaseResult, error) {
	f.calls.Add(1)
	if f.ReleaseFunc == nil {
		return nil, notStubbed("Release")
	}
	return f.ReleaseFunc(ctx, req)
}

func (f *FakeStore) Heartbeat(ctx context.Context, req *idemkv.HeartbeatRequest) (*idemkv.Record, error) {
	f.calls.Add(1)
	if f.HeartbeatFunc == nil {
		return nil, notStubbed("Heartbeat")
	}
	return f.HeartbeatFunc(ctx, req)
}

func (f *FakeStore) Doubt(ctx context.Context, req *idemkv.DoubtRequest) (*idemkv.Record, error) {
	f.calls.Add(1)
	if f.DoubtFunc == nil {
		return nil, notStubbed("Doubt")
	}
	return f.DoubtFunc(ctx, req)
}

func (f *FakeStore) Resolve(ctx context.Context, req *idemkv.ResolveRequest) (*idemkv.ResolveResult, error) {
	f.calls.Add(1)
	if f.ResolveFunc == nil {
		return nil, notStubbed("Resolve")
	}
	return f.ResolveFunc(ctx, req)
}

func (f *FakeStore) Get(ctx context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) {
	f.calls.Add(1)
	if f.GetFunc == nil {
		return nil, notStubbed("Get")
	}
	return f.GetFunc(ctx, req)
}

func (f *FakeStore) List(ctx context.Context, req *idemkv.ListRequest) (*idemkv.ListResult, error) {
	f.calls.Add(1)
	if f.ListFunc == nil {
		return nil, notStubbed("List")
	}
	return f.ListFunc(ctx, req)
}

func (f *FakeStore) ListInDoubt(ctx context.Context, req *idemkv.InDoubtRequest) (*idemkv.ListResult, error) {
	f.calls.Add(1)
	if f.ListInDoubtFunc == nil {
		return nil, notStubbed("ListInDoubt")
	}
	return f.ListInDoubtFunc(ctx, req)
}

func (f *FakeStore) Cluster(ctx context.Context) (*idemkv.ClusterInfo, error) {
	f.calls.Add(1)
	if f.ClusterFunc == nil {
		return nil, notStubbed("Cluster")
	}
	return f.ClusterFunc(ctx)
}

func (f *FakeStore) Join(ctx context.Context, req *idemkv.JoinRequest) (*idemkv.ClusterInfo, error) {
	f.calls.Add(1)
	if f.JoinFunc == nil {
		return nil, notStubbed("Join")
	}
	return f.JoinFunc(ctx, req)
}

func (f *FakeStore) Remove(ctx context.Context, req *idemkv.RemoveRequest) (*idemkv.ClusterInfo, error) {
	f.calls.Add(1)
	if f.RemoveFunc == nil {
		return nil, notStubbed("Remove")
	}
	return f.RemoveFunc(ctx, req)
}

// Leader defaults to "this node leads, address unknown".
func (f *FakeStore) Leader() (string, bool) {
	if f.LeaderFunc == nil {
		return "", true
	}
	return f.LeaderFunc()
}

func (f *FakeStore) IsLeader() bool {
	_, l := f.Leader()
	return l
}

func (f *FakeStore) Ready() error {
	if f.ReadyFunc == nil {
		return nil
	}
	return f.ReadyFunc()
}

func (f *FakeStore) Limits() idemkv.Limits { return f.LimitsValue.WithDefaults() }

func (f *FakeStore) DecideApproval(ctx context.Context, req *idemkv.DecideApprovalRequest) (*idemkv.Record, error) {
	f.calls.Add(1)
	if f.DecideApprovalFunc == nil {
		return nil, notStubbed("DecideApproval")
	}
	return f.DecideApprovalFunc(ctx, req)
}

func (f *FakeStore) Approvals(ctx context.Context, req *idemkv.ApprovalsRequest) (*idemkv.ApprovalsResult, error) {
	f.calls.Add(1)
	if f.ApprovalsFunc == nil {
		return nil, notStubbed("Approvals")
	}
	return f.ApprovalsFunc(ctx, req)
}

func (f *FakeStore) SetApprovalRule(ctx context.Context, req *idemkv.SetApprovalRuleRequest) (*idemkv.ApprovalRules, error) {
	f.calls.Add(1)
	if f.SetApprovalRuleFunc == nil {
		return nil, notStubbed("SetApprovalRule")
	}
	return f.SetApprovalRuleFunc(ctx, req)
}

func (f *FakeStore) ApprovalRules(ctx context.Context, tenant string) (*idemkv.ApprovalRules, error) {
	f.calls.Add(1)
	if f.ApprovalRulesFunc == nil {
		return nil, notStubbed("ApprovalRules")
	}
	return f.ApprovalRulesFunc(ctx, tenant)
}
