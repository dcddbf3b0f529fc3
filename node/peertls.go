package node

import (
	"crypto/tls"
	"crypto/x509"
)

// PeerTLS returns the Config.RaftTLS of mutual TLS between Raft peers. Every node
// presents cert, both when it dials and when it accepts, and accepts only peers whose
// certificate ca signed. A dialed peer's certificate must also name the host it was
// dialed at, so cert needs the Raft advertise host among its DNS or IP SANs and both
// the server and client auth key usages.
//
// A peer that cannot complete the handshake never reaches Raft: it can neither vote,
// nor append entries, nor install a snapshot.
func PeerTLS(ca *x509.CertPool, cert tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca,
		RootCAs:      ca,
	}
}
