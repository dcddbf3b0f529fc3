package lazyfs_test

import (
	"bytes"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/idemkv/idemkv/internal/lazyfs"
)

// Each test runs a small program of os calls on the mount, cuts the power, and reads
// what the backing directory holds then. Each asserts something a passthrough
// filesystem (one that keeps everything written) would fail: a write, a name or a
// removal that was not synced is undone.

// mount mounts a fresh lazy filesystem, skipping where FUSE cannot mount.
func mount(t *testing.T, opts lazyfs.Options) (*lazyfs.FS, string) {
	t.Helper()
	if err := lazyfs.Available(); err != nil {
		t.Skip(err)
	}
	root := t.TempDir()
	backing, mnt := filepath.Join(root, "disk"), filepath.Join(root, "mnt")
	for _, d := range []string{backing, mnt} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	f, err := lazyfs.Mount(backing, mnt, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Unmount() })
	return f, mnt
}

// tree lists dir as path → contents ("<dir>" for a directory).
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			m[rel] = "<dir>"
			return nil
		}
		b, err := os.ReadFile(p)
		m[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func mustTree(t *testing.T, dir string, want map[string]string) {
	t.Helper()
	got := tree(t, dir)
	if !maps.Equal(got, want) {
		t.Fatalf("after the cut %s holds\n  %v\nwant\n  %v", dir, show(got), show(want))
	}
}

func show(m map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := m[k]
		if len(v) > 40 {
			v = v[:40] + "…"
		}
		b.WriteString(k + "=" + v + " ")
	}
	return b.String()
}

func check(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func syncDir(t *testing.T, dir string) {
	t.Helper()
	d, err := os.Open(dir)
	check(t, err)
	check(t, d.Sync())
	check(t, d.Close())
}

// writeFile creates name with data and fsyncs the file (not its directory).
func writeFile(t *testing.T, name, data string) {
	t.Helper()
	f, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	check(t, err)
	_, err = f.WriteString(data)
	check(t, err)
	check(t, f.Sync())
	check(t, f.Close())
}

func cut(t *testing.T, f *lazyfs.FS) {
	t.Helper()
	if err := f.Cut(); err != nil {
		t.Fatal(err)
	}
}

func TestWriteWithoutSyncIsLost(t *testing.T) {
	f, mnt := mount(t, lazyfs.Options{})
	writeFile(t, filepath.Join(mnt, "a"), "durable")
	syncDir(t, mnt)
	// Overwrite the start, append, and leave it unsynced.
	h, err := os.OpenFile(filepath.Join(mnt, "a"), os.O_WRONLY, 0)
	check(t, err)
	_, err = h.WriteAt([]byte("LOST LOST LOST"), 0)
	check(t, err)
	check(t, h.Close())
	cut(t, f)
	mustTree(t, f.Backing(), map[string]string{"a": "durable"})
}

// fdatasync counts as much as fsync; an overwrite of pages in the middle of a large
// file, a truncation and a hole punched are undone page by page.
func TestLargeFileOverwritesTruncationsAndHolesAreUndone(t *testing.T) {
	f, mnt := mount(t, lazyfs.Options{})
	name := filepath.Join(mnt, "big")
	data := bytes.Repeat([]byte("0123456789abcdef"), 3*4096/16+100) // 3 pages and a bit
	h, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o600)
	check(t, err)
	_, err = h.Write(data)
	check(t, err)
	check(t, syscall.Fdatasync(int(h.Fd())))
	syncDir(t, mnt)
	_, err = h.WriteAt(bytes.Repeat([]byte("X"), 5000), 3000) // across pages 0-1
	check(t, err)
	check(t, h.Truncate(4097))
	check(t, h.Truncate(20000))
	_ = syscall.Fallocate(int(h.Fd()), 0x01|0x02, 0, 100) // KEEP_SIZE|PUNCH_HOLE; may be refused
	check(t, h.Close())
	cut(t, f)
	mustTree(t, f.Backing(), map[string]string{"big": string(data)})
}

func TestSyncedFileInUnsyncedDirectoryIsAbsent(t *testing.T) {
	f, mnt := mount(t, lazyfs.Options{})
	writeFile(t, filepath.Join(mnt, "kept"), "k")
	syncDir(t, mnt)
	writeFile(t, filepath.Join(mnt, "new"), "fsynced, but its name is not")
	cut(t, f)
	mustTree(t, f.Backing(), map[string]string{"kept": "k"})
}

// A new directory's entry is data of its parent: syncing the directory itself
// keeps nothing while the parent is not synced.
func TestNewDirectoryNeedsItsParentSynced(t *testing.T) {
	f, mnt := mount(t, lazyfs.Options{})
	check(t, os.MkdirAll(filepath.Join(mnt, "a", "b"), 0o700))
	syncDir(t, mnt) // a is durable, b is not
	writeFile(t, filepath.Join(mnt, "a", "b", "f"), "x")
	syncDir(t, filepath.Join(mnt, "a", "b"))
	check(t, os.Mkdir(filepath.Join(mnt, "c"), 0o700))
	syncDir(t, filepath.Join(mnt, "c"))
	cut(t, f)
	mustTree(t, f.Backing(), map[string]string{"a": "<dir>"})
}

func TestRenameWithoutDirectorySyncKeepsTheOldName(t *testing.T) {
	f, mnt := mount(t, lazyfs.Options{})
	writeFile(t, filepath.Join(mnt, "old"), "v1")
	writeFile(t, filepath.Join(mnt, "target"), "before")
	syncDir(t, mnt)
	check(t, os.Rename(filepath.Join(mnt, "old"), filepath.Join(mnt, "new")))
	// The atomic-replace pattern without its last step: tmp written and fsynced,
	// renamed over target, the directory not synced.
	writeFile(t, filepath.Join(mnt, "tmp"), "after")
	check(t, os.Rename(filepath.Join(mnt, "tmp"), filepath.Join(mnt, "target")))
	cut(t, f)
	mustTree(t, f.Backing(), map[string]string{"old": "v1", "target": "before"})
}

// A rename between directories is durable only when both are synced: here the
// destination is, so the file has both names after the cut (the per-directory model
// does not order the two syncs), and with the source synced too, only the new one.
func TestRenameAcrossDirectoriesNeedsBothSynced(t *testing.T) {
	f, mnt := mount(t, lazyfs.Options{})
	check(t, os.Mkdir(filepath.Join(mnt, "src"), 0o700))
	check(t, os.Mkdir(filepath.Join(mnt, "dst"), 0o700))
	writeFile(t, filepath.Join(mnt, "src", "f"), "data")
	writeFile(t, filepath.Join(mnt, "src", "g"), "data2")
	syncDir(t, filepath.Join(mnt, "src"))
	syncDir(t, filepath.Join(mnt, "dst"))
	syncDir(t, mnt)
	check(t, os.Rename(filepath.Join(mnt, "src", "f"), filepath.Join(mnt, "dst", "f")))
	check(t, os.Rename(filepath.Join(mnt, "src", "g"), filepath.Join(mnt, "dst", "g")))
	syncDir(t, filepath.Join(mnt, "dst"))
	cut(t, f)
	mustTree(t, f.Backing(), map[string]string{
		"src": "<dir>", "src/f": "data", "src/g": "data2",
		"dst": "<dir>", "dst/f": "data", "dst/g": "data2",
	})
}

func TestUnlinkAndRmdirWithoutSyncAreUndone(t *testing.T) {
	f, mnt := mount(t, lazyfs.Options{})
	check(t, os.Mkdir(filepath.Join(mnt, "d"), 0o700))
	writeFile(t, filepath.Join(mnt, "d", "f"), "still here")
	syncDir(t, filepath.Join(mnt, "d"))
	syncDir(t, mnt)
	check(t, os.RemoveAll(filepath.Join(mnt, "d")))
	// A new file may get the freed inode number; the model must not mix them up.
	writeFile(t, filepath.Join(mnt, "other"), "unsynced name")
	cut(t, f)
	mustTree(t, f.Backing(), map[string]string{"d": "<dir>", "d/f": "still here"})
}

// With every sync in place everything is kept, and the backing directory mounts
// again with it.
func TestEverythingSyncedIsKept(t *testing.T) {
	f, mnt := mount(t, lazyfs.Options{})
	check(t, os.Mkdir(filepath.Join(mnt, "d"), 0o700))
	syncDir(t, mnt)
	writeFile(t, filepath.Join(mnt, "d", "tmp"), "v2")
	writeFile(t, filepath.Join(mnt, "d", "gone"), "x")
	syncDir(t, filepath.Join(mnt, "d"))
	check(t, os.Rename(filepath.Join(mnt, "d", "tmp"), filepath.Join(mnt, "d", "cur")))
	check(t, os.Remove(filepath.Join(mnt, "d", "gone")))
	syncDir(t, filepath.Join(mnt, "d"))
	h, err := os.OpenFile(filepath.Join(mnt, "d", "cur"), os.O_WRONLY|os.O_APPEND, 0)
	check(t, err)
	_, err = h.WriteString("+more")
	check(t, err)
	check(t, h.Sync())
	// After the cut the open file fails: the machine is gone.
	cut(t, f)
	if _, err := h.WriteString("after"); !errors.Is(err, syscall.EIO) {
		t.Errorf("a write after the cut: %v, want EIO", err)
	}
	_ = h.Close()
	want := map[string]string{"d": "<dir>", "d/cur": "v2+more"}
	mustTree(t, f.Backing(), want)
	if made, _ := f.Syncs(); made < 5 {
		t.Errorf("%d syncs counted", made)
	}
	check(t, f.Unmount())

	again, err := lazyfs.Mount(f.Backing(), f.Mountpoint(), lazyfs.Options{})
	check(t, err)
	t.Cleanup(func() { _ = again.Unmount() })
	mustTree(t, again.Mountpoint(), want)
}

// SkipSync is the sabotage: the sync succeeds and keeps nothing.
func TestSkipSyncMakesNothingDurable(t *testing.T) {
	f, mnt := mount(t, lazyfs.Options{SkipSync: func(rel string) bool { return strings.HasPrefix(rel, "log") }})
	writeFile(t, filepath.Join(mnt, "log"), "acknowledged")
	writeFile(t, filepath.Join(mnt, "other"), "kept")
	syncDir(t, mnt)
	cut(t, f)
	mustTree(t, f.Backing(), map[string]string{"log": "", "other": "kept"})
	if _, skipped := f.Syncs(); skipped != 1 {
		t.Errorf("%d syncs skipped, want 1", skipped)
	}
}
