package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Directories beside the store (dir is the store's, e.g. DATA/pebble):
//
//	dir.restore-new    a restore receives the new store here
//	dir.restore-old    the old store, for the instant between the two renames of a swap
//	dir.snapshot-N     a snapshot's checkpoint while it is written
//
// Each is removed once done with, and at the next open if a crash left it.
const (
	suffixStage    = ".restore-new"
	suffixReplaced = ".restore-old"
	suffixSnapshot = ".snapshot-"
)

// openMode says what a database is opened for.
type openMode int

const (
	openLive     openMode = iota // the store itself
	openLoad                     // a new database a restore fills record by record
	openReceived                 // received files, opened once to fix up and check
)

func (s *Store) openDB(dir string, mode openMode) (*pebble.DB, error) {
	cacheBytes := s.opts.CacheBytes
	if mode == openReceived {
		cacheBytes = 8 << 20
	}
	cache := pebble.NewCache(cacheBytes)
	defer cache.Unref()
	opts := &pebble.Options{
		Cache: cache,
		// Bigger memtables absorb bursts of reserve/commit pairs that overwrite the
		// same keys, so fewer versions ever reach L0.
		MemTableSize:                64 << 20,
		MemTableStopWritesThreshold: 4,
		FormatMajorVersion:          pebble.FormatNewest,
		Logger:                      pebbleLogger{l: s.logger, fail: s.failure.fail},
		FS:                          s.opts.FS,
	}
	if mode == openReceived {
		// A received store must be one: without this, missing files would open as a
		// new empty database. It is open for a few writes only; compacting it would
		// rewrite what was just received.
		opts.ErrorIfNotExists = true
		opts.DisableAutomaticCompactions = true
	}
	for i := range opts.Levels {
		// Point lookups of records dominate (every command reads its record first),
		// and most reserves look up keys that do not exist yet: bloom filters turn
		// those misses into no disk reads.
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	if mode == openReceived {
		return openWatched(dir, opts)
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("storage: open %s: %w", dir, err)
	}
	return db, nil
}

// openWatched opens received files, giving up at Pebble's first background error:
// opening them replays their write-ahead log into memtables that must be flushed, and
// Pebble retries a flush that failed (a full disk) forever, inside Open. A restore,
// the check of a backup and a snapshot install would hang for good; they fail instead
// (the goroutine of the abandoned Open stays, retrying, until the process ends: a
// command exits, and a node's state machine halts on the failed restore).
func openWatched(dir string, opts *pebble.Options) (*pebble.DB, error) {
	bg := make(chan error, 1)
	listener := pebble.MakeLoggingEventListener(opts.Logger)
	logBackground := listener.BackgroundError
	listener.BackgroundError = func(err error) {
		logBackground(err)
		select {
		case bg <- err:
		default:
		}
	}
	opts.EventListener = &listener
	type opened struct {
		db  *pebble.DB
		err error
	}
	done := make(chan opened, 1)
	go func() {
		db, err := pebble.Open(dir, opts)
		done <- opened{db, err}
	}()
	select {
	case o := <-done:
		if o.err != nil {
			return nil, fmt.Errorf("storage: open %s: %w", dir, o.err)
		}
		return o.db, nil
	case err := <-bg:
		select {
		case o := <-done: // it opened after all, with the same moment's error
			if o.err == nil {
				return o.db, nil
			}
			return nil, fmt.Errorf("storage: open %s: %w", dir, o.err)
		default:
		}
		go func() {
			// Should the abandoned Open still finish (the disk freed), let go of it.
			if o := <-done; o.err == nil {
				_ = o.db.Close()
			}
		}()
		return nil, fmt.Errorf("storage: open %s: writing the received files failed, and would be retried for good (is the disk full?): %w", dir, err)
	}
}

// receiveFiles writes the files of a version-2 stream (the version byte read) into a new
// directory dir, checks them, and applies the fixups; it returns the number of records.
func (s *Store) receiveFiles(sr *snapReader, dir string) (records int64, err error) {
	h := sr.headerV2()
	if sr.err != nil {
		return 0, sr.err
	}
	fs := s.opts.FS
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return 0, fmt.Errorf("storage: restore: %w", err)
	}
	seen := make(map[string]bool)
	var fixups []fixup
	fixupBytes := 0
	for done := false; !done; {
		tag := sr.read(1)
		if sr.err != nil {
			return 0, sr.err
		}
		switch tag[0] {
		case tagFile:
			if len(fixups) > 0 {
				return 0, fmt.Errorf("%w: a file after the fixups", ErrCorrupt)
			}
			if err := sr.receiveFile(fs, dir, seen); err != nil {
				return 0, err
			}
		case tagFixup:
			fx, err := sr.fixup()
			if err != nil {
				return 0, err
			}
			if fixupBytes += len(fx.key) + len(fx.value); fixupBytes > maxFixupBytes {
				return 0, fmt.Errorf("%w: more than %d bytes of fixups", ErrCorrupt, maxFixupBytes)
			}
			fixups = append(fixups, fx)
		case tagTrailer:
			done = true
		default:
			return 0, fmt.Errorf("%w: bad frame tag %#x", ErrCorrupt, tag[0])
		}
	}
	counts := sr.read(16)
	wantFiles, wantFixups := binary.BigEndian.Uint64(counts), binary.BigEndian.Uint64(counts[8:])
	if err := sr.trailerEnd(); err != nil {
		return 0, err
	}
	if wantFiles != uint64(len(seen)) || wantFixups != uint64(len(fixups)) {
		return 0, fmt.Errorf("%w: trailer says %d files and %d fixups, stream had %d and %d",
			ErrCorrupt, wantFiles, wantFixups, len(seen), len(fixups))
	}
	if err := syncDir(fs, dir); err != nil {
		return 0, fmt.Errorf("storage: restore: %w", err)
	}
	return s.fixUp(dir, h, fixups)
}

// receiveFile writes one file frame (its tag read) into dir.
func (sr *snapReader) receiveFile(fs vfs.FS, dir string, seen map[string]bool) error {
	name := string(sr.field(maxFileName))
	size := sr.read(8)
	if sr.err != nil {
		return sr.err
	}
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\\\x00") || seen[name] {
		return fmt.Errorf("%w: bad or repeated file name %q", ErrCorrupt, name)
	}
	seen[name] = true
	n := int64(binary.BigEndian.Uint64(size))
	if n < 0 {
		return fmt.Errorf("%w: file %s of %d bytes", ErrCorrupt, name, uint64(n))
	}
	fileCRC := crc32.New(castagnoli)
	fileCRC.Write(binary.AppendUvarint(nil, uint64(len(name))))
	fileCRC.Write([]byte(name))
	fileCRC.Write(size)
	f, err := fs.Create(fs.PathJoin(dir, name), vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("storage: restore: %w", err)
	}
	// The checksums first: a file may scribble over what it was given (Pebble's
	// in-memory one does in race builds).
	_, err = io.CopyN(io.MultiWriter(sr.crc, fileCRC, f), sr.r, n)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case errors.Is(err, io.EOF):
		sr.err = truncated(io.ErrUnexpectedEOF)
		return sr.err
	case err != nil:
		return fmt.Errorf("storage: restore: writing %s: %w", name, err)
	}
	got := sr.read(4)
	if sr.err != nil {
		return sr.err
	}
	if binary.BigEndian.Uint32(got) != fileCRC.Sum32() {
		return fmt.Errorf("%w: checksum mismatch in file %s", ErrCorrupt, name)
	}
	return nil
}

// fixup reads one fixup frame (its tag read).
func (sr *snapReader) fixup() (fixup, error) {
	fx := fixup{key: sr.field(maxSnapKey)}
	present := sr.read(1)[0]
	if sr.err != nil {
		return fx, sr.err
	}
	switch present {
	case 0:
	case 1:
		if fx.value = sr.field(maxSnapValue); fx.value == nil {
			fx.value = []byte{}
		}
	default:
		return fx, fmt.Errorf("%w: bad fixup marker %#x", ErrCorrupt, present)
	}
	return fx, sr.err
}

// fixUp opens the received store in dir, puts the keys written after the capture back
// to their captured values, and checks that it holds the applied index of the header.
func (s *Store) fixUp(dir string, h headerV2, fixups []fixup) (records int64, err error) {
	db, err := s.openDB(dir, openReceived)
	if err != nil {
		return 0, fmt.Errorf("storage: restore: the received files: %w", err)
	}
	defer func() {
		if cerr := db.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("storage: restore: %w", cerr))
		}
	}()
	b := db.NewBatch()
	defer b.Close()
	for _, fx := range fixups {
		if fx.value == nil {
			err = b.Delete(fx.key, nil)
		} else {
			err = b.Set(fx.key, fx.value, nil)
		}
		if err != nil {
			return 0, err
		}
	}
	if err := guard(func() error { return b.Commit(pebble.Sync) }); err != nil {
		return 0, fmt.Errorf("storage: restore: %w", err)
	}
	index, term, err := readApplied(db)
	if err != nil {
		return 0, err
	}
	if index != h.index || term != h.term {
		return 0, fmt.Errorf("%w: the received store is at applied index %d (term %d), its header says %d (term %d)",
			ErrCorrupt, index, term, h.index, h.term)
	}
	return ensureRecordCount(db, s.logger)
}

// swapIn replaces the store's directory with stage, a complete, closed store: close the
// database, rename the store away, rename stage into its place, open it. A crash at any
// point leaves either the old store under dir (before the first rename, or undone by
// recoverSwap at the next open) or the new one (after the second). An I/O error undoes
// what it can and reopens what is under dir; only if that fails too is the store left
// closed, its reads failing, until a restart recovers it.
func (s *Store) swapIn(stage string) error {
	fs := s.opts.FS
	parent := fs.PathDir(s.dir)
	replaced := s.dir + suffixReplaced
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	s.dropCaptures()
	s.recent.clear()
	s.rules.clear()
	// The filters describe the old database; a scan of it ends at its next chunk.
	s.filter.Store(nil)
	s.nextFilter.Store(nil)
	if s.db != nil {
		if err := guard(s.db.Close); err != nil {
			// Nothing is lost: the directory is replaced either way.
			s.logger.Error("closing the store for a restore", logKeyErr, err)
		}
		s.db = nil
	}
	if err := fs.RemoveAll(replaced); err != nil {
		return s.reopen(fmt.Errorf("storage: restore: %w", err))
	}
	moved := false
	if _, err := fs.Stat(s.dir); err == nil {
		if err := fs.Rename(s.dir, replaced); err != nil {
			return s.reopen(fmt.Errorf("storage: restore: %w", err))
		}
		moved = true
	}
	// Durable before stage takes the name, so that no crash can find the new store
	// under dir and the old one still there too.
	err := syncDir(fs, parent)
	if err == nil {
		err = fs.Rename(stage, s.dir)
	}
	if err != nil {
		if moved {
			err = errors.Join(err, fs.Rename(replaced, s.dir), syncDir(fs, parent))
		}
		return s.reopen(fmt.Errorf("storage: restore: %w", err))
	}
	if err := syncDir(fs, parent); err != nil {
		return s.reopen(fmt.Errorf("storage: restore: %w", err))
	}
	if err := s.reopen(nil); err != nil {
		return err
	}
	if err := fs.RemoveAll(replaced); err != nil {
		s.logger.Error("removing the replaced store", logKeyDir, replaced, logKeyErr, err)
	}
	return nil
}

// reopen opens the store under dir after a swap (mu held exclusively) and returns
// cause, or the open's error with it.
func (s *Store) reopen(cause error) error {
	db, err := s.openDB(s.dir, openLive)
	if err != nil {
		s.logger.Error("the store stays closed: reopening it after a restore failed", logKeyErr, err)
		return errors.Join(cause, err)
	}
	s.db = db
	if err := s.loadRecordCount(); err != nil {
		return errors.Join(cause, err)
	}
	s.buildFilter(db)
	return cause
}

// recoverSwap undoes a swap that a crash cut between its two renames: dir is gone and
// the old store sits whole under dir.restore-old. The new one may not be complete; if
// the old store is behind, the node restores its newest snapshot again
// (restoreIfBehind).
func (s *Store) recoverSwap() error {
	fs := s.opts.FS
	replaced := s.dir + suffixReplaced
	if _, err := fs.Stat(s.dir); !errors.Is(err, os.ErrNotExist) {
		if err != nil {
			return fmt.Errorf("storage: open %s: %w", s.dir, err)
		}
		return nil
	}
	if _, err := fs.Stat(replaced); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("storage: open %s: %w", s.dir, err)
	}
	s.logger.Warn("a restore was cut short while it swapped the store; putting the old store back", logKeyDir, s.dir)
	if err := fs.Rename(replaced, s.dir); err != nil {
		return fmt.Errorf("storage: open %s: %w", s.dir, err)
	}
	if err := syncDir(fs, fs.PathDir(s.dir)); err != nil {
		return fmt.Errorf("storage: open %s: %w", s.dir, err)
	}
	return nil
}

// removeLeftovers removes what a crash left beside the store (see the suffixes).
func (s *Store) removeLeftovers() {
	fs := s.opts.FS
	parent, base := fs.PathDir(s.dir), fs.PathBase(s.dir)
	names, err := fs.List(parent)
	if err != nil {
		s.logger.Warn("listing the store's parent directory", logKeyDir, parent, logKeyErr, err)
		return
	}
	for _, name := range names {
		if name != base+suffixStage && name != base+suffixReplaced && !strings.HasPrefix(name, base+suffixSnapshot) {
			continue
		}
		p := fs.PathJoin(parent, name)
		if err := fs.RemoveAll(p); err != nil {
			s.logger.Warn("removing a leftover of a restore or snapshot", logKeyDir, p, logKeyErr, err)
		} else {
			s.logger.Info("removed a leftover of a restore or snapshot", logKeyDir, p)
		}
	}
}

// snapshotDir names a new directory for a snapshot's checkpoint.
func (s *Store) snapshotDir() string {
	for {
		d := fmt.Sprintf("%s%s%d", s.dir, suffixSnapshot, s.captureSeq.Add(1))
		if _, err := s.opts.FS.Stat(d); err != nil {
			return d
		}
	}
}

func syncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
