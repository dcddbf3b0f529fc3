package connlimit

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// dialFrom opens a connection to ln from the loopback address src and returns the
// client's end and the listener's.
func dialFrom(t *testing.T, l *Listener, src string) (client, server net.Conn) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	type accepted struct {
		c   net.Conn
		err error
	}
	got := make(chan accepted, 1)
	go func() {
		s, err := l.Accept()
		got <- accepted{s, err}
	}()
	select {
	case a := <-got:
		if a.err != nil {
			t.Fatal(a.err)
		}
		t.Cleanup(func() { a.c.Close() })
		return c, a.c
	case <-time.After(10 * time.Second):
		t.Fatalf("a connection from %s was not accepted", src)
	}
	return nil, nil
}

func newListener(t *testing.T, max, perSource int) *Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(ln, max, perSource)
	t.Cleanup(func() { l.Close() })
	return l
}

// closedByServer reports whether the server closed the client's end c.
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err)
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}

func stillOpen(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// One host's idle connections fill its own share; the next from it takes the place
// of its oldest, and a connection of another host is never closed for it.
func TestASourcesIdleConnectionsMakeRoomForItsOwn(t *testing.T) {
	l := newListener(t, 8, 2)
	other, _ := dialFrom(t, l, "127.0.0.9")
	first, _ := dialFrom(t, l, "127.0.0.2")
	second, _ := dialFrom(t, l, "127.0.0.2")
	dialFrom(t, l, "127.0.0.2")
	if !closedByServer(first) {
		t.Fatal("the source's oldest idle connection is still open past its share")
	}
	if !stillOpen(second) || !stillOpen(other) {
		t.Fatal("a newer connection of the source, or another source's, was closed")
	}
	if held, _, evicted := l.Stats(); held != 3 || evicted != 1 {
		t.Fatalf("held %d, evicted %d; want 3 and 1", held, evicted)
	}
}

// Past its share with every connection busy, a source's next connection is held all
// the same while there is room (a fleet of agents behind one address, a follower
// forwarding to the leader): only its idle ones give way.
func TestASourceWithEveryConnectionBusyIsHeldWhileThereIsRoom(t *testing.T) {
	l := newListener(t, 8, 2)
	var busy []net.Conn
	for range 2 {
		c, s := dialFrom(t, l, "127.0.0.3")
		l.ConnState(s, http.StateActive)
		busy = append(busy, c)
	}
	third, _ := dialFrom(t, l, "127.0.0.3")
	for _, c := range append(busy, third) {
		if !stillOpen(c) {
			t.Fatal("a connection of a source past its share was closed while every one was busy")
		}
	}
	if held, _, evicted := l.Stats(); held != 3 || evicted != 0 {
		t.Fatalf("held %d, evicted %d; want 3 and 0", held, evicted)
	}
}

// Past the whole bound a newcomer takes the place of an idle connection of the
// source that holds the most, not of a smaller one.
func TestTheBiggestSourceGivesWay(t *testing.T) {
	l := newListener(t, 4, 3)
	small, _ := dialFrom(t, l, "127.0.0.5")
	var big []net.Conn
	for range 3 {
		c, _ := dialFrom(t, l, "127.0.0.6")
		big = append(big, c)
	}
	dialFrom(t, l, "127.0.0.7")
	if !closedByServer(big[0]) {
		t.Fatal("the biggest source's oldest idle connection was kept")
	}
	if !stillOpen(small) {
		t.Fatal("the smaller source's connection was closed")
	}
}

// With the bound full and every connection busy, Accept waits until one turns idle
// (then it is closed for the newcomer) or closes.
func TestAcceptWaitsWhileEveryConnectionIsBusy(t *testing.T) {
	l := newListener(t, 2, 2)
	var servers []net.Conn
	for _, src := range []string{"127.0.0.10", "127.0.0.11"} {
		_, s := dialFrom(t, l, src)
		l.ConnState(s, http.StateActive)
		servers = append(servers, s)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.12")}}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if s, err := l.Accept(); err == nil {
			accepted <- s
		}
	}()
	select {
	case <-accepted:
		t.Fatal("a third connection was accepted while two were busy (max 2)")
	case <-time.After(300 * time.Millisecond):
	}
	l.ConnState(servers[1], http.StateIdle)
	select {
	case s := <-accepted:
		defer s.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting connection was not accepted once one turned idle")
	}
	if held, _, evicted := l.Stats(); held != 2 || evicted != 1 {
		t.Fatalf("held %d evicted %d, want 2 and 1", held, evicted)
	}
	servers[0].Close()
	if held, _, _ := l.Stats(); held != 1 {
		t.Fatalf("held %d after a close, want 1", held)
	}
}

func TestSource(t *testing.T) {
	for addr, want := range map[net.Addr]string{
		&net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 1}:            "192.0.2.7",
		&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 1}:     "192.0.2.7",
		&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:3:4:5:6"), Port: 1}: "2001:db8:1:2::/64",
		&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:ffff::1"), Port: 1}: "2001:db8:1:2::/64",
	} {
		if got := Source(addr); got != want {
			t.Errorf("Source(%v) = %q, want %q", addr, got, want)
		}
	}
}

// A server that serves TLS over the listener tells the states of its *tls.Conn.
func TestConnStateOfATLSConnection(t *testing.T) {
	l := newListener(t, 4, 4)
	_, s := dialFrom(t, l, "127.0.0.13")
	tc := tls.Server(s, &tls.Config{})
	l.ConnState(tc, http.StateActive)
	if _, idle, _ := l.Stats(); idle != 0 {
		t.Fatalf("a TLS connection with a request in flight counts as idle (%d idle)", idle)
	}
	l.ConnState(tc, http.StateIdle)
	if _, idle, _ := l.Stats(); idle != 1 {
		t.Fatalf("%d idle, want 1", idle)
	}
}

// net/http half-closes a connection after answering a body it did not read: the
// wrapper keeps TCP's CloseWrite (and ReadFrom for sendfile).
func TestConnKeepsTCPsHalfClose(t *testing.T) {
	l := newListener(t, 4, 4)
	c, s := dialFrom(t, l, "127.0.0.14")
	if _, ok := s.(interface{ CloseWrite() error }); !ok {
		t.Fatal("the accepted connection has no CloseWrite")
	}
	if _, ok := s.(io.ReaderFrom); !ok {
		t.Fatal("the accepted connection has no ReadFrom")
	}
	if err := s.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if !closedByServer(c) {
		t.Fatal("CloseWrite did not end the server's side of the stream")
	}
}
