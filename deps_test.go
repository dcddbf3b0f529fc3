package idemkv_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The core imports no HTTP stack and no test hooks, in the production build and in the
// test build alike: sabotage lives at the seams (node's apply layer, api, cmd), and a
// status code is a number. fsm used to reach net/http through internal/testhooks, and
// all three through errors.go.
//
// The root package's whole closure is free of net/http. fsm and storage cannot be:
// Pebble reaches net/http through cockroachdb/errors and sentry-go, Raft through
// armon/go-metrics, and the metrics package through Prometheus' client. So for them the
// rule is checked on every idemkv package in the closure: none imports net/http (or a
// package under it) itself, and no test-hook package is in the closure at all.
func TestCoreImportsNoHTTPNorHooks(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	const module = "github.com/idemkv/idemkv"
	isHTTP := func(p string) bool { return p == "net/http" || strings.HasPrefix(p, "net/http/") }
	for _, tags := range []string{"", "idemkv_testhooks"} {
		for _, pkg := range []string{".", "./fsm", "./storage"} {
			out, err := exec.Command("go", "list", "-tags", tags, "-deps",
				"-f", "{{.ImportPath}} {{join .Imports \" \"}}", pkg).CombinedOutput()
			if err != nil {
				t.Fatalf("go list -tags %q -deps %s: %v\n%s", tags, pkg, err, out)
			}
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				f := strings.Fields(line)
				dep, imports := f[0], f[1:]
				if strings.HasSuffix(dep, "/testhooks") || strings.Contains(dep, "/testhooks/") {
					t.Errorf("%s (tags %q) depends on %s", pkg, tags, dep)
				}
				if pkg == "." && isHTTP(dep) {
					t.Errorf("the root package (tags %q) depends on %s", tags, dep)
				}
				if dep != module && !strings.HasPrefix(dep, module+"/") {
					continue
				}
				for _, imp := range imports {
					if isHTTP(imp) {
						t.Errorf("%s (tags %q) depends on %s, which imports %s", pkg, tags, dep, imp)
					}
				}
			}
		}
	}
}
