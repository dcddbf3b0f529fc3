package main

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv/internal/testpki"
)

// handshake runs a TLS handshake between the Raft TLS configs of two nodes.
func handshake(t *testing.T, server, client *tls.Config) error {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	_ = a.SetDeadline(time.Now().Add(10 * time.Second))
	_ = b.SetDeadline(time.Now().Add(10 * time.Second))
	done := make(chan error, 1)
	go func() {
		s := tls.Server(a, server)
		err := s.Handshake()
		if err == nil {
			// TLS 1.3: the server learns of a client certificate it refused only
			// here; read so that the client sees the alert.
			_, err = s.Read(make([]byte, 1))
		}
		done <- err
	}()
	client = client.Clone()
	client.ServerName = "localhost" // what Raft's dial of localhost:port would check
	c := tls.Client(b, client)
	err := c.Handshake()
	if err == nil {
		_, err = c.Write([]byte{0})
	}
	serr := <-done
	if err != nil {
		return err
	}
	return serr
}

// Peer certificates that name no node id are refused unless the operator migrates
// with --peer-allow-unbound-certs; the flag alone, without peer TLS, is an error.
func TestPeerAllowUnboundCertsFlag(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "idemkv peers")
	caFile := ca.WriteCA(t, dir, "peer-ca")
	peerTLS := func(leaf *testpki.Leaf, name string, allowUnbound bool) *tls.Config {
		cert, key := leaf.Write(t, dir, name)
		e := &serveExtras{peerCA: caFile, peerCert: cert, peerKey: key, peerAllowUnbound: allowUnbound}
		conf, err := e.raftTLS()
		if err != nil {
			t.Fatal(err)
		}
		return conf
	}
	bound := func(id string) *tls.Config { return peerTLS(ca.IssueNode(t, id), "bound-"+id, false) }
	if err := handshake(t, bound("n1"), bound("n2")); err != nil {
		t.Fatalf("certificates bound to their node ids: %v", err)
	}
	unbound := func(id string, allow bool) *tls.Config { return peerTLS(ca.Issue(t, id), "unbound-"+id, allow) }
	if err := handshake(t, unbound("n1", false), unbound("n2", false)); err == nil {
		t.Fatal("two nodes with certificates that name no node id completed a handshake without --peer-allow-unbound-certs")
	} else {
		t.Logf("refused without the flag: %v", err)
	}
	if err := handshake(t, unbound("n1", true), unbound("n2", true)); err != nil {
		t.Fatalf("with --peer-allow-unbound-certs: %v", err)
	}
	if _, err := (&serveExtras{peerAllowUnbound: true}).raftTLS(); err == nil || !strings.Contains(err.Error(), "--peer-allow-unbound-certs needs") {
		t.Fatalf("the flag without peer TLS: %v", err)
	}
}
