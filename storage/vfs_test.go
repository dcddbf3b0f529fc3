package storage

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testlog"
)

func openOn(t *testing.T, fs vfs.FS, dir string) *Store {
	t.Helper()
	s, err := OpenWith(dir, testlog.NewLevel(t, "", slog.LevelInfo), Options{FS: fs, CacheBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The fault tests of node and jepsen-lite rest on Options.FS: Pebble must run on the
// filesystem given, and a crash clone of it must keep what Sync made durable and
// drop what was committed after it (the state machine commits without sync). If either
// failed, every power-loss test above this package would pass for nothing.
func TestCrashCloneKeepsSyncedDropsUnsynced(t *testing.T) {
	fs := vfs.NewCrashableMem()
	dir := filepath.Join(t.TempDir(), "pebble")
	s := openOn(t, fs, dir)
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Pebble wrote to the real disk (%v), not to the filesystem given", err)
	}
	putAll(t, s, rec("t", "synced", 1))
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	putAll(t, s, rec("t", "unsynced", 1))
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	after := openOn(t, crashed, dir)
	defer after.Close()
	if r, err := after.Record("t", "synced"); err != nil || r == nil {
		t.Fatalf("the synced record is gone after the crash: %v, %v", r, err)
	}
	if r, err := after.Record("t", "unsynced"); err != nil || r != nil {
		t.Fatalf("the record committed after the last sync survived the crash (%v, %v): the clone drops nothing", r, err)
	}
	if got := after.RecordCount(); got != 1 {
		t.Fatalf("record count %d after the crash, want 1", got)
	}
}

// A full disk under Pebble is never a silent success. A commit without sync (the
// state machine's) goes to the memtable and the log writer fails in the background; the
// next sync (Persist's, a restore's) reaches Pebble's fatal commit error, which fails
// the store: that sync, and everything after it, returns ErrFailed naming the full disk,
// and the hooks (the state machine's halt) hear of it. Raft's log replays what Pebble
// lost after a restart. The fault harness (node tests, jepsen-lite's storage family)
// builds on this.
func TestFullDiskFailsTheStoreAtTheNextSync(t *testing.T) {
	full := fullDisk()
	s := openOn(t, errorfs.Wrap(vfs.NewMem(), full), "pebble")
	heard := make(chan error, 2)
	s.OnFailure(func(err error) { heard <- err })
	putAll(t, s, rec("t", "before", 1))
	full.On()
	putAll(t, s, rec("t", "during", 1))
	err := s.Sync()
	if !errors.Is(err, ErrFailed) || !errors.Is(err, idemkv.ErrUnavailable) || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("a sync on a full disk: %v, want ErrFailed naming the full disk", err)
	}
	mustHaveFailed(t, s, heard)
}

// fullDisk fails every write with ENOSPC once switched on.
func fullDisk() *errorfs.Toggle {
	return &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return syscall.ENOSPC
		}
		return nil
	})}
}

// mustHaveFailed checks what a failed store does: the hook heard the failure once, a
// hook registered late hears it at once, every read and write refuses with ErrFailed,
// a restore too, and Close returns (the database is broken, not the process).
func mustHaveFailed(t *testing.T, s *Store, heard chan error) {
	t.Helper()
	select {
	case err := <-heard:
		if !errors.Is(err, ErrFailed) {
			t.Fatalf("the hook heard %v", err)
		}
	default:
		t.Fatal("the failure hook was not called")
	}
	if err := s.Failure(); !errors.Is(err, ErrFailed) {
		t.Fatalf("Failure() = %v", err)
	}
	late := make(chan error, 1)
	s.OnFailure(func(err error) { late <- err })
	select {
	case <-late:
	default:
		t.Fatal("a hook registered after the failure was not called")
	}
	if _, err := s.Record("t", "before"); !errors.Is(err, ErrFailed) {
		t.Fatalf("a read of the failed store: %v", err)
	}
	b := s.NewBatch()
	if err := b.PutRecord(rec("t", "after", 1)); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); !errors.Is(err, ErrFailed) {
		t.Fatalf("a commit to the failed store: %v", err)
	}
	if err := s.Restore(strings.NewReader("IDEMKVSN")); !errors.Is(err, ErrFailed) {
		t.Fatalf("a restore of the failed store: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("close of the failed store: %v; the failure was reported already", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("close of the failed store hangs")
	}
	if len(heard) != 0 {
		t.Fatalf("the hook was called again: %v", <-heard)
	}
}

// A backup takes a checkpoint, which flushes Pebble's log with a sync: on a full disk
// that is Pebble's fatal error on the backup's goroutine (an HTTP handler's, whose
// panics net/http recovers). The store fails there, whoever called: the backup gets
// ErrFailed and the hooks hear it.
func TestFullDiskFailsTheStoreDuringASnapshot(t *testing.T) {
	full := fullDisk()
	s := openOn(t, errorfs.Wrap(vfs.NewMem(), full), "pebble")
	heard := make(chan error, 2)
	s.OnFailure(func(err error) { heard <- err })
	putAll(t, s, rec("t", "before", 1))
	snap := s.NewSnapshot()
	full.On()
	putAll(t, s, rec("t", "during", 1))
	_, err := snap.WriteTo(io.Discard)
	if !errors.Is(err, ErrFailed) || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("a snapshot on a full disk: %v, want ErrFailed naming the full disk", err)
	}
	if err := snap.Close(); err != nil {
		t.Logf("close of the snapshot: %v", err)
	}
	mustHaveFailed(t, s, heard)
}
