// Package deploy_test runs the container deployment of deploy/: the image of the
// Dockerfile and the three-node cluster of docker-compose.yml, secured with the
// secrets of gen-secrets.sh. It needs Docker, Docker Compose and openssl, and skips
// where they are missing.
package deploy_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
)

// compose finds Docker Compose: the v2 plugin or the v1 command.
func compose(t *testing.T) []string {
	t.Helper()
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("docker is not installed; the container cluster test needs Docker Engine and Docker Compose")
	}
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		t.Skipf("the Docker daemon does not answer (%v: %s); the container cluster test needs it", err, bytes.TrimSpace(out))
	}
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl is not installed; gen-secrets.sh needs it")
	}
	if exec.Command("docker", "compose", "version").Run() == nil {
		return []string{"docker", "compose"}
	}
	if p, err := exec.LookPath("docker-compose"); err == nil {
		return []string{p}
	}
	t.Skip("neither `docker compose` nor docker-compose is installed")
	return nil
}

// run runs a command with a time bound and fails the test with its output on error.
func run(t *testing.T, timeout time.Duration, env []string, name string, args ...string) string {
	t.Helper()
	out, err := try(timeout, env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func try(timeout time.Duration, env []string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

type clusterClient struct {
	t     *testing.T
	hc    *http.Client
	ports map[string]string // service -> published host:port
	token string
}

func (c *clusterClient) do(service, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "https://"+c.ports[service]+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, raw, err
}

func (c *clusterClient) json(service, method, path string, body, out any) error {
	code, raw, err := c.do(service, method, path, body)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("%s %s via %s: %d %s", method, path, service, code, raw)
	}
	return json.Unmarshal(raw, out)
}

func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	if err := testcluster.Eventually(timeout, f); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func TestContainerCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("the container cluster test builds an image and runs three containers")
	}
	dc := compose(t)
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	id := fmt.Sprintf("%d%d", os.Getpid(), time.Now().UnixNano()%1_000_000)
	image := "idemkv-test:" + id
	project := "idemkvtest" + id

	// The image: a static binary built outside, copied into scratch.
	buildCtx := filepath.Join(work, "image")
	if err := os.MkdirAll(filepath.Join(buildCtx, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(buildCtx, "idemkv"), "./cmd/idemkv")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("static build: %v\n%s", err, out)
	}
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(buildCtx, "Dockerfile"), dockerfile, 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	phase := func(what string) { t.Logf("%6.1fs %s", time.Since(start).Seconds(), what) }
	run(t, 5*time.Minute, nil, "docker", "build", "-q", "-t", image, buildCtx)
	phase("image built")
	t.Cleanup(func() {
		if out, err := try(time.Minute, nil, "docker", "rmi", "-f", image); err != nil {
			t.Logf("removing image %s: %v\n%s", image, err, out)
		}
	})

	secrets := filepath.Join(work, "secrets")
	run(t, time.Minute, []string{"IDEMKV_TENANT=acme"}, filepath.Join(root, "deploy", "gen-secrets.sh"), secrets)
	readSecret := func(name string) string {
		b, err := os.ReadFile(filepath.Join(secrets, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}

	env := []string{"IDEMKV_IMAGE=" + image, "IDEMKV_SECRETS=" + secrets,
		"IDEMKV_N1_PUBLISH=127.0.0.1:", "IDEMKV_N2_PUBLISH=127.0.0.1:", "IDEMKV_N3_PUBLISH=127.0.0.1:"}
	composeFile := filepath.Join(root, "deploy", "docker-compose.yml")
	dcArgs := func(args ...string) []string {
		return append(append(dc[1:], "-p", project, "-f", composeFile), args...)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := try(time.Minute, env, dc[0], dcArgs("logs", "--no-color")...)
			t.Logf("--- container logs ---\n%s", out)
		}
		if out, err := try(3*time.Minute, env, dc[0], dcArgs("down", "-v", "--remove-orphans", "-t", "5")...); err != nil {
			t.Errorf("tearing down %s: %v\n%s", project, err, out)
		}
		phase("torn down")
	})
	run(t, 3*time.Minute, env, dc[0], dcArgs("up", "-d")...)
	phase("containers up")

	c := &clusterClient{t: t, ports: map[string]string{}, token: readSecret("client-token")}
	for _, s := range []string{"n1", "n2", "n3"} {
		out := strings.TrimSpace(run(t, time.Minute, env, dc[0], dcArgs("port", s, "7420")...))
		if !strings.HasPrefix(out, "127.0.0.1:") {
			t.Fatalf("%s publishes its API at %q, want loopback", s, out)
		}
		c.ports[s] = out
	}
	ca := x509.NewCertPool()
	if !ca.AppendCertsFromPEM([]byte(readSecret("ca.pem"))) {
		t.Fatal("no CA in ca.pem")
	}
	c.hc = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca}}}
	admin := &clusterClient{t: t, hc: c.hc, ports: c.ports, token: readSecret("admin-token")}

	eventually(t, 2*time.Minute, "three voters, all ready", func() error {
		var info idemkv.ClusterInfo
		if err := admin.json("n1", http.MethodGet, "/v1/cluster", nil, &info); err != nil {
			return err
		}
		if len(info.Nodes) != 3 || info.Leader.ID == "" {
			return fmt.Errorf("cluster %+v", info)
		}
		// A node that joins is a learner until it caught up: stopping the leader
		// before both are voters would leave one voter of two.
		for _, ni := range info.Nodes {
			if ni.Suffrage != "voter" {
				return fmt.Errorf("%s is a %s", ni.ID, ni.Suffrage)
			}
		}
		for _, s := range []string{"n1", "n2", "n3"} {
			if code, raw, err := c.do(s, http.MethodGet, "/readyz", nil); err != nil || code != http.StatusOK {
				return fmt.Errorf("%s readyz: %d %s %v", s, code, raw, err)
			}
		}
		return nil
	})

	phase("cluster ready")

	// status from inside the compose network, where the advertised addresses resolve.
	statusOut := run(t, time.Minute, env, dc[0], dcArgs("exec", "-T", "-e", "IDEMKV_TOKEN="+admin.token, "n2",
		"/idemkv", "status", "--json", "--endpoint", "n2:7420", "--ca-cert", "/etc/idemkv/ca.pem")...)
	var status []struct {
		ID, Role, Error string
		Term            uint64
		Lag             *uint64
	}
	if err := json.Unmarshal([]byte(statusOut), &status); err != nil {
		t.Fatalf("status: %v\n%s", err, statusOut)
	}
	roles := map[string]int{}
	for _, n := range status {
		roles[n.Role]++
		if n.Error != "" || n.Term == 0 || n.Lag == nil {
			t.Errorf("status of %s: %+v", n.ID, n)
		}
	}
	if len(status) != 3 || roles["leader"] != 1 || roles["follower"] != 2 {
		t.Fatalf("status: %s", statusOut)
	}

	// reserve, commit, replay through one node.
	reserve := idemkv.ReserveRequest{Tenant: "acme", Key: "conversation_9:approval_17:create_ticket", Tool: "create_ticket",
		Effect: json.RawMessage(`{"project":"OPS","title":"Outage in eu-west"}`)}
	var first idemkv.ReserveResult
	if err := c.json("n1", http.MethodPost, "/v1/reserve", reserve, &first); err != nil || first.Decision != idemkv.DecisionExecute {
		t.Fatalf("reserve: %+v %v", first, err)
	}
	var receipt idemkv.Receipt
	if err := c.json("n1", http.MethodPost, "/v1/commit", idemkv.CommitRequest{Tenant: "acme", Key: reserve.Key,
		Fingerprint: first.Record.Fingerprint, Fence: first.Fence, RemoteSystem: "linear", RemoteID: "LIN-1842"}, &receipt); err != nil {
		t.Fatalf("commit: %v", err)
	}
	var replay idemkv.ReserveResult
	if err := c.json("n1", http.MethodPost, "/v1/reserve", reserve, &replay); err != nil ||
		replay.Decision != idemkv.DecisionReplay || replay.Receipt.RemoteID != "LIN-1842" {
		t.Fatalf("replay: %+v %v", replay, err)
	}
	// The token for acme reads nothing of another tenant.
	if code, raw, err := c.do("n2", http.MethodGet, "/v1/records/beta?limit=1", nil); err != nil || code != http.StatusForbidden {
		t.Fatalf("acme's token listing beta: %d %s %v", code, raw, err)
	}

	// Stop the leader's container: the other two elect a leader and still replay.
	var info idemkv.ClusterInfo
	if err := admin.json("n1", http.MethodGet, "/v1/cluster", nil, &info); err != nil {
		t.Fatal(err)
	}
	oldLeader := info.Leader.ID
	var survivors []string
	for _, s := range []string{"n1", "n2", "n3"} {
		if s != oldLeader {
			survivors = append(survivors, s)
		}
	}
	run(t, 2*time.Minute, env, dc[0], dcArgs("stop", "-t", "20", oldLeader)...)
	phase(fmt.Sprintf("stopped the leader %s; %v remain", oldLeader, survivors))
	eventually(t, time.Minute, "a new leader among "+strings.Join(survivors, ", "), func() error {
		var info idemkv.ClusterInfo
		if err := admin.json(survivors[0], http.MethodGet, "/v1/cluster", nil, &info); err != nil {
			return err
		}
		if info.Leader.ID == "" || info.Leader.ID == oldLeader {
			return fmt.Errorf("leader %q", info.Leader.ID)
		}
		return nil
	})
	for _, s := range survivors {
		var again idemkv.ReserveResult
		eventually(t, time.Minute, "replay through "+s, func() error {
			if err := c.json(s, http.MethodPost, "/v1/reserve", reserve, &again); err != nil {
				return err
			}
			if again.Decision != idemkv.DecisionReplay || again.Receipt == nil || again.Receipt.RemoteID != "LIN-1842" {
				return fmt.Errorf("answer %+v", again)
			}
			return nil
		})
	}
	phase("replayed through the survivors")
	// Two of three still form a quorum: new writes land.
	var fresh idemkv.ReserveResult
	if err := c.json(survivors[1], http.MethodPost, "/v1/reserve", idemkv.ReserveRequest{Tenant: "acme", Key: "after-failover",
		Tool: "create_ticket", Effect: json.RawMessage(`{"n":2}`)}, &fresh); err != nil || fresh.Decision != idemkv.DecisionExecute || fresh.Fence <= first.Fence {
		t.Fatalf("a write after the failover: %+v %v", fresh, err)
	}
	phase("wrote after the failover")

	// The whole cluster recreated on a new network: `down` (volumes kept) and `up` on
	// another subnet give every container a new IP. Raft addresses are names in the
	// configuration (n1:7421, never a resolved IP), so the nodes find each other again
	// without any address override.
	info = idemkv.ClusterInfo{}
	if err := admin.json(survivors[0], http.MethodGet, "/v1/cluster", nil, &info); err != nil {
		t.Fatal(err)
	}
	for _, n := range info.Nodes {
		if n.RaftAddr != n.ID+":7421" {
			t.Fatalf("%s's Raft address in the configuration is %q, want the advertised name %s:7421", n.ID, n.RaftAddr, n.ID)
		}
	}
	oldSubnet := strings.TrimSpace(run(t, time.Minute, nil, "docker", "network", "inspect", "-f",
		"{{range .IPAM.Config}}{{.Subnet}}{{end}}", project+"_default"))
	subnet := "172.30.213.0/24"
	if strings.HasPrefix(oldSubnet, "172.30.") {
		subnet = "172.31.213.0/24"
	}
	override := filepath.Join(work, "new-network.yml")
	if err := os.WriteFile(override, []byte("version: \"3.8\"\nnetworks:\n  default:\n    ipam:\n      config:\n        - subnet: "+subnet+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, 3*time.Minute, env, dc[0], dcArgs("down", "-t", "20")...)
	phase("down, volumes kept (network " + oldSubnet + ")")
	run(t, 3*time.Minute, env, dc[0], append(append(dc[1:], "-p", project, "-f", composeFile, "-f", override), "up", "-d")...)
	phase("up again on " + subnet)
	for _, s := range []string{"n1", "n2", "n3"} {
		c.ports[s] = strings.TrimSpace(run(t, time.Minute, env, dc[0], dcArgs("port", s, "7420")...))
	}
	for _, s := range []string{"n1", "n2", "n3"} {
		var again idemkv.ReserveResult
		eventually(t, 2*time.Minute, "replay through "+s+" on the new network", func() error {
			if err := c.json(s, http.MethodPost, "/v1/reserve", reserve, &again); err != nil {
				return err
			}
			if again.Decision != idemkv.DecisionReplay || again.Receipt == nil || again.Receipt.RemoteID != "LIN-1842" {
				return fmt.Errorf("answer %+v", again)
			}
			return nil
		})
	}
	var moved idemkv.ReserveResult
	eventually(t, time.Minute, "a write on the new network", func() error {
		return c.json("n2", http.MethodPost, "/v1/reserve", idemkv.ReserveRequest{Tenant: "acme", Key: "after-new-network",
			Tool: "create_ticket", Effect: json.RawMessage(`{"n":3}`), AttemptID: "new-network-1"}, &moved)
	})
	if moved.Decision != idemkv.DecisionExecute || moved.Fence <= fresh.Fence {
		t.Fatalf("a write on the new network: %+v", moved)
	}
	phase("replayed and wrote on the new network")
}
