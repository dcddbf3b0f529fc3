// Package connlimit bounds the connections an HTTP server holds, in all and per
// source, so that one host cannot fill the server for everyone: a flood of idle
// sockets from one address takes the places of that address's own idle connections
// past its share, and when the server is full a newcomer takes the place of an idle
// connection of whichever source holds the most.
//
// A connection is idle while it has no request in flight: net/http tells its state
// through http.Server.ConnState, which the server must send to Listener.ConnState.
// Connections with a request in flight (a call under way, a stream) are never closed
// to make room, and no connection is refused: past its share with every connection
// busy, a source's next one is held as any other while there is room; with the server
// full and every connection busy, Accept waits.
package connlimit

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
)

// Source is the source a connection came from, as a map key: its IPv4 address, or
// the /64 of its IPv6 address (one host holds a whole /64, and may pick any address
// in it for each connection).
func Source(a net.Addr) string {
	if tcp, ok := a.(*net.TCPAddr); ok {
		return SourceOfIP(tcp.IP)
	}
	return SourceOfHostPort(a.String())
}

// SourceOfHostPort is Source of a peer written "host:port" (http.Request.RemoteAddr).
func SourceOfHostPort(hostPort string) string {
	host, _, err := net.SplitHostPort(hostPort)
	if err != nil {
		return hostPort
	}
	if ip := net.ParseIP(host); ip != nil {
		return SourceOfIP(ip)
	}
	return host
}

var ipv6Source = net.CIDRMask(64, 128)

// SourceOfIP is Source of a connection from ip.
func SourceOfIP(ip net.IP) string {
	if v4 := ip.To4(); v4 != nil {
		return v4.String()
	}
	return ip.Mask(ipv6Source).String() + "/64"
}

// Listener holds at most max connections, perSource of them from one source.
type Listener struct {
	net.Listener
	max, perSource int

	mu       sync.Mutex
	changed  *sync.Cond // a connection closed or turned idle
	closed   bool
	total    int
	idle     int // of total
	bySource map[string][]*Conn
	ticks    uint64 // idleSince's clock
	// evicted counts the idle connections closed to make room.
	evicted int
}

// New wraps ln. max and perSource must be positive; perSource above max is max.
func New(ln net.Listener, max, perSource int) *Listener {
	l := &Listener{Listener: ln, max: max, perSource: min(perSource, max), bySource: make(map[string][]*Conn)}
	l.changed = sync.NewCond(&l.mu)
	return l
}

// Conn is a connection of a Listener.
type Conn struct {
	net.Conn
	l      *Listener
	source string
	busy   bool // a request in flight (net/http's StateActive)
	// idleSince orders the idle connections: the listener's count of changes when
	// the connection was accepted or last turned idle.
	idleSince uint64
	gone      bool
	once      sync.Once
}

// Accept waits until a connection may be held (a slot is free, or an idle one can be
// closed for it), accepts the next, and makes room for it: past its source's share
// the source's oldest idle connection is closed (none idle: the new one is held all
// the same while there is room), past the whole bound the oldest idle one of the
// source that holds the most.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		for !l.closed && l.total >= l.max && l.idle == 0 {
			l.changed.Wait()
		}
		closed := l.closed
		l.mu.Unlock()
		if closed {
			return nil, net.ErrClosed
		}
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if c := l.admit(nc); c != nil {
			return c, nil
		}
	}
}

// admit makes room for nc and records it, or closes it and returns nil (the listener
// closed). Past the whole bound with every connection busy (one turned busy since
// Accept looked), it waits for a change.
func (l *Listener) admit(nc net.Conn) *Conn {
	src := Source(nc.RemoteAddr())
	l.mu.Lock()
	var victim *Conn
	for {
		if l.closed {
			l.mu.Unlock()
			_ = nc.Close()
			return nil
		}
		if len(l.bySource[src]) >= l.perSource {
			// Past its share the source gives up its own idle connection, if any.
			if victim = oldestIdle(l.bySource[src]); victim != nil {
				break
			}
		}
		if l.total < l.max {
			break
		}
		// The source holding the most with an idle connection; of two alike, the
		// one whose connection has been idle longer.
		most := 0
		for _, cs := range l.bySource {
			v := oldestIdle(cs)
			if v == nil || len(cs) < most {
				continue
			}
			if len(cs) > most || v.idleSince < victim.idleSince {
				most, victim = len(cs), v
			}
		}
		if victim != nil {
			break
		}
		l.changed.Wait()
	}
	if victim != nil {
		l.evicted++
		l.forget(victim)
	}
	l.ticks++
	c := &Conn{Conn: nc, l: l, source: src, idleSince: l.ticks}
	l.bySource[src] = append(l.bySource[src], c)
	l.total++
	l.idle++ // net/http's StateNew: nothing read yet
	l.mu.Unlock()
	if victim != nil {
		_ = victim.Conn.Close()
	}
	return c
}

// oldestIdle is the connection of cs idle the longest, or nil.
func oldestIdle(cs []*Conn) *Conn {
	var old *Conn
	for _, c := range cs {
		if !c.busy && (old == nil || c.idleSince < old.idleSince) {
			old = c
		}
	}
	return old
}

// forget drops c from the counts; l.mu is held.
func (l *Listener) forget(c *Conn) {
	if c.gone {
		return
	}
	c.gone = true
	l.total--
	if !c.busy {
		l.idle--
	}
	cs := l.bySource[c.source]
	for i, x := range cs {
		if x == c {
			cs = append(cs[:i:i], cs[i+1:]...)
			break
		}
	}
	if len(cs) == 0 {
		delete(l.bySource, c.source)
	} else {
		l.bySource[c.source] = cs
	}
	l.changed.Broadcast()
}

// ConnState is for http.Server.ConnState: it tells the listener which of its
// connections have a request in flight.
func (l *Listener) ConnState(nc net.Conn, state http.ConnState) {
	c, ok := nc.(*Conn)
	for !ok {
		// A server that serves TLS over the listener hands over its *tls.Conn.
		u, wraps := nc.(interface{ NetConn() net.Conn })
		if !wraps {
			return
		}
		nc = u.NetConn()
		c, ok = nc.(*Conn)
	}
	if c.l != l {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.gone {
		return
	}
	switch state {
	case http.StateActive, http.StateHijacked:
		if !c.busy {
			c.busy = true
			l.idle--
		}
	case http.StateIdle:
		if c.busy {
			c.busy = false
			l.ticks++
			c.idleSince = l.ticks
			l.idle++
			l.changed.Broadcast()
		}
	case http.StateClosed:
		l.forget(c)
	}
}

// Close closes the listener; Accept returns net.ErrClosed.
func (l *Listener) Close() error {
	l.mu.Lock()
	l.closed = true
	l.changed.Broadcast()
	l.mu.Unlock()
	return l.Listener.Close()
}

// Stats returns the connections held, the idle among them, and how many idle ones
// were closed to make room so far.
func (l *Listener) Stats() (held, idle, evicted int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total, l.idle, l.evicted
}

// CloseWrite half-closes a TCP connection (net/http does after an answer to a body it
// did not read, so that the client reads the answer rather than a reset).
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// ReadFrom lets a copy into the connection use the kernel's (sendfile, splice) as the
// bare connection's would.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// Close closes the connection and frees its place.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.forget(c)
		c.l.mu.Unlock()
	})
	return err
}
