package node_test

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	dto "github.com/prometheus/client_model/go"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testpki"
	"github.com/idemkv/idemkv/metrics"
	"github.com/idemkv/idemkv/node"
)

// rogueStream is a Raft stream layer an attacker controls: plain TCP, or TLS with
// whatever configuration the attacker has.
type rogueStream struct {
	net.Listener
	tls *tls.Config
}

func (r *rogueStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	if r.tls == nil {
		return d.Dial("tcp", string(addr))
	}
	return tls.DialWithDialer(d, "tcp", string(addr), r.tls)
}

// rogue is a Raft transport for an attacker.
func rogue(t *testing.T, conf *tls.Config) *raft.NetworkTransport {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	trans := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: &rogueStream{Listener: ln, tls: conf}, MaxPool: 1, Timeout: 3 * time.Second,
		Logger: hclog.New(&hclog.LoggerOptions{Output: io.Discard}),
	})
	t.Cleanup(func() { trans.Close() })
	return trans
}

func term(n *node.Node) uint64 {
	v, _ := strconv.ParseUint(n.RaftStats()["term"], 10, 64)
	return v
}

// usurp sends a follower the heartbeat of a self-proclaimed leader in a much later
// term: a follower that accepts it adopts the term and the new leader.
func usurp(trans *raft.NetworkTransport, id, addr string, inTerm uint64) error {
	return usurpAs(trans, "intruder", id, addr, inTerm)
}

// usurpAs is usurp with the sender claiming node id claimed.
func usurpAs(trans *raft.NetworkTransport, claimed, id, addr string, inTerm uint64) error {
	req := &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(claimed), Addr: []byte(trans.LocalAddr())},
		Term:      inTerm,
	}
	var resp raft.AppendEntriesResponse
	return trans.AppendEntries(raft.ServerID(id), raft.ServerAddress(addr), req, &resp)
}

func TestPeerMutualTLSRefusesPeersWithoutACertificateFromTheCA(t *testing.T) {
	ctx := opsCtx(t)
	ca := testpki.NewCA(t, "idemkv peers")
	certs := make([]*testpki.Leaf, 3)
	for i := range certs {
		certs[i] = ca.IssueNode(t, fmt.Sprintf("n%d", i+1))
	}
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
		cfg.RaftTLS = node.PeerTLS(ca.Pool(), certs[i].TLS)
	}))
	li := c.WaitLeader()
	leader := c.Node(li)
	if _, err := reserveAndCommit(ctx, leader, "before", true); err != nil {
		t.Fatal(err)
	}
	c.WaitConverged()
	info, err := leader.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fi := (li + 1) % c.Len()
	follower := c.Node(fi)
	var followerAddr string
	for _, ni := range info.Nodes {
		if ni.ID == follower.ID() {
			followerAddr = ni.RaftAddr
		}
	}
	startTerm := term(follower)

	foreign := testpki.NewCA(t, "someone else").Issue(t, "n9").TLS
	attacks := map[string]*tls.Config{
		"plain TCP":          nil,
		"TLS without a cert": {RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12},
		// Go's client would not even send a certificate the server's CA list does not
		// name; an attacker's client would.
		"cert from another CA": {RootCAs: ca.Pool(), GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &foreign, nil
		}},
		"another CA with the same name": {RootCAs: ca.Pool(), Certificates: []tls.Certificate{testpki.NewCA(t, "idemkv peers").IssueNode(t, "intruder").TLS}},
		// Before certificates were bound to node ids, any certificate of the CA could
		// act as any node.
		"cert from the CA that names no node id": {RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Issue(t, "intruder").TLS}},
	}
	for name, conf := range attacks {
		t.Run(name, func(t *testing.T) {
			err := usurp(rogue(t, conf), follower.ID(), followerAddr, startTerm+100)
			if err == nil {
				t.Fatal("the follower took an AppendEntries from a peer without a valid certificate")
			}
			t.Logf("refused: %v", err)
		})
	}

	// The cluster did not notice: same term everywhere, same leader, writes go on.
	for i := range c.Len() {
		if got := term(c.Node(i)); got != startTerm {
			t.Errorf("%s is in term %d, was %d", c.ID(i), got, startTerm)
		}
	}
	if !leader.IsLeader() {
		t.Fatal("the leader lost its leadership to refused peers")
	}
	if _, err := reserveAndCommit(ctx, leader, "after", true); err != nil {
		t.Fatal(err)
	}
	c.WaitConverged()
	if rec, err := follower.Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: "after", Consistency: idemkv.Stale}); err != nil || rec.Status != idemkv.StatusCommitted {
		t.Fatalf("follower after the attacks: %+v, %v", rec, err)
	}

	// Control: the same message with a certificate the CA signed is obeyed. This is
	// what the refusals above prevented.
	insider := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.IssueNode(t, "intruder").TLS}}
	if err := usurp(rogue(t, insider), follower.ID(), followerAddr, startTerm+100); err != nil {
		t.Fatalf("a peer with a valid certificate was refused: %v", err)
	}
	if err := testcluster.Eventually(5*time.Second, func() error {
		if got := term(follower); got < startTerm+100 {
			return fmt.Errorf("follower term %d", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestPeerCertificateActsOnlyAsItsNode: any certificate of the peer CA could act as
// any node (issue 22, point 7). Now a certificate names the node ids it may act as
// (URI SAN idemkv://node/<id>), and an RPC that claims another id closes the
// connection before Raft reads it: n2's certificate, stolen, cannot make a follower
// take an AppendEntries or a vote request as n3, even on a connection that carried a
// request as n2 before.
func TestPeerCertificateActsOnlyAsItsNode(t *testing.T) {
	ctx := opsCtx(t)
	ca := testpki.NewCA(t, "idemkv peers")
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
		cfg.RaftTLS = node.PeerTLS(ca.Pool(), ca.IssueNode(t, fmt.Sprintf("n%d", i+1)).TLS)
	}))
	li := c.WaitLeader()
	fi := (li + 1) % c.Len()
	follower := c.Node(fi)
	owner, victim := c.ID((fi+1)%c.Len()), c.ID((fi+2)%c.Len())
	info, err := c.Node(li).Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var followerAddr string
	for _, ni := range info.Nodes {
		if ni.ID == follower.ID() {
			followerAddr = ni.RaftAddr
		}
	}
	startTerm := term(follower)
	stolen := rogue(t, &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.IssueNode(t, owner).TLS}})

	// As its own node, the certificate is heard: a vote request of a stale term gets
	// an answer (a refusal of the vote, which changes nothing).
	var vresp raft.RequestVoteResponse
	vote := func(claimed string) error {
		return stolen.RequestVote(raft.ServerID(follower.ID()), raft.ServerAddress(followerAddr), &raft.RequestVoteRequest{
			RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(claimed), Addr: []byte(stolen.LocalAddr())},
			Term:      1,
		}, &vresp)
	}
	if err := vote(owner); err != nil {
		t.Fatalf("a vote request as %s with %s's certificate was refused: %v", owner, owner, err)
	}
	if vresp.Granted {
		t.Fatal("a stale vote request was granted")
	}

	// As another node, it is not: neither over the connection it used as its own
	// node (the transport pools one), nor over a new one.
	if err := usurpAs(stolen, victim, follower.ID(), followerAddr, startTerm+100); err == nil {
		t.Fatalf("a follower took an AppendEntries as %s from %s's certificate", victim, owner)
	} else {
		t.Logf("AppendEntries as %s refused: %v", victim, err)
	}
	if err := vote(victim); err == nil {
		t.Fatalf("a follower answered a vote request as %s from %s's certificate", victim, owner)
	}
	for i := range c.Len() {
		if got := term(c.Node(i)); got != startTerm {
			t.Errorf("%s is in term %d, was %d", c.ID(i), got, startTerm)
		}
	}
	if got := closedFor(t, c.Metrics(fi), "wrong_node_id"); got < 2 {
		t.Errorf("idemkv_raft_connections_closed_total{reason=wrong_node_id} = %v on the follower, want at least 2", got)
	}
	if _, err := reserveAndCommit(ctx, c.Node(c.WaitLeader()), "after", true); err != nil {
		t.Fatal(err)
	}
	c.WaitConverged()
}

func closedFor(t *testing.T, m *metrics.Metrics, reason string) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.RaftConnsClosed.WithLabelValues(reason).Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetCounter().GetValue()
}

// While migrating (PeerTLSAllowingUnboundCerts), certificates that name no node id
// work as before, and one that names ids is still held to them.
func TestPeerTLSAllowingUnboundCertsForMigration(t *testing.T) {
	ctx := opsCtx(t)
	ca := testpki.NewCA(t, "idemkv peers")
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
		cfg.RaftTLS = node.PeerTLSAllowingUnboundCerts(ca.Pool(), ca.Issue(t, fmt.Sprintf("n%d", i+1)).TLS)
	}))
	if err := c.OnLeader(func(n *node.Node) error {
		_, err := reserveAndCommit(ctx, n, "unbound", true)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c.WaitConverged()

	li := c.WaitLeader()
	fi := (li + 1) % c.Len()
	info, err := c.Node(li).Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var followerAddr string
	for _, ni := range info.Nodes {
		if ni.ID == c.ID(fi) {
			followerAddr = ni.RaftAddr
		}
	}
	startTerm := term(c.Node(fi))
	bound := rogue(t, &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.IssueNode(t, "n7").TLS}})
	if err := usurpAs(bound, c.ID(li), c.ID(fi), followerAddr, startTerm+100); err == nil {
		t.Fatal("a certificate bound to n7 acted as the leader while unbound certificates are allowed")
	}
	if got := term(c.Node(fi)); got != startTerm {
		t.Fatalf("follower term %d, was %d", got, startTerm)
	}
}

// A node does not start with a peer certificate bound to other nodes only: every peer
// would refuse its RPCs.
func TestNodeRefusesAPeerCertificateOfAnotherNode(t *testing.T) {
	ca := testpki.NewCA(t, "idemkv peers")
	cfg := node.DefaultConfig()
	cfg.ID = "n1"
	cfg.DataDir = t.TempDir()
	cfg.RaftAddr, cfg.APIAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.RaftTLS = node.PeerTLS(ca.Pool(), ca.IssueNode(t, "n2").TLS)
	n, err := node.Open(cfg)
	if err == nil {
		n.Close()
		t.Fatal("a node started with n2's peer certificate as n1")
	}
	if !strings.Contains(err.Error(), `names nodes n2, not this node "n1"`) {
		t.Fatalf("error %q does not say whose certificate it is", err)
	}
}
