// Package lazyfs is a FUSE filesystem for power-loss tests: a loopback over a real
// backing directory that models a disk whose cache loses, at a power cut, everything
// that was not made durable (after LazyFS, the tool of the same idea in C++).
//
// The model is strict POSIX:
//   - a file's data and size are durable as of its last fsync or fdatasync; a write,
//     a truncation or a hole punched since is lost;
//   - a directory's entries are durable as of its last fsync: a file or directory
//     created, removed or renamed since is not (a new file's name is durable only
//     after its directory is synced, however often the file itself is; a rename only
//     after both directories are).
//
// Everything is written through to the backing directory at once (nothing there is
// ever fsynced: the model is the durability). Beside it the filesystem keeps what a
// cut must give back: for each file written since its last sync, its durable size and
// the durable contents of every page overwritten since (an undo log, so a sync costs
// nothing and a write copies at most what it overwrites), and for each directory
// changed since its last sync, its durable entries as names → inode numbers. An inode
// a durable entry still names is kept alive after its last live name goes, by a hard
// link (or, for a directory, a rename) into the attic, a sibling of the backing
// directory, so that its inode number is never reused while the model needs it.
//
// Cut is the power cut: every later operation fails with EIO, the mount is detached,
// and the backing directory is rewritten to exactly its durable state, where a
// process can start again (on a new Mount, or on the backing directory itself).
//
// It is for tests only; nothing in the server imports it.
package lazyfs

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// pageSize is the granularity of the undo log.
const pageSize = 4096

// Options change the model.
type Options struct {
	// SkipSync, when set, is asked about each fsync or fdatasync of a regular file
	// (by its path relative to the mount); when it answers true the sync succeeds and
	// makes nothing durable. It is a sabotage: a store whose syncs are no-ops, which a
	// power-loss checker must catch.
	SkipSync func(rel string) bool
}

// FS is a mounted lazy filesystem.
type FS struct {
	backing, attic, mnt string
	opts                Options
	server              *fuse.Server

	// off is set by the cut; from then on every operation fails with EIO.
	off atomic.Bool
	// mu serializes every operation that changes the backing directory or the model,
	// with its change to the backing directory.
	mu      sync.Mutex
	files   map[uint64]*fileState // regular files written since their last sync
	dirs    map[uint64]*dirState  // directories changed since their last sync
	inAttic map[uint64]bool       // inodes with a name in the attic
	syncs   atomic.Int64          // syncs that made something durable, files and directories
	skipped atomic.Int64          // syncs SkipSync made no-ops
	cutOnce sync.Once
	cutErr  error
}

// fileState is what is durable of a regular file written since its last sync: its
// size, and the durable contents of the pages below that size overwritten since (the
// pages not here hold their durable contents in the backing file).
type fileState struct {
	size  int64
	pages map[int64][]byte
}

// dirState is what is durable of a directory changed since its last sync: its entries.
type dirState struct {
	entries map[string]uint64
}

// Available reports why FUSE cannot be mounted here, or nil if it can: tests skip
// with its message. It mounts a scratch directory once to find out.
func Available() error {
	probeOnce.Do(func() { probeErr = probe() })
	return probeErr
}

var (
	probeOnce sync.Once
	probeErr  error
)

func probe() error {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("lazyfs: FUSE cannot mount here: no /dev/fuse (%v)", err)
	}
	dir, err := os.MkdirTemp("", "lazyfs-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	backing, mnt := filepath.Join(dir, "disk"), filepath.Join(dir, "mnt")
	if err := errors.Join(os.Mkdir(backing, 0o700), os.Mkdir(mnt, 0o700)); err != nil {
		return err
	}
	f, err := Mount(backing, mnt, Options{})
	if err != nil {
		return fmt.Errorf("lazyfs: FUSE cannot mount here (as root, or with fusermount3 from fuse3): %w", err)
	}
	return f.Unmount()
}

// Mount serves backing at mountpoint (both directories must exist). The attic is
// backing + ".attic", made here; it must be on the backing directory's filesystem.
func Mount(backing, mountpoint string, opts Options) (*FS, error) {
	backing, err := filepath.Abs(backing)
	if err != nil {
		return nil, err
	}
	f := &FS{
		backing: backing, attic: backing + ".attic", mnt: mountpoint, opts: opts,
		files: map[uint64]*fileState{}, dirs: map[uint64]*dirState{}, inAttic: map[uint64]bool{},
	}
	if err := os.RemoveAll(f.attic); err != nil {
		return nil, err
	}
	if err := os.Mkdir(f.attic, 0o700); err != nil {
		return nil, err
	}
	var st syscall.Stat_t
	if err := syscall.Stat(backing, &st); err != nil {
		return nil, err
	}
	root := &fs.LoopbackRoot{Path: backing, Dev: uint64(st.Dev)}
	rootNode := &node{LoopbackNode: &fs.LoopbackNode{RootData: root}, lz: f}
	root.RootNode = rootNode
	zero := time.Duration(0)
	f.server, err = fs.Mount(mountpoint, rootNode, &fs.Options{
		// The kernel must ask for every attribute and entry: a cut changes them
		// behind its back (the mount is detached first, but a cache must not hide
		// an operation from the model meanwhile either).
		EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{FsName: "lazyfs", Name: "lazyfs", DirectMount: true, MaxBackground: 64, Debug: os.Getenv("LAZYFS_DEBUG") != ""},
	})
	if err != nil {
		return nil, fmt.Errorf("lazyfs: mount %s: %w", mountpoint, err)
	}
	return f, nil
}

// Mountpoint is where the filesystem is mounted.
func (f *FS) Mountpoint() string { return f.mnt }

// Backing is the directory the filesystem serves.
func (f *FS) Backing() string { return f.backing }

// Syncs counts the syncs (of files and directories) that made something durable, and
// those SkipSync turned into no-ops.
func (f *FS) Syncs() (made, skipped int64) { return f.syncs.Load(), f.skipped.Load() }

// Freeze is the moment of the power cut: every operation from now on fails with EIO,
// and one under way finishes first. Cut freezes too; Freeze alone lets a test cut
// several filesystems at one moment and rewrite them after.
func (f *FS) Freeze() {
	f.mu.Lock()
	f.off.Store(true)
	f.mu.Unlock()
}

// Cut cuts the power: it freezes the filesystem, detaches the mount (processes that
// still hold files in it get EIO until they close them), and rewrites the backing
// directory to its durable state. The FS is dead after it; Mount the backing
// directory again to go on.
func (f *FS) Cut() error {
	f.cutOnce.Do(func() {
		f.Freeze()
		f.detach()
		f.mu.Lock()
		defer f.mu.Unlock()
		f.cutErr = f.restore()
	})
	return f.cutErr
}

// Unmount unmounts without a power cut (the backing directory keeps everything).
// After Cut it waits, a few seconds at most, for the detached mount to go.
func (f *FS) Unmount() error {
	if f.off.Load() {
		done := make(chan struct{})
		go func() { f.server.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
		return os.RemoveAll(f.attic)
	}
	var err error
	for range 20 {
		if err = f.server.Unmount(); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		// Still busy (a test that failed with a file open): take it away anyway.
		f.detach()
		return fmt.Errorf("lazyfs: unmount %s: %w", f.mnt, err)
	}
	f.server.Wait()
	return os.RemoveAll(f.attic)
}

// detach takes the mount away from the namespace at once, busy or not.
func (f *FS) detach() {
	if err := syscall.Unmount(f.mnt, syscall.MNT_DETACH); err == nil {
		return
	}
	for _, prog := range []string{"fusermount3", "fusermount"} {
		if exec.Command(prog, "-u", "-z", f.mnt).Run() == nil {
			return
		}
	}
}

// lstat returns the inode number and mode of path.
func lstat(path string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Lstat(path, &st)
	return st, err
}

func isDir(st unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFDIR }

// atticPath is where inode ino is kept while only a durable entry names it.
func (f *FS) atticPath(ino uint64) string {
	return filepath.Join(f.attic, strconv.FormatUint(ino, 10))
}

// liveEntries lists directory path as names → inode numbers.
func liveEntries(path string) (map[string]uint64, error) {
	des, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	m := make(map[string]uint64, len(des))
	for _, de := range des {
		st, err := lstat(filepath.Join(path, de.Name()))
		if err != nil {
			return nil, err
		}
		m[de.Name()] = st.Ino
	}
	return m, nil
}

// ensureDir records the durable entries of directory path before it changes: its
// live entries, if it has not changed since its last sync. f.mu is held.
func (f *FS) ensureDir(path string) error {
	st, err := lstat(path)
	if err != nil {
		return err
	}
	if _, ok := f.dirs[st.Ino]; ok {
		return nil
	}
	m, err := liveEntries(path)
	if err != nil {
		return err
	}
	f.dirs[st.Ino] = &dirState{entries: m}
	return nil
}

// referenced reports whether a durable entry of a changed directory names ino (an
// unchanged directory's durable entries are its live ones).
func (f *FS) referenced(ino uint64) bool {
	for _, d := range f.dirs {
		for _, e := range d.entries {
			if e == ino {
				return true
			}
		}
	}
	return false
}

// keep is called before a name of the inode at path goes (an unlink, a rename over
// it): an inode a durable entry names gets a hard link in the attic, so its data
// outlives its live names. f.mu is held.
func (f *FS) keep(path string, st unix.Stat_t) error {
	if !f.referenced(st.Ino) || f.inAttic[st.Ino] {
		return nil
	}
	if err := os.Link(path, f.atticPath(st.Ino)); err != nil {
		return err
	}
	f.inAttic[st.Ino] = true
	return nil
}

// keepDir is called before directory path goes (rmdir, a rename over it): a
// directory a durable entry names moves to the attic instead of going, and reports
// true; otherwise its state goes with it. f.mu is held.
func (f *FS) keepDir(path string, st unix.Stat_t) (bool, error) {
	if err := f.ensureDir(path); err != nil {
		return false, err
	}
	if !f.referenced(st.Ino) {
		delete(f.dirs, st.Ino)
		return false, nil
	}
	if err := os.Rename(path, f.atticPath(st.Ino)); err != nil {
		return false, err
	}
	f.inAttic[st.Ino] = true
	return true, nil
}

// gone forgets a regular file whose last link went (unless the attic keeps it).
func (f *FS) gone(st unix.Stat_t) {
	if st.Nlink <= 1 && !f.inAttic[st.Ino] {
		delete(f.files, st.Ino)
	}
}

// dirSynced makes directory ino's entries durable, and lets the attic go of what no
// durable entry names any more. f.mu is held.
func (f *FS) dirSynced(ino uint64) {
	f.syncs.Add(1)
	delete(f.dirs, ino)
	for changed := true; changed; {
		changed = false
		for a := range f.inAttic {
			if f.referenced(a) {
				continue
			}
			p := f.atticPath(a)
			st, err := lstat(p)
			if err == nil {
				if isDir(st) {
					delete(f.dirs, a)
					err = os.Remove(p)
				} else {
					err = os.Remove(p)
					if st.Nlink <= 1 {
						delete(f.files, a)
					}
				}
			}
			if err != nil && !os.IsNotExist(err) {
				continue // kept; tried again at the next sync
			}
			delete(f.inAttic, a)
			changed = true
		}
	}
}

// file returns the state of the regular file open as fd, recording it first if it
// has not changed since its last sync. f.mu is held.
func (f *FS) file(ino uint64, fd int) (*fileState, error) {
	if s, ok := f.files[ino]; ok {
		return s, nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	s := &fileState{size: st.Size, pages: map[int64][]byte{}}
	f.files[ino] = s
	return s, nil
}

// preserve saves the durable contents of the pages of [lo, hi) below the durable
// size, before they are overwritten. f.mu is held.
func (s *fileState) preserve(fd int, lo, hi int64) error {
	hi = min(hi, s.size)
	if lo >= hi {
		return nil
	}
	for p := lo / pageSize; p*pageSize < hi; p++ {
		if _, ok := s.pages[p]; ok {
			continue
		}
		buf := make([]byte, min(pageSize, s.size-p*pageSize))
		n, err := unix.Pread(fd, buf, p*pageSize)
		if err != nil {
			return err
		}
		s.pages[p] = buf[:n]
	}
	return nil
}

// write is a write of data at off to the file open as fd.
func (f *FS) write(ino uint64, fd int, data []byte, off int64) (int, error) {
	s, err := f.file(ino, fd)
	if err != nil {
		return 0, err
	}
	if err := s.preserve(fd, off, off+int64(len(data))); err != nil {
		return 0, err
	}
	return unix.Pwrite(fd, data, off)
}

// truncate sets the size of the file open as fd.
func (f *FS) truncate(ino uint64, fd int, size int64) error {
	s, err := f.file(ino, fd)
	if err != nil {
		return err
	}
	if err := s.preserve(fd, size, s.size); err != nil {
		return err
	}
	return unix.Ftruncate(fd, size)
}

// allocate is fallocate(2) on the file open as fd: a mode that changes contents
// (punching a hole, zeroing, collapsing or inserting a range) saves what it changes
// first; plain allocation changes no data below the durable size.
func (f *FS) allocate(ino uint64, fd int, off, size int64, mode uint32) error {
	const changesData = unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_COLLAPSE_RANGE | unix.FALLOC_FL_INSERT_RANGE
	if mode&changesData != 0 {
		s, err := f.file(ino, fd)
		if err != nil {
			return err
		}
		hi := off + size
		if mode&(unix.FALLOC_FL_COLLAPSE_RANGE|unix.FALLOC_FL_INSERT_RANGE) != 0 {
			hi = s.size // everything after off moves
		}
		if err := s.preserve(fd, off, hi); err != nil {
			return err
		}
	}
	return unix.Fallocate(fd, mode, off, size)
}

// fileSynced makes a regular file's data and size durable.
func (f *FS) fileSynced(ino uint64, rel string) {
	if f.opts.SkipSync != nil && f.opts.SkipSync(rel) {
		f.skipped.Add(1)
		return
	}
	f.syncs.Add(1)
	delete(f.files, ino)
}
