package node_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// countingHandler counts the records it passes on.
type countingHandler struct {
	slog.Handler
	n *atomic.Int64
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	h.n.Add(1)
	return h.Handler.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return countingHandler{Handler: h.Handler.WithAttrs(as), n: h.n}
}

func (h countingHandler) WithGroup(name string) slog.Handler {
	return countingHandler{Handler: h.Handler.WithGroup(name), n: h.n}
}

// An idle three-node cluster whose nodes dial their peers through address overrides
// (as the compose file runs it) logs nothing at info: hashicorp/raft asks the address
// provider for every RPC, and a provider that had no answer for the node's own ID made
// it warn each time, about 400 lines a second on an idle leader.
func TestIdleClusterWithPeerAddressesIsQuiet(t *testing.T) {
	var lines [3]atomic.Int64
	c := testcluster.Start(t, 3, testcluster.WithPeerAddresses(), testcluster.WithConfig(func(i int, cfg *node.Config) {
		cfg.Logger = slog.New(countingHandler{Handler: cfg.Logger.Handler(), n: &lines[i]})
	}))
	c.WaitConverged()
	// Let the join's configuration changes and their snapshots settle.
	time.Sleep(time.Second)
	var before [3]int64
	for i := range lines {
		before[i] = lines[i].Load()
	}
	const idle = 3 * time.Second
	time.Sleep(idle)
	for i := range lines {
		if d := lines[i].Load() - before[i]; d > 0 {
			t.Errorf("node %s logged %d lines in %s of idleness; want none", c.ID(i), d, idle)
		}
	}
}
