package node_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// linkProxy carries one directed Raft link (a node dialing one peer). Paused, it still
// accepts connections and reads what comes, but delivers nothing either way, as a
// peer stopped with SIGSTOP or cut off by a partition that drops packets: the sender's
// RPC waits for the transport's timeout instead of failing at once.
type linkProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	conns  []net.Conn
}

func newLinkProxy(t *testing.T, target string) *linkProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &linkProxy{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *linkProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		d, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, d)
		p.mu.Unlock()
		go p.pipe(c, d)
		go p.pipe(d, c)
	}
}

// pipe copies src to dst. Paused, nothing passes, a close included: the other node's
// listener closes a connection idle for a while, and a paused peer closes nothing.
func (p *linkProxy) pipe(src, dst net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		for p.paused {
			p.cond.Wait()
		}
		p.mu.Unlock()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				src.Close()
			}
			return
		}
	}
}

func (p *linkProxy) setPaused(paused bool) {
	p.mu.Lock()
	p.paused = paused
	p.mu.Unlock()
	p.cond.Broadcast()
}

func (p *linkProxy) close() {
	p.setPaused(false)
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

// A voter that stops answering without closing its connections (paused, or behind a
// partition that drops packets) fails no heartbeat for the transport's 10 s, and the
// removal guard, which knew a voter was down only from Raft's failed heartbeats,
// allowed the removal of the one live follower meanwhile: the cluster was left with two
// voters, one of them silent, and committed nothing again. The guard now counts a
// voter only if it answered within two heartbeat timeouts; a promotion is held to the
// same rule; and once the voter answers again the removal goes through.
func TestRemovalGuardSeesAPausedVoter(t *testing.T) {
	var mu sync.Mutex
	links := map[[2]string]*linkProxy{} // {from, to} → the proxy from dials to reach to
	c := testcluster.Start(t, 3, testcluster.WithPeerAddresses(), testcluster.WithConfig(func(i int, cfg *node.Config) {
		mu.Lock()
		defer mu.Unlock()
		for peer, addr := range cfg.PeerAddresses {
			p := newLinkProxy(t, addr)
			links[[2]string{cfg.ID, peer}] = p
			cfg.PeerAddresses[peer] = p.ln.Addr().String()
		}
	}))
	li := c.WaitLeader()
	leader := c.Node(li)
	up, down := (li+1)%3, (li+2)%3
	pause := func(paused bool) {
		mu.Lock()
		defer mu.Unlock()
		for k, p := range links {
			if k[0] == c.ID(down) || k[1] == c.ID(down) {
				p.setPaused(paused)
			}
		}
	}
	stateOf := func(id string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		info, err := leader.Cluster(ctx)
		if err != nil {
			return err.Error()
		}
		for _, ni := range info.Nodes {
			if ni.ID == id {
				return ni.State
			}
		}
		return "absent"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := testcluster.Eventually(10*time.Second, func() error {
		if s := stateOf(c.ID(down)); s != "follower" {
			return errors.New(c.ID(down) + " is " + s)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	const nowhere = "127.0.0.1:9"
	if _, err := leader.Join(ctx, &idemkv.JoinRequest{ID: "n-learner", RaftAddr: nowhere, APIAddr: nowhere, Format: leader.Format(), Stage: idemkv.JoinLearner}); err != nil {
		t.Fatalf("joining a learner: %v", err)
	}

	pause(true)
	paused := time.Now()
	if err := testcluster.Eventually(5*time.Second, func() error {
		if s := stateOf(c.ID(down)); s != "unreachable" {
			return errors.New(c.ID(down) + " is " + s)
		}
		return nil
	}); err != nil {
		t.Fatalf("the leader's view of a paused voter: %v", err)
	}
	// Well inside the transport's 10 s: no heartbeat to the paused voter has failed.
	if d := time.Since(paused); d > 7*time.Second {
		t.Fatalf("took %s to see the paused voter; the test needs it inside the transport's timeout", d)
	}
	removed := make(chan error, 1)
	go func() {
		_, err := leader.Remove(ctx, &idemkv.RemoveRequest{ID: c.ID(up)})
		removed <- err
	}()
	select {
	case err := <-removed:
		if idemkv.CodeOf(err) != idemkv.CodeInvalidArgument {
			t.Fatalf("removing the one live follower while a voter is paused: %v, want invalid_argument", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("removing the one live follower while a voter is paused went ahead, and the cluster cannot commit it")
	}
	if _, err := leader.Join(ctx, &idemkv.JoinRequest{ID: "n-learner", RaftAddr: nowhere, APIAddr: nowhere, Format: leader.Format(), Stage: idemkv.JoinPromote}); idemkv.CodeOf(err) != idemkv.CodeUnavailable {
		t.Fatalf("promoting a learner nobody reaches while a voter is paused: %v, want unavailable", err)
	}

	pause(false)
	if err := testcluster.Eventually(10*time.Second, func() error {
		if s := stateOf(c.ID(down)); s != "follower" {
			return errors.New(c.ID(down) + " is " + s)
		}
		return nil
	}); err != nil {
		t.Fatalf("the voter answering again: %v", err)
	}
	for _, id := range []string{"n-learner", c.ID(up)} {
		if _, err := leader.Remove(ctx, &idemkv.RemoveRequest{ID: id}); err != nil {
			t.Fatalf("removing %s once every voter answers: %v", id, err)
		}
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if _, err := leader.Reserve(wctx, reserveReq("after-removal", "a1", "fp1")); err != nil {
		t.Fatalf("a write after the removal: %v", err)
	}
}
