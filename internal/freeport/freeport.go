// Package freeport hands out loopback addresses for test servers that must be started
// (and restarted) on a known port.
//
// Asking the kernel for port 0 and closing the listener is not enough: such a port
// comes from the ephemeral range, and every outgoing connection on the machine (a load
// test's clients, Raft's peers, another test's HTTP calls) takes its source port from
// that same range. A port handed out that way can be in use as someone's source port
// by the time the server binds it, which made cluster tests fail with "address already
// in use" while other suites ran beside them. Ports here come from below the
// ephemeral range, where only listeners live, at random, and never twice within one
// process.
//
// Random is not enough between processes: `go test ./...` runs several packages' test
// binaries at once, and each hands out hundreds of ports over its life. One process's
// port is free whenever its node is stopped or not started yet, so another process
// could draw it, see it free and bind it first. A port handed out is therefore also
// claimed for the life of the process: on Unix, a lock on byte `port` of one file in
// the temporary directory, which the kernel drops when the process exits, however it
// exits. A port another process claimed is never handed out.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// Ports are drawn from [low, ephemeralLow()).
const low = 15000

var (
	mu     sync.Mutex
	handed = map[int]bool{}
	claims *os.File // open for the life of the process: closing it would drop every claim

	// span narrows the range in this package's tests; zero means [low, ephemeralLow()).
	spanLow, spanHigh int
)

// Addr returns "127.0.0.1:port" for a port that nothing listened on a moment ago, that
// this process has not handed out before, and that no other process holds a claim on.
func Addr() (string, error) {
	lo, hi := portRange()
	mu.Lock()
	defer mu.Unlock()
	if claims == nil {
		f, err := openClaims()
		if err != nil {
			return "", err
		}
		claims = f
	}
	for range 1000 {
		port := lo + rand.IntN(hi-lo)
		if handed[port] {
			continue
		}
		ok, err := claim(claims, port)
		if err != nil {
			return "", err
		}
		if !ok {
			continue // another process's
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			// Not ours to use: whoever listens keeps it, and so do we, so the port is
			// never tried again here.
			handed[port] = true
			continue
		}
		if err := ln.Close(); err != nil {
			return "", fmt.Errorf("freeport: %w", err)
		}
		handed[port] = true
		return addr, nil
	}
	return "", fmt.Errorf("freeport: no free port in [%d, %d) after 1000 tries", lo, hi)
}

func portRange() (int, int) {
	if spanHigh > 0 {
		return spanLow, spanHigh
	}
	return low, ephemeralLow()
}

// openClaims opens the claims file, one per user so that another user's file, which
// this one may not write, never stops a test.
func openClaims() (*os.File, error) {
	name := filepath.Join(os.TempDir(), fmt.Sprintf("idemkv-freeport-%d.lock", os.Getuid()))
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("freeport: the claims file: %w", err)
	}
	return f, nil
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
