package node

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A directory a killed start created but never synced the parent of exists at the
// next start, where MkdirAll changes nothing: makeDir syncs its parent all the same.
func TestMakeDirSyncsTheParentOfADirectoryThatExists(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "a", "b")
	var synced []string
	record := func(p string) error { synced = append(synced, p); return nil }

	if err := makeDirSyncing(dir, record); err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(root, "a"), root}; !slices.Equal(synced, want) {
		t.Fatalf("creating %s synced %v, want %v", dir, synced, want)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("%s not made: %v", dir, err)
	}

	synced = nil
	if err := makeDirSyncing(dir, record); err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(root, "a")}; !slices.Equal(synced, want) {
		t.Fatalf("with %s there already, synced %v, want %v", dir, synced, want)
	}
}

// The parent of a directory that exists may be one this user cannot read (a root-owned
// /srv holding the data dir): its sync is best effort there, and the start goes on.
// A parent of a directory makeDir creates must be synced.
func TestMakeDirToleratesAnUnreadableParentOfADirectoryThatExists(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	denied := func(p string) error { return &os.PathError{Op: "open", Path: p, Err: os.ErrPermission} }
	if err := makeDirSyncing(dir, denied); err != nil {
		t.Fatalf("an existing dir under an unreadable parent: %v", err)
	}
	if err := makeDirSyncing(filepath.Join(root, "new"), denied); !errors.Is(err, os.ErrPermission) {
		t.Fatalf("a new dir whose parent cannot be synced: %v, want the error", err)
	}
}
