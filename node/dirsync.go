package node

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/idemkv/idemkv/storage"
)

// makeDir creates dir and any missing parents, and makes each entry durable: it
// syncs the directory that holds each one it creates, up to the closest ancestor that
// existed (Pebble's mkdirAllAndSyncParents does the same for pebble/), and the one
// that holds dir even when dir existed. A directory entry is data of its parent;
// without that sync a power cut may drop a directory whose files were all synced, e.g.
// wal/ with the term and vote of a node that just joined, which could then vote twice
// in one term (issue 22, point 5). dir may exist from a start that was killed between
// its mkdir and the sync: MkdirAll changes nothing then, so the sync is never skipped.
func makeDir(dir string) error { return makeDirSyncing(dir, syncPath) }

// makeDirSyncing is makeDir with the sync it makes of each directory.
func makeDirSyncing(dir string, sync func(string) error) error {
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
	existed := len(created) == 0
	if existed {
		created = []string{dir}
	} else if err := os.MkdirAll(dir, storage.PrivateDirMode); err != nil {
		return err
	}
	// The deepest first is no better than any order: nothing is durable until all are.
	for _, p := range created {
		err := sync(filepath.Dir(p))
		if existed && errors.Is(err, fs.ErrPermission) {
			// A parent this user may not read (a root-owned /srv holding the data dir)
			// was not made by idemkv: the sync is its owner's, and a start must not
			// fail for it where it did not before.
			err = nil
		}
		if err != nil {
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
