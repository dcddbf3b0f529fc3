package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
)

// TestBackupNeverOverwritesAFileCreatedWhileItRuns: `idemkv backup --out F` checks that
// F is absent when it starts, but a backup takes minutes; a file created at F while the
// backup streams (here: the moment the request reaches the node) must survive, and the
// backup must fail saying so, leaving no temporary file. Before, the finished backup was
// renamed over it. A normal backup is written 0600: it holds every tenant's records.
func TestBackupNeverOverwritesAFileCreatedWhileItRuns(t *testing.T) {
	c := testcluster.Start(t, 1)
	c.WaitLeader()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := client.New(client.Config{Endpoints: []string{c.Endpoint(0)}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Do(ctx, client.Op{Tenant: "acme", Key: "k1", Tool: "create_ticket", Effect: map[string]int{"n": 1}},
		func(context.Context) (*client.Result, error) {
			return &client.Result{RemoteSystem: "linear", RemoteID: "LIN-1"}, nil
		}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	out := filepath.Join(dir, "cluster.backup")
	const precious = "someone else's file\n"
	target, err := url.Parse("http://" + c.Endpoint(0))
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/backup" {
			if err := os.WriteFile(out, []byte(precious), 0o600); err != nil {
				t.Error(err)
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	defer front.Close()

	_, err = cli(t, "backup", "--out", out, "--endpoint", front.URL)
	if err == nil || !strings.Contains(err.Error(), "never overwrite") {
		t.Fatalf("a backup onto a file created while it ran: %v, want an error saying it never overwrites", err)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != precious {
		t.Fatalf("the file created while the backup ran now holds %d bytes (%v), want its own %q", len(b), err, precious)
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{"cluster.backup"}) {
		t.Fatalf("left behind in the backup's dir: %v", names)
	}

	// And with the name free, the backup is there, private.
	if err := os.Remove(out); err != nil {
		t.Fatal(err)
	}
	if _, err := cli(t, "backup", "--out", out, "--endpoint", c.Endpoint(0)); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	if perm := info.Mode().Perm(); perm != 0o600 || info.Size() < int64(len(precious)) {
		t.Fatalf("the backup is %v and %d bytes, want 0600 and a backup", perm, info.Size())
	}
	if names := dirNames(t, dir); !slices.Equal(names, []string{"cluster.backup"}) {
		t.Fatalf("left behind in the backup's dir: %v", names)
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
