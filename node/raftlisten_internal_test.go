package node

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/idemkv/idemkv/internal/connlimit"
)

// policyListener is a guarded listener on 127.0.0.1 without TLS (the first byte is the
// handshake) whose members are the given IPs.
func policyListener(t *testing.T, maxPending, perSource int, members ...string) *testListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "closed"}, []string{"reason"})
	g := newGuardedListener(ln, nil, listenPolicy{handshake: time.Minute, idle: time.Minute, maxPending: maxPending, perSource: perSource}, nil, closed)
	t.Cleanup(func() { g.Close() })
	addrs := make([]string, len(members))
	for i, m := range members {
		addrs[i] = net.JoinHostPort(m, "7421")
	}
	g.watchMembers(func() []string { return addrs })
	return &testListener{guardedListener: g, closed: closed}
}

type testListener struct {
	*guardedListener
	closed *prometheus.CounterVec
}

// count is how many connections the listener closed for reason.
func (g *testListener) count(reason string) float64 {
	var m dto.Metric
	if err := g.closed.WithLabelValues(reason).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// dialFrom opens a connection to g from source IP src and waits until g has taken it
// in (or closed it), so that arrival order is the order of the calls.
func dialFrom(t *testing.T, g *testListener, src string) net.Conn {
	t.Helper()
	before := g.admitted()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", g.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for g.admitted() == before {
		if time.Now().After(deadline) {
			t.Fatalf("the listener did not take in a connection from %s", src)
		}
		time.Sleep(time.Millisecond)
	}
	return c
}

// admitted counts the connections the accept loop has decided on: taken in or refused.
func (g *testListener) admitted() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seq + uint64(g.count(closedRefused))
}

// closedByServer reports whether the listener closed c (EOF or reset), waiting up to
// wait for it; false means c is still open.
func closedByServer(t *testing.T, c net.Conn, wait time.Duration) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(wait))
	var b [1]byte
	_, err := c.Read(b[:])
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	if err == nil {
		t.Fatal("the listener sent a byte on a pending connection")
	}
	return true
}

func TestListenPolicyEvictsTheOldestOfASourceOverItsCap(t *testing.T) {
	g := policyListener(t, 100, 4)
	var conns []net.Conn
	for range 10 {
		conns = append(conns, dialFrom(t, g, "127.0.0.2"))
	}
	for i, c := range conns {
		want := i < 6
		wait := 2 * time.Second
		if !want {
			wait = 200 * time.Millisecond
		}
		if got := closedByServer(t, c, wait); got != want {
			t.Errorf("connection %d of 10 from one source: closed %v, want %v (the cap keeps the newest 4)", i, got, want)
		}
	}
	if got := g.count(closedSourceFull); got != 6 {
		t.Errorf("%s counted %v, want 6", closedSourceFull, got)
	}
	// Another source is not held to this one's cap.
	other := dialFrom(t, g, "127.0.0.3")
	if closedByServer(t, other, 200*time.Millisecond) {
		t.Error("a connection from another source was closed")
	}
}

func TestListenPolicyEvictsFromTheBusiestStrangerAndNeverAMember(t *testing.T) {
	g := policyListener(t, 8, 8, "127.0.0.1")
	var members []net.Conn
	for range 3 {
		members = append(members, dialFrom(t, g, "127.0.0.1"))
	}
	// 127.0.0.2 fills the rest and then some; 127.0.0.3 has one, the oldest of all
	// strangers.
	lone := dialFrom(t, g, "127.0.0.3")
	var busy []net.Conn
	for range 4 {
		busy = append(busy, dialFrom(t, g, "127.0.0.2"))
	}
	// Full (3 + 1 + 4). Each newcomer evicts the oldest of 127.0.0.2, the busiest.
	for range 2 {
		busy = append(busy, dialFrom(t, g, "127.0.0.4"))
	}
	for i, c := range busy[:2] {
		if !closedByServer(t, c, 2*time.Second) {
			t.Errorf("busiest source's connection %d was not evicted", i)
		}
	}
	for i, c := range busy[2:] {
		if closedByServer(t, c, 200*time.Millisecond) {
			t.Errorf("connection %d after the evicted ones was closed", i+2)
		}
	}
	if closedByServer(t, lone, 200*time.Millisecond) {
		t.Error("the oldest stranger's connection was evicted although its source was not the busiest")
	}
	// A member's newcomer evicts a stranger, never a member.
	members = append(members, dialFrom(t, g, "127.0.0.1"))
	for i, c := range members {
		if closedByServer(t, c, 200*time.Millisecond) {
			t.Errorf("member connection %d was closed", i)
		}
	}
	if got := g.count(closedListenerFull); got != 3 {
		t.Errorf("%s counted %v, want 3", closedListenerFull, got)
	}
}

func TestListenPolicyRefusesAStrangerWhenOnlyMembersArePending(t *testing.T) {
	g := policyListener(t, 4, 8, "127.0.0.1", "127.0.0.5")
	var conns []net.Conn
	for range 3 {
		conns = append(conns, dialFrom(t, g, "127.0.0.1"))
	}
	quiet := dialFrom(t, g, "127.0.0.5")
	stranger := dialFrom(t, g, "127.0.0.2")
	if !closedByServer(t, stranger, 2*time.Second) {
		t.Fatal("a stranger got in while only members' connections were pending")
	}
	if got := g.count(closedRefused); got != 1 {
		t.Errorf("%s counted %v, want 1", closedRefused, got)
	}
	// A member's newcomer makes room in the busiest member source: 127.0.0.1.
	newcomer := dialFrom(t, g, "127.0.0.5")
	if !closedByServer(t, conns[0], 2*time.Second) {
		t.Error("the oldest connection of the busiest member source was not evicted")
	}
	for i, c := range append(conns[1:], quiet, newcomer) {
		if closedByServer(t, c, 200*time.Millisecond) {
			t.Errorf("member connection %d was closed", i)
		}
	}
}

// A connection that completes its handshake leaves the pending set and reaches
// Accept, whatever the caps; one evicted never does.
func TestListenPolicyHandsOverHandshakenConnections(t *testing.T) {
	g := policyListener(t, 2, 1)
	evicted := dialFrom(t, g, "127.0.0.2")
	peer := dialFrom(t, g, "127.0.0.2")
	if !closedByServer(t, evicted, 2*time.Second) {
		t.Fatal("the older connection over the per-source cap was not evicted")
	}
	if _, err := peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := g.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	select {
	case c := <-accepted:
		defer c.Close()
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err != nil || b[0] != 'x' {
			t.Fatalf("accepted connection read %q, %v", b, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a connection that sent its first byte never reached Accept")
	}
	// Its slot is free again: two more from other sources fit the global cap of 2.
	for i := range 2 {
		c := dialFrom(t, g, fmt.Sprintf("127.0.0.%d", 3+i))
		if closedByServer(t, c, 200*time.Millisecond) {
			t.Errorf("connection %d after the handover was closed", i)
		}
	}
}

// An IPv6 host holds a /64 and may dial from any address in it: the whole /64 is one
// source. IPv4 addresses are sources of their own.
func TestSourceKeys(t *testing.T) {
	for _, c := range []struct{ a, b string }{
		{"[2001:db8:1:2::1]:4000", "[2001:db8:1:2:ffff::9]:5000"},
		{"127.0.0.2:1", "127.0.0.2:2"},
		{"[::ffff:10.0.0.1]:1", "10.0.0.1:2"},
	} {
		a, _ := net.ResolveTCPAddr("tcp", c.a)
		b, _ := net.ResolveTCPAddr("tcp", c.b)
		if connlimit.Source(a) != connlimit.Source(b) {
			t.Errorf("%s and %s are different sources (%s, %s)", c.a, c.b, connlimit.Source(a), connlimit.Source(b))
		}
	}
	for _, c := range []struct{ a, b string }{
		{"[2001:db8:1:2::1]:4000", "[2001:db8:1:3::1]:4000"},
		{"127.0.0.2:1", "127.0.0.3:1"},
	} {
		a, _ := net.ResolveTCPAddr("tcp", c.a)
		b, _ := net.ResolveTCPAddr("tcp", c.b)
		if connlimit.Source(a) == connlimit.Source(b) {
			t.Errorf("%s and %s are one source (%s)", c.a, c.b, connlimit.Source(a))
		}
	}
}
