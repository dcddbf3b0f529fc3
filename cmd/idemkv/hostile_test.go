package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/auth"
)

// The hostile-client suite (issue 13): a three-node cluster configured as
// docs/operations.md advises (token file, API TLS with client certificates, peer mutual
// TLS) is attacked through its public ports. Every attack must get its status, and no
// record stored before the attacks may differ afterwards.

// rawAnswer is one answer to a request sent byte for byte.
type rawAnswer struct {
	status int
	header http.Header
	body   string
	err    error
}

// raw sends body unchanged to path unchanged (no cleaning, no escaping).
func (e *secureEnv) raw(t *testing.T, method, endpoint, path, token string, body []byte) rawAnswer {
	t.Helper()
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: e.tlsClient},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	r, err := http.NewRequest(method, "https://"+endpoint+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/json")
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(r)
	if err != nil {
		return rawAnswer{err: err}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return rawAnswer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// storedRecords lists every record of the tenants, as the leader serves them, by
// tenant/key, in their wire bytes.
func (e *secureEnv) storedRecords(t *testing.T, endpoint string, tenants ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, tenant := range tenants {
		a := e.raw(t, http.MethodGet, endpoint, "/v1/records/"+tenant+"?limit=1000", e.tokens["admin"], nil)
		if a.err != nil || a.status != http.StatusOK {
			t.Fatalf("listing %s: %d %s %v", tenant, a.status, a.body, a.err)
		}
		var page struct {
			Records []json.RawMessage `json:"records"`
		}
		if err := json.Unmarshal([]byte(a.body), &page); err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Records {
			var id struct {
				Key string `json:"idempotency_key"`
			}
			if err := json.Unmarshal(r, &id); err != nil {
				t.Fatal(err)
			}
			out[tenant+"/"+id.Key] = string(r)
		}
	}
	return out
}

type hostileCluster struct {
	e                *secureEnv
	procs            []*opsProc
	leader, follower *opsProc
	info             idemkv.ClusterInfo
}

func startHostileCluster(t *testing.T, extra ...string) *hostileCluster {
	t.Helper()
	e := newSecureEnv(t)
	h := &hostileCluster{e: e}
	n1 := e.proc(t, "n1", "")
	n1.args = append(n1.args, extra...)
	n1.start()
	e.waitReady(t, n1)
	for _, id := range []string{"n2", "n3"} {
		p := e.proc(t, id, n1.httpAddr)
		p.args = append(p.args, extra...)
		p.start()
		h.procs = append(h.procs, p)
	}
	h.procs = append([]*opsProc{n1}, h.procs...)
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
	for _, p := range h.procs {
		e.waitReady(t, p)
	}
	h.info = e.cluster(t, n1.httpAddr)
	for _, p := range h.procs {
		if p.id == h.info.Leader.ID {
			h.leader = p
		} else if h.follower == nil {
			h.follower = p
		}
	}
	if h.leader == nil {
		t.Fatalf("no leader among %+v", h.info)
	}
	return h
}

func (h *hostileCluster) member(t *testing.T, id string) idemkv.NodeInfo {
	t.Helper()
	for _, ni := range h.info.Nodes {
		if ni.ID == id {
			return ni
		}
	}
	t.Fatalf("no member %s", id)
	return idemkv.NodeInfo{}
}

// seed stores, through the API, the records the attacks aim at.
func (h *hostileCluster) seed(t *testing.T) map[string]idemkv.ReserveResult {
	t.Helper()
	granted := map[string]idemkv.ReserveResult{}
	for _, s := range []struct {
		tenant, key, effect string
		commit              bool
	}{
		{"acme", "a-done", `{"amount": 9007199254740992}`, true},
		{"acme", "a-pending", `{"n": 2}`, false},
		{"acme", "inv\ufffd", `{"n": 3}`, true},
		{"beta", "k-done", `{"n": 4}`, true},
		{"beta", "k-pending", `{"n": 5}`, false},
		{"beta", "a/b", `{"n": 6}`, true},
	} {
		body := fmt.Sprintf(`{"tenant":%q,"idempotency_key":%q,"tool":"create_ticket","effect":%s,"lease_ttl_ms":600000}`, s.tenant, s.key, s.effect)
		a := h.e.raw(t, http.MethodPost, h.leader.httpAddr, "/v1/reserve", h.e.tokens[s.tenant], []byte(body))
		var res idemkv.ReserveResult
		if a.status != http.StatusOK || json.Unmarshal([]byte(a.body), &res) != nil || res.Decision != idemkv.DecisionExecute {
			t.Fatalf("seeding %s/%s: %d %s %v", s.tenant, s.key, a.status, a.body, a.err)
		}
		granted[s.tenant+"/"+s.key] = res
		if !s.commit {
			continue
		}
		c := idemkv.CommitRequest{Tenant: s.tenant, Key: s.key, Fingerprint: res.Record.Fingerprint, Fence: res.Fence,
			RemoteSystem: "linear", RemoteID: "LIN-" + s.key, Result: json.RawMessage(`{"ok":true}`)}
		if a := h.e.req(t, http.MethodPost, h.leader.httpAddr, "/v1/commit", h.e.tokens[s.tenant], c); a.status != http.StatusOK {
			t.Fatalf("seeding commit %s/%s: %d %s %v", s.tenant, s.key, a.status, a.body, a.err)
		}
	}
	return granted
}

// attack is one hostile request and the status it must get. fixed names the defect of
// issue 13 whose fix changed the answer ("" for attacks that already failed).
type attack struct {
	name   string
	fixed  string
	via    func(h *hostileCluster) *opsProc
	method string
	path   string
	token  string // a key of secureEnv.tokens, or "" for none, or "bogus"
	body   string
	status int
}

func viaLeader(h *hostileCluster) *opsProc   { return h.leader }
func viaFollower(h *hostileCluster) *opsProc { return h.follower }

func TestHostileClients(t *testing.T) {
	// Small caps so the suite can reach them: long-polls per token, tool series.
	h := startHostileCluster(t, "--pprof", "--max-long-polls-per-token", "4", "--metrics-max-tools", "5")
	e := h.e
	granted := h.seed(t)
	pending := granted["acme/a-pending"]
	tenants := []string{"acme", "beta"}
	before := e.storedRecords(t, h.leader.httpAddr, tenants...)
	if len(before) != 6 {
		t.Fatalf("seeded %d records, want 6: %v", len(before), before)
	}

	big := `{"tenant":"acme","idempotency_key":"big","tool":"t","effect":"` + strings.Repeat("x", 2<<20) + `"}`
	deep := `{"tenant":"acme","idempotency_key":"deep","tool":"t","effect":` + strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000) + `}`
	leaderInfo := h.member(t, h.leader.id)
	attacks := []attack{
		// Cross-tenant reads through paths.
		{"read another tenant's record", "", viaFollower, "GET", "/v1/records/beta/k-done", "acme", "", 403},
		{"read it with the tenant percent-encoded", "", viaFollower, "GET", "/v1/records/%62eta/k-done", "acme", "", 403},
		{"list another tenant", "", viaFollower, "GET", "/v1/records/beta", "acme", "", 403},
		{"escaped dot segments stay inside the key", "", viaLeader, "GET", "/v1/records/acme/..%2Fbeta%2Fk-done", "acme", "", 404},
		{"raw dot segments are the key, never a redirect", "6", viaFollower, "GET", "/v1/records/acme/../beta/k-done", "acme", "", 404},
		{"raw double slash is the key, never a redirect", "6", viaLeader, "GET", "/v1/records/beta/a//b", "beta", "", 404},
		{"unclean non-record path refused", "6", viaLeader, "POST", "//v1/reserve", "acme", `{}`, 400},
		// Cross-tenant writes through bodies.
		{"write another tenant", "", viaFollower, "POST", "/v1/reserve", "acme",
			`{"tenant":"beta","idempotency_key":"k-done","tool":"create_ticket","effect_fingerprint":"sha256:x"}`, 403},
		{"duplicate tenant member", "4", viaFollower, "POST", "/v1/reserve", "acme",
			`{"tenant":"beta","idempotency_key":"x","tool":"t","effect_fingerprint":"f","tenant":"acme"}`, 400},
		{"tenant in another case", "4", viaLeader, "POST", "/v1/release", "acme",
			`{"tenant":"beta","idempotency_key":"k-pending","effect_fingerprint":"f","fence":1,"Tenant":"acme"}`, 400},
		{"invalid UTF-8 key aliasing another", "4", viaLeader, "POST", "/v1/reserve", "acme",
			"{\"tenant\":\"acme\",\"idempotency_key\":\"inv\xfe\",\"tool\":\"create_ticket\",\"effect\":{\"n\":3}}", 400},
		{"lone surrogate key aliasing another", "4", viaLeader, "POST", "/v1/reserve", "acme",
			`{"tenant":"acme","idempotency_key":"inv\udfff","tool":"create_ticket","effect":{"n":3}}`, 400},
		{"invalid UTF-8 in a stored result", "4", viaLeader, "POST", "/v1/commit", "acme",
			fmt.Sprintf("{\"tenant\":\"acme\",\"idempotency_key\":\"a-pending\",\"effect_fingerprint\":%q,\"fence\":%d,\"remote_system\":\"s\",\"remote_id\":\"r\",\"result\":\"\xff\"}",
				pending.Record.Fingerprint, pending.Fence), 400},
		{"a number beyond 2^53 replays another effect", "5", viaFollower, "POST", "/v1/reserve", "acme",
			`{"tenant":"acme","idempotency_key":"a-done","tool":"create_ticket","effect":{"amount": 9007199254740993}}`, 400},
		{"heartbeat lease overflowing a Duration", "3", viaFollower, "POST", "/v1/heartbeat", "acme",
			fmt.Sprintf(`{"tenant":"acme","idempotency_key":"a-pending","fence":%d,"lease_ttl_ms":166020696664386}`, pending.Fence), 400},
		// Roles and tokens.
		{"no token", "", viaFollower, "GET", "/v1/records/acme/a-done", "", "", 401},
		{"unknown token", "", viaFollower, "GET", "/v1/records/acme/a-done", "bogus", "", 401},
		{"client takes a backup", "", viaFollower, "GET", "/v1/backup", "acme", "", 403},
		{"client joins a node", "", viaLeader, "POST", "/v1/cluster/join", "acme",
			`{"id":"n9","raft_addr":"127.0.0.1:9","api_addr":"127.0.0.1:9"}`, 403},
		{"client removes a voter", "", viaFollower, "POST", "/v1/cluster/remove", "acme", `{"id":"` + h.follower.id + `"}`, 403},
		{"client scrapes metrics", "", viaLeader, "GET", "/metrics", "acme", "", 403},
		{"monitor reads a record", "", viaLeader, "GET", "/v1/records/beta/k-done", "monitor", "", 403},
		{"admin moves the leader's api_addr by joining with its id", "1", viaFollower, "POST", "/v1/cluster/join", "admin",
			`{"id":"` + leaderInfo.ID + `","raft_addr":"` + leaderInfo.RaftAddr + `","api_addr":"127.0.0.1:9"}`, 400},
		{"pprof without a token", "2", viaLeader, "GET", "/debug/pprof/cmdline", "", "", 401},
		{"pprof with a client token", "2", viaLeader, "GET", "/debug/pprof/goroutine?debug=1", "acme", "", 403},
		// Size and shape.
		{"2 MiB body", "", viaFollower, "POST", "/v1/reserve", "acme", big, 413},
		{"malformed JSON", "", viaFollower, "POST", "/v1/commit", "acme", `{"tenant":"acme",`, 400},
		{"100,000-deep effect", "", viaLeader, "POST", "/v1/reserve", "acme", deep, 400},
		{"unknown field", "", viaLeader, "POST", "/v1/reserve", "acme",
			`{"tenant":"acme","idempotency_key":"u","tool":"t","effect_fingerprint":"f","tenantId":"beta"}`, 400},
	}
	var table strings.Builder
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			token := e.tokens[a.token]
			if a.token == "bogus" {
				token = "idk_not-a-token"
			}
			var body []byte
			if a.body != "" {
				body = []byte(a.body)
			}
			got := e.raw(t, a.method, a.via(h).httpAddr, a.path, token, body)
			fmt.Fprintf(&table, "%-60s defect %-2s %d\n", a.name, a.fixed, got.status)
			if got.err != nil || got.status != a.status {
				t.Errorf("%s %s: %d (Location %q) %.300s %v; want %d", a.method, a.path, got.status, got.header.Get("Location"), got.body, got.err, a.status)
			}
		})
	}

	t.Run("admin reads profiles", func(t *testing.T) {
		if a := e.raw(t, "GET", h.leader.httpAddr, "/debug/pprof/cmdline", e.tokens["admin"], nil); a.status != http.StatusOK {
			t.Errorf("%d %.200s %v", a.status, a.body, a.err)
		}
	})

	t.Run("followers still forward to the real leader", func(t *testing.T) {
		for _, p := range h.procs {
			a := e.raw(t, "GET", p.httpAddr, "/v1/records/acme/a-done", e.tokens["acme"], nil)
			if a.status != http.StatusOK || a.header.Get("Idemkv-Leader") != h.leader.httpAddr {
				t.Errorf("via %s: %d, leader %q; want 200 from %s", p.id, a.status, a.header.Get("Idemkv-Leader"), h.leader.httpAddr)
			}
		}
	})

	t.Run("long-polls beyond the token's cap", func(t *testing.T) {
		// A record of its own to poll on, committed at the end to release the polls.
		body := `{"tenant":"acme","idempotency_key":"polled","tool":"t","effect_fingerprint":"sha256:p","lease_ttl_ms":600000}`
		a := e.raw(t, "POST", h.leader.httpAddr, "/v1/reserve", e.tokens["acme"], []byte(body))
		var res idemkv.ReserveResult
		if a.status != http.StatusOK || json.Unmarshal([]byte(a.body), &res) != nil {
			t.Fatalf("reserve: %d %.200s", a.status, a.body)
		}
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// The probe below holds a slot for a moment too: a poll it crowds out
				// tries again until the four are parked.
				for {
					a := e.raw(t, "GET", h.leader.httpAddr, "/v1/records/acme/polled?wait_ms=25000", e.tokens["acme"], nil)
					if a.status != http.StatusTooManyRequests {
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
		}
		// A poll of 1 ms takes a slot too: it is refused once the four are parked.
		waitFor(t, 20*time.Second, "four polls parked", func() error {
			a := e.raw(t, "GET", h.leader.httpAddr, "/v1/records/acme/polled?wait_ms=1", e.tokens["acme"], nil)
			if a.status != http.StatusTooManyRequests || !strings.Contains(a.body, idemkv.CodeResourceExhausted) {
				return fmt.Errorf("fifth poll: %d %.200s", a.status, a.body)
			}
			return nil
		})
		fmt.Fprintf(&table, "%-60s defect %-2s %d\n", "fifth long-poll of one token", "8", http.StatusTooManyRequests)
		// Another token is not starved by acme's polls.
		if a := e.raw(t, "GET", h.leader.httpAddr, "/v1/records/beta/k-pending?wait_ms=100", e.tokens["beta"], nil); a.status != http.StatusOK {
			t.Errorf("beta's poll: %d %.200s", a.status, a.body)
		}
		c := idemkv.CommitRequest{Tenant: "acme", Key: "polled", Fingerprint: "sha256:p", Fence: res.Fence, RemoteSystem: "s", RemoteID: "r"}
		if a := e.req(t, http.MethodPost, h.leader.httpAddr, "/v1/commit", e.tokens["acme"], c); a.status != http.StatusOK {
			t.Fatalf("commit: %d %s %v", a.status, a.body, a.err)
		}
		wg.Wait()
	})

	t.Run("tool names beyond the label cap fold into other", func(t *testing.T) {
		for i := range 30 {
			body := fmt.Sprintf(`{"tenant":"acme","idempotency_key":"tool-%d","tool":"made-up-%d","effect_fingerprint":"sha256:%d"}`, i, i, i)
			if a := e.raw(t, "POST", h.leader.httpAddr, "/v1/reserve", e.tokens["acme"], []byte(body)); a.status != http.StatusOK {
				t.Fatalf("reserve: %d %.200s", a.status, a.body)
			}
		}
		a := e.raw(t, "GET", h.leader.httpAddr, "/metrics", e.tokens["monitor"], nil)
		series := 0
		for line := range strings.SplitSeq(a.body, "\n") {
			if strings.HasPrefix(line, "idemkv_decisions_total{") && strings.Contains(line, `decision="execute"`) {
				series++
			}
		}
		if series > 6 || !strings.Contains(a.body, `tool="other"`) {
			t.Errorf("%d execute series after 30 made-up tools (cap 5): want at most 6 with other", series)
		}
		fmt.Fprintf(&table, "%-60s defect %-2s %d series\n", "30 made-up tool names", "9", series)
	})

	t.Run("slowloris headers are cut off", func(t *testing.T) {
		conn, err := tls.Dial("tcp", h.follower.httpAddr, e.tlsClient)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, "GET /v1/cluster HTTP/1.1\r\nHost: x\r\n"); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for time.Since(start) < 30*time.Second {
			if _, err := io.WriteString(conn, "X-Slow: 1\r\n"); err != nil {
				break
			}
			_ = conn.SetReadDeadline(time.Now().Add(time.Second))
			var b [1]byte
			if _, err := conn.Read(b[:]); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
		}
		if d := time.Since(start); d >= 30*time.Second {
			t.Errorf("a connection dribbling headers was still open after %s", d)
		}
	})

	t.Run("idle sockets on the Raft port are closed", func(t *testing.T) {
		raftAddr := h.member(t, h.follower.id).RaftAddr
		const sockets = 200
		conns := make([]net.Conn, 0, sockets)
		for range sockets {
			c, err := net.DialTimeout("tcp", raftAddr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			conns = append(conns, c)
		}
		start := time.Now()
		var open atomic.Int32
		var wg sync.WaitGroup
		for _, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = c.SetReadDeadline(start.Add(40 * time.Second))
				var b [1]byte
				if _, err := c.Read(b[:]); errors.Is(err, os.ErrDeadlineExceeded) {
					open.Add(1)
				}
			}()
		}
		wg.Wait()
		fmt.Fprintf(&table, "%-60s defect %-2s %d of %d open after 40 s\n", "200 idle sockets on the Raft port", "7", open.Load(), sockets)
		if open.Load() > 0 {
			t.Errorf("%d of %d idle Raft sockets still open after 40 s", open.Load(), sockets)
		}
	})

	after := e.storedRecords(t, h.leader.httpAddr, tenants...)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("record %s changed:\nbefore %s\nafter  %s", k, v, after[k])
		}
	}
	for k := range after {
		if strings.HasPrefix(k, "beta/") && before[k] == "" {
			t.Errorf("attacks created beta record %s", k)
		}
	}
	t.Logf("attack, defect fixed, status:\n%s", table.String())
}

// TestScopedAdminTokenFileRefused: a token with role admin and tenants [acme] could take
// a backup of every tenant and change the membership (issue 13, defect 1). Admin is
// global, and a file that scopes one is refused at start.
func TestScopedAdminTokenFileRefused(t *testing.T) {
	dir := t.TempDir()
	f := auth.File{Tokens: []auth.Token{{Name: "acme-admin", Hash: auth.HashToken("t"), Role: auth.RoleAdmin, Tenants: []string{"acme"}}}}
	raw, err := json.Marshal(&f)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "tokens.json")
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	p := &opsProc{t: t, id: "scoped", httpAddr: freePort(t), raftAddr: freePort(t)}
	p.args = append(fastServeArgs("scoped", filepath.Join(dir, "d"), p.httpAddr, p.raftAddr), "--auth-file", file)
	if err := p.run(20 * time.Second); err == nil || !strings.Contains(p.output(), "admin token is global") {
		t.Fatalf("serve with a scoped admin: %v\n%s", err, p.output())
	}
}
