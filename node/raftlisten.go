package node

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Bounds of the Raft listener. hashicorp/raft's transport sets no deadline on the
// connections it accepts: 400 TCP connections that never sent a byte stayed open for
// good, and at a low file limit they starved the API of descriptors.
const (
	// DefaultRaftHandshakeTimeout bounds a connection's TLS handshake (or, without
	// TLS, its first byte). A peer on a LAN completes one in milliseconds.
	DefaultRaftHandshakeTimeout = 10 * time.Second
	// DefaultRaftIdleTimeout closes an established connection silent this long. A
	// leader heartbeats every member ten times per HeartbeatTimeout, so a live
	// connection is never quiet for minutes; a pooled spare that is gets redialled.
	DefaultRaftIdleTimeout = 5 * time.Minute
	// DefaultRaftMaxPending caps connections still in their handshake; beyond it new
	// ones are closed at once. Peers open a handful each (raft's pool holds 5).
	DefaultRaftMaxPending = 64
)

// guardedListener hands Raft only connections that completed their handshake within
// a deadline, holds at most maxPending in that state, and closes established ones
// after idle time without traffic.
type guardedListener struct {
	raw        net.Listener
	tls        *tls.Config
	handshake  time.Duration
	idle       time.Duration
	maxPending int

	ready     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	mu      sync.Mutex
	pending map[net.Conn]struct{}
}

func newGuardedListener(raw net.Listener, tlsConf *tls.Config, handshake, idle time.Duration, maxPending int) *guardedListener {
	g := &guardedListener{
		raw: raw, tls: tlsConf, handshake: handshake, idle: idle, maxPending: maxPending,
		ready: make(chan net.Conn), done: make(chan struct{}), pending: map[net.Conn]struct{}{},
	}
	g.wg.Add(1)
	go g.acceptLoop()
	return g
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
		g.mu.Lock()
		full := len(g.pending) >= g.maxPending
		if !full {
			g.pending[c] = struct{}{}
		}
		g.mu.Unlock()
		if full {
			c.Close()
			continue
		}
		g.wg.Add(1)
		go g.admit(c)
	}
}

// admit runs the handshake of c under the deadline and hands the result to Accept.
func (g *guardedListener) admit(c net.Conn) {
	defer g.wg.Done()
	conn, err := g.open(c)
	g.mu.Lock()
	delete(g.pending, c)
	g.mu.Unlock()
	if err != nil {
		c.Close()
		return
	}
	select {
	case g.ready <- conn:
	case <-g.done:
		conn.Close()
	}
}

func (g *guardedListener) open(c net.Conn) (net.Conn, error) {
	if err := c.SetDeadline(time.Now().Add(g.handshake)); err != nil {
		return nil, err
	}
	var conn net.Conn
	if g.tls != nil {
		tc := tls.Server(c, g.tls)
		if err := tc.Handshake(); err != nil {
			return nil, err
		}
		conn = tc
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
	return &idleConn{Conn: conn, idle: g.idle}, nil
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
