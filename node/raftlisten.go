package node

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkv/idemkv/internal/connlimit"
)

// Bounds of the Raft listener. hashicorp/raft's transport sets no deadline on the
// connections it accepts: 400 TCP connections that never sent a byte stayed open for
// good, and at a low file limit they starved the API of descriptors. A bound on
// pending handshakes alone was not enough either (issue 22, point 7): with one global
// cap of 64, a 10 s handshake bound and the newest connection refused when full, ~90
// idle sockets per port kept a 3-node mTLS cluster without a leader for the whole 32 s
// of the flood after the leader was killed, since a peer's dial found the slots taken.
const (
	// DefaultRaftHandshakeTimeout bounds a connection's TLS handshake (or, without
	// TLS, its first byte). A peer completes one in a few round trips: milliseconds on
	// a LAN, under a second across regions; every second more is a second a stranger
	// holds a slot.
	DefaultRaftHandshakeTimeout = 3 * time.Second
	// DefaultRaftIdleTimeout closes an established connection silent this long. A
	// leader heartbeats every member ten times per HeartbeatTimeout, so a live
	// connection is never quiet for minutes; a pooled spare that is gets redialled.
	DefaultRaftIdleTimeout = 5 * time.Minute
	// DefaultRaftMaxPending caps connections still in their handshake. When it is
	// reached, a new connection evicts the oldest pending one of the busiest source
	// that is not a member of the Raft configuration (or is refused, when only
	// members' connections are pending).
	DefaultRaftMaxPending = 64
	// DefaultRaftMaxPendingPerSource caps the pending connections of one source (an
	// IPv4 address, an IPv6 /64); a new one beyond it evicts that source's oldest. A
	// peer opens a handful at once (raft's pool holds 5, a snapshot install one more).
	DefaultRaftMaxPendingPerSource = 8
)

// Why the listener closed a connection before Raft saw it: the reason label of
// idemkv_raft_connections_closed_total.
const (
	closedSourceFull   = "source_full"   // its source was over the per-source cap: its oldest was evicted
	closedListenerFull = "listener_full" // the listener was full: evicted for a newcomer
	closedRefused      = "refused"       // the listener was full of members' connections: a stranger's newcomer
	closedHandshake    = "handshake"     // handshake failed or timed out
	closedWrongID      = "wrong_node_id" // an RPC claimed a node id its certificate does not name
)

// listenPolicy is how the Raft listener admits connections.
type listenPolicy struct {
	handshake, idle time.Duration
	maxPending      int
	perSource       int
}

// guardedListener hands Raft only connections that completed their handshake within
// a deadline, holds at most maxPending in that state and perSource per source (connlimit.Source), and
// closes established ones after idle time without traffic. With peer TLS, every RPC
// on a connection must claim a node id the peer's certificate names (rpcGuard).
type guardedListener struct {
	raw    net.Listener
	tls    *tls.Config
	policy listenPolicy
	log    *slog.Logger
	closed *prometheus.CounterVec // may be nil

	// members holds the sources (connlimit.SourceOfIP) of the Raft configuration's servers; their
	// pending connections are never evicted for a stranger's.
	members   atomic.Pointer[map[string]bool]
	memberSrc atomic.Pointer[func() []string]

	ready     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	mu       sync.Mutex
	seq      uint64
	pending  map[net.Conn]*pendingConn
	bySource map[string][]*pendingConn // oldest first
}

// pendingConn is a connection in its handshake.
type pendingConn struct {
	conn   net.Conn
	source string
	seq    uint64 // arrival order
}

func newGuardedListener(raw net.Listener, tlsConf *tls.Config, policy listenPolicy, log *slog.Logger, closed *prometheus.CounterVec) *guardedListener {
	g := &guardedListener{
		raw: raw, tls: tlsConf, policy: policy, log: log, closed: closed,
		ready: make(chan net.Conn), done: make(chan struct{}),
		pending: map[net.Conn]*pendingConn{}, bySource: map[string][]*pendingConn{},
	}
	g.wg.Add(2)
	go g.acceptLoop()
	go g.refreshMembers()
	return g
}

// watchMembers makes the listener prefer connections from the hosts of addrs (the Raft
// addresses of the configuration's servers, re-read every memberRefresh).
func (g *guardedListener) watchMembers(addrs func() []string) {
	g.memberSrc.Store(&addrs)
	g.resolveMembers()
}

// memberRefresh is how often the members' addresses are re-read and resolved: a new
// member's connections are preferred within it.
const memberRefresh = 2 * time.Second

func (g *guardedListener) refreshMembers() {
	defer g.wg.Done()
	t := time.NewTicker(memberRefresh)
	defer t.Stop()
	for {
		select {
		case <-g.done:
			return
		case <-t.C:
			g.resolveMembers()
		}
	}
}

// resolveMembers stores the IPs of the members' hosts. A name is resolved here, off
// the accept path, so that a slow resolver never delays a handshake; one that does
// not resolve keeps the IPs it had.
func (g *guardedListener) resolveMembers() {
	src := g.memberSrc.Load()
	if src == nil {
		return
	}
	old := g.members.Load()
	set := map[string]bool{}
	for _, addr := range (*src)() {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			continue
		}
		if ip := net.ParseIP(host); ip != nil {
			set[connlimit.SourceOfIP(ip)] = true
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
		cancel()
		if err != nil && old != nil {
			// Keep whatever IPs this host had: a resolver hiccup must not demote a peer.
			for ip := range *old {
				set[ip] = true
			}
			continue
		}
		for _, ip := range ips {
			set[connlimit.SourceOfIP(ip.IP)] = true
		}
	}
	g.members.Store(&set)
}

func (g *guardedListener) member(source string) bool {
	m := g.members.Load()
	return m != nil && (*m)[source]
}

func (g *guardedListener) count(reason string) {
	if g.closed != nil {
		g.closed.WithLabelValues(reason).Inc()
	}
}

func (g *guardedListener) acceptLoop() {
	defer g.wg.Done()
	for {
		c, err := g.raw.Accept()
		if err != nil {
			select {
			case <-g.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors and the like: let them free up rather than spin.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !g.admitPending(c) {
			continue
		}
		g.wg.Add(1)
		go g.admit(c)
	}
}

// admitPending records c as pending, making room as the policy says. It reports
// whether c was admitted; a connection it evicts or refuses is closed.
func (g *guardedListener) admitPending(c net.Conn) bool {
	if admitted, handled := g.admitLegacy(c); handled {
		return admitted
	}
	source := connlimit.Source(c.RemoteAddr())
	g.mu.Lock()
	var victim *pendingConn
	reason := ""
	switch {
	case len(g.bySource[source]) >= g.policy.perSource:
		victim, reason = g.bySource[source][0], closedSourceFull
	case len(g.pending) >= g.policy.maxPending:
		victim = g.evictionVictim(g.member(source))
		reason = closedListenerFull
	}
	if reason == closedListenerFull && victim == nil {
		g.mu.Unlock()
		c.Close()
		g.count(closedRefused)
		return false
	}
	if victim != nil {
		g.forget(victim)
	}
	g.seq++
	p := &pendingConn{conn: c, source: source, seq: g.seq}
	g.pending[c] = p
	g.bySource[source] = append(g.bySource[source], p)
	g.mu.Unlock()
	if victim != nil {
		victim.conn.Close()
		g.count(reason)
	}
	return true
}

// evictionVictim picks the pending connection a newcomer replaces when the listener
// is full: the oldest of the source with the most pending connections, among the
// sources that are not members. A member's newcomer may also evict from the busiest
// member source; a stranger's may not (nil: refuse it). Called with g.mu held.
func (g *guardedListener) evictionVictim(newcomerIsMember bool) *pendingConn {
	var best, bestMember *pendingConn
	bestN, bestMemberN := 0, 0
	better := func(list []*pendingConn, cur *pendingConn, curN int) bool {
		return len(list) > curN || len(list) == curN && cur != nil && list[0].seq < cur.seq
	}
	for source, list := range g.bySource {
		if len(list) == 0 {
			continue
		}
		if g.member(source) {
			if better(list, bestMember, bestMemberN) {
				bestMember, bestMemberN = list[0], len(list)
			}
			continue
		}
		if better(list, best, bestN) {
			best, bestN = list[0], len(list)
		}
	}
	if best != nil {
		return best
	}
	if newcomerIsMember {
		return bestMember
	}
	return nil
}

// forget removes p from the pending connections (if it still is one). Called with
// g.mu held.
func (g *guardedListener) forget(p *pendingConn) {
	if g.pending[p.conn] != p {
		return
	}
	delete(g.pending, p.conn)
	list := g.bySource[p.source]
	for i, q := range list {
		if q == p {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(g.bySource, p.source)
	} else {
		g.bySource[p.source] = list
	}
}

// admit runs the handshake of c under the deadline and hands the result to Accept.
func (g *guardedListener) admit(c net.Conn) {
	defer g.wg.Done()
	conn, err := g.open(c)
	g.mu.Lock()
	evicted := true
	if p, ok := g.pending[c]; ok {
		evicted = false
		g.forget(p)
	}
	g.mu.Unlock()
	if err != nil {
		c.Close()
		if !evicted {
			g.count(closedHandshake)
		}
		return
	}
	select {
	case g.ready <- conn:
	case <-g.done:
		conn.Close()
	}
}

func (g *guardedListener) open(c net.Conn) (net.Conn, error) {
	if err := c.SetDeadline(time.Now().Add(legacyHandshake(g.policy.handshake))); err != nil {
		return nil, err
	}
	var conn net.Conn
	if g.tls != nil {
		tc := tls.Server(c, g.tls)
		if err := tc.Handshake(); err != nil {
			return nil, err
		}
		conn = tc
		if ids, bound := certNodeIDs(tc.ConnectionState()); bound {
			conn = newRPCGuard(tc, ids, g.log, g.count)
		}
	} else {
		// Without TLS the first byte stands for the handshake: a connection that
		// sends nothing is not a peer.
		var first [1]byte
		if _, err := io.ReadFull(c, first[:]); err != nil {
			return nil, err
		}
		conn = &prefixConn{Conn: c, prefix: first[:]}
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return &idleConn{Conn: conn, idle: g.policy.idle}, nil
}

func (g *guardedListener) Accept() (net.Conn, error) {
	select {
	case c := <-g.ready:
		return c, nil
	case <-g.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting, cuts every connection still in its handshake and waits for
// the goroutines the listener started.
func (g *guardedListener) Close() error {
	var err error
	g.closeOnce.Do(func() {
		close(g.done)
		err = g.raw.Close()
		g.mu.Lock()
		for c := range g.pending {
			c.Close()
		}
		g.mu.Unlock()
		g.wg.Wait()
	})
	return err
}

func (g *guardedListener) Addr() net.Addr { return g.raw.Addr() }

// prefixConn replays bytes already read from Conn.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (p *prefixConn) Read(b []byte) (int, error) {
	if len(p.prefix) > 0 {
		n := copy(b, p.prefix)
		p.prefix = p.prefix[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}

// idleConn closes the connection when a read or write waits longer than idle.
type idleConn struct {
	net.Conn
	idle time.Duration
}

func (c *idleConn) Read(b []byte) (int, error) {
	if err := c.Conn.SetReadDeadline(time.Now().Add(c.idle)); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *idleConn) Write(b []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.idle)); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}
