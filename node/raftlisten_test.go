package node_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testpki"
	"github.com/idemkv/idemkv/node"
)

// TestRaftListenerDropsIdleSockets: 400 TCP connections that never sent a byte stayed
// open on the Raft port for good (issue 13, defect 7). Now those beyond the pending cap
// are closed at once, the rest when the handshake deadline passes, a connection that
// sent its first byte and went quiet when the idle bound passes, and the cluster keeps
// committing meanwhile, with and without peer TLS.
func TestRaftListenerDropsIdleSockets(t *testing.T) {
	const (
		sockets    = 400
		maxPending = 16
		handshake  = 2 * time.Second
		idle       = 3 * time.Second
	)
	for _, withTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", withTLS), func(t *testing.T) {
			ctx := opsCtx(t)
			ca := testpki.NewCA(t, "idemkv peers")
			c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
				if withTLS {
					cfg.RaftTLS = node.PeerTLS(ca.Pool(), ca.IssueNode(t, fmt.Sprintf("n%d", i+1)).TLS)
				}
				cfg.RaftHandshakeTimeout = handshake
				cfg.RaftIdleTimeout = idle
				cfg.RaftMaxPending = maxPending
			}))
			li := c.WaitLeader()
			fi := (li + 1) % c.Len()
			info, err := c.Node(li).Cluster(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var target string
			for _, ni := range info.Nodes {
				if ni.ID == c.ID(fi) {
					target = ni.RaftAddr
				}
			}

			start := time.Now()
			conns := make([]net.Conn, 0, sockets)
			for range sockets {
				conn, err := net.DialTimeout("tcp", target, 5*time.Second)
				if err != nil {
					t.Fatalf("dial %d: %v", len(conns), err)
				}
				t.Cleanup(func() { conn.Close() })
				conns = append(conns, conn)
			}
			// One more that sends a byte (a plain-TCP "handshake") and then nothing.
			quiet, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { quiet.Close() })
			if !withTLS {
				if _, err := quiet.Write([]byte{0}); err != nil {
					t.Fatal(err)
				}
			}

			// The cluster commits while the sockets are open, through the attacked follower.
			if _, err := reserveAndCommit(ctx, c.Node(li), "under-attack", true); err != nil {
				t.Fatal(err)
			}
			c.WaitConverged()
			if rec, err := c.Node(fi).Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: "under-attack", Consistency: idemkv.Stale}); err != nil || rec.Status != idemkv.StatusCommitted {
				t.Fatalf("attacked follower: %+v, %v", rec, err)
			}

			// Every idle socket is closed by the node within the handshake bound (plus
			// slack for a loaded machine); none may still be open after it.
			closedAt := make([]time.Duration, sockets)
			var wg sync.WaitGroup
			for i, conn := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = conn.SetReadDeadline(start.Add(handshake + 20*time.Second))
					var b [1]byte
					_, err := conn.Read(b[:])
					if errors.Is(err, os.ErrDeadlineExceeded) {
						closedAt[i] = -1
						return
					}
					closedAt[i] = time.Since(start)
				}()
			}
			wg.Wait()
			early, open := 0, 0
			for _, d := range closedAt {
				switch {
				case d < 0:
					open++
				case d < handshake:
					early++
				}
			}
			if open > 0 {
				t.Fatalf("%d of %d idle sockets still open %s after they connected", open, sockets, handshake+20*time.Second)
			}
			if early < sockets-maxPending {
				t.Errorf("only %d sockets closed before the handshake deadline; beyond the cap of %d all %d should be", early, maxPending, sockets-maxPending)
			}
			t.Logf("%d sockets closed at once (over the cap), %d at the handshake deadline", early, sockets-early)

			_ = quiet.SetReadDeadline(time.Now().Add(idle + handshake + 20*time.Second))
			var b [1]byte
			if _, err := quiet.Read(b[:]); errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("a connection that went quiet after its first byte is still open")
			}

			// Peers still get in: the cluster commits again and converges.
			if _, err := reserveAndCommit(ctx, c.Node(c.WaitLeader()), "after-attack", true); err != nil {
				t.Fatal(err)
			}
			c.WaitConverged()
		})
	}
}
