//go:build unix

package node

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// TestSnapshotWriteErrorLeavesNothing: a snapshot whose state.bin cannot be written (a
// full disk; here the file size limit, which fails the write in the kernel just the
// same) is cancelled, as fsmSnapshot.Persist and Raft's install do. Raft's Cancel
// flushes its buffer first, meets the write error again and returns before it removes
// anything: the part written stayed in snapshots/<id>.tmp for good, on a disk that was
// already full, and each later attempt (Raft retries every SnapshotInterval) left one
// more.
func TestSnapshotWriteErrorLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	snaps, err := openSnapshotStore(dir, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	_, trans := raft.NewInmemTransport("")
	defer trans.Close()
	conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: "n1", Address: trans.LocalAddr()}}}
	sink, err := snaps.Create(raft.SnapshotVersionMax, 10, 2, conf, 1, trans)
	if err != nil {
		t.Fatal(err)
	}

	var was syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &was); err != nil {
		t.Fatal(err)
	}
	limit := was
	limit.Cur = 64 << 10
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &limit); err != nil {
		t.Fatal(err)
	}
	_, werr := sink.Write(bytes.Repeat([]byte("part of a store "), 64<<10))
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &was); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(werr, syscall.EFBIG) {
		t.Fatalf("writing 1 MiB past a 64 KiB file size limit: %v, want EFBIG", werr)
	}
	t.Logf("write: %v; cancel: %v", werr, sink.Cancel())

	entries, err := os.ReadDir(filepath.Join(dir, snapshotsDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("the cancelled snapshot is still there: %s", e.Name())
		}
	}
}
