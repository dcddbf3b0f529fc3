//go:build idemkv_testhooks

package api

import (
	"net/http"

	"github.com/idemkv/idemkv/internal/testhooks"
)

// stateHasher is what the debug endpoint of the test build reads from a node that has
// it; a Store without it still gets the hook endpoints.
type stateHasher interface {
	AppliedIndex() uint64
	StateHash() (string, error)
}

// mountDebug registers the endpoints of the test build (jepsen-lite drives them: clock
// offsets, sabotage modes, the state hash for convergence checks). Compiled only with
// the tag; sabotage_off.go has the no-op of every other build.
func (s *Server) mountDebug() {
	var snap testhooks.SnapshotFunc
	if h, ok := s.store.(stateHasher); ok {
		snap = func() (testhooks.Snapshot, error) {
			applied := h.AppliedIndex()
			hash, err := h.StateHash()
			return testhooks.Snapshot{AppliedIndex: applied, StateHash: hash}, err
		}
	}
	// On both muxes, as handle registers every route: the one that serves, and the
	// routes alone, which tell unmatched a method a hook does not allow (405) from a
	// path no route has (404).
	for _, mux := range []*http.ServeMux{s.mux, s.routes} {
		testhooks.Mount(mux, snap)
	}
}
