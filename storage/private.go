package storage

import (
	"errors"
	"io"
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// The modes of everything a node writes under its data dir, and of backups: the
// records of every tenant are in there, so only the user idemkv runs as may read them.
// The one place that says so: node's data dir, raft log and snapshot store, and the
// CLI's backup files take theirs from here.
const (
	PrivateFileMode os.FileMode = 0o600
	PrivateDirMode  os.FileMode = 0o700
)

// privateFS is the OS filesystem with the files and directories Pebble creates made
// PrivateFileMode and PrivateDirMode. Pebble's own creates them 0666 and 0755 (less the
// umask), so in a data dir that others may enter, every record was readable by any
// local user. A file is made private by path just after it is created and before
// Pebble writes to it: the data dir, which the node makes private before it opens
// anything, keeps others out of that moment too.
type privateFS struct{ vfs.FS }

// newPrivateFS makes the filesystems that write to the real disk private; any other
// (an in-memory or error-injecting one a test hands in) is its owner's business.
func newPrivateFS(fs vfs.FS) vfs.FS {
	if fs != vfs.Default {
		return fs
	}
	return privateFS{fs}
}

func (p privateFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := p.FS.Create(name, c)
	return makePrivate(name, f, err)
}

func (p privateFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := p.FS.OpenReadWrite(name, c, opts...)
	return makePrivate(name, f, err)
}

func (p privateFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := p.FS.ReuseForWrite(oldname, newname, c)
	return makePrivate(newname, f, err)
}

func (p privateFS) MkdirAll(dir string, _ os.FileMode) error {
	if err := p.FS.MkdirAll(dir, PrivateDirMode); err != nil {
		return err
	}
	// MkdirAll leaves a directory that exists as it is. Every one Pebble asks for is
	// its own: the store's, a checkpoint's, a restore's new store.
	return os.Chmod(dir, PrivateDirMode)
}

func (p privateFS) Lock(name string) (io.Closer, error) {
	l, err := p.FS.Lock(name)
	return makePrivate(name, l, err)
}

func (p privateFS) Unwrap() vfs.FS { return p.FS }

// makePrivate makes the file just opened at name private, closing it if that fails.
func makePrivate[F io.Closer](name string, f F, err error) (F, error) {
	if err != nil {
		return f, err
	}
	if err := os.Chmod(name, PrivateFileMode); err != nil {
		var none F
		return none, errors.Join(err, f.Close())
	}
	return f, nil
}
