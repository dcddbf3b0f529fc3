// Package cluster runs an idemkv cluster as real processes on loopback for
// jepsen-lite: it builds the binary with the test hooks, starts each node with its own
// data dir, puts a proxy on every directed Raft link, and offers the operations the
// nemeses need (kill, pause, wipe, cut links, change membership, set hooks).
//
// It never touches anything but the processes and directories it created.
package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/freeport"
	"github.com/idemkv/idemkv/internal/testhooks"
	"github.com/idemkv/idemkv/jepsen-lite/internal/proxy"
)

// Build compiles cmd/idemkv of the module at root with the test hooks into out.
func Build(ctx context.Context, root, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-tags", "idemkv_testhooks", "-o", out, "./cmd/idemkv")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("cluster: build idemkv: %w\n%s", err, b)
	}
	return nil
}

// Config describes a cluster.
type Config struct {
	// Binary is the idemkv binary built with the test hooks.
	Binary string
	// Dir holds every node's data dir and log.
	Dir   string
	Nodes int
	// ServeFlags are added to every `idemkv serve` (Raft tuning).
	ServeFlags []string
	// Env is added to every node's environment (sabotage modes).
	Env    []string
	Logger *slog.Logger
}

// Node is one idemkv process.
type Node struct {
	Index    int
	ID       string
	APIAddr  string
	RaftAddr string
	DataDir  string
	LogPath  string

	// join: start with --join (every node but the first, and any node once wiped).
	join   bool
	cmd    *exec.Cmd
	exited chan struct{}
	paused bool
	starts int
	// nextEnv is added to the environment of the next start only (StartNodeWithEnv).
	nextEnv []string
	// stopping: the harness signalled the process to end (stop); faulted: a storage
	// fault is set on it (SetFaults), which may end it. An exit with neither is the
	// node's own doing (UnexpectedExits).
	stopping, faulted bool
}

// Cluster is a running set of nodes and their link proxies.
type Cluster struct {
	cfg   Config
	log   *slog.Logger
	http  *http.Client
	nodes []*Node
	// links[i][j] carries node i's Raft traffic to node j.
	links [][]*proxy.Link

	mu sync.Mutex
	// exits are the nodes' exits of their own (UnexpectedExits).
	exits []string
}

// New prepares a cluster: addresses, directories and link proxies. Start runs it.
func New(cfg Config) (*Cluster, error) {
	if cfg.Nodes < 1 {
		return nil, errors.New("cluster: at least one node")
	}
	c := &Cluster{cfg: cfg, log: cfg.Logger, http: &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 4, DisableKeepAlives: true},
	}}
	for i := range cfg.Nodes {
		api, err := freeAddr()
		if err != nil {
			return nil, err
		}
		raftAddr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		id := fmt.Sprintf("n%d", i+1)
		c.nodes = append(c.nodes, &Node{Index: i, ID: id, APIAddr: api, RaftAddr: raftAddr,
			DataDir: filepath.Join(cfg.Dir, id, "data"), LogPath: filepath.Join(cfg.Dir, id+".log"), join: i > 0})
	}
	c.links = make([][]*proxy.Link, cfg.Nodes)
	for i := range c.nodes {
		c.links[i] = make([]*proxy.Link, cfg.Nodes)
		for j, to := range c.nodes {
			if i == j {
				continue
			}
			l, err := proxy.Listen("127.0.0.1:0", to.RaftAddr, cfg.Logger.With("link", fmt.Sprintf("%s->%s", c.nodes[i].ID, to.ID)))
			if err != nil {
				c.closeLinks()
				return nil, err
			}
			c.links[i][j] = l
		}
	}
	return c, nil
}

// freeAddr finds a loopback port that is free now, outside the range outgoing
// connections take their ports from. Another process could still take it before the
// node binds it; starting a node is retried by its caller in that case.
func freeAddr() (string, error) { return freeport.Addr() }

// Nodes lists the nodes.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Size is the number of nodes.
func (c *Cluster) Size() int { return len(c.nodes) }

// Start starts the first node, waits for it to lead, then starts the others, which
// join through it, and waits until every node is a voter that knows the leader.
func (c *Cluster) Start(ctx context.Context) error {
	if err := c.StartNode(0); err != nil {
		return err
	}
	if err := c.waitFor(ctx, 30*time.Second, "the first node leads", func(ctx context.Context) error {
		info, err := c.Info(ctx, 0)
		if err != nil {
			return err
		}
		if info.Leader.ID != c.nodes[0].ID {
			return fmt.Errorf("leader is %q", info.Leader.ID)
		}
		return nil
	}); err != nil {
		return err
	}
	for i := 1; i < len(c.nodes); i++ {
		if err := c.StartNode(i); err != nil {
			return err
		}
	}
	return c.WaitHealthy(ctx, 60*time.Second)
}

// WaitHealthy waits until every node is running, is a voter, and agrees on one leader.
func (c *Cluster) WaitHealthy(ctx context.Context, timeout time.Duration) error {
	return c.waitFor(ctx, timeout, "every node is a voter that knows the leader", func(ctx context.Context) error {
		leader := ""
		for i, n := range c.nodes {
			info, err := c.Info(ctx, i)
			if err != nil {
				return fmt.Errorf("%s: %w", n.ID, err)
			}
			if info.Leader.ID == "" || (leader != "" && info.Leader.ID != leader) {
				return fmt.Errorf("%s sees leader %q, others %q", n.ID, info.Leader.ID, leader)
			}
			leader = info.Leader.ID
			voters := 0
			for _, m := range info.Nodes {
				if m.Suffrage == "voter" {
					voters++
				}
			}
			if voters != len(c.nodes) {
				return fmt.Errorf("%s sees %d voters", n.ID, voters)
			}
		}
		return nil
	})
}

func (c *Cluster) waitFor(ctx context.Context, timeout time.Duration, what string, f func(ctx context.Context) error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = f(ctx); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster: waiting until %s: %w", what, last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: waiting until %s: %w (%w)", what, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// StartNode starts node i if it is not running.
func (c *Cluster) StartNode(i int) error { return c.StartNodeWithEnv(i) }

// StartNodeWithEnv starts node i if it is not running, with env added to its
// environment for this start alone (a clock offset at boot, say): a later restart by
// another fault starts it as usual.
func (c *Cluster) StartNodeWithEnv(i int, env ...string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[i]
	if n.cmd != nil {
		return nil
	}
	n.nextEnv = env
	if err := os.MkdirAll(filepath.Dir(n.DataDir), 0o755); err != nil {
		return err
	}
	args := []string{"serve", "--id", n.ID, "--data-dir", n.DataDir, "--http-addr", n.APIAddr,
		"--raft-addr", n.RaftAddr, "--log-level", "info"}
	for j, other := range c.nodes {
		if j != i {
			args = append(args, "--peer-address", other.ID+"="+c.links[i][j].Addr())
		}
	}
	if n.join {
		for j, other := range c.nodes {
			if j != i {
				args = append(args, "--join", other.APIAddr)
			}
		}
	}
	args = append(args, c.cfg.ServeFlags...)
	logf, err := os.OpenFile(n.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	n.starts++
	fmt.Fprintf(logf, "\n===== jepsen-lite: start #%d of %s at %s =====\n", n.starts, n.ID, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(c.cfg.Binary, args...)
	cmd.Env = append(append(os.Environ(), c.cfg.Env...), n.nextEnv...)
	n.nextEnv = nil
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so a Ctrl-C on the harness reaches the harness first and
	// the harness decides how the nodes stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("cluster: start %s: %w", n.ID, err)
	}
	exited := make(chan struct{})
	start := n.starts
	go func() {
		err := cmd.Wait()
		logf.Close()
		c.mu.Lock()
		if !n.stopping && !n.faulted {
			// A crash (a panic on any goroutine, a fatal error) or an exit of its own:
			// quorum carries on and the final heal starts it again, so nothing else
			// would say it happened.
			c.exits = append(c.exits, fmt.Sprintf("%s (start #%d) exited by itself at %s: %v; see its log",
				n.ID, start, time.Now().Format(time.RFC3339Nano), err))
		}
		c.mu.Unlock()
		close(exited)
	}()
	// A new process holds no fault: they are set in the process (SetFaults).
	n.cmd, n.exited, n.paused, n.stopping, n.faulted = cmd, exited, false, false, false
	c.log.Info("started node", "node", n.ID, "pid", cmd.Process.Pid, "join", n.join)
	return nil
}

// UnexpectedExits describes every exit of a node process that neither the harness
// caused (a kill, a termination) nor a storage fault set on it may have.
func (c *Cluster) UnexpectedExits() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.exits)
}

// Running reports whether node i's process is alive (paused counts as alive).
func (c *Cluster) Running(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[i]
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		n.cmd = nil
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL to node i and waits for it to die.
func (c *Cluster) Kill(i int) error { return c.stop(i, syscall.SIGKILL, 0) }

// Terminate asks node i to shut down (SIGTERM) and kills it if it takes over grace.
func (c *Cluster) Terminate(i int, grace time.Duration) error {
	return c.stop(i, syscall.SIGTERM, grace)
}

func (c *Cluster) stop(i int, sig syscall.Signal, grace time.Duration) error {
	c.mu.Lock()
	n := c.nodes[i]
	cmd, exited := n.cmd, n.exited
	paused := n.paused
	if cmd != nil {
		n.stopping = true
	}
	c.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if paused && sig != syscall.SIGKILL {
		_ = cmd.Process.Signal(syscall.SIGCONT)
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		c.mu.Lock()
		n.stopping = false // not stopped: an exit of its own later is still its own
		c.mu.Unlock()
		return fmt.Errorf("cluster: signal %s: %w", n.ID, err)
	}
	if grace > 0 {
		select {
		case <-exited:
		case <-time.After(grace):
			_ = cmd.Process.Kill()
			<-exited
		}
	} else {
		<-exited
	}
	c.mu.Lock()
	n.cmd, n.paused = nil, false
	c.mu.Unlock()
	c.log.Info("stopped node", "node", n.ID, "signal", sig.String())
	return nil
}

// Pause stops node i with SIGSTOP.
func (c *Cluster) Pause(i int) error { return c.signal(i, syscall.SIGSTOP, true) }

// Resume continues node i with SIGCONT.
func (c *Cluster) Resume(i int) error { return c.signal(i, syscall.SIGCONT, false) }

func (c *Cluster) signal(i int, sig syscall.Signal, paused bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[i]
	if n.cmd == nil {
		return nil
	}
	if err := n.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("cluster: signal %s: %w", n.ID, err)
	}
	n.paused = paused
	return nil
}

// Paused reports whether node i is stopped by SIGSTOP.
func (c *Cluster) Paused(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i].paused
}

// Wipe deletes node i's data dir; the node must be stopped. From then on it joins
// through the others when it starts, as a new member would.
func (c *Cluster) Wipe(i int) error {
	if c.Running(i) {
		return fmt.Errorf("cluster: wipe %s while it runs", c.nodes[i].ID)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes[i].join = true
	return os.RemoveAll(c.nodes[i].DataDir)
}

// Link returns the proxy that carries node from's Raft traffic to node to.
func (c *Cluster) Link(from, to int) *proxy.Link { return c.links[from][to] }

// SetLinks applies s to both directions of every link between a node in a and a node
// in b.
func (c *Cluster) SetLinks(a, b []int, s proxy.Setting) {
	for _, i := range a {
		for _, j := range b {
			if i != j {
				c.links[i][j].Set(s)
				c.links[j][i].Set(s)
			}
		}
	}
}

// Partition cuts every link between nodes of different groups. Nodes in no group are
// cut from everyone.
func (c *Cluster) Partition(groups [][]int) {
	group := make([]int, len(c.nodes))
	for i := range group {
		group[i] = -1 - i
	}
	for g, members := range groups {
		for _, i := range members {
			group[i] = g
		}
	}
	for i := range c.nodes {
		for j := range c.nodes {
			if i == j {
				continue
			}
			if group[i] == group[j] {
				c.links[i][j].Set(proxy.Setting{Mode: proxy.Pass})
			} else {
				c.links[i][j].Set(proxy.Setting{Mode: proxy.Cut})
			}
		}
	}
}

// HealNetwork sets every link back to pass.
func (c *Cluster) HealNetwork() {
	for i := range c.nodes {
		for j := range c.nodes {
			if i != j {
				c.links[i][j].Set(proxy.Setting{Mode: proxy.Pass})
			}
		}
	}
}

// Close kills every node and closes the proxies.
func (c *Cluster) Close() error {
	var errs []error
	for i := range c.nodes {
		if err := c.Kill(i); err != nil {
			errs = append(errs, err)
		}
	}
	c.closeLinks()
	return errors.Join(errs...)
}

func (c *Cluster) closeLinks() {
	for _, row := range c.links {
		for _, l := range row {
			if l != nil {
				_ = l.Close()
			}
		}
	}
}

// call does one admin request against node i and decodes a 200 answer into out.
func (c *Cluster) call(ctx context.Context, i int, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.nodes[i].APIAddr+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		if e := idemkv.ParseErrorBody(b); e != nil {
			return fmt.Errorf("%s %s on %s: %w", method, path, c.nodes[i].ID, e)
		}
		return fmt.Errorf("%s %s on %s: %s: %s", method, path, c.nodes[i].ID, resp.Status, strings.TrimSpace(string(b)))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// Info asks node i for its view of the cluster.
func (c *Cluster) Info(ctx context.Context, i int) (*idemkv.ClusterInfo, error) {
	var info idemkv.ClusterInfo
	if err := c.call(ctx, i, http.MethodGet, "/v1/cluster", nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// Leader returns the index of the node that the live nodes name as leader in the
// highest term any of them reports, or -1 if none does.
func (c *Cluster) Leader(ctx context.Context) int {
	best, bestTerm := -1, uint64(0)
	for i := range c.nodes {
		if !c.Running(i) || c.Paused(i) {
			continue
		}
		info, err := c.Info(ctx, i)
		if err != nil || info.Leader.ID == "" {
			continue
		}
		if info.Term >= bestTerm {
			if idx := c.index(info.Leader.ID); idx >= 0 {
				best, bestTerm = idx, info.Term
			}
		}
	}
	return best
}

func (c *Cluster) index(id string) int {
	for i, n := range c.nodes {
		if n.ID == id {
			return i
		}
	}
	return -1
}

// Remove takes node id out of the cluster, asking the live nodes in turn.
func (c *Cluster) Remove(ctx context.Context, id string, force bool) error {
	var errs []error
	for i := range c.nodes {
		if c.nodes[i].ID == id || !c.Running(i) || c.Paused(i) {
			continue
		}
		err := c.call(ctx, i, http.MethodPost, "/v1/cluster/remove", idemkv.RemoveRequest{ID: id, Force: force}, nil)
		if err == nil || errors.Is(err, idemkv.ErrNotFound) {
			return nil
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("cluster: remove %s: %w", id, errors.Join(errs...))
}

// SetHooks changes node i's test hooks.
func (c *Cluster) SetHooks(ctx context.Context, i int, u testhooks.StateUpdate) (*testhooks.State, error) {
	var s testhooks.State
	if err := c.call(ctx, i, http.MethodPost, testhooks.PathHooks, u, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// StateHash asks node i for its applied index and state hash.
func (c *Cluster) StateHash(ctx context.Context, i int) (*testhooks.Snapshot, error) {
	var s testhooks.Snapshot
	if err := c.call(ctx, i, http.MethodGet, testhooks.PathStateHash, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// APIAddrs lists every node's API address.
func (c *Cluster) APIAddrs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.APIAddr
	}
	return out
}
