// Package typescript_test drives the TypeScript client's suite from go test, so that
// the repository's one test command covers it: compile the sources with tsc, then run
// `node --test` against idemkv processes built from this checkout.
//
// Without node (>= 20) or tsc the test skips on a developer's machine and fails in CI
// (env CI set), where .ci/run installs Debian's node-typescript first.
package typescript_test

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv/internal/freeport"
	"github.com/idemkv/idemkv/internal/testcluster"
)

func TestTypeScriptClient(t *testing.T) {
	node, tsc := tools(t)

	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "idemkv")
	build := exec.Command("go", "build", "-o", bin, "./cmd/idemkv")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/idemkv: %v\n%s", err, out)
	}

	// Build output goes to the temporary directory, never into the source tree; the
	// package.json there makes Node read the emitted files as ES modules.
	outDir := filepath.Join(dir, "dist")
	if out, err := exec.Command(tsc, "-p", ".", "--outDir", outDir).CombinedOutput(); err != nil {
		t.Fatalf("tsc: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(outDir, "package.json"), []byte(`{"type":"module"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(outDir, "test", "*.test.js"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no compiled test files under %s (%v)", outDir, err)
	}

	cmd := exec.Command(node, append([]string{"--test"}, files...)...)
	cmd.Env = append(os.Environ(), "IDEMKV_BIN="+bin, "IDEMKV_REPO="+repo)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("node --test (%d files):\n%s", len(files), out.String())
	if err != nil {
		t.Fatalf("node --test: %v", err)
	}
	// An exit code of 0 with nothing run would prove nothing.
	m := regexp.MustCompile(`(?m)^# pass (\d+)$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatal("node --test printed no pass count")
	}
	if n, _ := strconv.Atoi(m[1]); n < 20 {
		t.Fatalf("only %d node tests passed", n)
	}

	t.Run("example", func(t *testing.T) { runExample(t, node, tsc, repo, bin) })
	t.Run("consumer", func(t *testing.T) { runConsumer(t, node, tsc, repo) })
}

// runExample compiles examples/typescript and runs it against a node of its own: the
// README points people at it, so it must keep compiling and keep its promise of one
// ticket per approval.
func runExample(t *testing.T, node, tsc, repo, bin string) {
	dir := t.TempDir()
	outDir := filepath.Join(dir, "dist")
	if out, err := exec.Command(tsc, "-p", filepath.Join(repo, "examples", "typescript"), "--outDir", outDir).CombinedOutput(); err != nil {
		t.Fatalf("tsc examples/typescript: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(outDir, "package.json"), []byte(`{"type":"module"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	httpAddr, raftAddr := addr(t), addr(t)
	srv := exec.Command(bin, "serve", "--id", "ex", "--data-dir", filepath.Join(dir, "data"), "--http-addr", httpAddr,
		"--raft-addr", raftAddr, "--heartbeat-timeout", "500ms", "--election-timeout", "500ms", "--leader-lease-timeout", "250ms")
	var logs bytes.Buffer
	srv.Stdout, srv.Stderr = &logs, &logs
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	})
	if err := testcluster.Eventually(30*time.Second, func() error {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	}); err != nil {
		t.Fatalf("node not ready: %v\n%s", err, logs.String())
	}
	out, err := exec.Command(node, filepath.Join(outDir, "examples", "typescript", "agent.js"), "--endpoint", httpAddr).CombinedOutput()
	t.Logf("examples/typescript:\n%s", out)
	if err != nil {
		t.Fatalf("examples/typescript: %v", err)
	}
	for _, want := range []string{"(found by the probe, stored)", "(replayed, the API was not called)", "conflict: idempotency_key_reused_with_different_effect",
		"tickets created by the API: 2 for 2 approvals"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the example's output lacks %q", want)
		}
	}
	// The Vercel AI SDK and Mastra recipes, under stand-ins of their tool contracts
	// (issue 24, point 11): a replayed step and a resumed run replay the effect.
	out, err = exec.Command(node, filepath.Join(outDir, "examples", "typescript", "frameworks.js"), "--endpoint", httpAddr).CombinedOutput()
	t.Logf("examples/typescript/frameworks:\n%s", out)
	if err != nil {
		t.Fatalf("examples/typescript/frameworks: %v", err)
	}
	for _, want := range []string{"ai sdk: LIN-1 then, replaying the step, LIN-1 (tickets 1)", "mastra: LIN-2, resumed LIN-2 (tickets 2)",
		"tickets created: 2 for 2 tool calls"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the recipes' output lacks %q", want)
		}
	}
}

// runConsumer builds the package as another Node project gets it (package.json and
// dist/src, as `npm pack` would ship them), installs it into a project of its own under
// node_modules/idemkv, and compiles and runs that project with tsc's "types": [] (no
// @types/node) against the in-memory store: the README's "Using it from another
// project" (issue 24, point 12).
func runConsumer(t *testing.T, node, tsc, repo string) {
	dir := t.TempDir()
	pkg := filepath.Join(dir, "app", "node_modules", "idemkv")
	if out, err := exec.Command(tsc, "-p", filepath.Join(repo, "clients", "typescript", "tsconfig.build.json"), "--outDir", filepath.Join(pkg, "dist")).CombinedOutput(); err != nil {
		t.Fatalf("tsc -p tsconfig.build.json: %v\n%s", err, out)
	}
	data, err := os.ReadFile(filepath.Join(repo, "clients", "typescript", "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	app := filepath.Join(dir, "app")
	files := map[string]string{
		filepath.Join(pkg, "package.json"): string(data),
		filepath.Join(app, "package.json"): `{"private": true, "type": "module"}`,
		filepath.Join(app, "tsconfig.json"): `{"compilerOptions": {"target": "ES2022", "module": "Node16", "moduleResolution": "Node16",
  "lib": ["ES2022", "DOM"], "types": [], "strict": true, "outDir": "dist"}, "include": ["main.ts"]}`,
		filepath.Join(app, "main.ts"): `import { idempotent, MemoryStore } from "idemkv";

const store = new MemoryStore();
let runs = 0;
const createTicket = async (title: string, severity?: string) => ({ id: "LIN-" + (++runs), title, severity: severity ?? "sev3" });
const once = idempotent(createTicket, { client: store.client(), tenant: "acme", tool: "create_ticket", key: (title) => title });
const a = await once("Outage X");
const b = await once("Outage X", undefined);
console.log("consumer:", a.id, b.id, "runs", runs);
`,
	}
	for name, text := range files {
		if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command(tsc, "-p", app).CombinedOutput(); err != nil {
		t.Fatalf("tsc of the consuming project: %v\n%s", err, out)
	}
	out, err := exec.Command(node, filepath.Join(app, "dist", "main.js")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "consumer: LIN-1 LIN-1 runs 1") {
		t.Fatalf("the consuming project: %v\n%s", err, out)
	}
}

func addr(t *testing.T) string {
	t.Helper()
	a, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// tools finds node (>= 20, for its global fetch and test runner) and tsc.
func tools(t *testing.T) (node, tsc string) {
	t.Helper()
	missing := func(msg string) {
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node is not installed; the TypeScript client needs Node >= 20")
	}
	v, err := exec.Command(node, "-p", "process.versions.node.split('.')[0]").Output()
	if err != nil {
		t.Fatalf("node --version: %v", err)
	}
	if major, _ := strconv.Atoi(string(bytes.TrimSpace(v))); major < 20 {
		missing("node " + string(bytes.TrimSpace(v)) + " is older than 20")
	}
	tsc, err = exec.LookPath("tsc")
	if err != nil {
		missing("tsc is not installed (Debian: apt-get install node-typescript)")
	}
	return node, tsc
}
