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

// sabotageReserve wraps the store's reserve: under EarlyRecover the lease stored is a
// quarter of the one asked for, and the answer shows the whole of it.
func (s *Server) sabotageReserve(call func(context.Context, *idemkv.ReserveRequest) (*idemkv.ReserveResult, error)) func(context.Context, *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
	return func(ctx context.Context, q *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
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
