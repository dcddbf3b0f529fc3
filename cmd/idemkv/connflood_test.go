package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A flood of idle sockets from one host takes that host's share of the API's
// connections (--max-conns-per-source), not the node: another host is served at once,
// and the flooding host's own next connection takes the place of its oldest.
func TestServeBoundsIdleConnectionsPerSource(t *testing.T) {
	httpAddr := serveNode(t, nil, "--max-conns", "8", "--max-conns-per-source", "4")

	dial := func(src string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	healthz := func(c net.Conn) error {
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	// Two flooding hosts hold every connection, idle, never sending a byte.
	var flood []net.Conn
	for i := range 8 {
		flood = append(flood, dial(fmt.Sprintf("127.0.0.%d", 2+i%2)))
	}
	time.Sleep(200 * time.Millisecond)
	for _, src := range []string{"127.0.0.4", "127.0.0.5", "127.0.0.2"} {
		if err := healthz(dial(src)); err != nil {
			t.Fatalf("a request from %s while two hosts hold idle sockets: %v", src, err)
		}
	}
	// Well inside the server's 5 s header timeout, which closes idle sockets anyway.
	deadline := time.Now().Add(time.Second)
	closed := 0
	for _, c := range flood {
		_ = c.SetReadDeadline(deadline)
		if _, err := c.Read(make([]byte, 1)); err != nil && !strings.Contains(err.Error(), "timeout") {
			closed++
		}
	}
	if closed < 3 {
		t.Fatalf("%d of the flood's idle sockets were closed for 3 newcomers, want at least 3", closed)
	}
}
