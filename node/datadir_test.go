package node_test

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/idemkv/idemkv/node"
)

// openToOthers lists every file and directory under dir (dir included) that a user
// other than its owner could read, enter or write, with its mode; and how many entries
// it looked at and their names relative to dir.
func openToOthers(t testing.TB, dir string) (open []string, names []string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := os.Lstat(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		names = append(names, rel)
		if info.Mode().Perm()&0o077 != 0 {
			open = append(open, fmt.Sprintf("%s %v", rel, info.Mode().Perm()))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return open, names
}

// walkingWriter checks the data dir on the first write of a backup, while the
// checkpoint the backup streams from is on disk beside the store.
type walkingWriter struct {
	t      testing.TB
	dir    string
	buf    bytes.Buffer
	open   []string
	names  []string
	walked bool
}

func (w *walkingWriter) Write(p []byte) (int, error) {
	if !w.walked {
		w.walked = true
		w.open, w.names = openToOthers(w.t, w.dir)
	}
	return w.buf.Write(p)
}

// TestDataDirIsPrivate: a data dir that exists 0755 with files 0644 in it (made by
// `mkdir -p` under umask 022, or by an older version) ends up with nothing under it
// that another local user can read, after real writes, a Raft snapshot, a backup's
// checkpoint, a restart and a restore, with either Raft log. Before, the dir stayed
// 0755 and Pebble's, raft-wal's and the snapshot store's files were 0644.
func TestDataDirIsPrivate(t *testing.T) {
	// The umask most systems run with: what idemkv must not rely on to keep others out.
	old := syscall.Umask(0o022)
	t.Cleanup(func() { syscall.Umask(old) })
	for _, backend := range node.RaftLogs {
		t.Run(backend, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "n1")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "left-by-an-older-version"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg := opsNodeConfig(t, "n1", dir)
			cfg.Bootstrap, cfg.RaftLog = true, backend
			cfg.TrailingLogs = 1
			n, err := node.Open(cfg)
			if err != nil {
				t.Fatal(err)
			}
			waitLeaderReady(t, n)
			for i := range 40 {
				if _, err := reserveAndCommit(opsCtx(t), n, fmt.Sprintf("k%02d", i), i%2 == 0); err != nil {
					t.Fatal(err)
				}
			}
			if err := n.Snapshot(); err != nil {
				t.Fatal(err)
			}
			if _, err := reserveAndCommit(opsCtx(t), n, "after-snapshot", true); err != nil {
				t.Fatal(err)
			}
			backup := &walkingWriter{t: t, dir: dir}
			if err := n.Backup(opsCtx(t), backup); err != nil {
				t.Fatal(err)
			}
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
			if len(backup.open) > 0 {
				t.Errorf("during a backup, open to other users: %v", backup.open)
			}
			if !slices.ContainsFunc(backup.names, func(s string) bool { return strings.Contains(s, ".snap") && strings.Contains(s, "MANIFEST") }) {
				t.Errorf("the backup's checkpoint was not on disk when it was checked: %v", backup.names)
			}
			openAndRead(t, cfg, "k00", "after-snapshot")
			open, names := openToOthers(t, dir)
			if len(open) > 0 {
				t.Errorf("open to other users: %v", open)
			}
			// What the walk must have seen, so that it checked the stores' own files.
			want := []string{".", "left-by-an-older-version", "pebble/MANIFEST-", "pebble/OPTIONS-", "pebble/LOCK", ".sst", "snapshots", "/state.bin", "/meta.json"}
			if backend == node.RaftLogWAL {
				want = append(want, "wal/wal-meta.db", ".wal")
			} else {
				want = append(want, "raft.db")
			}
			for _, w := range want {
				if !slices.ContainsFunc(names, func(s string) bool { return s == w || strings.Contains(s, w) && w != "." }) {
					t.Errorf("no %q under the data dir: %v", w, names)
				}
			}

			restored := filepath.Join(t.TempDir(), "restored")
			if err := os.Mkdir(restored, 0o755); err != nil {
				t.Fatal(err)
			}
			rcfg := opsNodeConfig(t, "n1", restored)
			rcfg.RaftLog = backend
			if _, err := node.Restore(rcfg, &backup.buf); err != nil {
				t.Fatal(err)
			}
			if open, _ := openToOthers(t, restored); len(open) > 0 {
				t.Errorf("a restored data dir is open to other users: %v", open)
			}
		})
	}
}
