package storage

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
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
// next sync (Persist's, a restore's) reaches Pebble's fatal commit error, which the
// store turns into a panic: the process stops, and Raft's log replays what Pebble lost.
// The fault harness (node tests, jepsen-lite's storage family) builds on this.
func TestFullDiskStopsAtTheNextSync(t *testing.T) {
	full := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return syscall.ENOSPC
		}
		return nil
	})}
	// The store is not closed: after a fatal error Pebble's commit pipeline is gone.
	s := openOn(t, errorfs.Wrap(vfs.NewMem(), full), "pebble")
	putAll(t, s, rec("t", "before", 1))
	full.On()
	putAll(t, s, rec("t", "during", 1))
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		err := s.Sync()
		t.Fatalf("a sync on a full disk returned %v instead of stopping", err)
	}()
	if msg := fmt.Sprint(recovered); !strings.Contains(msg, "no space left") {
		t.Fatalf("stopped with %q, want the full disk named", msg)
	}
}
