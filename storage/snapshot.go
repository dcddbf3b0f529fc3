package storage

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"slices"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Snapshot stream format, version 2 (what WriteTo writes: Raft snapshots and backups):
//
//	"IDEMKVSN" (8 bytes) | 0x02
//	applied index (8 bytes BE) | applied term (8 bytes BE) | CRC-32C of the 25 bytes before (4 bytes BE)
//	{ 0x03 | uvarint len(name) | name | size (8 bytes BE) | content | CRC-32C of name, size and content (4 bytes BE) }*
//	{ 0x04 | uvarint len(key) | key | 0x00 (absent), or 0x01 | uvarint len(value) | value }*
//	0x02 | files (8 bytes BE) | fixups (8 bytes BE) | CRC-32C of every byte before it (4 bytes BE)
//
// The files are a Pebble checkpoint of the store: its tables hard-linked, its log and
// manifest copied, so writing one costs the store's files (compressed: about half the
// bytes), not a walk over its records. At 10 million records writing a snapshot took
// 7-20 s and installing one 24-37 s as a walk, 1.5 s and 1.8-4.8 s as files
// (BenchmarkSnapshot); at a million, forced snapshots raised reserve p99 from 10.5 ms
// to 25.9 ms as a walk, from 10.9 ms to 11.8 ms as files (bench/run.sh scale, 16
// clients). A checkpoint cannot be taken in the instant Raft asks for a
// snapshot: it copies the write-ahead log, up to 64 MiB, which took 90-180 ms at a
// million records here, too long to stop applying for. So Snapshot captures a Pebble
// snapshot and starts noting the keys that commits write; WriteTo takes the checkpoint
// later, while commits go on, and the fixups carry each key noted, with its value in
// the Pebble snapshot. Applied on the received files, they put every key written after
// the capture back to its captured value: the restored state is exactly the state at
// the applied index in the header, which Raft's contract asks for (the snapshot stands
// for its index). restoreIfBehind reads that index from the first bytes alone.
//
// Version 1, a stream of every key and value (snapshotv1.go), is still read: Raft
// snapshots and backups written by older versions restore.
const (
	snapMagic          = "IDEMKVSN"
	snapVersionRecords = 1
	snapVersionFiles   = 2
	tagPair            = 0x01
	tagTrailer         = 0x02
	tagFile            = 0x03
	tagFixup           = 0x04
	maxSnapKey         = 64 << 10
	maxSnapValue       = 64 << 20
	// maxFileName bounds a received file's name (Pebble's are under 64 bytes).
	maxFileName = 255
	// maxFixupBytes bounds the fixups a restore holds before the trailer verifies them,
	// and the keys a snapshot notes: a snapshot written within seconds of its capture
	// notes a few thousand keys.
	maxFixupBytes = 256 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Snapshot is a consistent, point-in-time view of the whole store. Taking one is cheap
// (no I/O); WriteTo does the I/O. Close must follow, once.
type Snapshot struct {
	s *Store

	// mu guards snap and err; a restore that replaces the store under the snapshot
	// sets err and closes snap.
	mu   sync.Mutex
	snap *pebble.Snapshot
	err  error

	index, term uint64

	// written holds the keys committed since the capture while tracking (guarded by
	// Store.commitMu); trackErr says why tracking failed.
	written      map[string]struct{}
	writtenBytes int
	trackErr     error
}

// errReplaced fails a snapshot whose store a restore replaced before it was written.
var errReplaced = errors.New("storage: snapshot: a restore replaced the store after the snapshot was taken")

// NewSnapshot captures the current state. It does no I/O: it takes a Pebble snapshot
// and starts noting the keys that later commits write. Close must follow.
func (s *Store) NewSnapshot() *Snapshot {
	sn := &Snapshot{s: s, written: make(map[string]struct{})}
	db, err := s.open()
	if err != nil {
		sn.err = err
		return sn
	}
	defer s.mu.RUnlock()
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	sn.snap = db.NewSnapshot()
	s.captures[sn] = struct{}{}
	if sn.index, sn.term, err = readApplied(sn.snap); err != nil {
		sn.err = err
	}
	return sn
}

// Applied is the applied index and term of the captured state.
func (sn *Snapshot) Applied() (index, term uint64) { return sn.index, sn.term }

// noteWrites records the keys of batch b, about to commit (commitMu held).
func (s *Store) noteWrites(b *pebble.Batch) {
	r := b.Reader()
	for {
		kind, k, _, ok, err := r.Next()
		if !ok || err != nil {
			if err != nil {
				s.failCaptures(fmt.Errorf("storage: snapshot: reading a batch: %w", err))
			}
			return
		}
		switch kind {
		case pebble.InternalKeyKindSet, pebble.InternalKeyKindDelete, pebble.InternalKeyKindSingleDelete:
		default:
			// Batches write single keys only; a range or merge could not be undone key by key.
			s.failCaptures(fmt.Errorf("storage: snapshot: a batch wrote a %s, which fixups cannot undo", kind))
			return
		}
		for sn := range s.captures {
			if sn.trackErr != nil {
				continue
			}
			if _, ok := sn.written[string(k)]; !ok {
				sn.written[string(k)] = struct{}{}
				if sn.writtenBytes += len(k); sn.writtenBytes > maxFixupBytes {
					sn.trackErr = fmt.Errorf("storage: snapshot: more than %d bytes of keys written since it was taken", maxFixupBytes)
					sn.written = nil
				}
			}
		}
	}
}

func (s *Store) failCaptures(err error) {
	for sn := range s.captures {
		if sn.trackErr == nil {
			sn.trackErr, sn.written = err, nil
		}
	}
}

// commit commits b, noting its keys for every snapshot not yet written.
func (s *Store) commit(b *pebble.Batch) error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	if err := s.Failure(); err != nil {
		return err
	}
	if len(s.captures) > 0 {
		s.noteWrites(b)
	}
	return guard(func() error { return b.Commit(pebble.NoSync) })
}

// stopTracking ends the noting of writes for sn and returns the keys noted.
func (s *Store) stopTracking(sn *Snapshot) ([]string, error) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	delete(s.captures, sn)
	keys := make([]string, 0, len(sn.written))
	for k := range sn.written {
		keys = append(keys, k)
	}
	err := sn.trackErr
	sn.written, sn.trackErr = nil, nil
	slices.Sort(keys)
	return keys, err
}

// dropCaptures fails every snapshot not yet written (mu held exclusively): the
// database under them is about to close.
func (s *Store) dropCaptures() {
	s.commitMu.Lock()
	list := make([]*Snapshot, 0, len(s.captures))
	for sn := range s.captures {
		list = append(list, sn)
	}
	clear(s.captures)
	s.commitMu.Unlock()
	for _, sn := range list {
		sn.mu.Lock()
		if sn.snap != nil {
			if err := sn.snap.Close(); err != nil {
				s.logger.Error("closing a replaced snapshot", logKeyErr, err)
			}
			sn.snap = nil
		}
		if sn.err == nil {
			sn.err = errReplaced
		}
		sn.mu.Unlock()
	}
}

// Close releases the snapshot.
func (sn *Snapshot) Close() error {
	sn.s.mu.RLock()
	defer sn.s.mu.RUnlock()
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if sn.snap == nil {
		return nil
	}
	_, _ = sn.s.stopTracking(sn)
	err := sn.snap.Close()
	sn.snap = nil
	if sn.err == nil {
		sn.err = errors.New("storage: snapshot closed")
	}
	return err
}

// fixup is a key written after the capture, with its captured value (nil: absent).
type fixup struct {
	key   []byte
	value []byte
}

// checkpoint writes a Pebble checkpoint of the store into a new directory beside it and
// returns it, with the fixups that take it back to the captured state. The Pebble
// snapshot is released: the files stand for the capture from now on.
func (sn *Snapshot) checkpoint() (dir string, fixups []fixup, err error) {
	s := sn.s
	db, err := s.open()
	if err != nil {
		return "", nil, err
	}
	defer s.mu.RUnlock()
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if sn.err != nil {
		return "", nil, sn.err
	}
	dir = s.snapshotDir()
	// The log is copied as it is when Checkpoint reads it: flushed first, so that every
	// commit before the call is in the files (commits without sync may still sit in
	// Pebble's buffer), and commits made while it runs may be there too. The keys noted
	// until it returned cover all of those.
	cerr := guard(func() error { return db.Checkpoint(dir, pebble.WithFlushedWAL()) })
	keys, terr := s.stopTracking(sn)
	if err := errors.Join(cerr, terr); err != nil {
		return "", nil, errors.Join(fmt.Errorf("storage: snapshot: checkpoint: %w", err), s.opts.FS.RemoveAll(dir))
	}
	for _, k := range keys {
		v, err := getValue(sn.snap, []byte(k))
		if err != nil {
			return "", nil, errors.Join(err, s.opts.FS.RemoveAll(dir))
		}
		fixups = append(fixups, fixup{key: []byte(k), value: v})
	}
	err = sn.snap.Close()
	sn.snap = nil
	sn.err = errors.New("storage: snapshot already written")
	if err != nil {
		return "", nil, errors.Join(err, s.opts.FS.RemoveAll(dir))
	}
	return dir, fixups, nil
}

// WriteTo streams the snapshot to w in the version-2 format. It can be called once.
func (sn *Snapshot) WriteTo(w io.Writer) (int64, error) {
	dir, fixups, err := sn.checkpoint()
	if err != nil {
		return 0, err
	}
	fs := sn.s.opts.FS
	n, err := writeFiles(w, fs, dir, sn.index, sn.term, fixups)
	if rerr := fs.RemoveAll(dir); rerr != nil {
		sn.s.logger.Error("removing a snapshot checkpoint", logKeyDir, dir, logKeyErr, rerr)
	}
	if err != nil {
		return n, fmt.Errorf("storage: snapshot: %w", err)
	}
	sn.s.logger.Info("snapshot written", "applied_index", sn.index, "fixups", len(fixups), logKeyBytes, n)
	return n, nil
}

func writeFiles(w io.Writer, fs vfs.FS, dir string, index, term uint64, fixups []fixup) (int64, error) {
	names, err := fs.List(dir)
	if err != nil {
		return 0, err
	}
	slices.Sort(names)
	crc := crc32.New(castagnoli)
	bw := bufio.NewWriterSize(io.MultiWriter(crc, w), 256<<10)
	cw := &countingWriter{w: bw}
	hdr := binary.BigEndian.AppendUint64(append([]byte(snapMagic), snapVersionFiles), index)
	hdr = binary.BigEndian.AppendUint64(hdr, term)
	cw.write(binary.BigEndian.AppendUint32(hdr, crc32.Checksum(hdr, castagnoli)))
	var buf []byte
	for _, name := range names {
		fileCRC := crc32.New(castagnoli)
		f, err := fs.Open(fs.PathJoin(dir, name))
		if err != nil {
			return cw.n, err
		}
		info, err := f.Stat()
		if err != nil || info.IsDir() {
			return cw.n, errors.Join(err, fmt.Errorf("%s is not a file", name), f.Close())
		}
		buf = binary.AppendUvarint(append(buf[:0], tagFile), uint64(len(name)))
		buf = binary.BigEndian.AppendUint64(append(buf, name...), uint64(info.Size()))
		cw.write(buf)
		fileCRC.Write(buf[1:])
		if cw.err == nil {
			var copied int64
			copied, cw.err = io.Copy(io.MultiWriter(fileCRC, bw), io.LimitReader(f, info.Size()))
			cw.n += copied
			if cw.err == nil && copied != info.Size() {
				cw.err = fmt.Errorf("%s: read %d of %d bytes", name, copied, info.Size())
			}
		}
		if err := f.Close(); cw.err == nil {
			cw.err = err
		}
		cw.write(binary.BigEndian.AppendUint32(buf[:0], fileCRC.Sum32()))
	}
	for _, fx := range fixups {
		buf = binary.AppendUvarint(append(buf[:0], tagFixup), uint64(len(fx.key)))
		buf = append(buf, fx.key...)
		if fx.value == nil {
			buf = append(buf, 0)
		} else {
			buf = binary.AppendUvarint(append(buf, 1), uint64(len(fx.value)))
			buf = append(buf, fx.value...)
		}
		cw.write(buf)
	}
	buf = binary.BigEndian.AppendUint64(append(buf[:0], tagTrailer), uint64(len(names)))
	cw.write(binary.BigEndian.AppendUint64(buf, uint64(len(fixups))))
	// Flush before reading the CRC: the hash sees bytes only as they leave the buffer.
	if cw.err == nil {
		cw.err = bw.Flush()
	}
	if cw.err != nil {
		return cw.n, cw.err
	}
	if _, err := w.Write(binary.BigEndian.AppendUint32(nil, crc.Sum32())); err != nil {
		return cw.n, err
	}
	return cw.n + 4, nil
}

type countingWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countingWriter) write(b []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(b)
	c.n += int64(n)
	c.err = err
}

// Restore replaces the whole store with the snapshot stream r (either version). The
// stream is received into a new directory beside the store and checked to the last
// byte (every file's checksum, the trailer's, the applied index against the header)
// before the store is swapped for it. A stream that fails anywhere leaves the store as
// it was; only an I/O error in the swap itself can leave it closed (see swapIn).
func (s *Store) Restore(r io.Reader) error {
	// A failed store stays failed: its database cannot be closed cleanly, and the disk
	// under it is what failed.
	if err := s.Failure(); err != nil {
		return fmt.Errorf("storage: restore: %w", err)
	}
	sr := &snapReader{r: bufio.NewReaderSize(r, 256<<10), crc: crc32.New(castagnoli)}
	version, err := sr.header()
	if err != nil {
		return err
	}
	stage := s.dir + suffixStage
	fs := s.opts.FS
	if err := fs.RemoveAll(stage); err != nil {
		return fmt.Errorf("storage: restore: %w", err)
	}
	var records int64
	switch version {
	case snapVersionRecords:
		records, err = s.loadRecords(sr, stage)
	case snapVersionFiles:
		records, err = s.receiveFiles(sr, stage)
	}
	if err != nil {
		if rerr := fs.RemoveAll(stage); rerr != nil {
			s.logger.Error("removing a failed restore", logKeyDir, stage, logKeyErr, rerr)
		}
		return err
	}
	if err := s.swapIn(stage); err != nil {
		// Still there if the swap failed before renaming it.
		return errors.Join(err, fs.RemoveAll(stage))
	}
	s.logger.Info("snapshot restored", "version", version, "records", records)
	return nil
}

// SnapshotApplied reads the applied index and term stored in the snapshot stream r
// without restoring it: from the header of a version-2 stream, from the first few pairs
// of a version-1 one (the applied index sorts among the first keys). It returns 0, 0 if
// the stream has none. Beyond the header the stream is not verified (that takes
// reading it all): a corrupt one fails Restore.
func SnapshotApplied(r io.Reader) (index, term uint64, err error) {
	sr := &snapReader{r: bufio.NewReader(r), crc: crc32.New(castagnoli)}
	version, err := sr.header()
	if err != nil {
		return 0, 0, err
	}
	if version == snapVersionRecords {
		return appliedInRecords(sr)
	}
	h := sr.headerV2()
	return h.index, h.term, sr.err
}

// header reads the magic and the version.
func (s *snapReader) header() (byte, error) {
	magic := s.read(len(snapMagic) + 1)
	if s.err != nil {
		return 0, s.err
	}
	if !bytes.Equal(magic[:len(snapMagic)], []byte(snapMagic)) {
		return 0, fmt.Errorf("%w: not an idemkv snapshot", ErrCorrupt)
	}
	switch v := magic[len(snapMagic)]; v {
	case snapVersionRecords, snapVersionFiles:
		return v, nil
	default:
		return 0, fmt.Errorf("%w: unknown snapshot version %d", ErrCorrupt, v)
	}
}

type headerV2 struct{ index, term uint64 }

// headerV2 reads the rest of a version-2 header, after the version byte.
func (s *snapReader) headerV2() headerV2 {
	b := s.read(20)
	if s.err != nil {
		return headerV2{}
	}
	h := headerV2{index: binary.BigEndian.Uint64(b), term: binary.BigEndian.Uint64(b[8:])}
	want := crc32.Update(crc32.Checksum(append([]byte(snapMagic), snapVersionFiles), castagnoli), castagnoli, b[:16])
	if binary.BigEndian.Uint32(b[16:]) != want {
		s.err = fmt.Errorf("%w: snapshot header checksum mismatch", ErrCorrupt)
	}
	return h
}

// snapReader reads the stream and checksums what it reads; the first error sticks.
type snapReader struct {
	r   *bufio.Reader
	crc hash.Hash32
	buf []byte
	err error
}

// read returns the next n bytes; the slice is valid until the next read.
func (s *snapReader) read(n int) []byte {
	if s.err != nil {
		return make([]byte, n)
	}
	if cap(s.buf) < n {
		s.buf = make([]byte, n)
	}
	b := s.buf[:n]
	if _, err := io.ReadFull(s.r, b); err != nil {
		s.err = truncated(err)
		return b
	}
	s.crc.Write(b)
	return b
}

// truncated is the error of a stream that ended early, or whose source failed.
func truncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: snapshot truncated: %v", ErrCorrupt, err)
	}
	return fmt.Errorf("storage: reading the snapshot: %w", err)
}

// field reads a length-prefixed field into fresh memory.
func (s *snapReader) field(max uint64) []byte {
	if s.err != nil {
		return nil
	}
	n, err := binary.ReadUvarint(byteCounter{s})
	if err != nil {
		s.err = truncated(err)
		return nil
	}
	if n > max {
		s.err = fmt.Errorf("%w: field of %d bytes exceeds %d", ErrCorrupt, n, max)
		return nil
	}
	return bytes.Clone(s.read(int(n)))
}

// byteCounter feeds ReadUvarint byte by byte through the checksum.
type byteCounter struct{ s *snapReader }

func (b byteCounter) ReadByte() (byte, error) {
	c, err := b.s.r.ReadByte()
	if err == nil {
		b.s.crc.Write([]byte{c})
	}
	return c, err
}

// trailerEnd checks the stream checksum (the 4 bytes after everything read so far)
// and that nothing follows it.
func (s *snapReader) trailerEnd() error {
	sum := s.crc.Sum32()
	got := s.read(4)
	if s.err != nil {
		return s.err
	}
	if binary.BigEndian.Uint32(got) != sum {
		return fmt.Errorf("%w: snapshot checksum mismatch", ErrCorrupt)
	}
	if _, err := s.r.ReadByte(); err != io.EOF {
		if err != nil {
			return truncated(err)
		}
		return fmt.Errorf("%w: bytes after the snapshot trailer", ErrCorrupt)
	}
	return nil
}
