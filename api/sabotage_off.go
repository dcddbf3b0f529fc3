//go:build !idemkv_testhooks

package api

import (
	"context"
	"net/http"

	"github.com/idemkv/idemkv"
)

// The sabotages of the API seam exist only in the test build (sabotage_on.go). Here each
// is a no-op the compiler removes.

func (s *Server) sabotageRefuse(http.ResponseWriter, *http.Request) bool { return false }

func (s *Server) sabotageAnswer(http.ResponseWriter, *http.Request) bool { return false }

func (s *Server) sabotageReserve(call func(context.Context, *idemkv.ReserveRequest) (*idemkv.ReserveResult, error)) func(context.Context, *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
	return call
}

func (s *Server) sabotageCommit(call func(context.Context, *idemkv.CommitRequest) (*idemkv.Receipt, error)) func(context.Context, *idemkv.CommitRequest) (*idemkv.Receipt, error) {
	return call
}

func sabotageRead(*idemkv.GetRequest) {}

// mountDebug registers nothing here: the debug endpoints of the test build do not exist.
func (s *Server) mountDebug() {}
