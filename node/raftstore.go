package node

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	walfs "github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"go.etcd.io/bbolt"
)

// The Raft log backends: the store under Raft's log and its stable state (current term,
// vote). A data dir keeps the one it was created with (see openRaftLog).
const (
	// RaftLogBolt is raft-boltdb: log and stable state in one bbolt file, raft.db. Every
	// append commits a bbolt transaction, which syncs twice (the pages, then the meta
	// page that points at them).
	RaftLogBolt = "bolt"
	// RaftLogWAL is raft-wal (Consul's "wal" backend): the log in append-only segment
	// files under wal/, synced once per append; the stable state and the segment list
	// in a small bbolt file beside them, written only on a new term or vote, a new
	// segment or a truncation.
	RaftLogWAL = "wal"

	// DefaultRaftLog is the backend a new data dir gets when the configuration names
	// none. The one place that chooses it. wal, from the numbers of bench/run.sh
	// (2026-11-30, same run): one sync per append instead of two doubles a lone
	// client's new operations (1.8x on three nodes, 2.0x on one) and is level with bolt
	// or ahead at 16 to 256 clients, and jepsen-lite's kill and storage families are
	// clean on both.
	DefaultRaftLog = RaftLogWAL

	// DefaultRaftWALSegmentBytes is the size of a raft-wal segment file (raft-wal's and
	// Consul's default). Compaction frees the log's disk space a whole segment at a
	// time, and a follower needs a snapshot only once the entries it lacks are in a
	// deleted segment: the leader still serves them from a segment it keeps.
	DefaultRaftWALSegmentBytes = 64 << 20
	// maxRaftWALSegmentBytes bounds the segment size (raft-wal preallocates each
	// segment file with a 32-bit size).
	maxRaftWALSegmentBytes = 1 << 30
)

// RaftLogs lists the backends Config.RaftLog accepts (besides "", the data dir's own).
var RaftLogs = []string{RaftLogBolt, RaftLogWAL}

// checkRaftLog reports a backend name or a segment size Config does not accept.
func checkRaftLog(name string, walSegmentBytes int) error {
	if name != "" && !slices.Contains(RaftLogs, name) {
		return fmt.Errorf("node: unknown raft log backend %q; want one of %v", name, RaftLogs)
	}
	if walSegmentBytes < 0 || walSegmentBytes > maxRaftWALSegmentBytes {
		return fmt.Errorf("node: raft-wal segment size %d bytes; want at most %d", walSegmentBytes, maxRaftWALSegmentBytes)
	}
	return nil
}

// ErrRaftLogMismatch marks a configuration whose Raft log backend is not the one the
// data dir holds. A node never converts a log in place: docs/operations.md ("Raft log
// backends") moves a node to the other backend by rejoining it with an empty data dir.
var ErrRaftLogMismatch = errors.New("node: raft log backend differs from the data dir's")

// The names in the data dir. raftLogMarker records the backend so that a restart
// without a choice keeps it and one with the other choice is refused.
const (
	raftLogMarker = "raft-log"
	boltLogFile   = "raft.db"
	walLogDir     = "wal"
)

// raftLogStore is a Raft log and stable store in one, as both backends are.
type raftLogStore interface {
	raft.LogStore
	raft.StableStore
	io.Closer
}

// chooseRaftLog settles the backend of dataDir, which must exist: the one it records,
// else the one it holds (a data dir from before the marker holds raft.db), else the
// one asked for, else DefaultRaftLog. asked ("" for no choice) must agree with what
// the data dir has. It records the outcome before any store exists, so a crash between
// leaves a data dir that reopens with the same backend.
func chooseRaftLog(dataDir, asked string) (string, error) {
	have, recorded, err := dataDirRaftLog(dataDir)
	if err != nil {
		return "", err
	}
	switch {
	case have == "":
		have = cmp.Or(asked, DefaultRaftLog)
	case asked != "" && asked != have:
		return "", fmt.Errorf("%w: the data dir %s holds a %q raft log and the configuration asks for %q "+
			"(leave --raft-log out to keep the data dir's; to move this node to %q, remove it from the "+
			"cluster, empty its data dir and start it again with --join: docs/operations.md, \"Raft log backends\")",
			ErrRaftLogMismatch, dataDir, have, asked, asked)
	}
	if !recorded {
		if err := writeFileSynced(dataDir, raftLogMarker, []byte(have+"\n")); err != nil {
			return "", fmt.Errorf("node: record the raft log backend: %w", err)
		}
	}
	return have, nil
}

// dataDirRaftLog reports the backend dataDir records or, if it records none, holds; ""
// for a data dir with no Raft log yet.
func dataDirRaftLog(dataDir string) (backend string, recorded bool, err error) {
	b, err := os.ReadFile(filepath.Join(dataDir, raftLogMarker))
	switch {
	case err == nil:
		backend = strings.TrimSpace(string(b))
		if !slices.Contains(RaftLogs, backend) {
			return "", false, fmt.Errorf("node: %s names the raft log backend %q; want one of %v",
				filepath.Join(dataDir, raftLogMarker), backend, RaftLogs)
		}
		return backend, true, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", false, fmt.Errorf("node: read the raft log backend: %w", err)
	}
	bolt, err := exists(filepath.Join(dataDir, boltLogFile))
	if err != nil {
		return "", false, err
	}
	wal, err := exists(filepath.Join(dataDir, walLogDir))
	if err != nil {
		return "", false, err
	}
	switch {
	case bolt && wal:
		return "", false, fmt.Errorf("node: the data dir %s holds both %s and %s/ and no %s file to say which is the raft log",
			dataDir, boltLogFile, walLogDir, raftLogMarker)
	case bolt:
		return RaftLogBolt, false, nil
	case wal:
		return RaftLogWAL, false, nil
	}
	return "", false, nil
}

func exists(path string) (bool, error) {
	_, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// writeFileSynced replaces dir/name with data so that a crash leaves the old file or
// the new one: it writes a temporary file, syncs it, renames it into place and syncs
// the directory.
func writeFileSynced(dir, name string, data []byte) error {
	tmp, err := os.CreateTemp(dir, name+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after the rename
	if _, err := tmp.Write(data); err != nil {
		return errors.Join(err, tmp.Close())
	}
	if err := tmp.Sync(); err != nil {
		return errors.Join(err, tmp.Close())
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return err
	}
	return syncPath(dir)
}

// openRaftLog opens (or creates) the Raft log of dataDir in the given backend;
// walSegmentBytes sizes the segment files raft-wal creates from now on.
//
// The log's files are synced before it opens. A process killed between a write and its
// sync leaves the write in the page cache, where the next process reads it as if it were
// on disk: bbolt and raft-wal's recovery both take the last commit they find, and Raft
// then tells a leader it holds those entries, and the leader may count them toward a
// commit. Were the power to go before the kernel wrote them back, a log that had
// reported them would have lost them.
func openRaftLog(dataDir, backend string, walSegmentBytes int, hlog hclog.Logger) (raftLogStore, error) {
	if err := syncRaftLogFiles(dataDir, backend); err != nil {
		return nil, fmt.Errorf("node: raft log (%s): syncing what a previous process wrote: %w", backend, err)
	}
	switch backend {
	case RaftLogBolt:
		// Once the log has been compacted, raft.db is mostly free pages; syncing the
		// free list on every commit then rewrites it all each time. Without it, bbolt
		// rebuilds the free list by a scan when it opens, which costs far less than it
		// saves.
		opts := &bbolt.Options{Timeout: time.Second, NoFreelistSync: true, FreelistType: bbolt.FreelistMapType}
		s, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dataDir, boltLogFile), BoltOptions: opts})
		if err != nil {
			return nil, fmt.Errorf("node: raft log (%s): %w", backend, err)
		}
		// bbolt syncs the file it may just have created, never the directory holding it.
		if err := syncPath(dataDir); err != nil {
			return nil, errors.Join(fmt.Errorf("node: raft log (%s): %w", backend, err), s.Close())
		}
		return s, nil
	case RaftLogWAL:
		dir := filepath.Join(dataDir, walLogDir)
		if err := makeDir(dir); err != nil {
			return nil, fmt.Errorf("node: raft log (%s): %w", backend, err)
		}
		// The files read raft-wal's speculative frame reads short once the log is
		// open (walread.go); its recovery of the last segment reads them in full.
		armed := new(atomic.Bool)
		fsys := shortReadWALFS{privateWALFS{walfs.New()}, armed}
		// A zero size is raft-wal's default, which is ours; the meta store's repair
		// (walrotation.go) records the size of the segment it adds.
		size := cmp.Or(walSegmentBytes, DefaultRaftWALSegmentBytes)
		sf := segment.NewFiler(dir, fsys)
		w, err := wal.Open(dir, wal.WithLogger(hlog.Named("wal")), wal.WithSegmentSize(size),
			wal.WithSegmentFiler(sf), wal.WithMetaStore(newRotatingMeta(dir, fsys, sf, size, hlog.Named("wal"))))
		if err != nil {
			return nil, fmt.Errorf("node: raft log (%s): %w", backend, err)
		}
		armed.Store(true)
		// raft-wal opens its meta store (the term, the vote, the segment list) 0644.
		if err := makePrivate(filepath.Join(dir, metadb.FileName)); err != nil {
			return nil, errors.Join(fmt.Errorf("node: raft log (%s): %w", backend, err), w.Close())
		}
		return w, nil
	}
	return nil, fmt.Errorf("node: unknown raft log backend %q", backend)
}

// syncRaftLogFiles syncs the files of dataDir's Raft log in backend, those there are:
// raft.db, or every file in wal/ (the segments and the meta store) and wal/ itself.
func syncRaftLogFiles(dataDir, backend string) error {
	var files []string
	switch backend {
	case RaftLogBolt:
		files = []string{filepath.Join(dataDir, boltLogFile)}
	case RaftLogWAL:
		dir := filepath.Join(dataDir, walLogDir)
		des, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, de := range des {
			if de.Type().IsRegular() {
				files = append(files, filepath.Join(dir, de.Name()))
			}
		}
		if err := syncPath(dir); err != nil {
			return err
		}
	}
	for _, name := range files {
		if err := syncPath(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// monotonicLog declares a wrapped log store monotonic (see keepMonotonic).
type monotonicLog struct{ raft.LogStore }

func (monotonicLog) IsMonotonic() bool { return true }

// keepMonotonic passes the opened log store's raft.MonotonicLogStore promise on to the
// store a WrapRaftStores hook put in front of it. raft-wal refuses an append that
// leaves a gap; Raft avoids the gap after installing a snapshot, by emptying the log,
// only when the log it is given says it is monotonic. A wrapper that embeds
// raft.LogStore hides the method: a follower of a wal backend would then fail every
// append after its first snapshot install. Emptying the log then is right for any
// store, so the promise is kept even for a store that replaces the original.
func keepMonotonic(opened, wrapped raft.LogStore) raft.LogStore {
	m, ok := opened.(raft.MonotonicLogStore)
	if !ok || !m.IsMonotonic() {
		return wrapped
	}
	if _, ok := wrapped.(raft.MonotonicLogStore); ok {
		return wrapped
	}
	return monotonicLog{wrapped}
}
