package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
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

// What killed backups left beside --out (each a copy of the store) is removed by the
// next backup into that directory; what a backup still running writes is not.
func TestBackupRemovesWhatKilledBackupsLeft(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	old := now.Add(-staleBackupFiles - time.Minute)
	files := map[string]time.Time{
		".idemkv-backup-123":                 old,
		".idemkv-verify-456":                 old,
		".idemkv-verify-456.restore-new":     old,
		".idemkv-backup-running":             now.Add(-time.Minute),
		"idemkv-2026-12-01.backup":           old,
		".idemkv-backupish-not-ours-but-old": old,
	}
	for name, at := range files {
		p := filepath.Join(dir, name)
		if strings.Contains(name, "verify") {
			if err := os.MkdirAll(filepath.Join(p, "sub"), 0o700); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
	}
	var out strings.Builder
	removeStaleBackupFiles(dir, now, &out)
	for name := range files {
		_, err := os.Stat(filepath.Join(dir, name))
		gone := errors.Is(err, fs.ErrNotExist)
		want := name == ".idemkv-backup-123" || strings.HasPrefix(name, ".idemkv-verify-456")
		if gone != want {
			t.Errorf("%s: removed %v, want %v", name, gone, want)
		}
	}
	if strings.Count(out.String(), "removed ") != 3 {
		t.Errorf("said:\n%s", out.String())
	}
}

// SIGINT or SIGTERM (the command's context) stop a restore as a failure, which leaves
// the data dir empty: it ignored them, so an operator or an orchestrator ended it with
// SIGKILL, mid-write.
func TestRestoreStopsWithItsContext(t *testing.T) {
	c := testcluster.Start(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 50 {
		if _, err := c.Node(0).Reserve(ctx, &idemkv.ReserveRequest{Tenant: "acme", Key: fmt.Sprint("k", i), Tool: "t",
			Fingerprint: "sha256:x", AttemptID: fmt.Sprint("a", i)}); err != nil {
			t.Fatal(err)
		}
	}
	var backup bytes.Buffer
	if err := c.Node(0).Backup(ctx, &backup); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(t.TempDir(), "backup.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(t.TempDir(), "r1")
	stop, stopNow := context.WithCancel(context.Background())
	defer stopNow()
	root := newRootCommand()
	var out bytes.Buffer
	root.SetArgs([]string{"restore", "--from", fifo, "--data-dir", dataDir, "--id", "r1", "--raft-addr", "127.0.0.1:1"})
	root.SetOut(&out)
	root.SetErr(&out)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(stop) }()
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(backup.Bytes()[:backup.Len()/2]); err != nil {
		t.Fatal(err)
	}
	stopNow() // as SIGTERM cancels main's context
	_, _ = w.Write(backup.Bytes()[backup.Len()/2:])
	w.Close()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "restore stopped") {
			t.Fatalf("restore after its context ended: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("restore still runs 30 s after its context ended")
	}
	if entries, _ := os.ReadDir(dataDir); len(entries) != 0 {
		t.Fatalf("a stopped restore left %d entries in the data dir", len(entries))
	}
}
