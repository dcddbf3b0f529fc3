package main

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemkv/idemkv/node"
)

// serveExtras holds the serve flags for what wraps a node: telemetry, TLS and
// authentication. setup turns them into the pieces runServe plugs in.
type serveExtras struct{}

// extras are the pieces serveExtras.setup builds for runServe.
type extras struct {
	middleware    func(http.Handler) http.Handler
	forwardScheme string
	forwardClient *http.Client
	joinClient    *http.Client
	apiTLS        *tls.Config
	closers       []func()
}

func (e *serveExtras) register(cmd *cobra.Command) {}

func (e *serveExtras) setup(ctx context.Context, cfg *node.Config, logger *slog.Logger) (*extras, error) {
	return &extras{forwardScheme: "http", joinClient: &http.Client{Timeout: 15 * time.Second}}, nil
}

func (x *extras) close() {
	for i := len(x.closers) - 1; i >= 0; i-- {
		x.closers[i]()
	}
}

// addExtraCommands adds the operator commands beyond serving and the client.
func addExtraCommands(root *cobra.Command) {}
