// Package proxy is a controllable TCP proxy for one directed network link between two
// nodes. jepsen-lite puts one on every Raft link so that a link can be cut, slowed or
// made to drop connections while a workload runs, without touching the kernel.
//
// A cut link behaves like a network that drops every packet: connections are accepted
// but nothing is forwarded, so the peers find out through their own timeouts. A
// connection that lost bytes is never resumed (the stream would be corrupt); it is
// closed when the link heals.
package proxy

import (
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Mode is what a link does with traffic.
type Mode int

const (
	// Pass forwards everything.
	Pass Mode = iota
	// Cut forwards nothing: the link is partitioned.
	Cut
	// Delay forwards everything after a fixed latency.
	Delay
	// Flaky forwards, but resets a connection with a given probability per chunk.
	Flaky
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Cut:
		return "cut"
	case Delay:
		return "delay"
	case Flaky:
		return "flaky"
	}
	return "unknown"
}

// Setting is a link's mode with its parameters.
type Setting struct {
	Mode Mode
	// Latency is added to every chunk in Delay mode.
	Latency time.Duration
	// DropRate is the chance that a chunk resets its connection in Flaky mode.
	DropRate float64
}

// Link is a proxy from a local listener to one target address.
type Link struct {
	ln     net.Listener
	target string
	log    *slog.Logger

	mu      sync.Mutex
	setting Setting
	conns   map[*conn]struct{}
	closed  bool
	stats   Stats

	// dial opens the connection to the target (net.DialTimeout but in tests).
	dial func(network, addr string, timeout time.Duration) (net.Conn, error)
	wg   sync.WaitGroup
}

type conn struct {
	client net.Conn
	// tainted is set once the connection dropped bytes; it must not carry traffic
	// again. Guarded by the link's mu.
	tainted bool

	// mu guards server and closed: the link may close the connection (a heal, Close)
	// while serve is still dialling the target, from another goroutine.
	mu     sync.Mutex
	server net.Conn
	closed bool
}

func (c *conn) close() {
	c.mu.Lock()
	server, already := c.server, c.closed
	c.closed = true
	c.mu.Unlock()
	if already {
		return
	}
	_ = c.client.Close()
	if server != nil {
		_ = server.Close()
	}
}

// attach gives c its dialled server side, unless c was closed meanwhile; then the
// caller closes server.
func (c *conn) attach(server net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.server = server
	return true
}

// Listen starts a link that listens on addr (use 127.0.0.1:0 for any port) and forwards
// to target.
func Listen(addr, target string, logger *slog.Logger) (*Link, error) {
	return listen(addr, target, logger, net.DialTimeout)
}

func listen(addr, target string, logger *slog.Logger, dial func(string, string, time.Duration) (net.Conn, error)) (*Link, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	l := &Link{ln: ln, target: target, log: logger, conns: map[*conn]struct{}{}, dial: dial}
	l.wg.Add(1)
	go l.accept()
	return l, nil
}

// Addr is the address the link listens on.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// Target is the address the link forwards to.
func (l *Link) Target() string { return l.target }

// Stats counts what a link did to the traffic it carried, so that a fault can show
// it had an effect: a cut that dropped nothing partitioned nothing.
type Stats struct {
	// Passed and Dropped are bytes forwarded and bytes thrown away (cut or tainted).
	Passed, Dropped uint64
	// Delayed counts chunks held back in Delay mode, Resets the connections closed
	// in Flaky mode.
	Delayed, Resets uint64
}

// Add returns the sum of s and o.
func (s Stats) Add(o Stats) Stats {
	return Stats{Passed: s.Passed + o.Passed, Dropped: s.Dropped + o.Dropped, Delayed: s.Delayed + o.Delayed, Resets: s.Resets + o.Resets}
}

// Stats returns the link's counters since it started.
func (l *Link) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

func (l *Link) count(f func(*Stats)) {
	l.mu.Lock()
	f(&l.stats)
	l.mu.Unlock()
}

// Setting returns the link's current setting.
func (l *Link) Setting() Setting {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.setting
}

// Set changes the link's setting. Leaving Cut closes every connection that was open
// during the cut: bytes were dropped, so the streams are unusable.
func (l *Link) Set(s Setting) {
	l.mu.Lock()
	prev := l.setting
	l.setting = s
	var stale []*conn
	if s.Mode == Cut && prev.Mode != Cut {
		for c := range l.conns {
			c.tainted = true
		}
	}
	if s.Mode != Cut {
		for c := range l.conns {
			if c.tainted {
				stale = append(stale, c)
				delete(l.conns, c)
			}
		}
	}
	l.mu.Unlock()
	for _, c := range stale {
		c.close()
	}
}

// Close stops the link and closes every connection.
func (l *Link) Close() error {
	l.mu.Lock()
	l.closed = true
	conns := l.conns
	l.conns = map[*conn]struct{}{}
	l.mu.Unlock()
	err := l.ln.Close()
	for c := range conns {
		c.close()
	}
	l.wg.Wait()
	return err
}

func (l *Link) accept() {
	defer l.wg.Done()
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			return
		}
		c := &conn{client: nc}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = nc.Close()
			return
		}
		c.tainted = l.setting.Mode == Cut
		l.conns[c] = struct{}{}
		l.mu.Unlock()
		l.wg.Add(1)
		go l.serve(c)
	}
}

func (l *Link) forget(c *conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	c.close()
}

func (l *Link) serve(c *conn) {
	defer l.wg.Done()
	defer l.forget(c)
	if l.isTainted(c) {
		// Accepted during a cut: a black hole until the link heals and closes it.
		buf := make([]byte, 32<<10)
		for {
			n, err := c.client.Read(buf)
			if n > 0 {
				l.count(func(st *Stats) { st.Dropped += uint64(n) })
			}
			if err != nil {
				return
			}
		}
	}
	server, err := l.dial("tcp", l.target, 5*time.Second)
	if err != nil {
		return
	}
	// The link may have closed or healed this connection while it was dialling; its
	// close ran without the server side, so close that here.
	if !c.attach(server) {
		_ = server.Close()
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); l.pump(c, c.client, server) }()
	go func() { defer wg.Done(); l.pump(c, server, c.client) }()
	wg.Wait()
}

func (l *Link) isTainted(c *conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return c.tainted
}

type chunk struct {
	data []byte
	due  time.Time
}

// pump copies src to dst through the link's current setting. Reading and writing are
// separate so that Delay keeps order and throughput while adding latency.
func (l *Link) pump(c *conn, src, dst net.Conn) {
	defer c.close()
	queue := make(chan chunk, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ch := range queue {
			if d := time.Until(ch.due); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(ch.data); err != nil {
				c.close()
				for range queue {
				}
				return
			}
		}
	}()
	defer func() { close(queue); <-done }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			s, tainted := l.settingFor(c)
			switch {
			case tainted || s.Mode == Cut:
				l.taint(c)
				l.count(func(st *Stats) { st.Dropped += uint64(n) })
				continue
			case s.Mode == Flaky && rand.Float64() < s.DropRate:
				l.count(func(st *Stats) { st.Resets++ })
				return
			}
			due := time.Now()
			if s.Mode == Delay {
				due = due.Add(s.Latency)
			}
			l.count(func(st *Stats) {
				st.Passed += uint64(n)
				if s.Mode == Delay {
					st.Delayed++
				}
			})
			data := make([]byte, n)
			copy(data, buf[:n])
			queue <- chunk{data: data, due: due}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				l.log.Debug("proxy read ended", "target", l.target, "err", err)
			}
			return
		}
	}
}

func (l *Link) settingFor(c *conn) (Setting, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.setting, c.tainted
}

func (l *Link) taint(c *conn) {
	l.mu.Lock()
	c.tainted = true
	l.mu.Unlock()
}
