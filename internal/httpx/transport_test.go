package httpx

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"testing"
)

// The TLS given is the one the transport dials with: a node that trusts the peer's CA
// reaches it, one without that trust is refused at the handshake.
func TestNodeTransportUsesItsTLS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	trusting := srv.Client().Transport.(*http.Transport).TLSClientConfig

	for _, c := range []struct {
		name string
		tls  *tls.Config
		ok   bool
	}{
		{"trusts the peer's CA", trusting, true},
		{"system roots only", nil, false},
	} {
		tr := NodeTransport(c.tls)
		if tr.Proxy != nil {
			t.Fatal("node-to-node traffic goes through the environment's proxy")
		}
		resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
		if resp != nil {
			resp.Body.Close()
		}
		tr.CloseIdleConnections()
		if ok := err == nil && resp.StatusCode == http.StatusNoContent; ok != c.ok {
			t.Errorf("%s: reached the peer %v (err %v), want %v", c.name, ok, err, c.ok)
		}
	}
}
