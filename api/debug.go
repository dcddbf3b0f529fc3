package api

import (
	"net/http"
	"net/http/pprof"
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
