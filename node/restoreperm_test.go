package node_test

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemkv/idemkv/node"
)

// TestRefusedRestoreLeavesTheDirAlone: restore refuses a data dir that is not empty,
// and that refusal changes nothing in it. It used to make the dir private first, as a
// node does its own data dir: the dir and everything under it lost their group and
// other permissions, recursively, before the refusal. A restore pointed at the wrong
// directory (a shared one, a web root, a parent of the data dir), as root, changed the
// modes of a whole tree that was not idemkv's.
func TestRefusedRestoreLeavesTheDirAlone(t *testing.T) {
	_, full := backupOfANewNode(t, 1)
	dir := filepath.Join(t.TempDir(), "shared")
	if err := os.MkdirAll(filepath.Join(dir, "site", "assets"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "site", "index.html"), []byte("<p>hi</p>"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "site"), filepath.Join(dir, "site", "assets")} {
		if err := os.Chmod(p, 0o755); err != nil { // whatever the umask made them
			t.Fatal(err)
		}
	}
	modes := func() map[string]fs.FileMode {
		m := map[string]fs.FileMode{}
		if err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			m[p] = info.Mode().Perm()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return m
	}
	before := modes()

	rc := opsNodeConfig(t, "r1", dir)
	if _, err := node.Restore(rc, bytes.NewReader(full.Bytes())); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("restore into a dir that holds files: %v, want a refusal", err)
	}
	after := modes()
	for p, m := range before {
		if after[p] != m {
			t.Errorf("the refused restore changed %s from %v to %v", p, m, after[p])
		}
	}
	if len(after) != len(before) {
		t.Errorf("the refused restore changed the dir's entries: %d, then %d", len(before), len(after))
	}
}
