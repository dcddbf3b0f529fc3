package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/auth"
	"github.com/idemkv/idemkv/internal/testpki"
)

// The tests in this file run real idemkv processes with the operator features on:
// tokens, TLS for the API, mutual TLS between peers, backup and restore, membership.

// opsProc is one `idemkv serve` process with arbitrary flags.
type opsProc struct {
	t        *testing.T
	id       string
	httpAddr string
	raftAddr string
	args     []string
	env      []string // added to the test's environment
	bin      string   // the binary to run (default idemkvBinary)
	cmd      *exec.Cmd
	mu       sync.Mutex
	logs     bytes.Buffer
}

func (p *opsProc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.Write(b)
}

func (p *opsProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

func (p *opsProc) start() {
	p.t.Helper()
	bin := p.bin
	if bin == "" {
		bin = idemkvBinary(p.t)
	}
	p.cmd = exec.Command(bin, p.args...)
	if p.env != nil {
		p.cmd.Env = append(os.Environ(), p.env...)
	}
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	cmd := p.cmd
	p.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if p.t.Failed() {
			p.t.Logf("--- %s logs ---\n%s", p.id, p.output())
		}
	})
}

// run starts the process and waits for it to exit, for commands that must refuse to
// start.
func (p *opsProc) run(timeout time.Duration) error {
	p.t.Helper()
	p.start()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		p.t.Fatalf("%s still running after %s", p.id, timeout)
		return nil
	}
}

func (p *opsProc) signal(sig syscall.Signal) error {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		p.t.Fatalf("%s did not exit 30 s after %v", p.id, sig)
		return nil
	}
}

func fastServeArgs(id, dataDir, httpAddr, raftAddr string) []string {
	return []string{"serve", "--id", id, "--data-dir", dataDir, "--http-addr", httpAddr, "--raft-addr", raftAddr,
		"--heartbeat-timeout", "500ms", "--election-timeout", "500ms", "--leader-lease-timeout", "250ms"}
}

// secureEnv is everything a secured cluster and its clients need.
type secureEnv struct {
	dir       string
	apiCA     *testpki.CA
	peerCA    *testpki.CA
	tokens    map[string]string // name -> token
	authFile  string
	serveTLS  []string // API TLS, peer TLS and auth flags of serve
	cliTLS    []string // TLS flags of the CLI
	tlsClient *tls.Config
}

func newSecureEnv(t *testing.T) *secureEnv {
	t.Helper()
	dir := t.TempDir()
	e := &secureEnv{dir: dir, apiCA: testpki.NewCA(t, "idemkv api"), tokens: map[string]string{}}
	peerCA := testpki.NewCA(t, "idemkv peers")
	e.peerCA = peerCA
	apiCAFile := e.apiCA.WriteCA(t, dir, "api-ca")
	peerCAFile := peerCA.WriteCA(t, dir, "peer-ca")
	apiCert, apiKey := e.apiCA.Issue(t, "node").Write(t, dir, "api")
	client := e.apiCA.Issue(t, "operator")
	clientCert, clientKey := client.Write(t, dir, "client")

	var f auth.File
	for name, spec := range map[string]struct {
		role    auth.Role
		tenants []string
	}{
		"acme": {auth.RoleClient, []string{"acme"}}, "beta": {auth.RoleClient, []string{"beta"}},
		"admin": {auth.RoleAdmin, []string{auth.AllTenants}}, "monitor": {auth.RoleMonitor, nil},
	} {
		tok, err := auth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		e.tokens[name] = tok
		f.Tokens = append(f.Tokens, auth.Token{Name: name, Hash: auth.HashToken(tok), Role: spec.role, Tenants: spec.tenants})
	}
	raw, err := json.Marshal(&f)
	if err != nil {
		t.Fatal(err)
	}
	e.authFile = filepath.Join(dir, "tokens.json")
	if err := os.WriteFile(e.authFile, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	joinToken := filepath.Join(dir, "join-token")
	if err := os.WriteFile(joinToken, []byte(e.tokens["admin"]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.serveTLS = []string{"--auth-file", e.authFile,
		"--tls-cert", apiCert, "--tls-key", apiKey, "--tls-client-ca", apiCAFile, "--tls-ca", apiCAFile,
		"--peer-ca", peerCAFile, "--join-token-file", joinToken}
	e.cliTLS = []string{"--ca-cert", apiCAFile, "--client-cert", clientCert, "--client-key", clientKey}
	e.tlsClient = &tls.Config{RootCAs: e.apiCA.Pool(), Certificates: []tls.Certificate{client.TLS}}
	return e
}

func (e *secureEnv) proc(t *testing.T, id, join string) *opsProc {
	p := &opsProc{t: t, id: id, httpAddr: freePort(t), raftAddr: freePort(t)}
	p.args = append(fastServeArgs(id, filepath.Join(e.dir, id), p.httpAddr, p.raftAddr), e.serveTLS...)
	// Each node's peer certificate names its id: peers refuse RPCs that claim another.
	peerCert, peerKey := e.peerCA.IssueNode(t, id).Write(t, e.dir, "peer-"+id)
	p.args = append(p.args, "--peer-cert", peerCert, "--peer-key", peerKey)
	if join != "" {
		p.args = append(p.args, "--join", join)
	}
	return p
}

type httpAnswer struct {
	status int
	body   string
	err    error
}

// req sends one request over https with the client certificate.
func (e *secureEnv) req(t *testing.T, method, endpoint, path, token string, body any) httpAnswer {
	t.Helper()
	return sendWith(t, &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: e.tlsClient}},
		method, "https://"+endpoint+path, token, body)
}

func sendWith(t *testing.T, hc *http.Client, method, url, token string, body any) httpAnswer {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	r, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(r)
	if err != nil {
		return httpAnswer{err: err}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return httpAnswer{status: resp.StatusCode, body: string(b)}
}

func (e *secureEnv) waitReady(t *testing.T, p *opsProc) {
	t.Helper()
	waitFor(t, 30*time.Second, p.id+" ready", func() error {
		a := e.req(t, http.MethodGet, p.httpAddr, "/readyz", "", nil)
		if a.err != nil || a.status != http.StatusOK {
			return fmt.Errorf("readyz: %d %s %v", a.status, a.body, a.err)
		}
		return nil
	})
}

func (e *secureEnv) cluster(t *testing.T, endpoint string) idemkv.ClusterInfo {
	t.Helper()
	var info idemkv.ClusterInfo
	waitFor(t, 20*time.Second, "cluster info", func() error {
		a := e.req(t, http.MethodGet, endpoint, "/v1/cluster", e.tokens["admin"], nil)
		if a.err != nil || a.status != http.StatusOK {
			return fmt.Errorf("%d %s %v", a.status, a.body, a.err)
		}
		return json.Unmarshal([]byte(a.body), &info)
	})
	return info
}

// cli runs an idemkv command in-process and returns its standard output.
func cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCommand()
	var out, errOut bytes.Buffer
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errOut)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := root.ExecuteContext(ctx)
	if errOut.Len() > 0 {
		t.Logf("idemkv %s: stderr:\n%s", strings.Join(args, " "), errOut.String())
	}
	return out.String(), err
}

func TestSecuredCluster(t *testing.T) {
	e := newSecureEnv(t)
	n1 := e.proc(t, "n1", "")
	n1.start()
	e.waitReady(t, n1)
	n2, n3 := e.proc(t, "n2", n1.httpAddr), e.proc(t, "n3", n1.httpAddr)
	n2.start()
	n3.start()
	procs := []*opsProc{n1, n2, n3}
	waitFor(t, 40*time.Second, "three voters with API addresses", func() error {
		info := e.cluster(t, n1.httpAddr)
		if len(info.Nodes) != 3 {
			return fmt.Errorf("%d nodes", len(info.Nodes))
		}
		for _, ni := range info.Nodes {
			if ni.APIAddr == "" {
				return fmt.Errorf("%s has no API address", ni.ID)
			}
			// A node that joins is a learner until it caught up.
			if ni.Suffrage != "voter" {
				return fmt.Errorf("%s is a %s", ni.ID, ni.Suffrage)
			}
		}
		return nil
	})
	for _, p := range procs {
		e.waitReady(t, p)
	}
	info := e.cluster(t, n1.httpAddr)
	var leader, follower *opsProc
	for _, p := range procs {
		if p.id == info.Leader.ID {
			leader = p
		} else if follower == nil {
			follower = p
		}
	}
	if leader == nil {
		t.Fatalf("no leader among %+v", info)
	}
	tok := e.tokens

	// beta's records: one committed, one pending.
	fpDone, fpPending := fmt.Sprintf("sha256:%064d", 1), fmt.Sprintf("sha256:%064d", 2)
	reserve := func(token, endpoint, tenant, key, fp string) idemkv.ReserveResult {
		t.Helper()
		a := e.req(t, http.MethodPost, endpoint, "/v1/reserve", token, idemkv.ReserveRequest{
			Tenant: tenant, Key: key, Tool: "create_ticket", Fingerprint: fp, LeaseTTLMs: 60_000})
		var res idemkv.ReserveResult
		if a.err != nil || a.status != http.StatusOK || json.Unmarshal([]byte(a.body), &res) != nil {
			t.Fatalf("reserve %s/%s: %d %s %v", tenant, key, a.status, a.body, a.err)
		}
		return res
	}
	done := reserve(tok["beta"], leader.httpAddr, "beta", "k-done", fpDone)
	if a := e.req(t, http.MethodPost, leader.httpAddr, "/v1/commit", tok["beta"], idemkv.CommitRequest{
		Tenant: "beta", Key: "k-done", Fingerprint: fpDone, Fence: done.Fence, RemoteSystem: "linear", RemoteID: "LIN-1"}); a.status != http.StatusOK {
		t.Fatalf("commit: %d %s %v", a.status, a.body, a.err)
	}
	pending := reserve(tok["beta"], leader.httpAddr, "beta", "k-pending", fpPending)

	t.Run("tenant isolation", func(t *testing.T) {
		type probe struct {
			name, method, path string
			body               func(key string) any
		}
		probes := []probe{
			{"reserve", http.MethodPost, "/v1/reserve", func(k string) any {
				return idemkv.ReserveRequest{Tenant: "beta", Key: k, Tool: "create_ticket", Fingerprint: fpDone}
			}},
			{"commit", http.MethodPost, "/v1/commit", func(k string) any {
				return idemkv.CommitRequest{Tenant: "beta", Key: k, Fingerprint: fpDone, Fence: done.Fence, RemoteSystem: "x", RemoteID: "y"}
			}},
			{"fail", http.MethodPost, "/v1/fail", func(k string) any {
				return idemkv.FailRequest{Tenant: "beta", Key: k, Fingerprint: fpPending, Fence: pending.Fence, Error: idemkv.ErrorInfo{Code: "x"}}
			}},
			{"release", http.MethodPost, "/v1/release", func(k string) any {
				return idemkv.ReleaseRequest{Tenant: "beta", Key: k, Fingerprint: fpPending, Fence: pending.Fence}
			}},
			{"heartbeat", http.MethodPost, "/v1/heartbeat", func(k string) any {
				return idemkv.HeartbeatRequest{Tenant: "beta", Key: k, Fence: pending.Fence}
			}},
			{"get", http.MethodGet, "/v1/records/beta/%s", nil},
			{"stale get", http.MethodGet, "/v1/records/beta/%s?consistency=stale", nil},
			{"long-poll", http.MethodGet, "/v1/records/beta/%s?wait_ms=5000", nil},
			{"list", http.MethodGet, "/v1/records/beta?prefix=%s", nil},
		}
		var refusal string
		for _, p := range probes {
			for _, n := range []*opsProc{leader, follower} {
				answers := map[string]httpAnswer{}
				// An existing pending key, an existing committed key and a key that does
				// not exist must be refused alike: the answer tells nothing about them.
				for _, key := range []string{"k-pending", "k-done", "k-absent"} {
					path := p.path
					if strings.Contains(path, "%s") {
						path = fmt.Sprintf(path, key)
					}
					var body any
					if p.body != nil {
						body = p.body(key)
					}
					start := time.Now()
					a := e.req(t, p.method, n.httpAddr, path, tok["acme"], body)
					if took := time.Since(start); took > 2*time.Second {
						t.Errorf("%s %s via %s took %s: a refusal must not wait", p.name, key, n.id, took)
					}
					if a.status != http.StatusForbidden || !strings.Contains(a.body, idemkv.CodePermissionDenied) {
						t.Errorf("acme token, %s on beta/%s via %s: %d %s %v, want 403", p.name, key, n.id, a.status, a.body, a.err)
					}
					answers[key] = a
					if unauth := e.req(t, p.method, n.httpAddr, path, "", body); unauth.status != http.StatusUnauthorized {
						t.Errorf("no token, %s on beta/%s via %s: %d %s, want 401", p.name, key, n.id, unauth.status, unauth.body)
					}
				}
				if answers["k-pending"].body != answers["k-absent"].body || answers["k-done"].body != answers["k-absent"].body {
					t.Errorf("%s via %s: refusals differ between keys:\n%s\n%s\n%s", p.name, n.id,
						answers["k-pending"].body, answers["k-done"].body, answers["k-absent"].body)
				}
				if refusal == "" {
					refusal = answers["k-absent"].body
				} else if answers["k-absent"].body != refusal {
					t.Errorf("%s via %s: refusal %s differs from %s", p.name, n.id, answers["k-absent"].body, refusal)
				}
			}
		}
		// beta's records are untouched, and beta reads them through a follower.
		a := e.req(t, http.MethodGet, follower.httpAddr, "/v1/records/beta/k-pending", tok["beta"], nil)
		var rec idemkv.Record
		if a.status != http.StatusOK || json.Unmarshal([]byte(a.body), &rec) != nil || rec.Status != idemkv.StatusPending || rec.Fence != pending.Fence {
			t.Fatalf("beta's pending record after the probes: %d %s", a.status, a.body)
		}
		// The acme token works on acme through a follower: forwarding carries it.
		reserve(tok["acme"], follower.httpAddr, "acme", "a-1", fpDone)
		if a := e.req(t, http.MethodGet, follower.httpAddr, "/v1/records/acme?limit=10", tok["acme"], nil); a.status != http.StatusOK || !strings.Contains(a.body, `"a-1"`) {
			t.Fatalf("acme lists acme through a follower: %d %s", a.status, a.body)
		}
	})

	t.Run("roles", func(t *testing.T) {
		cases := []struct {
			token, method, path string
			body                any
			status              int
		}{
			{tok["acme"], http.MethodGet, "/v1/cluster", nil, http.StatusOK},
			{tok["acme"], http.MethodGet, "/metrics", nil, http.StatusForbidden},
			{tok["acme"], http.MethodGet, "/v1/backup", nil, http.StatusForbidden},
			{tok["acme"], http.MethodPost, "/v1/cluster/join", idemkv.JoinRequest{ID: "n9", RaftAddr: "127.0.0.1:1", APIAddr: "127.0.0.1:2"}, http.StatusForbidden},
			{tok["acme"], http.MethodPost, "/v1/cluster/remove", idemkv.RemoveRequest{ID: "n3"}, http.StatusForbidden},
			{tok["monitor"], http.MethodGet, "/metrics", nil, http.StatusOK},
			{tok["monitor"], http.MethodGet, "/v1/records/acme/a-1", nil, http.StatusForbidden},
			{tok["monitor"], http.MethodGet, "/v1/records/acme", nil, http.StatusForbidden},
			{tok["admin"], http.MethodGet, "/metrics", nil, http.StatusOK},
			{tok["admin"], http.MethodGet, "/v1/records/beta/k-done", nil, http.StatusOK},
			{"", http.MethodGet, "/healthz", nil, http.StatusOK},
			{"", http.MethodGet, "/metrics", nil, http.StatusUnauthorized},
		}
		for _, c := range cases {
			if a := e.req(t, c.method, follower.httpAddr, c.path, c.token, c.body); a.status != c.status {
				t.Errorf("%s %s: %d %s %v, want %d", c.method, c.path, a.status, a.body, a.err, c.status)
			}
		}
		a := e.req(t, http.MethodGet, leader.httpAddr, "/metrics", tok["monitor"], nil)
		if !strings.Contains(a.body, `idemkv_http_request_duration_seconds_count{code="403",endpoint="GET /v1/records/{tenant}/{key...}"}`) {
			t.Errorf("the leader's metrics do not count the refusals:\n%s", a.body)
		}
	})

	t.Run("TLS", func(t *testing.T) {
		insecure := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: e.apiCA.Pool()}}}
		if a := sendWith(t, insecure, http.MethodGet, "https://"+leader.httpAddr+"/v1/cluster", tok["admin"], nil); a.err == nil {
			t.Errorf("a client without a certificate got %d %s", a.status, a.body)
		}
		other := testpki.NewCA(t, "idemkv api").Issue(t, "mallory").TLS
		forged := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: e.apiCA.Pool(), Certificates: []tls.Certificate{other}}}}
		if a := sendWith(t, forged, http.MethodGet, "https://"+leader.httpAddr+"/v1/cluster", tok["admin"], nil); a.err == nil {
			t.Errorf("a client with a certificate from another CA got %d %s", a.status, a.body)
		}
		plain := &http.Client{Timeout: 5 * time.Second}
		if a := sendWith(t, plain, http.MethodGet, "http://"+leader.httpAddr+"/v1/cluster", tok["admin"], nil); a.err == nil && a.status == http.StatusOK {
			t.Errorf("plain http got %d %s", a.status, a.body)
		}
		// A node trusts its peers' API certificates only from --tls-ca: a client that
		// does not trust the CA refuses the server.
		untrusting := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			Certificates: e.tlsClient.Certificates}}}
		if a := sendWith(t, untrusting, http.MethodGet, "https://"+leader.httpAddr+"/healthz", "", nil); a.err == nil {
			t.Errorf("a client that does not trust the API CA connected: %d", a.status)
		}
	})

	t.Run("status", func(t *testing.T) {
		out, err := cli(t, append([]string{"status", "--json", "--endpoint", follower.httpAddr, "--token", tok["acme"]}, e.cliTLS...)...)
		if err != nil {
			t.Fatal(err)
		}
		var nodes []NodeStatus
		if err := json.Unmarshal([]byte(out), &nodes); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		leaders := 0
		for _, n := range nodes {
			if n.Error != "" || n.Term == 0 || n.Term != nodes[0].Term || n.Lag == nil || n.AppliedIndex == 0 || n.Suffrage != "voter" {
				t.Errorf("status of %s: %+v", n.ID, n)
			}
			if n.Role == "leader" {
				leaders++
				if n.ID != leader.id || *n.Lag != 0 {
					t.Errorf("leader %s with lag %d, want %s with 0", n.ID, *n.Lag, leader.id)
				}
			} else if n.Role != "follower" {
				t.Errorf("%s has role %q", n.ID, n.Role)
			}
		}
		if len(nodes) != 3 || leaders != 1 {
			t.Fatalf("status: %d nodes, %d leaders:\n%s", len(nodes), leaders, out)
		}
		table, err := cli(t, append([]string{"status", "--endpoint", n1.httpAddr, "--token", tok["admin"]}, e.cliTLS...)...)
		if err != nil || strings.Count(table, "voter") != 3 || !strings.Contains(table, "leader") || !strings.HasPrefix(table, "ID") {
			t.Fatalf("status table: %v\n%s", err, table)
		}
	})

	t.Run("backup and restore", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "cluster.backup")
		_, err := cli(t, append([]string{"backup", "--out", file, "--endpoint", follower.httpAddr, "--token", tok["acme"]}, e.cliTLS...)...)
		if !errors.Is(err, idemkv.ErrPermissionDenied) {
			t.Fatalf("backup with a client token: %v", err)
		}
		if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a refused backup left a file: %v", err)
		}
		out, err := cli(t, append([]string{"backup", "--out", file, "--endpoint", follower.httpAddr, "--token", tok["admin"]}, e.cliTLS...)...)
		if err != nil || !strings.Contains(out, "wrote "+file) {
			t.Fatalf("backup: %v\n%s", err, out)
		}
		if _, err := cli(t, append([]string{"backup", "--out", file, "--endpoint", follower.httpAddr, "--token", tok["admin"]}, e.cliTLS...)...); err == nil {
			t.Fatal("a second backup overwrote the first")
		}

		r := e.proc(t, "r1", "")
		if out, err := cli(t, "restore", "--from", file, "--data-dir", filepath.Join(e.dir, "r1"), "--id", "r1", "--raft-addr", r.raftAddr); err != nil || !strings.Contains(out, "restored 3 records") {
			t.Fatalf("restore: %v\n%s", err, out)
		}
		r.start()
		e.waitReady(t, r)
		for _, c := range []struct{ token, path string }{
			{tok["beta"], "/v1/records/beta/k-done"}, {tok["beta"], "/v1/records/beta/k-pending"}, {tok["acme"], "/v1/records/acme/a-1"},
		} {
			orig := e.req(t, http.MethodGet, leader.httpAddr, c.path, c.token, nil)
			got := e.req(t, http.MethodGet, r.httpAddr, c.path, c.token, nil)
			if orig.status != http.StatusOK || got.status != http.StatusOK || got.body != orig.body {
				t.Errorf("%s: restored %d %s, original %d %s", c.path, got.status, got.body, orig.status, orig.body)
			}
		}
		// The restored node is its own cluster, secured like the old one.
		if a := e.req(t, http.MethodGet, r.httpAddr, "/v1/records/beta/k-done", tok["acme"], nil); a.status != http.StatusForbidden {
			t.Errorf("acme on the restored node's beta: %d %s", a.status, a.body)
		}
		ri := e.cluster(t, r.httpAddr)
		if len(ri.Nodes) != 1 || ri.Leader.ID != "r1" {
			t.Errorf("restored cluster: %+v", ri)
		}
	})

	t.Run("members", func(t *testing.T) {
		victim := n3
		if victim == leader {
			victim = n2
		}
		_, err := cli(t, append([]string{"members", "remove", "--id", victim.id, "--endpoint", follower.httpAddr, "--token", tok["acme"]}, e.cliTLS...)...)
		if !errors.Is(err, idemkv.ErrPermissionDenied) {
			t.Fatalf("members remove with a client token: %v", err)
		}
		out, err := cli(t, append([]string{"members", "remove", "--id", victim.id, "--endpoint", follower.httpAddr, "--token", tok["admin"]}, e.cliTLS...)...)
		if err != nil {
			t.Fatal(err)
		}
		var after idemkv.ClusterInfo
		if err := json.Unmarshal([]byte(out), &after); err != nil || len(after.Nodes) != 2 {
			t.Fatalf("after removing %s: %v\n%s", victim.id, err, out)
		}
		for _, ni := range after.Nodes {
			if ni.ID == victim.id {
				t.Fatalf("%s is still a member: %s", victim.id, out)
			}
		}
		// The removed node stops without disturbing the others.
		termBefore := e.cluster(t, leader.httpAddr).Term
		if err := victim.signal(syscall.SIGTERM); err != nil {
			t.Fatalf("%s after SIGTERM: %v", victim.id, err)
		}
		reserve(tok["acme"], leader.httpAddr, "acme", "after-leave", fpDone)
		if got := e.cluster(t, leader.httpAddr).Term; got != termBefore {
			t.Errorf("term moved from %d to %d when a removed node stopped", termBefore, got)
		}
	})
}

func TestListeningBeyondLoopbackNeedsAuthentication(t *testing.T) {
	base := func(t *testing.T, id, httpAddr, raftAddr string) *opsProc {
		p := &opsProc{t: t, id: id, httpAddr: httpAddr, raftAddr: raftAddr}
		p.args = fastServeArgs(id, filepath.Join(t.TempDir(), id), httpAddr, raftAddr)
		return p
	}
	apiPort := freePort(t)[len("127.0.0.1:"):]
	refused := base(t, "api", "0.0.0.0:"+apiPort, freePort(t))
	if err := refused.run(20 * time.Second); err == nil || !strings.Contains(refused.output(), "--insecure-listen") {
		t.Fatalf("API on 0.0.0.0 without --auth-file: %v\n%s", err, refused.output())
	}
	raftPort := freePort(t)[len("127.0.0.1:"):]
	raftRefused := base(t, "raft", freePort(t), "0.0.0.0:"+raftPort)
	raftRefused.args = append(raftRefused.args, "--advertise-raft-addr", "127.0.0.1:"+raftPort)
	if err := raftRefused.run(20 * time.Second); err == nil || !strings.Contains(raftRefused.output(), "--peer-cert") {
		t.Fatalf("Raft on 0.0.0.0 without peer TLS: %v\n%s", err, raftRefused.output())
	}

	allowed := base(t, "insecure", "0.0.0.0:"+apiPort, freePort(t))
	allowed.args = append(allowed.args, "--insecure-listen")
	allowed.start()
	waitFor(t, 30*time.Second, "insecure node ready", func() error { return readyPlain("127.0.0.1:" + apiPort) })
	if !strings.Contains(allowed.output(), "serving without authentication beyond loopback") {
		t.Fatalf("no warning for --insecure-listen:\n%s", allowed.output())
	}
}

func TestLeaderHandsOverOnSIGTERM(t *testing.T) {
	procs := make([]*opsProc, 3)
	for i := range procs {
		p := &opsProc{t: t, id: fmt.Sprintf("n%d", i+1), httpAddr: freePort(t), raftAddr: freePort(t)}
		// A long election timeout: a new leader within it can only come from a handover.
		p.args = []string{"serve", "--id", p.id, "--data-dir", filepath.Join(t.TempDir(), p.id), "--http-addr", p.httpAddr,
			"--raft-addr", p.raftAddr, "--heartbeat-timeout", "5s", "--election-timeout", "5s", "--leader-lease-timeout", "1s"}
		if i > 0 {
			p.args = append(p.args, "--join", procs[0].httpAddr)
		}
		procs[i] = p
		p.start()
		if i == 0 {
			waitFor(t, 30*time.Second, "n1 ready", func() error { return readyPlain(p.httpAddr) })
		}
	}
	var info idemkv.ClusterInfo
	waitFor(t, 40*time.Second, "three voters", func() error {
		code, raw := call(t, http.MethodGet, procs[0].httpAddr, "/v1/cluster", nil)
		if code != http.StatusOK || json.Unmarshal(raw, &info) != nil || len(info.Nodes) != 3 {
			return fmt.Errorf("%d %s", code, raw)
		}
		for _, ni := range info.Nodes {
			if ni.Suffrage != "voter" {
				return fmt.Errorf("%s is a %s", ni.ID, ni.Suffrage)
			}
		}
		for _, p := range procs {
			if err := readyPlain(p.httpAddr); err != nil {
				return err
			}
		}
		return nil
	})
	var leader *opsProc
	var others []*opsProc
	for _, p := range procs {
		if p.id == info.Leader.ID {
			leader = p
		} else {
			others = append(others, p)
		}
	}
	if err := leader.signal(syscall.SIGTERM); err != nil {
		t.Fatalf("leader exit: %v", err)
	}
	stopped := time.Now()
	// Followers wait 5-10 s without a leader before they stand for election; a leader
	// within 4 s of the old one's exit was handed leadership.
	waitFor(t, 4*time.Second, "a new leader before any election timeout", func() error {
		for _, p := range others {
			var ci idemkv.ClusterInfo
			code, raw := call(t, http.MethodGet, p.httpAddr, "/v1/cluster", nil)
			if code == http.StatusOK && json.Unmarshal(raw, &ci) == nil && ci.Leader.ID != "" && ci.Leader.ID != leader.id {
				return nil
			}
		}
		return errors.New("no new leader")
	})
	t.Logf("new leader %s after the old one exited", time.Since(stopped))
}

func readyPlain(addr string) error {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("readyz %d", resp.StatusCode)
	}
	return nil
}

func TestHashTokenCommand(t *testing.T) {
	out, err := cli(t, "auth", "hash-token", "hello")
	if err != nil || strings.TrimSpace(out) != "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824" {
		t.Fatalf("hash-token hello: %v %q", err, out)
	}
	out, err = cli(t, "auth", "hash-token", "--generate")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err != nil || len(lines) != 2 || auth.HashToken(lines[0]) != lines[1] || !strings.HasPrefix(lines[0], "idk_") {
		t.Fatalf("hash-token --generate: %v %q", err, out)
	}
	root := newRootCommand()
	var buf bytes.Buffer
	root.SetArgs([]string{"auth", "hash-token"})
	root.SetIn(strings.NewReader(lines[0] + "\n"))
	root.SetOut(&buf)
	if err := root.Execute(); err != nil || strings.TrimSpace(buf.String()) != lines[1] {
		t.Fatalf("hash-token from stdin: %v %q, want %s", err, buf.String(), lines[1])
	}
}
