// Package freeport hands out loopback addresses for test servers that must be started
// (and restarted) on a known port.
//
// Asking the kernel for port 0 and closing the listener is not enough: such a port
// comes from the ephemeral range, and every outgoing connection on the machine (a load
// test's clients, Raft's peers, another test's HTTP calls) takes its source port from
// that same range. A port handed out that way can be in use as someone's source port
// by the time the server binds it, which made cluster tests fail with "address already
// in use" while other suites ran beside them. Ports here come from below the
// ephemeral range, where only listeners live, at random so that test processes
// running in parallel rarely try the same one, and never twice within one process.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Ports are drawn from [low, ephemeralLow()).
const low = 15000

var (
	mu     sync.Mutex
	handed = map[int]bool{}
)

// Addr returns "127.0.0.1:port" for a port that nothing listened on a moment ago and
// that this process has not handed out before.
func Addr() (string, error) {
	high := ephemeralLow()
	mu.Lock()
	defer mu.Unlock()
	for range 1000 {
		port := low + rand.IntN(high-low)
		if handed[port] {
			continue
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		if err := ln.Close(); err != nil {
			return "", fmt.Errorf("freeport: %w", err)
		}
		handed[port] = true
		return addr, nil
	}
	return "", fmt.Errorf("freeport: no free port in [%d, %d) after 1000 tries", low, high)
}

// ephemeralLow is the first port the kernel uses for outgoing connections.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if p, err := strconv.Atoi(f[0]); err == nil && p > low+1000 {
				return p
			}
		}
	}
	return 32768 // Linux's default; elsewhere a range that is usually free of clients
}
