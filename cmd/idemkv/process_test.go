package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/freeport"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// The tests in this file run the real binary as separate processes and kill them with
// SIGKILL, the way a crash or an OOM killer would.

// builds holds one binary per set of build tags, built once per test binary.
var builds sync.Map // tags -> *build

type build struct {
	once sync.Once
	path string
	err  error
}

func idemkvBinary(t *testing.T) string { return idemkvBinaryTagged(t, "") }

// idemkvBinaryTagged builds cmd/idemkv with tags (once per test binary).
func idemkvBinaryTagged(t *testing.T, tags string) string {
	t.Helper()
	v, _ := builds.LoadOrStore(tags, &build{})
	b := v.(*build)
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "idemkv-bin-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, "idemkv")
		out, err := exec.Command("go", "build", "-tags", tags, "-o", b.path, ".").CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go build -tags %q: %v\n%s", tags, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// proc is an `idemkv serve` process with fast Raft timing and tiny snapshot
// thresholds, restartable on the same data dir; opsProc runs it and keeps its logs.
type proc struct {
	*opsProc
	dataDir string
	join    string
	raftLog string   // --raft-log, if set
	extra   []string // more serve flags, after the others
}

func freePort(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func newProc(t *testing.T, id, join string) *proc {
	return &proc{
		opsProc: &opsProc{t: t, id: id, httpAddr: freePort(t), raftAddr: freePort(t)},
		dataDir: filepath.Join(t.TempDir(), id),
		join:    join,
	}
}

// logText is everything the process wrote so far, across restarts.
func (p *proc) logText() string { return p.output() }

func (p *proc) start() {
	p.t.Helper()
	p.args = append(fastServeArgs(p.id, p.dataDir, p.httpAddr, p.raftAddr),
		"--snapshot-threshold", "64", "--trailing-logs", "32", "--snapshot-interval", "200ms")
	if p.join != "" {
		p.args = append(p.args, "--join", p.join)
	}
	if p.raftLog != "" {
		p.args = append(p.args, "--raft-log", p.raftLog)
	}
	p.args = append(p.args, p.extra...)
	p.opsProc.start()
}

func (p *proc) kill() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		p.t.Fatal(err)
	}
	_ = p.cmd.Wait()
}

func waitFor(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	if err := testcluster.Eventually(timeout, f); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func (p *proc) waitReady() {
	p.t.Helper()
	waitFor(p.t, 30*time.Second, p.id+" ready", func() error {
		resp, err := http.Get("http://" + p.httpAddr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	})
}

func call(t *testing.T, method, endpoint, path string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://"+endpoint+path, rd)
	req.Header.Set("Content-Type", "application/json")
	c := http.Client{Timeout: 15 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

// writeRecords acknowledges n reserve+commit pairs (and n/4 pending reserves) and
// returns each record as a linearizable read saw it right after the ack.
func writeRecords(t *testing.T, endpoint string, n int) map[string]string {
	t.Helper()
	acked := map[string]string{}
	for i := range n {
		key := fmt.Sprintf("op:%d/create_ticket", i)
		reserve := idemkv.ReserveRequest{Tenant: "acme", Key: key, Tool: "create_ticket",
			Fingerprint: fmt.Sprintf("sha256:%064d", i), AttemptID: "w1"}
		code, raw := call(t, http.MethodPost, endpoint, "/v1/reserve", reserve)
		if code != 200 {
			t.Fatalf("reserve %s: %d %s", key, code, raw)
		}
		var res idemkv.ReserveResult
		if err := json.Unmarshal(raw, &res); err != nil || res.Decision != idemkv.DecisionExecute {
			t.Fatalf("reserve %s: %v %s", key, err, raw)
		}
		if i%4 != 3 {
			commit := idemkv.CommitRequest{Tenant: "acme", Key: key, Fingerprint: reserve.Fingerprint, Fence: res.Fence,
				RemoteSystem: "linear", RemoteID: fmt.Sprintf("LIN-%d", i), Result: json.RawMessage(`{"ok":true}`)}
			if code, raw := call(t, http.MethodPost, endpoint, "/v1/commit", commit); code != 200 {
				t.Fatalf("commit %s: %d %s", key, code, raw)
			}
		}
		code, raw = call(t, http.MethodGet, endpoint, "/v1/records/acme/"+url.PathEscape(key), nil)
		if code != 200 {
			t.Fatalf("get %s: %d %s", key, code, raw)
		}
		acked[key] = string(raw)
	}
	return acked
}

func checkRecords(t *testing.T, endpoint string, acked map[string]string) {
	t.Helper()
	for key, want := range acked {
		var code int
		var raw []byte
		waitFor(t, 20*time.Second, "read "+key, func() error {
			code, raw = call(t, http.MethodGet, endpoint, "/v1/records/acme/"+url.PathEscape(key), nil)
			if code == http.StatusServiceUnavailable || code == 0 {
				return fmt.Errorf("%d %s", code, raw)
			}
			return nil
		})
		if code != 200 || string(raw) != want {
			t.Fatalf("after SIGKILL, %s = %d %s\nacknowledged: %s", key, code, raw, want)
		}
	}
}

func TestSIGKILLSingleNodeLosesNothing(t *testing.T) {
	for _, backend := range node.RaftLogs {
		t.Run(backend, func(t *testing.T) {
			p := newProc(t, "n1", "")
			p.raftLog = backend
			p.start()
			p.waitReady()
			acked := writeRecords(t, p.httpAddr, 120)
			p.kill()
			p.start()
			p.waitReady()
			checkRecords(t, p.httpAddr, acked)
			if !strings.Contains(p.logText(), "idemkv serving") {
				t.Fatalf("restarted node did not log its start")
			}
		})
	}
}

func TestSIGKILLWholeClusterLosesNothing(t *testing.T) {
	for _, backend := range node.RaftLogs {
		t.Run(backend, func(t *testing.T) {
			n1 := newProc(t, "n1", "")
			n2 := newProc(t, "n2", n1.httpAddr)
			n3 := newProc(t, "n3", n1.httpAddr)
			procs := []*proc{n1, n2, n3}
			for _, p := range procs {
				p.raftLog = backend
			}
			n1.start()
			n1.waitReady()
			n2.start()
			n3.start()
			waitFor(t, 30*time.Second, "three voters", func() error {
				code, raw := call(t, http.MethodGet, n1.httpAddr, "/v1/cluster", nil)
				var info idemkv.ClusterInfo
				if code != 200 || json.Unmarshal(raw, &info) != nil {
					return fmt.Errorf("cluster: %d %s", code, raw)
				}
				if len(info.Nodes) != 3 {
					return fmt.Errorf("%d nodes", len(info.Nodes))
				}
				for _, ni := range info.Nodes {
					if ni.APIAddr == "" {
						return fmt.Errorf("node %s has no API address yet", ni.ID)
					}
				}
				return nil
			})
			for _, p := range procs {
				p.waitReady()
			}
			// Write through a follower as well: it forwards to the leader.
			acked := writeRecords(t, n2.httpAddr, 100)
			for _, p := range procs {
				p.kill()
			}
			for _, p := range procs {
				p.start()
			}
			for _, p := range procs {
				p.waitReady()
			}
			for _, p := range procs {
				checkRecords(t, p.httpAddr, acked)
			}
		})
	}
}

func TestSIGTERMShutsDownCleanly(t *testing.T) {
	p := newProc(t, "n1", "")
	p.start()
	p.waitReady()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no exit 20 s after SIGTERM")
	}
	if !strings.Contains(p.logText(), "stopped") {
		t.Fatalf("no clean stop in the logs")
	}
}

// TestServeKeepsTheDataDirsRaftLog: serve without --raft-log restarts on the backend the
// data dir holds; with the other one it refuses to start, naming both and the
// migration procedure, and leaves the data dir as it was.
func TestServeKeepsTheDataDirsRaftLog(t *testing.T) {
	p := newProc(t, "n1", "")
	p.start()
	p.waitReady()
	acked := writeRecords(t, p.httpAddr, 10)
	if err := p.signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	marker, err := os.ReadFile(filepath.Join(p.dataDir, "raft-log"))
	if err != nil {
		t.Fatal(err)
	}
	have := strings.TrimSpace(string(marker))
	other := node.RaftLogWAL
	if have == node.RaftLogWAL {
		other = node.RaftLogBolt
	}

	refused := &opsProc{t: t, id: "n1-" + other, args: append(fastServeArgs(p.id, p.dataDir, p.httpAddr, p.raftAddr), "--raft-log", other)}
	if err := refused.run(30 * time.Second); err == nil {
		t.Fatalf("serve --raft-log %s on a %s data dir started", other, have)
	}
	for _, want := range []string{`"` + have + `"`, `"` + other + `"`, "docs/operations.md"} {
		if !strings.Contains(refused.output(), want) {
			t.Fatalf("the refusal does not say %s:\n%s", want, refused.output())
		}
	}
	if strings.Contains(refused.output(), "idemkv serving") {
		t.Fatalf("the refused node served:\n%s", refused.output())
	}

	p.start()
	p.waitReady()
	checkRecords(t, p.httpAddr, acked)
}
