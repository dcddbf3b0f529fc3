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

	"github.com/cockroachdb/pebble/v2"
)

// Snapshot stream format (version 1):
//
//	"IDEMKVSN" (8 bytes) | version (1 byte)
//	{ 0x01 | uvarint len(key) | key | uvarint len(value) | value }*
//	0x02 | count of pairs (8 bytes BE) | CRC-32C of every byte before it (4 bytes BE)
//
// The trailer makes truncation detectable: a stream cut anywhere lacks it or fails
// its checksum.
const (
	snapMagic    = "IDEMKVSN"
	snapVersion  = 1
	tagPair      = 0x01
	tagTrailer   = 0x02
	maxSnapKey   = 64 << 10
	maxSnapValue = 64 << 20
)

// restoreBatchBytes bounds the memory a restore holds before committing (a variable
// so tests can make restores span many batches).
var restoreBatchBytes = 4 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Snapshot is a consistent, point-in-time view of the whole store. Taking one is cheap;
// WriteTo does the I/O.
type Snapshot struct {
	snap *pebble.Snapshot
	s    *Store
}

// NewSnapshot captures the current state. Close must follow.
func (s *Store) NewSnapshot() *Snapshot { return &Snapshot{snap: s.db.NewSnapshot(), s: s} }

// Close releases the snapshot.
func (sn *Snapshot) Close() error { return sn.snap.Close() }

// WriteTo streams every key and value of the snapshot to w.
func (sn *Snapshot) WriteTo(w io.Writer) (int64, error) {
	crc := crc32.New(castagnoli)
	cw := &countingWriter{w: bufio.NewWriterSize(io.MultiWriter(w, crc), 256<<10)}
	cw.write([]byte(snapMagic))
	cw.write([]byte{snapVersion})
	it, err := sn.snap.NewIter(nil)
	if err != nil {
		return 0, fmt.Errorf("storage: snapshot: %w", err)
	}
	var count uint64
	var hdr []byte
	for it.First(); it.Valid() && cw.err == nil; it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			it.Close()
			return cw.n, fmt.Errorf("storage: snapshot: %w", err)
		}
		hdr = append(hdr[:0], tagPair)
		hdr = binary.AppendUvarint(hdr, uint64(len(it.Key())))
		cw.write(hdr)
		cw.write(it.Key())
		cw.write(binary.AppendUvarint(hdr[:0], uint64(len(v))))
		cw.write(v)
		count++
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return cw.n, fmt.Errorf("storage: snapshot: %w", err)
	}
	cw.write([]byte{tagTrailer})
	cw.write(binary.BigEndian.AppendUint64(nil, count))
	// Flush before reading the CRC: the hash sees bytes only as they leave the buffer.
	if cw.err == nil {
		cw.err = cw.w.Flush()
	}
	if cw.err != nil {
		return cw.n, fmt.Errorf("storage: snapshot: %w", cw.err)
	}
	sum := binary.BigEndian.AppendUint32(nil, crc.Sum32())
	if _, err := w.Write(sum); err != nil {
		return cw.n, fmt.Errorf("storage: snapshot: %w", err)
	}
	sn.s.logger.Info("snapshot written", logKeyKeys, count, logKeyBytes, cw.n+4)
	return cw.n + 4, nil
}

type countingWriter struct {
	w   *bufio.Writer
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

// Restore replaces the whole store with the stream r. The applied index is written
// last, together with the sync, only once the trailer has verified: if the stream is
// cut or corrupt, the store is left empty with no applied index, never as a partial
// state that claims to be complete.
func (s *Store) Restore(r io.Reader) error {
	// The restore writes past the batches that keep the recent records current.
	s.recent.clear()
	defer s.recent.clear()
	if err := s.restore(r); err != nil {
		werr := s.wipe()
		if werr == nil {
			werr = s.loadRecordCount() // an empty store still has its count
		}
		if werr != nil {
			s.logger.Error("wiping after a failed restore", logKeyErr, werr)
			err = errors.Join(err, werr)
		}
		return err
	}
	return nil
}

func (s *Store) wipe() error {
	if err := s.db.DeleteRange([]byte{0x00}, []byte{0xff, 0xff, 0xff, 0xff}, pebble.Sync); err != nil {
		return fmt.Errorf("storage: wipe: %w", err)
	}
	s.records.Store(0)
	return nil
}

func (s *Store) restore(r io.Reader) error {
	sr := &snapReader{r: bufio.NewReaderSize(r, 256<<10), crc: crc32.New(castagnoli)}
	magic := sr.read(len(snapMagic) + 1)
	if sr.err != nil {
		return sr.err
	}
	if !bytes.Equal(magic[:len(snapMagic)], []byte(snapMagic)) {
		return fmt.Errorf("%w: not an idemkv snapshot", ErrCorrupt)
	}
	if v := magic[len(snapMagic)]; v != snapVersion {
		return fmt.Errorf("%w: unknown snapshot version %d", ErrCorrupt, v)
	}
	if err := s.wipe(); err != nil {
		return err
	}
	batch := s.db.NewBatch()
	defer func() { batch.Close() }()
	var applied []byte
	var count uint64
	for {
		tag := sr.read(1)
		if sr.err != nil {
			return sr.err
		}
		if tag[0] == tagTrailer {
			break
		}
		if tag[0] != tagPair {
			return fmt.Errorf("%w: bad frame tag %#x", ErrCorrupt, tag[0])
		}
		k := sr.field(maxSnapKey)
		v := sr.field(maxSnapValue)
		if sr.err != nil {
			return sr.err
		}
		count++
		if bytes.Equal(k, keyApplied) {
			applied = bytes.Clone(v)
			continue
		}
		if err := batch.Set(k, v, nil); err != nil {
			return err
		}
		if batch.Len() >= restoreBatchBytes {
			if err := batch.Commit(pebble.NoSync); err != nil {
				return fmt.Errorf("storage: restore: %w", err)
			}
			batch.Close()
			batch = s.db.NewBatch()
		}
	}
	want := binary.BigEndian.Uint64(sr.read(8))
	sum := sr.crc.Sum32()
	got := sr.read(4)
	if sr.err != nil {
		return sr.err
	}
	if want != count {
		return fmt.Errorf("%w: trailer says %d pairs, stream had %d", ErrCorrupt, want, count)
	}
	if binary.BigEndian.Uint32(got) != sum {
		return fmt.Errorf("%w: snapshot checksum mismatch", ErrCorrupt)
	}
	if _, err := sr.r.ReadByte(); err != io.EOF {
		return fmt.Errorf("%w: bytes after the snapshot trailer", ErrCorrupt)
	}
	if applied != nil {
		if err := batch.Set(keyApplied, applied, nil); err != nil {
			return err
		}
	}
	if err := batch.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("storage: restore: %w", err)
	}
	s.logger.Info("snapshot restored", logKeyKeys, count)
	// The stream carries the count when its store kept one; one that did not is
	// counted now.
	return s.loadRecordCount()
}

// SnapshotApplied reads the applied index and term stored in the snapshot stream r
// without restoring it: keys come in order and the applied index is among the first, so
// it reads only the few pairs before it (the in-doubt index, "d/", sorts first). It
// returns 0, 0 if the stream has none. The stream is not
// verified (that takes reading it all): a corrupt one fails Restore.
func SnapshotApplied(r io.Reader) (index, term uint64, err error) {
	sr := &snapReader{r: bufio.NewReader(r), crc: crc32.New(castagnoli)}
	magic := sr.read(len(snapMagic) + 1)
	if sr.err != nil {
		return 0, 0, sr.err
	}
	if !bytes.Equal(magic[:len(snapMagic)], []byte(snapMagic)) || magic[len(snapMagic)] != snapVersion {
		return 0, 0, fmt.Errorf("%w: not an idemkv snapshot of version %d", ErrCorrupt, snapVersion)
	}
	for {
		tag := sr.read(1)
		if sr.err != nil {
			return 0, 0, sr.err
		}
		if tag[0] != tagPair {
			return 0, 0, nil // the trailer, or garbage that Restore will refuse
		}
		k := sr.field(maxSnapKey)
		v := sr.field(maxSnapValue)
		if sr.err != nil {
			return 0, 0, sr.err
		}
		switch c := bytes.Compare(k, keyApplied); {
		case c == 0:
			if len(v) != 16 {
				return 0, 0, fmt.Errorf("%w: applied index is %d bytes", ErrCorrupt, len(v))
			}
			return binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:]), nil
		case c > 0:
			return 0, 0, nil
		}
	}
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
		s.err = fmt.Errorf("%w: snapshot truncated: %v", ErrCorrupt, err)
		return b
	}
	s.crc.Write(b)
	return b
}

// field reads a length-prefixed field into fresh memory (it goes into a batch).
func (s *snapReader) field(max uint64) []byte {
	if s.err != nil {
		return nil
	}
	n, err := binary.ReadUvarint(byteCounter{s})
	if err != nil {
		s.err = fmt.Errorf("%w: snapshot truncated: %v", ErrCorrupt, err)
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
