// Package testpki makes certificate authorities and certificates for tests, at test
// time, so that no private key is ever committed.
//
// It is for tests only; nothing in the server imports it.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority that signs leaf certificates.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate, PEM-encoded.
	PEM []byte
}

// Leaf is a signed certificate with its key.
type Leaf struct {
	CertPEM []byte
	KeyPEM  []byte
	TLS     tls.Certificate
}

// NewCA makes a self-signed CA named name.
func NewCA(tb testing.TB, name string) *CA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(tb),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return &CA{Cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Pool returns a pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issue signs a certificate for name, valid as server and client, for the given hosts
// (IP addresses or DNS names; 127.0.0.1 and localhost are always included).
func (ca *CA) Issue(tb testing.TB, name string, hosts ...string) *Leaf {
	tb.Helper()
	return ca.issue(tb, name, nil, hosts)
}

// IssueNode signs a Raft peer certificate for node id: Issue's, bound to the id by
// the URI SAN idemkv://node/<id> that node.PeerTLS requires (node.NodeIDURI).
func (ca *CA) IssueNode(tb testing.TB, id string, hosts ...string) *Leaf {
	tb.Helper()
	return ca.issue(tb, id, []*url.URL{{Scheme: "idemkv", Host: "node", Path: "/" + id}}, hosts)
}

func (ca *CA) issue(tb testing.TB, name string, uris []*url.URL, hosts []string) *Leaf {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(tb),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
		URIs:         uris,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	l := &Leaf{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
	if l.TLS, err = tls.X509KeyPair(l.CertPEM, l.KeyPEM); err != nil {
		tb.Fatal(err)
	}
	return l
}

// WriteCA writes the CA certificate into dir and returns its path.
func (ca *CA) WriteCA(tb testing.TB, dir, name string) string {
	tb.Helper()
	return write(tb, dir, name+".pem", ca.PEM)
}

// Write writes the certificate and key into dir as name.pem and name-key.pem and
// returns their paths.
func (l *Leaf) Write(tb testing.TB, dir, name string) (certFile, keyFile string) {
	tb.Helper()
	return write(tb, dir, name+".pem", l.CertPEM), write(tb, dir, name+"-key.pem", l.KeyPEM)
}

func write(tb testing.TB, dir, name string, data []byte) string {
	tb.Helper()
	p := filepath.Join(dir, name)
	// Readable by others: container tests mount these into images that run as
	// another user.
	if err := os.WriteFile(p, data, 0o644); err != nil {
		tb.Fatal(err)
	}
	return p
}

func serial(tb testing.TB) *big.Int {
	tb.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		tb.Fatal(err)
	}
	return n
}
