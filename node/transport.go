package node

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// streamLayer carries Raft RPCs over TCP, optionally wrapped in (mutual) TLS. With a
// TLS config, a peer that cannot present a certificate the config accepts never gets
// to speak Raft: the handshake runs before the transport sees the connection.
type streamLayer struct {
	net.Listener
	advertise net.Addr
	tls       *tls.Config
	guard     *guardedListener
}

// newStreamLayer listens on bind for Raft. With TLS it checks first that this node's
// own certificate may act as node id.
func newStreamLayer(id, bind, advertise string, tlsConf *tls.Config, policy listenPolicy, log *slog.Logger, closed *prometheus.CounterVec) (*streamLayer, error) {
	ids, err := checkOwnPeerCert(id, tlsConf)
	if err != nil {
		return nil, err
	}
	if tlsConf != nil && len(ids) == 0 {
		log.Warn("the raft TLS certificate names no node id: peers that bind certificates to ids refuse it; reissue it with the URI SAN "+nodeIDURIPrefix+id, "node_id", id)
	}
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("node: listen for raft on %s: %w", bind, err)
	}
	var adv net.Addr = ln.Addr()
	if advertise != "" {
		a, err := advertisedAddr(advertise)
		if err != nil {
			ln.Close()
			return nil, err
		}
		adv = a
	}
	if tcp, ok := adv.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		ln.Close()
		return nil, errors.New("node: the raft address peers dial must not be unspecified (0.0.0.0); set an advertise address")
	}
	g := newGuardedListener(ln, tlsConf, policy, log, closed)
	return &streamLayer{advertise: adv, tls: tlsConf, Listener: g, guard: g}, nil
}

// preferMembers makes the listener prefer connections from the hosts of the servers
// in r's latest configuration, and of the peer addresses this node dials instead (a
// proxy or NAT in front of a peer).
func (s *streamLayer) preferMembers(r *raft.Raft, overrides map[string]string) {
	s.guard.watchMembers(func() []string {
		var addrs []string
		for _, srv := range r.GetConfiguration().Configuration().Servers {
			addrs = append(addrs, string(srv.Address))
		}
		for _, a := range overrides {
			addrs = append(addrs, a)
		}
		return addrs
	})
}

// advertiseAddr is the Raft address exactly as the operator gave it. A name stays a
// name: resolving it here would write today's IP into the Raft configuration, and after
// the network changes (containers recreated on a new network) peers would dial a dead
// address.
type advertiseAddr string

func (a advertiseAddr) Network() string { return "tcp" }
func (a advertiseAddr) String() string  { return string(a) }

// advertisedAddr checks that addr is a host and port peers can dial and returns it
// unresolved.
func advertisedAddr(addr string) (net.Addr, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("node: raft advertise address %q: %w", addr, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return nil, fmt.Errorf("node: raft advertise address %q: port must be 1-65535", addr)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return nil, fmt.Errorf("node: the raft address peers dial (%q) must name a host, not an unspecified address; set an advertise address", addr)
	}
	return advertiseAddr(addr), nil
}

func (s *streamLayer) Addr() net.Addr { return s.advertise }

func (s *streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	if s.tls == nil {
		return d.Dial("tcp", string(addr))
	}
	return tls.DialWithDialer(d, "tcp", string(addr), s.tls)
}

// peerAddresses makes this node dial some peers at other addresses than the ones in
// the Raft configuration: a NAT, or a fault-injection proxy on one directed link.
//
// hashicorp/raft asks the provider for every RPC: for the peer it dials and for this
// node's own ID (the address it puts in each RPC header). An error makes Raft log a
// warning and use the configured address, so answering "no override" for our own ID
// or for a peer without an override logged a line per RPC (about 400 a second on an
// idle leader). The provider therefore answers every ID it can: an override, this
// node's advertised address, or the address in the latest Raft configuration.
type peerAddresses struct {
	overrides map[string]string
	self      raft.ServerID
	advertise raft.ServerAddress
	raft      atomic.Pointer[raft.Raft] // set once Raft runs; nil before
}

func (p *peerAddresses) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) {
	if a, ok := p.overrides[string(id)]; ok {
		return raft.ServerAddress(a), nil
	}
	if id == p.self {
		return p.advertise, nil
	}
	if r := p.raft.Load(); r != nil {
		// GetConfiguration reads an atomic copy of the latest configuration: no wait on
		// Raft's main loop.
		for _, s := range r.GetConfiguration().Configuration().Servers {
			if s.ID == id {
				return s.Address, nil
			}
		}
	}
	return "", fmt.Errorf("%w for server %s, and it is not in the Raft configuration", errNoOverride, id)
}

var errNoOverride = errors.New("no address override")

// heartbeatTransport is Raft's network transport with its heartbeat handler fenced
// off from Close. The transport runs Raft's heartbeat handler on the goroutine of the
// connection it came in on, outside Raft's own goroutines: Raft.Shutdown does not wait
// for it, and its check that Raft is still running may pass just before the shutdown.
// A heartbeat of a newer term then saved the term through a log store that Close had
// closed meanwhile, and Raft panicked ("failed to save current term: closed") and took
// the process down (seen under -race in CI). stopHeartbeats waits for a handler under
// way and turns later heartbeats away, unanswered, as Raft itself does once shut down.
//
// With a fence (a node started without Raft state, votefence.go), the RPCs Raft consumes
// pass through it first, and this node's own vote requests stay home while it is shut.
// Heartbeats need not pass: they carry no index it could learn from.
type heartbeatTransport struct {
	*raft.NetworkTransport
	mu      sync.RWMutex
	stopped bool

	fence       *voteFence    // nil: votes as Raft decides
	contacts    *peerContacts // nil: answers go unrecorded
	appends     *appendWatch  // nil: sends whatever its own disk does
	consumeOnce sync.Once
	consumed    chan raft.RPC
	done        chan struct{}
	closeOnce   sync.Once
	filtering   sync.WaitGroup
}

// Consumer is Raft's channel of RPCs, behind the fence if there is one. Raft calls it
// once, in NewRaft.
func (t *heartbeatTransport) Consumer() <-chan raft.RPC {
	if t.fence == nil {
		return t.NetworkTransport.Consumer()
	}
	t.consumeOnce.Do(func() {
		t.consumed, t.done = make(chan raft.RPC), make(chan struct{})
		t.filtering.Add(1)
		go func() {
			defer t.filtering.Done()
			t.fence.filter(t.NetworkTransport.Consumer(), t.consumed, t.done)
		}()
	})
	return t.consumed
}

// RequestVote asks target for its vote, unless the fence withholds this node's votes:
// then it answers for target with a refusal of the candidate's own term.
func (t *heartbeatTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if t.fence.withholds() {
		*resp = raft.RequestVoteResponse{Term: args.Term}
		return nil
	}
	return t.NetworkTransport.RequestVote(id, target, args, resp)
}

// RequestPreVote is RequestVote's pre-vote.
func (t *heartbeatTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	if t.fence.withholds() {
		*resp = raft.RequestPreVoteResponse{Term: args.Term}
		return nil
	}
	return t.NetworkTransport.RequestPreVote(id, target, args, resp)
}

// Close closes the transport and waits for the fence's goroutine. Raft's Shutdown
// calls it, and so does the node's Close.
func (t *heartbeatTransport) Close() error {
	t.consumeOnce.Do(func() {}) // a Consumer from now on gets no fence, and done is set if it ran
	t.closeOnce.Do(func() {
		if t.done != nil {
			close(t.done)
		}
	})
	err := t.NetworkTransport.Close()
	t.filtering.Wait()
	return err
}

// SetHeartbeatHandler installs cb behind the fence.
func (t *heartbeatTransport) SetHeartbeatHandler(cb func(rpc raft.RPC)) {
	if cb == nil {
		t.NetworkTransport.SetHeartbeatHandler(nil)
		return
	}
	t.NetworkTransport.SetHeartbeatHandler(func(rpc raft.RPC) {
		t.mu.RLock()
		defer t.mu.RUnlock()
		if !t.stopped {
			cb(rpc)
		}
	})
}

// stopHeartbeats returns once no heartbeat handler runs, and none will again.
func (t *heartbeatTransport) stopHeartbeats() {
	t.mu.Lock()
	t.stopped = true
	t.mu.Unlock()
}
