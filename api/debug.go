package api

import (
	"net/http"
	"net/http/pprof"

	"github.com/idemkv/idemkv/internal/testhooks"
)

// mountPprof registers Go's profiles behind the route check, as OpAdmin (see access):
// they used to be served beside the API, outside authentication.
func (s *Server) mountPprof() {
	s.handle("GET /debug/pprof/", http.HandlerFunc(pprof.Index))
	s.handle("GET /debug/pprof/cmdline", http.HandlerFunc(pprof.Cmdline))
	s.handle("GET /debug/pprof/profile", http.HandlerFunc(pprof.Profile))
	s.handle("GET /debug/pprof/symbol", http.HandlerFunc(pprof.Symbol))
	s.handle("POST /debug/pprof/symbol", http.HandlerFunc(pprof.Symbol))
	s.handle("GET /debug/pprof/trace", http.HandlerFunc(pprof.Trace))
}

// stateHasher is what the debug endpoint of the test build reads from a node that has
// it; a Store without it still gets the hook endpoints.
type stateHasher interface {
	AppliedIndex() uint64
	StateHash() (string, error)
}

// mountDebug registers the endpoints of the test build (jepsen-lite drives them: clock
// offsets, sabotage modes, the state hash for convergence checks). In a production
// build testhooks.Enabled is false and nothing is registered.
func (s *Server) mountDebug() {
	if !testhooks.Enabled {
		return
	}
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
