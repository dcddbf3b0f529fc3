package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/idemkv/idemkv/auth"
	"github.com/idemkv/idemkv/internal/httpx"
	"github.com/idemkv/idemkv/node"
)

// serveExtras holds the serve flags for what wraps a node: TLS and authentication.
// setup turns them into the pieces runServe plugs in.
type serveExtras struct {
	authFile       string
	insecureListen bool

	tlsCert, tlsKey string
	tlsClientCA     string
	tlsCA           string

	peerCA, peerCert, peerKey string
	peerAllowUnbound          bool

	joinToken     string
	joinTokenFile string

	httpAddr *pflag.Flag
}

// extras are the pieces serveExtras.setup builds for runServe.
type extras struct {
	middleware    func(http.Handler) http.Handler
	authn         *auth.Authenticator // nil: authentication off
	forwardScheme string
	forwardClient *http.Client
	joinClient    *http.Client
	apiTLS        *tls.Config
	closers       []func()
}

func (e *serveExtras) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&e.authFile, "auth-file", "", "token file (JSON or YAML) with token hashes, roles and tenants; SIGHUP reloads it")
	f.BoolVar(&e.insecureListen, "insecure-listen", false, "allow the API without --auth-file, or Raft without --peer-cert, on non-loopback addresses")
	f.StringVar(&e.tlsCert, "tls-cert", "", "PEM certificate of the API (serves https; SIGHUP reloads it)")
	f.StringVar(&e.tlsKey, "tls-key", "", "PEM key of --tls-cert")
	f.StringVar(&e.tlsClientCA, "tls-client-ca", "", "PEM CA bundle: API clients must present a certificate it signed (mutual TLS)")
	f.StringVar(&e.tlsCA, "tls-ca", "", "PEM CA bundle that signs the other nodes' API certificates, for forwarding and joining (default: the system roots)")
	f.StringVar(&e.peerCA, "peer-ca", "", "PEM CA bundle for Raft peer traffic: peers must present a certificate it signed")
	f.StringVar(&e.peerCert, "peer-cert", "", "PEM certificate this node presents to Raft peers (server and client auth, SAN of its Raft host, URI SAN idemkv://node/ID)")
	f.StringVar(&e.peerKey, "peer-key", "", "PEM key of --peer-cert")
	f.BoolVar(&e.peerAllowUnbound, "peer-allow-unbound-certs", false, "accept peer certificates that name no node id (URI SAN idemkv://node/ID) as any node, while migrating to bound ones")
	f.StringVar(&e.joinToken, "join-token", "", "admin token that --join sends (prefer IDEMKV_JOIN_TOKEN or --join-token-file)")
	f.StringVar(&e.joinTokenFile, "join-token-file", "", "file holding the admin token that --join sends")
	e.httpAddr = f.Lookup("http-addr")
}

func (e *serveExtras) setup(ctx context.Context, cfg *node.Config, logger *slog.Logger) (_ *extras, err error) {
	x := &extras{forwardScheme: "http"}
	defer func() {
		if err != nil {
			x.close()
		}
	}()
	apiAddr := cfg.APIAddr
	if e.httpAddr != nil {
		apiAddr = e.httpAddr.Value.String()
	}

	var reloads []func() error
	if e.authFile != "" {
		a, err := auth.Load(e.authFile, logger)
		if err != nil {
			return nil, fmt.Errorf("--auth-file: %w", err)
		}
		x.middleware = a.Middleware
		x.authn = a
		reloads = append(reloads, a.Reload)
		logger.Info("API authentication on", "auth_file", e.authFile)
	}
	if err := e.checkListen(logger, apiAddr, cfg.RaftAddr); err != nil {
		return nil, err
	}

	clientTLS, err := e.apiTLS(x, &reloads)
	if err != nil {
		return nil, err
	}
	if cfg.RaftTLS, err = e.raftTLS(); err != nil {
		return nil, err
	}
	token, err := e.token()
	if err != nil {
		return nil, err
	}
	if e.authFile != "" && x.apiTLS == nil && !loopback(apiAddr) {
		logger.Warn("bearer tokens cross the network in clear text: set --tls-cert and --tls-key", "http_addr", apiAddr)
	}

	fwd := httpx.NodeTransport(clientTLS)
	x.forwardClient = &http.Client{Transport: fwd}
	x.joinClient = &http.Client{Timeout: 15 * time.Second, Transport: bearer{token: token, next: fwd}}
	x.closers = append(x.closers, fwd.CloseIdleConnections)

	if len(reloads) > 0 {
		x.closers = append(x.closers, reloadOnHangup(ctx, logger, reloads))
	}
	return x, nil
}

// checkListen refuses to expose an unauthenticated API or unauthenticated Raft beyond
// loopback unless the operator insists.
func (e *serveExtras) checkListen(logger *slog.Logger, apiAddr, raftAddr string) error {
	exposed := map[string]string{}
	if e.authFile == "" && !loopback(apiAddr) {
		exposed["API"] = apiAddr
	}
	if e.peerCert == "" && !loopback(raftAddr) {
		exposed["Raft"] = raftAddr
	}
	for what, addr := range exposed {
		if !e.insecureListen {
			fix := "--auth-file"
			if what == "Raft" {
				fix = "--peer-ca, --peer-cert and --peer-key"
			}
			return fmt.Errorf("refusing to serve %s on %s without authentication: set %s, listen on loopback, or pass --insecure-listen", what, addr, fix)
		}
		logger.Warn("serving without authentication beyond loopback (--insecure-listen)", "what", what, "addr", addr)
	}
	return nil
}

// apiTLS sets up https for the API and returns the client side that forwarding and
// joining use (nil without TLS).
func (e *serveExtras) apiTLS(x *extras, reloads *[]func() error) (*tls.Config, error) {
	if e.tlsCert == "" && e.tlsKey == "" {
		if e.tlsClientCA != "" || e.tlsCA != "" {
			return nil, errors.New("--tls-client-ca and --tls-ca need --tls-cert and --tls-key")
		}
		return nil, nil
	}
	if e.tlsCert == "" || e.tlsKey == "" {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	kp, err := loadKeyPair(e.tlsCert, e.tlsKey)
	if err != nil {
		return nil, err
	}
	*reloads = append(*reloads, kp.reload)
	server := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return kp.current(), nil
		},
	}
	if e.tlsClientCA != "" {
		pool, err := loadPool("--tls-client-ca", e.tlsClientCA)
		if err != nil {
			return nil, err
		}
		server.ClientCAs = pool
		server.ClientAuth = tls.RequireAndVerifyClientCert
	}
	client := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// A node that requires client certificates of its clients requires them of
		// its peers too: each presents its own API certificate.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return kp.current(), nil
		},
	}
	if e.tlsCA != "" {
		if client.RootCAs, err = loadPool("--tls-ca", e.tlsCA); err != nil {
			return nil, err
		}
	}
	x.apiTLS = server
	x.forwardScheme = "https"
	return client, nil
}

func (e *serveExtras) raftTLS() (*tls.Config, error) {
	set := 0
	for _, v := range []string{e.peerCA, e.peerCert, e.peerKey} {
		if v != "" {
			set++
		}
	}
	switch set {
	case 0:
		if e.peerAllowUnbound {
			return nil, errors.New("--peer-allow-unbound-certs needs --peer-ca, --peer-cert and --peer-key")
		}
		return nil, nil
	case 3:
	default:
		return nil, errors.New("--peer-ca, --peer-cert and --peer-key go together")
	}
	pool, err := loadPool("--peer-ca", e.peerCA)
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(e.peerCert, e.peerKey)
	if err != nil {
		return nil, fmt.Errorf("--peer-cert: %w", err)
	}
	if e.peerAllowUnbound {
		return node.PeerTLSAllowingUnboundCerts(pool, cert), nil
	}
	return node.PeerTLS(pool, cert), nil
}

func (e *serveExtras) token() (string, error) {
	if e.joinToken != "" && e.joinTokenFile != "" {
		return "", errors.New("--join-token and --join-token-file exclude each other")
	}
	if e.joinTokenFile == "" {
		return e.joinToken, nil
	}
	b, err := os.ReadFile(e.joinTokenFile)
	if err != nil {
		return "", fmt.Errorf("--join-token-file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

func (x *extras) close() {
	for i := len(x.closers) - 1; i >= 0; i-- {
		x.closers[i]()
	}
}

// loopback reports whether addr (host:port) listens on loopback only. An empty host
// or a name other than localhost counts as exposed.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func loadPool(flag, file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s %s: no PEM certificates found", flag, file)
	}
	return pool, nil
}

// keyPair is a certificate that SIGHUP can replace while connections use the old one.
type keyPair struct {
	certFile, keyFile string
	cert              atomic.Pointer[tls.Certificate]
}

func loadKeyPair(certFile, keyFile string) (*keyPair, error) {
	kp := &keyPair{certFile: certFile, keyFile: keyFile}
	if err := kp.reload(); err != nil {
		return nil, err
	}
	return kp, nil
}

func (kp *keyPair) reload() error {
	c, err := tls.LoadX509KeyPair(kp.certFile, kp.keyFile)
	if err != nil {
		return fmt.Errorf("--tls-cert: %w", err)
	}
	kp.cert.Store(&c)
	return nil
}

func (kp *keyPair) current() *tls.Certificate { return kp.cert.Load() }

// reloadOnHangup runs every reload on SIGHUP until ctx ends or the returned stop is
// called. A reload that fails keeps what was loaded before.
func reloadOnHangup(ctx context.Context, logger *slog.Logger, reloads []func() error) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-ctx.Done():
				return
			case <-done:
				return
			case <-hup:
				failed := false
				for _, r := range reloads {
					if err := r(); err != nil {
						failed = true
						logger.Error("reload on SIGHUP failed; keeping what was loaded before", "err", err)
					}
				}
				if !failed {
					logger.Info("reloaded on SIGHUP")
				}
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(done)
		<-finished
	}
}

// bearer adds the join token to requests.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.token == "" {
		return b.next.RoundTrip(r)
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}
