package httpx

import (
	"crypto/tls"
	"net"
	"net/http"
	"time"
)

// NodeTransport returns the transport one node uses to reach another node's API:
// a follower forwarding to the leader (api) and a starting node joining through a seed
// (cmd). tlsConf is the client side of the API's TLS, nil for plain http.
//
// The transport sets no overall timeout: a forwarded long-poll may rightly take
// idemkv.MaxWait, so each caller bounds its own requests. Dial and handshake are
// bounded here so that a dead peer fails in seconds, not at the caller's deadline.
func NodeTransport(tlsConf *tls.Config) *http.Transport {
	return &http.Transport{
		// Node-to-node traffic must not go through a proxy configured for the outside.
		Proxy: nil,
		DialContext: (&net.Dialer{
			Timeout:   5 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
		TLSClientConfig:       tlsConf,
	}
}
