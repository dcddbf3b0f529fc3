// Package crosslang_test proves the one default effect across languages (docs/protocol.md,
// "One default effect"; issue 24, point 3): the same operation run by a Go, a Python and
// a TypeScript worker, in each order, against one real node, makes one effect, and every
// later worker replays the first one's receipt instead of conflicting.
//
// Without python3 (>= 3.10), node (>= 20) or tsc the test skips on a developer's machine
// and fails in CI (env CI set).
package crosslang_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testlog"
)

// answer is what each worker prints.
type answer struct {
	Worker      string `json:"worker"`
	Replayed    bool   `json:"replayed"`
	RemoteID    string `json:"remote_id"`
	Fingerprint string `json:"fingerprint"`
}

func TestOneOperationAcrossLanguages(t *testing.T) {
	py, node, tsc := tools(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "dist")
	if b, err := exec.Command(tsc, "-p", ".", "--outDir", out).CombinedOutput(); err != nil {
		t.Fatalf("tsc: %v\n%s", err, b)
	}
	if err := os.WriteFile(filepath.Join(out, "package.json"), []byte(`{"type":"module"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tsWorker := filepath.Join(out, "crosslang", "worker.js")

	c := testcluster.Start(t, 1)
	endpoint := c.Endpoint(0)
	cl, err := client.New(client.Config{Endpoints: []string{endpoint}, Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	tickets := filepath.Join(dir, "tickets.txt")

	workers := map[string]func(op string) answer{
		"go": func(op string) answer {
			// Go has no default: its effect is the tool's object of arguments, which is
			// what the default of the others comes to.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			o, err := cl.Do(ctx, client.Op{Tenant: "acme", Key: op + ":create_ticket", Tool: "create_ticket",
				Effect: map[string]any{"title": "Outage X", "severity": "sev1"}}, func(context.Context) (*client.Result, error) {
				f, err := os.OpenFile(tickets, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
				if err != nil {
					return nil, err
				}
				defer f.Close()
				if _, err := fmt.Fprintf(f, "%s go\n", op); err != nil {
					return nil, err
				}
				return &client.Result{RemoteSystem: "tickets", RemoteID: "TCK-" + op}, nil
			})
			if err != nil {
				t.Fatalf("go worker: %v", err)
			}
			return answer{Worker: "go", Replayed: o.Replayed, RemoteID: o.Receipt.RemoteID, Fingerprint: o.Fingerprint}
		},
		// A tool taking one dict of arguments, and one taking keyword arguments.
		"python": func(op string) answer { return run(t, py, "worker.py", endpoint, op, tickets, "object") },
		"python-kwargs": func(op string) answer {
			return run(t, py, "worker.py", endpoint, op, tickets, "kwargs")
		},
		"typescript": func(op string) answer {
			return run(t, node, tsWorker, endpoint, op, tickets)
		},
	}
	orders := [][]string{{"go", "python", "typescript"}, {"python-kwargs", "typescript", "go"}, {"typescript", "go", "python"},
		{"python", "python-kwargs"}}
	var fps []string
	for i, order := range orders {
		op := fmt.Sprintf("xl_%d_%d", time.Now().UnixNano(), i)
		for j, w := range order {
			a := workers[w](op)
			t.Logf("%s: %s %+v", op, w, a)
			if a.Replayed != (j > 0) || a.RemoteID != "TCK-"+op {
				t.Errorf("%s, worker %d (%s): %+v; want %s, the first worker's receipt, replayed from the second on", op, j, w, a, "TCK-"+op)
			}
			fps = append(fps, a.Fingerprint)
		}
		data, _ := os.ReadFile(tickets)
		if n := strings.Count(string(data), op+" "); n != 1 {
			t.Errorf("%s: %d effects for one operation run by %v:\n%s", op, n, order, data)
		}
	}
	for _, fp := range fps[1:] {
		if fp != fps[0] {
			t.Errorf("fingerprints differ across workers: %v", fps)
			break
		}
	}
}

func run(t *testing.T, bin string, args ...string) answer {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %v: %v\n%s%s", bin, args, err, stdout.String(), stderr.String())
	}
	var a answer
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &a); err != nil {
		t.Fatalf("%s printed %q: %v\n%s", bin, stdout.String(), err, stderr.String())
	}
	return a
}

// tools finds python3 (>= 3.10), node (>= 20) and tsc.
func tools(t *testing.T) (py, node, tsc string) {
	t.Helper()
	missing := func(msg string) {
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	py, err := exec.LookPath("python3")
	if err == nil {
		err = exec.Command(py, "-c", "import sys; sys.exit(sys.version_info < (3, 10))").Run()
	}
	if err != nil {
		missing("python3 >= 3.10 not found: " + err.Error())
	}
	node, err = exec.LookPath("node")
	if err == nil {
		err = exec.Command(node, "-e", "process.exit(Number(process.versions.node.split('.')[0]) < 20 ? 1 : 0)").Run()
	}
	if err != nil {
		missing("node >= 20 not found: " + err.Error())
	}
	if tsc, err = exec.LookPath("tsc"); err != nil {
		missing("tsc is not installed (Debian: apt-get install node-typescript)")
	}
	return py, node, tsc
}
