package lazyfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// restore rewrites the backing directory to its durable state. The filesystem is
// frozen and f.mu held.
//
// It puts back the durable contents of every file written since its last sync (in
// place: the inode is the same wherever its names are), then builds the durable tree
// from the root down in a fresh directory, hard-linking each file's inode under its
// durable names, and swaps that tree in.
func (f *FS) restore() error {
	where := map[uint64]string{} // inode → a path of it, live or in the attic
	for _, top := range []string{f.backing, f.attic} {
		err := filepath.WalkDir(top, func(p string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			st, err := lstat(p)
			if err != nil {
				return err
			}
			if _, ok := where[st.Ino]; !ok {
				where[st.Ino] = p
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("lazyfs: restore: %w", err)
		}
	}
	for name := range f.inAttic {
		if _, ok := where[name]; !ok {
			return fmt.Errorf("lazyfs: restore: inode %d lost from the attic", name)
		}
	}
	for ino, s := range f.files {
		p, ok := where[ino]
		if !ok {
			continue // an open file with no name left, durable or live
		}
		if err := s.putBack(p); err != nil {
			return fmt.Errorf("lazyfs: restore %s: %w", p, err)
		}
	}
	rootSt, err := lstat(f.backing)
	if err != nil {
		return err
	}
	fresh := f.backing + ".durable"
	if err := os.RemoveAll(fresh); err != nil {
		return err
	}
	if err := os.Mkdir(fresh, os.FileMode(rootSt.Mode&0o7777)); err != nil {
		return err
	}
	onPath := map[uint64]bool{rootSt.Ino: true}
	placed := map[uint64]bool{}
	if err := f.build(rootSt.Ino, fresh, where, onPath, placed); err != nil {
		return fmt.Errorf("lazyfs: restore: %w", err)
	}
	// Swap the contents: the backing directory itself stays (a mount of it, or a
	// process's working directory, may name it).
	old := f.backing + ".old"
	if err := os.RemoveAll(old); err != nil {
		return err
	}
	if err := os.Mkdir(old, 0o700); err != nil {
		return err
	}
	if err := moveAll(f.backing, old); err != nil {
		return err
	}
	if err := moveAll(fresh, f.backing); err != nil {
		return err
	}
	f.files, f.dirs, f.inAttic = map[uint64]*fileState{}, map[uint64]*dirState{}, map[uint64]bool{}
	return errors.Join(os.RemoveAll(old), os.RemoveAll(fresh), os.RemoveAll(f.attic), os.Mkdir(f.attic, 0o700))
}

// putBack writes a file's durable pages back and cuts it to its durable size.
func (s *fileState) putBack(path string) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	for p, buf := range s.pages {
		if _, err := unix.Pwrite(fd, buf, p*pageSize); err != nil {
			return err
		}
	}
	return unix.Ftruncate(fd, s.size)
}

// durableEntries are the entries of directory ino at the cut.
func (f *FS) durableEntries(ino uint64, where map[uint64]string) (map[string]uint64, error) {
	if d, ok := f.dirs[ino]; ok {
		return d.entries, nil
	}
	p, ok := where[ino]
	if !ok {
		return nil, fmt.Errorf("directory inode %d has no path", ino)
	}
	return liveEntries(p)
}

// build makes in dst the durable entries of directory ino. onPath holds the
// directories above (the per-directory model can name a directory under itself
// after renames synced in one directory but not the other: such an entry is
// dropped, as is a second name of a directory).
func (f *FS) build(ino uint64, dst string, where map[uint64]string, onPath, placed map[uint64]bool) error {
	entries, err := f.durableEntries(ino, where)
	if err != nil {
		return err
	}
	for name, child := range entries {
		src, ok := where[child]
		if !ok {
			return fmt.Errorf("%s names inode %d, which is gone", filepath.Join(dst, name), child)
		}
		st, err := lstat(src)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, name)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if onPath[child] || placed[child] {
				continue
			}
			placed[child] = true
			if err := os.Mkdir(target, os.FileMode(st.Mode&0o777)); err != nil {
				return err
			}
			onPath[child] = true
			err := f.build(child, target, where, onPath, placed)
			delete(onPath, child)
			if err != nil {
				return err
			}
		case unix.S_IFLNK:
			to, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(to, target); err != nil {
				return err
			}
		default:
			if err := os.Link(src, target); err != nil {
				return err
			}
		}
	}
	return nil
}

// moveAll renames every entry of from into to.
func moveAll(from, to string) error {
	des, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	for _, de := range des {
		if err := os.Rename(filepath.Join(from, de.Name()), filepath.Join(to, de.Name())); err != nil {
			return err
		}
	}
	return nil
}
