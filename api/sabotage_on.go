//go:build idemkv_testhooks

package api

import (
	"context"
	mrand "math/rand/v2"
	"net/http"
	"strings"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testhooks"
)

// The sabotage modes of the test build that live at the API seam (internal/testhooks).
// jepsen-lite switches them on to show that its checkers catch each way a server can
// break a guarantee. They are compiled only with the tag; sabotage_off.go holds the
// no-ops of every other build, which does not import internal/testhooks.

// recordWrite reports whether path is a write to a record (not a membership change,
// which the harness itself needs while the nodes are sabotaged).
func recordWrite(path string) bool {
	return strings.HasPrefix(path, "/v1/") && !strings.HasPrefix(path, "/v1/cluster")
}

// sabotageRefuse answers a record write with unavailable before anything is done,
// under FailWrites, and reports whether it did.
func (s *Server) sabotageRefuse(w http.ResponseWriter, r *http.Request) bool {
	if !testhooks.Sabotaged(testhooks.FailWrites) || !recordWrite(r.URL.Path) {
		return false
	}
	s.writeError(w, r, idemkv.Errorf(idemkv.ErrUnavailable, "sabotage fail-writes"))
	return true
}

// sabotageAnswer replaces the answer to one record write in eight, which went
// through, with a 500, under InternalErrors, and reports whether it did.
func (s *Server) sabotageAnswer(w http.ResponseWriter, r *http.Request) bool {
	if !testhooks.Sabotaged(testhooks.InternalErrors) || !recordWrite(r.URL.Path) || mrand.IntN(8) != 0 {
		return false
	}
	s.writeError(w, r, idemkv.Errorf(idemkv.ErrInternal, "sabotage internal-errors"))
	return true
}

// sabotageReserve wraps the store's reserve, where a leader proposes one and answers
// it: under EarlyRecover the lease stored is a quarter of the one asked for, and the
// answer shows the whole of it; under ShortDefaultRetention a record left to the
// default retention is kept only as long as its lease (shortenDefaultRetention); and
// the answer itself may be relabelled (relabelDecision).
func (s *Server) sabotageReserve(call func(context.Context, *idemkv.ReserveRequest) (*idemkv.ReserveResult, error)) func(context.Context, *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
	return func(ctx context.Context, q *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
		s.shortenDefaultRetention(q)
		res, err := s.earlyRecover(ctx, q, call)
		if err != nil || res == nil {
			return res, err
		}
		return relabelDecision(res), nil
	}
}

// earlyRecover is call, under EarlyRecover with a quarter of the lease stored and the
// whole answered.
func (s *Server) earlyRecover(ctx context.Context, q *idemkv.ReserveRequest, call func(context.Context, *idemkv.ReserveRequest) (*idemkv.ReserveResult, error)) (*idemkv.ReserveResult, error) {
	if !testhooks.Sabotaged(testhooks.EarlyRecover) || q.LeaseTTLMs <= 0 {
		return call(ctx, q)
	}
	asked := q.LeaseTTLMs
	q.LeaseTTLMs = max(asked/4, s.store.Limits().MinLeaseTTL.Milliseconds())
	res, err := call(ctx, q)
	if err != nil || (res.Decision != idemkv.DecisionExecute && res.Decision != idemkv.DecisionRecover) {
		return res, err
	}
	hidden := idemkv.Timestamp(asked - q.LeaseTTLMs)
	if res.LeaseExpiresAt != 0 {
		res.LeaseExpiresAt += hidden
	}
	if res.Record != nil && res.Record.LeaseExpiresAt != 0 {
		res.Record.LeaseExpiresAt += hidden
	}
	return res, nil
}

// shortenDefaultRetention is ShortDefaultRetention: a reserve whose retention is the
// default (the request named none, and validation filled it in) is kept only as long
// as its lease, and at least the shortest retention the node accepts, as if the
// default had been clamped like a request below the minimum.
func (s *Server) shortenDefaultRetention(q *idemkv.ReserveRequest) {
	if !testhooks.Sabotaged(testhooks.ShortDefaultRetention) || q.ExpiresAt != 0 {
		return
	}
	l := s.store.Limits().WithDefaults()
	if q.TTLMs != l.DefaultTTL.Milliseconds() {
		return
	}
	q.TTLMs = max(l.MinTTL.Milliseconds(), q.LeaseTTLMs)
}

// relabelDecision is the leader's answer to a reserve under the sabotages that answer
// another decision than the one the state machine took (which it stored as it took
// it): ApprovalRecoverExecutes answers the recover of a record an approval let run
// with execute, and InProgressConflict answers in_progress with a conflict naming the
// holder's fingerprint, the caller's own. Any other answer is res itself.
func relabelDecision(res *idemkv.ReserveResult) *idemkv.ReserveResult {
	rec := res.Record
	switch {
	case testhooks.Sabotaged(testhooks.ApprovalRecoverExecutes) && res.Decision == idemkv.DecisionRecover && res.Fence != 0 &&
		rec != nil && rec.Approval != nil && rec.Approval.State == idemkv.ApprovalApproved:
		c := *res
		c.Decision = idemkv.DecisionExecute
		return &c
	case testhooks.Sabotaged(testhooks.InProgressConflict) && res.Decision == idemkv.DecisionInProgress && rec != nil:
		return &idemkv.ReserveResult{Decision: idemkv.DecisionConflict, Record: rec, Conflict: &idemkv.Conflict{
			Status: string(idemkv.DecisionConflict), Reason: idemkv.ReasonDifferentEffect,
			ExistingFingerprint: rec.Fingerprint, ReceivedFingerprint: rec.Fingerprint}}
	}
	return res
}

// sabotageCommit wraps the store's commit: under OrphanEffects one commit in five
// releases the key instead and answers unavailable.
func (s *Server) sabotageCommit(call func(context.Context, *idemkv.CommitRequest) (*idemkv.Receipt, error)) func(context.Context, *idemkv.CommitRequest) (*idemkv.Receipt, error) {
	return func(ctx context.Context, q *idemkv.CommitRequest) (*idemkv.Receipt, error) {
		if !testhooks.Sabotaged(testhooks.OrphanEffects) || mrand.IntN(5) != 0 {
			return call(ctx, q)
		}
		if _, err := s.store.Release(ctx, &idemkv.ReleaseRequest{Tenant: q.Tenant, Key: q.Key,
			Fingerprint: q.Fingerprint, Fence: q.Fence}); err != nil {
			return nil, err
		}
		return nil, idemkv.Errorf(idemkv.ErrUnavailable, "sabotage orphan-effects")
	}
}

// sabotageRead turns a linearizable read into a stale one under StaleReads: the node
// answers from its local state, neither forwarding to the leader nor asking it for a
// read index. This is the one place the sabotage is checked.
func sabotageRead(req *idemkv.GetRequest) {
	if testhooks.Sabotaged(testhooks.StaleReads) {
		req.Consistency = idemkv.Stale
	}
}
