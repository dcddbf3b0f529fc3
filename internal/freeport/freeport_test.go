package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestAddrIsFreeBelowTheEphemeralRangeAndNeverRepeats(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		addr, err := Addr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if port < low || port >= ephemeralLow() {
			t.Fatalf("port %d outside [%d, %d)", port, low, ephemeralLow())
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("handed-out %s cannot be bound: %v", addr, err)
		}
		ln.Close()
	}
}
