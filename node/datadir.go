package node

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	walfs "github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/types"

	"github.com/idemkv/idemkv/storage"
)

// The data dir holds every tenant's records, so nothing under it may be readable by
// another local user. os.MkdirAll(dir, 0o700) does nothing to a dir that exists (a
// Docker volume, a `mkdir -p` made under umask 022 are 0755), and the stores under it
// create their files 0644 and directories 0755: raft-wal's segments and wal-meta.db,
// Raft's file snapshot store, Pebble (storage makes its own files private). So the
// node makes the data dir private when it opens it, tightening whatever an older
// version or another tool left in it, and each store's new files private as they are
// created. It does not refuse to start on a dir that was open: the fix is its own to
// make, and an upgrade must not turn into a failed start. It refuses only a dir it
// cannot make private (owned by another user), saying so.

// privateDataDir creates dir PrivateDirMode, or makes the one that exists so, and
// removes the group and other bits of every file and directory already under it
// (symbolic links are left alone: a chmod would follow them out of the data dir). It
// logs what it changed, once.
func privateDataDir(dir string, log *slog.Logger) error {
	if err := makeDir(dir); err != nil {
		return fmt.Errorf("node: data dir: %w", err)
	}
	info, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("node: data dir: %w", err)
	}
	if !info.IsDir() {
		return fmt.Errorf("node: data dir %s is not a directory", dir)
	}
	if info.Mode().Perm() != storage.PrivateDirMode {
		if err := os.Chmod(dir, storage.PrivateDirMode); err != nil {
			return fmt.Errorf("node: data dir %s is %v and cannot be made %v (it holds every tenant's records; "+
				"run idemkv as the dir's owner, or chmod 700 it): %w", dir, info.Mode().Perm(), storage.PrivateDirMode, err)
		}
		log.Warn("made the data dir private: it was readable by other local users", "dir", dir,
			"was", info.Mode().Perm().String(), "now", storage.PrivateDirMode.String())
	}
	tightened := 0
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir || d.Type()&fs.ModeSymlink != 0 {
			return err
		}
		changed, err := dropGroupOther(path)
		if changed {
			tightened++
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("node: make the data dir private: %w", err)
	}
	if tightened > 0 {
		log.Warn("made files in the data dir private: they were readable by other local users", "dir", dir, "entries", tightened)
	}
	return nil
}

// dropGroupOther removes the group and other bits of path's mode, reporting whether
// there were any.
func dropGroupOther(path string) (bool, error) {
	info, err := os.Lstat(path)
	if err != nil {
		return false, err
	}
	perm := info.Mode().Perm()
	if perm&0o077 == 0 {
		return false, nil
	}
	return true, os.Chmod(path, perm&^0o077)
}

// makePrivate gives each of paths PrivateFileMode, or PrivateDirMode if it is a
// directory.
func makePrivate(paths ...string) error {
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			return err
		}
		mode := storage.PrivateFileMode
		if info.IsDir() {
			mode = storage.PrivateDirMode
		}
		if err := os.Chmod(p, mode); err != nil {
			return err
		}
	}
	return nil
}

// privateWALFS is raft-wal's filesystem with its segment files made private as they are
// created (raft-wal creates them 0644), before anything is written to them.
type privateWALFS struct{ *walfs.FS }

func (p privateWALFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	f, err := p.FS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	if err := makePrivate(filepath.Join(dir, name)); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	return f, nil
}

// snapshotsDir is where Raft's file snapshot store keeps its snapshots in a data dir.
const snapshotsDir = "snapshots"

// openSnapshotStore opens Raft's file snapshot store in dataDir, keeping two snapshots,
// with its directory and every snapshot it creates private (Raft makes them 0755 and
// 0666: a snapshot is every record of every tenant).
func openSnapshotStore(dataDir string, hlog hclog.Logger) (raft.SnapshotStore, error) {
	// Raft's store makes its directory with MkdirAll and never syncs the data dir;
	// makeDir does both first (issue 22, point 5).
	dir := filepath.Join(dataDir, snapshotsDir)
	if err := makeDir(dir); err != nil {
		return nil, fmt.Errorf("node: snapshot store: %w", err)
	}
	if err := removeUnfinishedSnapshots(dir, hlog); err != nil {
		return nil, fmt.Errorf("node: snapshot store: %w", err)
	}
	s, err := raft.NewFileSnapshotStoreWithLogger(dataDir, 2, hlog)
	if err != nil {
		return nil, fmt.Errorf("node: snapshot store: %w", err)
	}
	if err := makePrivate(dir); err != nil {
		return nil, fmt.Errorf("node: snapshot store: %w", err)
	}
	return &privateSnapshots{FileSnapshotStore: s, dir: dir}, nil
}

type privateSnapshots struct {
	*raft.FileSnapshotStore
	dir string
}

// Create makes the new snapshot's directory and the two files Raft has created in it
// private before the sink is handed out, so before any state is written; the rename
// that finishes the snapshot keeps the modes. It also syncs that directory: Raft
// syncs the files in it and, after the rename, snapshots/, never the snapshot's own
// directory, so on a file system that keeps only synced directory entries a power cut
// left the finished snapshot without its meta.json and state.bin. Raft then skipped
// it at start, found its log compacted past the last snapshot it could read, and
// panicked: every node of a cluster whose power was cut after its first log
// compaction (issue 22, point 5; TestPowerLossOnLazyFS). The files' names are made
// here, in Create (Close rewrites meta.json in place), so this one sync covers them.
func (p *privateSnapshots) Create(version raft.SnapshotVersion, index, term uint64, conf raft.Configuration,
	confIndex uint64, trans raft.Transport) (raft.SnapshotSink, error) {
	sink, err := p.FileSnapshotStore.Create(version, index, term, conf, confIndex, trans)
	if err != nil {
		return nil, err
	}
	// Raft's names: <dir>/<id>.tmp/{meta.json,state.bin} until the sink is closed.
	tmp := filepath.Join(p.dir, sink.ID()+unfinishedSnapshotSuffix)
	if err := makePrivate(tmp, filepath.Join(tmp, "meta.json"), filepath.Join(tmp, "state.bin")); err != nil {
		return nil, errors.Join(fmt.Errorf("node: snapshot store: %w", err), sink.Cancel())
	}
	if err := syncPath(tmp); err != nil {
		return nil, errors.Join(fmt.Errorf("node: snapshot store: %w", err), sink.Cancel())
	}
	return &unfinishedSink{SnapshotSink: sink, tmp: tmp}, nil
}

// unfinishedSnapshotSuffix ends the name of a snapshot's directory until Raft's sink is
// closed (Raft's tmpSuffix, which it does not export).
const unfinishedSnapshotSuffix = ".tmp"

// unfinishedSink is Raft's sink that removes the snapshot's directory whenever the
// snapshot does not finish. Raft's Cancel flushes its buffer before it removes the
// directory and returns at the flush's error, so a snapshot cancelled after a write
// error (a full disk) stayed, a part of a copy of the store, and Raft never lists
// or reaps a directory whose name ends in .tmp: each retry on a full disk left one
// more. Raft's Close likewise leaves it when writing meta.json or the rename fails.
type unfinishedSink struct {
	raft.SnapshotSink
	tmp string
}

func (s *unfinishedSink) Cancel() error {
	return errors.Join(s.SnapshotSink.Cancel(), os.RemoveAll(s.tmp))
}

func (s *unfinishedSink) Close() error {
	err := s.SnapshotSink.Close()
	if err != nil {
		// Once renamed (a later step failed), tmp is gone and the snapshot stays.
		err = errors.Join(err, os.RemoveAll(s.tmp))
	}
	return err
}

// removeUnfinishedSnapshots removes from dir, Raft's snapshots/, the directories of
// snapshots that never finished: a process killed while it wrote one (its own, or one
// a leader sent) leaves <id>.tmp with what it wrote of state.bin, up to a copy of the
// whole store, and Raft ignores it for good. Only the node that holds the data dir
// (Pebble's lock is taken first) writes snapshots in it, and none is being written
// before its snapshot store opens.
func removeUnfinishedSnapshots(dir string, hlog hclog.Logger) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	removed := false
	for _, e := range entries {
		if !e.IsDir() || !strings.HasSuffix(e.Name(), unfinishedSnapshotSuffix) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
		hlog.Warn("removed a snapshot that never finished (the node was stopped or failed while writing it)", "name", e.Name())
		removed = true
	}
	if removed {
		return syncPath(dir)
	}
	return nil
}
