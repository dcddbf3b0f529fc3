package node_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// TestFullDiskDuringBackupHaltsTheNode: GET /v1/backup takes Pebble's checkpoint on the
// HTTP handler's goroutine. With the disk full, the checkpoint's sync of Pebble's log is
// Pebble's fatal commit error; it used to be a panic that net/http recovered, and the
// node went on acknowledging writes on a Pebble that called itself unusable (it died
// only at the next snapshot). Now the store fails wherever the error met it: the
// backup gets an error, the state machine halts, /readyz says why and writes are
// refused (issue 22, point 4).
func TestFullDiskDuringBackupHaltsTheNode(t *testing.T) {
	full := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return syscall.ENOSPC
		}
		return nil
	})}
	c := testcluster.Start(t, 1, testcluster.WithConfig(func(_ int, cfg *node.Config) {
		cfg.PebbleFS = errorfs.Wrap(vfs.Default, full)
		// No Raft snapshot in the window: its sync would meet the full disk first,
		// and the backup would not be what stops the node.
		cfg.SnapshotThreshold = 1 << 20
		cfg.SnapshotInterval = time.Hour
	}))
	ctx := opsCtx(t)
	n := c.Node(0)
	for i := range 20 {
		if _, err := reserveAndCommit(ctx, n, fmt.Sprintf("k%02d", i), true); err != nil {
			t.Fatal(err)
		}
	}
	if err := readyz(n); err != nil {
		t.Fatalf("before the full disk: %v", err)
	}
	httpReserve := func(key string) (int, []byte) {
		return httpCall(t, http.MethodPost, c.Endpoint(0), "/v1/reserve", &idemkv.ReserveRequest{Tenant: "acme", Key: key,
			Tool: "create_ticket", Fingerprint: fp(key), AttemptID: "a-" + key}, nil)
	}
	if code, raw := httpReserve("before-http"); code != http.StatusOK {
		t.Fatalf("a reserve over HTTP before the full disk: %d %s", code, raw)
	}

	full.On()
	resp, err := http.Get("http://" + c.Endpoint(0) + "/v1/backup")
	if err == nil {
		body, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && rerr == nil {
			t.Fatalf("a backup on a full disk answered 200 with %d bytes", len(body))
		}
		t.Logf("backup on a full disk: %d %v %.200s", resp.StatusCode, rerr, body)
	} else {
		t.Logf("backup on a full disk: %v", err)
	}

	waitHalted(t, n)
	err = readyz(n)
	if !strings.Contains(fmt.Sprint(err), "no space left") {
		t.Fatalf("/readyz of the halted node: %v, want the full disk named", err)
	}
	t.Log(err)
	// Not acknowledged on a dead Pebble: through the node and through HTTP.
	if res, err := n.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "acme", Key: "after", Tool: "create_ticket",
		Fingerprint: fp("after"), AttemptID: "a-after"}); err == nil {
		t.Fatalf("a reserve on the halted node was acknowledged: %+v", res)
	}
	if code, raw := httpReserve("after-http"); code == http.StatusOK {
		t.Fatalf("a reserve over HTTP on the halted node was acknowledged: %s", raw)
	}
}
