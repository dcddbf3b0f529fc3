package client_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/storage"
)

func backupClient(t *testing.T, endpoints ...string) *client.Client {
	t.Helper()
	c, err := client.New(client.Config{Endpoints: endpoints, Timeout: 2 * time.Second, Logger: testlog.New(t),
		BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A backup asked of a follower, after a node that is down, comes from the leader of a
// real cluster and restores into a store holding what was committed before it.
func TestBackupThroughAFollower(t *testing.T) {
	cluster := testcluster.Start(t, 3)
	leader := cluster.LeaderIndex(t)
	follower := (leader + 1) % 3
	ctx := timeout(t, 30*time.Second)
	writer := backupClient(t, cluster.Endpoints()...)
	for i := range 5 {
		key := fmt.Sprintf("k%d", i)
		res, err := writer.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "acme", Key: key, Tool: "t",
			Fingerprint: fmt.Sprintf("sha256:%064d", i)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := writer.Commit(ctx, &idemkv.CommitRequest{Tenant: "acme", Key: key, Fence: res.Fence,
			Fingerprint: fmt.Sprintf("sha256:%064d", i), RemoteSystem: "s", RemoteID: "R-" + key}); err != nil {
			t.Fatal(err)
		}
	}

	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	var buf bytes.Buffer
	n, err := backupClient(t, dead.URL, cluster.Endpoint(follower)).Backup(ctx, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 || n != int64(buf.Len()) {
		t.Fatalf("Backup reported %d bytes, wrote %d", n, buf.Len())
	}
	st, err := storage.Open(t.TempDir(), testlog.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Restore(&buf); err != nil {
		t.Fatalf("restoring the backup: %v", err)
	}
	for i := range 5 {
		key := fmt.Sprintf("k%d", i)
		rec, err := st.Record("acme", key)
		if err != nil || rec == nil || rec.Status != idemkv.StatusCommitted || rec.Receipt == nil || rec.Receipt.RemoteID != "R-"+key {
			t.Fatalf("restored %s: %+v, %v", key, rec, err)
		}
	}
}

// A fake node serving /v1/backup with answer, counting requests.
func fakeBackupNode(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/backup" {
			http.NotFound(w, r)
			return
		}
		hits.Add(1)
		answer(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

// A transfer cut after its first bytes is not retried (the writer holds them), and
// says how much it wrote; refusals keep their sentinel and write nothing.
func TestBackupFailures(t *testing.T) {
	ctx := timeout(t, 30*time.Second)
	cut, cutHits := fakeBackupNode(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", idemkv.BackupContentType)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("first bytes"))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	spare, spareHits := fakeBackupNode(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", idemkv.BackupContentType)
		_, _ = w.Write([]byte("whole"))
	})
	var buf bytes.Buffer
	n, err := backupClient(t, cut.URL, spare.URL).Backup(ctx, &buf)
	if err == nil || errors.Is(err, idemkv.ErrUnavailable) || !strings.Contains(err.Error(), "broke after 11 bytes") {
		t.Fatalf("cut transfer: %v, want a final error naming 11 bytes", err)
	}
	if n != 11 || buf.String() != "first bytes" || cutHits.Load() != 1 || spareHits.Load() != 0 {
		t.Fatalf("cut transfer: n %d, wrote %q, requests %d then %d; want 11, one request, none elsewhere",
			n, buf.String(), cutHits.Load(), spareHits.Load())
	}

	refusing, refusals := fakeBackupNode(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"error":{"code":"permission_denied","message":"backups need the admin role"}}`))
	})
	buf.Reset()
	n, err = backupClient(t, refusing.URL, spare.URL).Backup(ctx, &buf)
	if !errors.Is(err, idemkv.ErrPermissionDenied) || n != 0 || buf.Len() != 0 || refusals.Load() != 1 {
		t.Fatalf("refused backup: %v, n %d, wrote %q, %d requests", err, n, buf.String(), refusals.Load())
	}

	// An answer that is not a backup (a proxy's page) is not copied into the file.
	page, _ := fakeBackupNode(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte("<html>sign in</html>"))
	})
	buf.Reset()
	if n, err = backupClient(t, page.URL).Backup(ctx, &buf); err == nil || n != 0 || buf.Len() != 0 {
		t.Fatalf("a page instead of a backup: %v, n %d, wrote %q", err, n, buf.String())
	}

	// A node that takes the connection and never answers is left after Timeout (2 s),
	// not after the hour a backup may take, and the next endpoint serves.
	silent, _ := fakeBackupNode(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	buf.Reset()
	start := time.Now()
	n, err = backupClient(t, silent.URL, spare.URL).Backup(ctx, &buf)
	if err != nil || n != 5 || buf.String() != "whole" {
		t.Fatalf("after a silent node: %v, n %d, wrote %q", err, n, buf.String())
	}
	t.Logf("moved past the silent node in %s", time.Since(start))
}
