package client

import (
	"os/exec"
	"strings"
	"testing"
)

// A runtime that imports the client must not compile in the server: no Raft, no
// Pebble, no server package, no OpenTelemetry SDK.
func TestClientStaysLight(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 {
		t.Fatalf("go list named only %d packages: %s", len(deps), out)
	}
	forbidden := []string{
		"github.com/hashicorp/raft",
		"github.com/cockroachdb/pebble",
		"go.etcd.io/bbolt",
		"github.com/idemkv/idemkv/node",
		"github.com/idemkv/idemkv/fsm",
		"github.com/idemkv/idemkv/storage",
		"github.com/idemkv/idemkv/api",
		"github.com/idemkv/idemkv/telemetry", // the SDK side; telemetry/semconv is allowed
		"go.opentelemetry.io/otel/sdk",
		"go.opentelemetry.io/otel/exporters",
		"github.com/prometheus/client_golang",
	}
	var found []string
	for _, d := range deps {
		for _, f := range forbidden {
			if (d == f || strings.HasPrefix(d, f+"/") || strings.HasPrefix(d, f+"-")) && !strings.HasPrefix(d, "github.com/idemkv/idemkv/telemetry/semconv") {
				found = append(found, d)
			}
		}
	}
	if len(found) > 0 {
		t.Fatalf("the client depends on %v", found)
	}
	for _, want := range []string{"github.com/idemkv/idemkv/fingerprint", "go.opentelemetry.io/otel/trace"} {
		if !contains(deps, want) {
			t.Errorf("expected dependency %s missing: is go list reporting the right package?", want)
		}
	}
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
