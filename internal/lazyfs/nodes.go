package lazyfs

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is go-fuse's loopback node with every operation that changes a directory or a
// file's size routed through the model, and every operation refused after the cut.
// Data goes through file, the handle every open returns: it does not embed the
// loopback's handle, whose kernel passthrough would send writes around the model.
type node struct {
	*fs.LoopbackNode
	lz *FS
}

// WrapChild makes every node the loopback creates one of ours.
func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	if l, ok := ops.(*fs.LoopbackNode); ok {
		return &node{LoopbackNode: l, lz: n.lz}
	}
	return ops
}

var (
	_ fs.NodeLookuper       = (*node)(nil)
	_ fs.NodeWrapChilder    = (*node)(nil)
	_ fs.NodeGetattrer      = (*node)(nil)
	_ fs.NodeStatxer        = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeMkdirer        = (*node)(nil)
	_ fs.NodeMknoder        = (*node)(nil)
	_ fs.NodeUnlinker       = (*node)(nil)
	_ fs.NodeRmdirer        = (*node)(nil)
	_ fs.NodeRenamer        = (*node)(nil)
	_ fs.NodeLinker         = (*node)(nil)
	_ fs.NodeSymlinker      = (*node)(nil)
	_ fs.NodeReadlinker     = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeCopyFileRanger = (*node)(nil)
	_ fs.NodeSetxattrer     = (*node)(nil)
	_ fs.NodeRemovexattrer  = (*node)(nil)

	_ fs.FileReader    = (*file)(nil)
	_ fs.FileWriter    = (*file)(nil)
	_ fs.FileFsyncer   = (*file)(nil)
	_ fs.FileAllocater = (*file)(nil)
	_ fs.FileReleaser  = (*file)(nil)
	_ fs.FileGetattrer = (*file)(nil)
	_ fs.FileLseeker   = (*file)(nil)
	_ fs.FileFlusher   = (*file)(nil)

	_ fs.FileFsyncdirer   = (*dirHandle)(nil)
	_ fs.FileReaddirenter = (*dirHandle)(nil)
	_ fs.FileReleasedirer = (*dirHandle)(nil)
	_ fs.FileSeekdirer    = (*dirHandle)(nil)
)

const eio = syscall.EIO

// full is the node's path in the backing directory; rel, relative to the mount.
func (n *node) full() string { return filepath.Join(n.RootData.Path, n.Path(nil)) }

func errno(err error) syscall.Errno { return fs.ToErrno(err) }

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.lz.off.Load() {
		return nil, eio
	}
	return n.LoopbackNode.Lookup(ctx, name, out)
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if n.lz.off.Load() {
		return eio
	}
	return n.LoopbackNode.Getattr(ctx, f, out)
}

func (n *node) Statx(ctx context.Context, f fs.FileHandle, flags, mask uint32, out *fuse.StatxOut) syscall.Errno {
	if n.lz.off.Load() {
		return eio
	}
	return n.LoopbackNode.Statx(ctx, f, flags, mask, out)
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	if n.lz.off.Load() {
		return nil, eio
	}
	return n.LoopbackNode.Readlink(ctx)
}

// Setattr routes a change of size through the model; the rest (mode, owner, times)
// is not modelled: it passes through and survives a cut.
func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	lz := n.lz
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if lz.off.Load() {
		return eio
	}
	if size, ok := in.GetSize(); ok {
		if h, ok := f.(*file); ok {
			if err := lz.truncate(h.ino, h.fd, int64(size)); err != nil {
				return errno(err)
			}
		} else {
			fd, err := unix.Open(n.full(), unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				return errno(err)
			}
			var st unix.Stat_t
			err = unix.Fstat(fd, &st)
			if err == nil {
				err = lz.truncate(st.Ino, fd, int64(size))
			}
			unix.Close(fd)
			if err != nil {
				return errno(err)
			}
		}
		rest := *in
		rest.Valid &^= fuse.FATTR_SIZE
		in = &rest
	}
	return n.LoopbackNode.Setattr(ctx, f, in, out)
}

// readable opens a write-only file read-write in the backing directory: the undo
// log reads what a write overwrites.
func readable(flags uint32) uint32 {
	if flags&syscall.O_ACCMODE == syscall.O_WRONLY {
		return flags&^syscall.O_ACCMODE | syscall.O_RDWR
	}
	return flags
}

// wrap makes the loopback's handle of a just opened file one of ours.
func (n *node) wrap(h fs.FileHandle) (*file, syscall.Errno) {
	lf, ok := h.(*fs.LoopbackFile)
	if !ok {
		return nil, syscall.ENOTSUP
	}
	fd, ok := lf.PassthroughFd()
	if !ok {
		lf.Release(context.Background())
		return nil, syscall.EBADF
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		lf.Release(context.Background())
		return nil, errno(err)
	}
	return &file{lz: n.lz, n: n, lf: lf, fd: fd, ino: st.Ino}, 0
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	lz := n.lz
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if lz.off.Load() {
		return nil, nil, 0, eio
	}
	_, err := lstat(filepath.Join(n.full(), name))
	existed := err == nil
	if !existed {
		if err := lz.ensureDir(n.full()); err != nil {
			return nil, nil, 0, errno(err)
		}
	}
	trunc := existed && flags&syscall.O_TRUNC != 0
	flags = readable(flags &^ syscall.O_TRUNC)
	ch, h, fuseFlags, e := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if e != 0 {
		return nil, nil, 0, e
	}
	cn, _ := ch.Operations().(*node)
	if cn == nil {
		cn = n
	}
	f, e := cn.wrap(h)
	if e != 0 {
		return nil, nil, 0, e
	}
	if !existed {
		lz.files[f.ino] = &fileState{pages: map[int64][]byte{}}
	}
	if trunc {
		if err := lz.truncate(f.ino, f.fd, 0); err != nil {
			f.lf.Release(ctx)
			return nil, nil, 0, errno(err)
		}
	}
	return ch, f, fuseFlags, 0
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	lz := n.lz
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if lz.off.Load() {
		return nil, 0, eio
	}
	trunc := flags&syscall.O_TRUNC != 0
	flags = readable(flags &^ syscall.O_TRUNC)
	h, fuseFlags, e := n.LoopbackNode.Open(ctx, flags)
	if e != 0 {
		return nil, 0, e
	}
	f, e := n.wrap(h)
	if e != 0 {
		return nil, 0, e
	}
	if trunc {
		if err := lz.truncate(f.ino, f.fd, 0); err != nil {
			f.lf.Release(ctx)
			return nil, 0, errno(err)
		}
	}
	return f, fuseFlags, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	lz := n.lz
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if lz.off.Load() {
		return nil, eio
	}
	if err := lz.ensureDir(n.full()); err != nil {
		return nil, errno(err)
	}
	ch, e := n.LoopbackNode.Mkdir(ctx, name, mode, out)
	if e != 0 {
		return nil, e
	}
	// A new directory is durably empty until it is synced.
	if st, err := lstat(filepath.Join(n.full(), name)); err == nil {
		lz.dirs[st.Ino] = &dirState{entries: map[string]uint64{}}
	}
	return ch, 0
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	lz := n.lz
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if lz.off.Load() {
		return nil, eio
	}
	if err := lz.ensureDir(n.full()); err != nil {
		return nil, errno(err)
	}
	ch, e := n.LoopbackNode.Mknod(ctx, name, mode, rdev, out)
	if e != 0 {
		return nil, e
	}
	if st, err := lstat(filepath.Join(n.full(), name)); err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
		lz.files[st.Ino] = &fileState{pages: map[int64][]byte{}}
	}
	return ch, 0
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	lz := n.lz
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if lz.off.Load() {
		return eio
	}
	p := filepath.Join(n.full(), name)
	st, err := lstat(p)
	if err != nil {
		return errno(err)
	}
	if err := lz.ensureDir(n.full()); err != nil {
		return errno(err)
	}
	if err := lz.keep(p, st); err != nil {
		return errno(err)
	}
	if e := n.LoopbackNode.Unlink(ctx, name); e != 0 {
		return e
	}
	lz.gone(st)
	return 0
}

// emptyDir reports whether directory path has no entries.
func emptyDir(path string) (bool, error) {
	d, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer d.Close()
	names, err := d.Readdirnames(1)
	if len(names) > 0 {
		return false, nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return true, nil
	}
	return false, err
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	lz := n.lz
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if lz.off.Load() {
		return eio
	}
	p := filepath.Join(n.full(), name)
	st, err := lstat(p)
	if err != nil {
		return errno(err)
	}
	if !isDir(st) {
		return syscall.ENOTDIR
	}
	if empty, err := emptyDir(p); err != nil {
		return errno(err)
	} else if !empty {
		return syscall.ENOTEMPTY
	}
	if err := lz.ensureDir(n.full()); err != nil {
		return errno(err)
	}
	moved, err := lz.keepDir(p, st)
	if err != nil {
		return errno(err)
	}
	if moved {
		return 0
	}
	return n.LoopbackNode.Rmdir(ctx, name)
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	lz := n.lz
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if lz.off.Load() {
		return eio
	}
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	if flags&unix.RENAME_EXCHANGE != 0 {
		return syscall.ENOTSUP
	}
	src, dst := filepath.Join(n.full(), name), filepath.Join(np.full(), newName)
	sst, err := lstat(src)
	if err != nil {
		return errno(err)
	}
	if err := lz.ensureDir(n.full()); err != nil {
		return errno(err)
	}
	if err := lz.ensureDir(np.full()); err != nil {
		return errno(err)
	}
	dst0, err := lstat(dst)
	replaces := err == nil && dst0.Ino != sst.Ino
	if replaces {
		if flags&unix.RENAME_NOREPLACE != 0 {
			return syscall.EEXIST
		}
		switch {
		case isDir(dst0) && !isDir(sst):
			return syscall.EISDIR
		case !isDir(dst0) && isDir(sst):
			return syscall.ENOTDIR
		case isDir(dst0):
			if empty, err := emptyDir(dst); err != nil {
				return errno(err)
			} else if !empty {
				return syscall.ENOTEMPTY
			}
			if _, err := lz.keepDir(dst, dst0); err != nil {
				return errno(err)
			}
		default:
			if err := lz.keep(dst, dst0); err != nil {
				return errno(err)
			}
		}
	}
	if e := n.LoopbackNode.Rename(ctx, name, newParent, newName, flags); e != 0 {
		return e
	}
	if replaces && !isDir(dst0) {
		lz.gone(dst0)
	}
	return 0
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	lz := n.lz
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if lz.off.Load() {
		return nil, eio
	}
	if err := lz.ensureDir(n.full()); err != nil {
		return nil, errno(err)
	}
	return n.LoopbackNode.Link(ctx, target, name, out)
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	lz := n.lz
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if lz.off.Load() {
		return nil, eio
	}
	if err := lz.ensureDir(n.full()); err != nil {
		return nil, errno(err)
	}
	return n.LoopbackNode.Symlink(ctx, target, name, out)
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if n.lz.off.Load() {
		return eio
	}
	return n.LoopbackNode.Setxattr(ctx, attr, data, flags)
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if n.lz.off.Load() {
		return eio
	}
	return n.LoopbackNode.Removexattr(ctx, attr)
}

// CopyFileRange is refused, so the kernel copies through reads and writes the model
// sees.
func (n *node) CopyFileRange(context.Context, fs.FileHandle, uint64, *fs.Inode, fs.FileHandle, uint64, uint64, uint64) (uint32, syscall.Errno) {
	return 0, syscall.ENOSYS
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if n.lz.off.Load() {
		return nil, 0, eio
	}
	st, err := lstat(n.full())
	if err != nil {
		return nil, 0, errno(err)
	}
	ds, e := fs.NewLoopbackDirStream(n.full())
	if e != 0 {
		return nil, 0, e
	}
	return &dirHandle{ds: ds, lz: n.lz, ino: st.Ino}, 0, 0
}

// file is an open regular file.
type file struct {
	lz  *FS
	n   *node
	lf  *fs.LoopbackFile
	fd  int
	ino uint64
}

func (f *file) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if f.lz.off.Load() {
		return nil, eio
	}
	return f.lf.Read(ctx, buf, off)
}

func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	lz := f.lz
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if lz.off.Load() {
		return 0, eio
	}
	n, err := lz.write(f.ino, f.fd, data, off)
	return uint32(max(n, 0)), errno(err)
}

// Fsync is fsync and fdatasync alike: both make the data and the size durable.
func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	lz := f.lz
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if lz.off.Load() {
		return eio
	}
	lz.fileSynced(f.ino, f.n.Path(nil))
	return 0
}

func (f *file) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	lz := f.lz
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if lz.off.Load() {
		return eio
	}
	return errno(lz.allocate(f.ino, f.fd, int64(off), int64(size), mode))
}

func (f *file) Flush(ctx context.Context) syscall.Errno {
	if f.lz.off.Load() {
		return eio
	}
	return f.lf.Flush(ctx)
}

func (f *file) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	if f.lz.off.Load() {
		return eio
	}
	return f.lf.Getattr(ctx, out)
}

func (f *file) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	if f.lz.off.Load() {
		return 0, eio
	}
	return f.lf.Lseek(ctx, off, whence)
}

// Release closes the file even after the cut; the state of a file with no name left
// goes with its last handle.
func (f *file) Release(ctx context.Context) syscall.Errno {
	lz := f.lz
	lz.mu.Lock()
	if !lz.off.Load() {
		var st unix.Stat_t
		if unix.Fstat(f.fd, &st) == nil && st.Nlink == 0 {
			delete(lz.files, f.ino)
		}
	}
	lz.mu.Unlock()
	return f.lf.Release(ctx)
}

// dirHandle is an open directory: the loopback's stream, with its sync routed through
// the model.
type dirHandle struct {
	ds  fs.DirStream
	lz  *FS
	ino uint64
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if d.lz.off.Load() {
		return nil, eio
	}
	return d.ds.(fs.FileReaddirenter).Readdirent(ctx)
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if d.lz.off.Load() {
		return eio
	}
	return d.ds.(fs.FileSeekdirer).Seekdir(ctx, off)
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	d.ds.(fs.FileReleasedirer).Releasedir(ctx, flags)
}

func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	lz := d.lz
	lz.mu.Lock()
	defer lz.mu.Unlock()
	if lz.off.Load() {
		return eio
	}
	lz.dirSynced(d.ino)
	return 0
}
