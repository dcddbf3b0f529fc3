//go:build idemkv_testhooks

package api

import "github.com/idemkv/idemkv/internal/testhooks"

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
	testhooks.Mount(s.mux, snap)
}
