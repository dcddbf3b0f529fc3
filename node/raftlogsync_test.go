package node

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv/internal/lazyfs"
)

// TestRaftLogOpenSyncsWhatAKilledProcessWrote: a process killed after writing entries
// to its Raft log and before syncing them leaves them in the page cache; the next
// process opens the log, finds them and reports them (to Raft, which reports them to
// the leader). A power cut after that must not take them back. On lazyfs, whose cut
// drops everything not synced: entries stored with their syncs made no-ops (the write
// without its sync), the store closed, then reopened with syncs working; what the
// reopened log reports must survive a cut, on each backend. (raft-boltdb commits a
// transaction when it opens, whose sync happens to make the whole file durable; the
// wal backend, without the sync at open, kept 10 of the 20 entries it had reported.)
func TestRaftLogOpenSyncsWhatAKilledProcessWrote(t *testing.T) {
	if err := lazyfs.Available(); err != nil {
		t.Skip(err)
	}
	hlog := newHCLogger(slog.New(slog.DiscardHandler))
	for _, backend := range RaftLogs {
		t.Run(backend, func(t *testing.T) {
			root := t.TempDir()
			backing, mnt := filepath.Join(root, "disk"), filepath.Join(root, "mnt")
			for _, d := range []string{backing, mnt} {
				if err := os.Mkdir(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			var unsynced atomic.Bool
			lz, err := lazyfs.Mount(backing, mnt, lazyfs.Options{SkipSync: func(string) bool { return unsynced.Load() }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = lz.Unmount() })
			entry := func(i uint64) *raft.Log {
				return &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: fmt.Appendf(nil, "entry-%d", i)}
			}
			open := func(dir string) raftLogStore {
				t.Helper()
				s, err := openRaftLog(dir, backend, 0, hlog)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			s := open(mnt)
			for i := uint64(1); i <= 20; i++ {
				if i == 11 {
					unsynced.Store(true) // from here on, written and never synced
				}
				if err := s.StoreLogs([]*raft.Log{entry(i)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Close(); err != nil { // the kill: nothing more is synced
				t.Fatal(err)
			}
			unsynced.Store(false)
			s = open(mnt) // the next process
			reported, err := s.LastIndex()
			if err != nil {
				t.Fatal(err)
			}
			if reported != 20 {
				t.Fatalf("the reopened log reports %d entries, want the 20 in the page cache", reported)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if _, skipped := lz.Syncs(); skipped == 0 {
				t.Fatal("no sync was skipped: the test proved nothing")
			}
			if err := lz.Cut(); err != nil {
				t.Fatal(err)
			}
			s = open(backing) // after the power cut
			defer s.Close()   //nolint:errcheck // a test's store
			last, err := s.LastIndex()
			if err != nil {
				t.Fatal(err)
			}
			if last != reported {
				t.Fatalf("the log reported %d entries after the restart and holds %d after a power cut", reported, last)
			}
			for i := uint64(1); i <= last; i++ {
				var got raft.Log
				if err := s.GetLog(i, &got); err != nil || string(got.Data) != string(entry(i).Data) {
					t.Fatalf("entry %d after the cut: %q (%v)", i, got.Data, err)
				}
			}
		})
	}
}
