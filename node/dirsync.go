package node

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/idemkv/idemkv/storage"
)

// makeDir creates dir and any missing parents, and makes each new entry durable: it
// syncs the directory that holds it, up to the closest ancestor that existed (Pebble's
// mkdirAllAndSyncParents does the same for pebble/). A directory entry is data of its
// parent; without that sync a power cut may drop a directory whose files were all
// synced, e.g. wal/ with the term and vote of a node that just joined, which could
// then vote twice in one term (issue 22, point 5).
func makeDir(dir string) error {
	dir = filepath.Clean(dir)
	var created []string
	for p := dir; ; p = filepath.Dir(p) {
		_, err := os.Stat(p)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		created = append(created, p)
		if filepath.Dir(p) == p {
			break
		}
	}
	if len(created) == 0 {
		return nil
	}
	if err := os.MkdirAll(dir, storage.PrivateDirMode); err != nil {
		return err
	}
	// The deepest first is no better than any order: nothing is durable until all are.
	for _, p := range created {
		if err := syncPath(filepath.Dir(p)); err != nil {
			return err
		}
	}
	return nil
}

// syncPath makes durable what path holds: a directory's entries (files and
// directories created in it, renamed into it or out of it), a file's data.
func syncPath(path string) error {
	d, err := os.Open(path)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
