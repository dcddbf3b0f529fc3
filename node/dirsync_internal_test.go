package node

import (
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
