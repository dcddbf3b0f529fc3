// Package testcluster runs real idemkv clusters inside a test: every node has its own
// Pebble store and Raft log on disk, talks Raft over TCP on loopback, and serves the
// HTTP API on its own port. Tests use it to check behaviour end to end.
//
// It is for tests only; nothing in the server imports it.
package testcluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
	"github.com/idemkv/idemkv/internal/freeport"
	"github.com/idemkv/idemkv/metrics"
	"github.com/idemkv/idemkv/node"
)

// Cluster is a set of in-process nodes.
type Cluster struct {
	tb      testing.TB
	mu      sync.Mutex
	members []*member
	stopped bool
	tweak   func(i int, c *node.Config)
	// peerOverrides: see WithPeerAddresses.
	peerOverrides bool
	middleware    func(http.Handler) http.Handler
	serve         func(i int, cfg api.Config) http.Handler
}

type member struct {
	id       string
	dir      string
	raftAddr string
	apiAddr  string
	node     *node.Node
	srv      *http.Server
	metrics  *metrics.Metrics
}

// Option changes how the cluster is started.
type Option func(*Cluster)

// WithPeerAddresses gives every node an address override for each of its peers (their
// own Raft addresses), as a cluster behind NAT or in containers would run.
func WithPeerAddresses() Option {
	return func(c *Cluster) { c.peerOverrides = true }
}

// WithAPIMiddleware wraps every node's API handler, as `idemkv serve` wraps it in
// tracing and authentication.
func WithAPIMiddleware(mw func(http.Handler) http.Handler) Option {
	return func(c *Cluster) { c.middleware = mw }
}

// WithServe builds node i's whole HTTP handler from the API configuration the
// cluster made for it, as `idemkv serve` mounts the console over the API.
func WithServe(f func(i int, cfg api.Config) http.Handler) Option {
	return func(c *Cluster) { c.serve = f }
}

// WithConfig lets a test change node i's configuration before every (re)start.
func WithConfig(f func(i int, c *node.Config)) Option {
	return func(c *Cluster) { c.tweak = f }
}

// Start runs an n-node cluster and waits until it has a ready leader and every node
// is a member. It is stopped in t.Cleanup.
func Start(tb testing.TB, n int, opts ...Option) *Cluster {
	tb.Helper()
	c := &Cluster{tb: tb}
	for _, o := range opts {
		o(c)
	}
	root := tb.TempDir()
	for i := range n {
		c.members = append(c.members, &member{
			id:       fmt.Sprintf("n%d", i+1),
			dir:      filepath.Join(root, fmt.Sprintf("n%d", i+1)),
			raftAddr: freeAddr(tb),
			apiAddr:  freeAddr(tb),
		})
	}
	tb.Cleanup(c.StopAll)
	c.startMember(0, true)
	c.WaitLeader()
	for i := 1; i < n; i++ {
		c.startMember(i, false)
		m := c.members[i]
		c.eventually(20*time.Second, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			l := c.members[c.WaitLeader()]
			// The node advertises what it reads, as `idemkv serve --join` does.
			_, err := l.node.Join(ctx, &idemkv.JoinRequest{ID: m.id, RaftAddr: m.raftAddr, APIAddr: m.apiAddr, Format: c.Node(i).Format()})
			return err
		})
	}
	c.WaitConverged()
	return c
}

// Config returns the test configuration of node i: real disk and TCP, short
// timeouts, and tiny snapshot thresholds so snapshot install is exercised.
func (c *Cluster) config(i int, bootstrap bool) node.Config {
	m := c.members[i]
	cfg := node.DefaultConfig()
	cfg.ID = m.id
	cfg.DataDir = m.dir
	cfg.RaftAddr = m.raftAddr
	cfg.APIAddr = m.apiAddr
	cfg.Bootstrap = bootstrap
	cfg.HeartbeatTimeout = 500 * time.Millisecond
	cfg.ElectionTimeout = 500 * time.Millisecond
	cfg.LeaderLeaseTimeout = 250 * time.Millisecond
	cfg.SnapshotThreshold = 64
	cfg.TrailingLogs = 32
	// raft-wal frees the log a segment at a time and a leader serves compacted entries
	// from a segment it still keeps: small segments make a follower that missed entries
	// need a snapshot install, as with bolt.
	cfg.RaftWALSegmentBytes = 16 << 10
	cfg.SnapshotInterval = 200 * time.Millisecond
	cfg.ApplyTimeout = 5 * time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(tbWriter{c, m.id}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg.Sweep.Interval = 100 * time.Millisecond
	if c.peerOverrides {
		cfg.PeerAddresses = map[string]string{}
		for j, o := range c.members {
			if j != i {
				cfg.PeerAddresses[o.id] = o.raftAddr
			}
		}
	}
	if c.tweak != nil {
		c.tweak(i, &cfg)
	}
	return cfg
}

func (c *Cluster) startMember(i int, bootstrap bool) {
	c.tb.Helper()
	m := c.members[i]
	cfg := c.config(i, bootstrap)
	m.metrics = metrics.New()
	cfg.Metrics = m.metrics
	var n *node.Node
	// The Raft port of a node that just stopped can linger for a moment.
	c.eventually(10*time.Second, func() error {
		var err error
		n, err = node.Open(cfg)
		return err
	})
	var ln net.Listener
	c.eventually(10*time.Second, func() error {
		var err error
		ln, err = net.Listen("tcp", m.apiAddr)
		return err
	})
	acfg := api.Config{Store: n, Logger: cfg.Logger, Metrics: m.metrics, Middleware: c.middleware}
	var h http.Handler
	if c.serve != nil {
		h = c.serve(i, acfg)
	} else {
		h = api.New(acfg).Handler()
	}
	srv := api.NewHTTPServer(m.apiAddr, h)
	go func() { _ = srv.Serve(ln) }()
	c.mu.Lock()
	m.node, m.srv = n, srv
	c.mu.Unlock()
}

// Len is the number of nodes.
func (c *Cluster) Len() int { return len(c.members) }

// Node returns node i (nil while stopped).
func (c *Cluster) Node(i int) *node.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i].node
}

// Metrics returns node i's metrics.
func (c *Cluster) Metrics(i int) *metrics.Metrics { return c.members[i].metrics }

// ID returns node i's ID.
func (c *Cluster) ID(i int) string { return c.members[i].id }

// DataDir returns node i's data dir.
func (c *Cluster) DataDir(i int) string { return c.members[i].dir }

// Endpoints returns every node's API address (host:port), stopped ones included.
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.apiAddr
	}
	return out
}

// Endpoint returns node i's API address.
func (c *Cluster) Endpoint(i int) string { return c.members[i].apiAddr }

// LeaderIndex waits for a ready leader and returns its index.
func (c *Cluster) LeaderIndex(tb testing.TB) int {
	tb.Helper()
	return c.WaitLeader()
}

// WaitLeader waits (up to 20 s) until one running node is a ready leader.
func (c *Cluster) WaitLeader() int {
	c.tb.Helper()
	leader := -1
	c.eventually(20*time.Second, func() error {
		for i := range c.members {
			n := c.Node(i)
			if n != nil && n.IsLeader() && n.Ready() == nil {
				leader = i
				return nil
			}
		}
		return errors.New("no ready leader")
	})
	return leader
}

// WaitConverged waits until every running node has applied the same index and holds
// the same state hash.
func (c *Cluster) WaitConverged() {
	c.tb.Helper()
	if err := c.Converged(30 * time.Second); err != nil {
		c.tb.Fatalf("testcluster: %v", err)
	}
}

// Converged waits up to timeout until every running node has applied the same index
// and holds the same state hash, and says how they still differ if they do not.
func (c *Cluster) Converged(timeout time.Duration) error {
	return Eventually(timeout, func() error {
		var idx uint64
		var hash string
		first := true
		for i := range c.members {
			n := c.Node(i)
			if n == nil {
				continue
			}
			h, err := n.StateHash()
			if err != nil {
				return err
			}
			if first {
				idx, hash, first = n.AppliedIndex(), h, false
				continue
			}
			if n.AppliedIndex() != idx || h != hash {
				return fmt.Errorf("node %s at index %d hash %s, others at %d %s", c.members[i].id, n.AppliedIndex(), h, idx, hash)
			}
		}
		return nil
	})
}

// OnLeader calls f with the current leader until f succeeds, for up to 20 s. It tries
// again, on whichever node leads then, after an error that says the request certainly
// was not applied or may be retried as it is (not the leader, unavailable, outcome
// unknown), as a client would; any other error ends it. f must be safe to repeat:
// a reserve with its attempt_id, a commit with its fence.
func (c *Cluster) OnLeader(f func(n *node.Node) error) error {
	var last error
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		n := c.Node(c.WaitLeader())
		if n == nil {
			last = errors.New("the leader stopped")
			continue
		}
		last = f(n)
		if last == nil || !retryable(last) {
			return last
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("testcluster: still failing after 20s: %w", last)
}

func retryable(err error) bool {
	return errors.Is(err, idemkv.ErrNotLeader) || errors.Is(err, idemkv.ErrUnavailable) || errors.Is(err, idemkv.ErrOutcomeUnknown)
}

// Stop shuts node i down (gracefully: a leader hands leadership over first).
func (c *Cluster) Stop(i int) {
	c.tb.Helper()
	c.mu.Lock()
	m := c.members[i]
	n, srv := m.node, m.srv
	m.node, m.srv = nil, nil
	c.mu.Unlock()
	if n == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
	if err := n.Close(); err != nil {
		c.tb.Errorf("close %s: %v", m.id, err)
	}
}

// Restart starts a stopped node i again from its data dir.
func (c *Cluster) Restart(i int) {
	c.tb.Helper()
	c.startMember(i, false)
}

// StopAll stops every node.
func (c *Cluster) StopAll() {
	for i := range c.members {
		c.Stop(i)
	}
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
}

func (c *Cluster) eventually(timeout time.Duration, f func() error) {
	c.tb.Helper()
	if err := Eventually(timeout, f); err != nil {
		c.tb.Fatalf("testcluster: %v", err)
	}
}

// Eventually polls f until it returns nil or timeout passes, and returns the last error.
func Eventually(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	delay := 5 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still failing after %s: %w", timeout, err)
		}
		time.Sleep(delay)
		delay = min(2*delay, 100*time.Millisecond)
	}
}

func freeAddr(tb testing.TB) string {
	tb.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		tb.Fatal(err)
	}
	return addr
}

// tbWriter sends log lines to t.Log, so they show only when a test fails.
// After the cluster stopped, stray lines from background goroutines are dropped:
// testing panics on a Log after the test has completed.
type tbWriter struct {
	c  *Cluster
	id string
}

func (w tbWriter) Write(p []byte) (int, error) {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	if !w.c.stopped {
		w.c.tb.Log(w.id + ": " + strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}
