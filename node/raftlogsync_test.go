package node

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
//
// Each store runs in a process of its own, as a node does: bbolt maps its file, and a
// process that serves a FUSE mount must not fault on its own pages (a fault holds its
// thread where the garbage collector cannot stop it, and the collector then waits
// forever, with the server's goroutines, for that thread: the test hung so once).
func TestRaftLogOpenSyncsWhatAKilledProcessWrote(t *testing.T) {
	if raftLogChild() {
		return
	}
	if err := lazyfs.Available(); err != nil {
		t.Skip(err)
	}
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
			runRaftLogChild(t, raftLogChildSpec{Dir: mnt, Backend: backend, From: 1, To: 10})
			unsynced.Store(true) // written and never synced, then the kill
			runRaftLogChild(t, raftLogChildSpec{Dir: mnt, Backend: backend, From: 11, To: 20})
			unsynced.Store(false)
			reported := runRaftLogChild(t, raftLogChildSpec{Dir: mnt, Backend: backend}) // the next process
			if reported != 20 {
				t.Fatalf("the reopened log reports %d entries, want the 20 in the page cache", reported)
			}
			if _, skipped := lz.Syncs(); skipped == 0 {
				t.Fatal("no sync was skipped: the test proved nothing")
			}
			if err := lz.Cut(); err != nil {
				t.Fatal(err)
			}
			s := mustOpenRaftLog(t, backing, backend, 0) // after the power cut, off the mount
			defer s.Close()                              //nolint:errcheck // a test's store
			last, err := s.LastIndex()
			if err != nil {
				t.Fatal(err)
			}
			if last != reported {
				t.Fatalf("the log reported %d entries after the restart and holds %d after a power cut", reported, last)
			}
			for i := uint64(1); i <= last; i++ {
				var got raft.Log
				if err := s.GetLog(i, &got); err != nil || string(got.Data) != string(testEntry(i, 1).Data) {
					t.Fatalf("entry %d after the cut: %q (%v)", i, got.Data, err)
				}
			}
		})
	}
}

// envRaftLogChild carries a child's raftLogChildSpec, as JSON.
const envRaftLogChild = "IDEMKV_TEST_RAFTLOG_CHILD"

// raftLogChildSpec is what a child does: open the log in Dir, store entries From to
// To (none when To is 0), print its last index and close it.
type raftLogChildSpec struct {
	Dir, Backend string
	From, To     uint64
}

// runRaftLogChild runs spec in a child process and returns the last index it printed.
func runRaftLogChild(t *testing.T, spec raftLogChildSpec) uint64 {
	t.Helper()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRaftLogOpenSyncsWhatAKilledProcessWrote$", "-test.count=1")
	cmd.Env = append(os.Environ(), envRaftLogChild+"="+string(raw))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child %+v: %v\n%s", spec, err, out)
	}
	for l := range strings.Lines(string(out)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "last="); ok {
			last, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return last
		}
	}
	t.Fatalf("child %+v printed no last index:\n%s", spec, out)
	return 0
}

// raftLogChild does a child's work, if this process is one, and reports whether it was.
func raftLogChild() bool {
	raw := os.Getenv(envRaftLogChild)
	if raw == "" {
		return false
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "raft log child:", err)
		os.Exit(2)
	}
	var spec raftLogChildSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fail(err)
	}
	s, err := openRaftLog(spec.Dir, spec.Backend, 0, newHCLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		fail(err)
	}
	for i := spec.From; i <= spec.To && spec.To > 0; i++ {
		if err := s.StoreLogs([]*raft.Log{testEntry(i, 1)}); err != nil {
			fail(err)
		}
	}
	last, err := s.LastIndex()
	if err != nil {
		fail(err)
	}
	if err := s.Close(); err != nil {
		fail(err)
	}
	fmt.Printf("last=%d\n", last)
	return true
}
