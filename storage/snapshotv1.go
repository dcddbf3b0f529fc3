package storage

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/cockroachdb/pebble/v2"
)

// Snapshot stream format, version 1 (what idemkv wrote before version 2; still read):
//
//	"IDEMKVSN" (8 bytes) | 0x01
//	{ 0x01 | uvarint len(key) | key | uvarint len(value) | value }*
//	0x02 | count of pairs (8 bytes BE) | CRC-32C of every byte before it (4 bytes BE)
//
// The trailer makes truncation detectable: a stream cut anywhere lacks it or fails
// its checksum.

// restoreBatchBytes bounds the memory a version-1 restore holds before committing (a
// variable so tests can make restores span many batches).
var restoreBatchBytes = 4 << 20

// WriteRecordsTo streams every key and value of the snapshot to w in the version-1
// format: independent of Pebble's files, and O(records). A restore waits for it to
// finish, so it is for tools and tests, not for Raft. It can be called instead of
// WriteTo, not after it.
func (sn *Snapshot) WriteRecordsTo(w io.Writer) (int64, error) {
	sn.s.mu.RLock()
	defer sn.s.mu.RUnlock()
	sn.mu.Lock()
	defer sn.mu.Unlock()
	if sn.err != nil {
		return 0, sn.err
	}
	crc := crc32.New(castagnoli)
	bw := bufio.NewWriterSize(io.MultiWriter(crc, w), 256<<10)
	cw := &countingWriter{w: bw}
	cw.write([]byte(snapMagic))
	cw.write([]byte{snapVersionRecords})
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
		cw.err = bw.Flush()
	}
	if cw.err != nil {
		return cw.n, fmt.Errorf("storage: snapshot: %w", cw.err)
	}
	if _, err := w.Write(binary.BigEndian.AppendUint32(nil, crc.Sum32())); err != nil {
		return cw.n, fmt.Errorf("storage: snapshot: %w", err)
	}
	sn.s.logger.Info("snapshot written", "version", snapVersionRecords, logKeyKeys, count, logKeyBytes, cw.n+4)
	return cw.n + 4, nil
}

// loadRecords fills a new database in dir with the pairs of a version-1 stream (the
// header read) and returns the number of records. The applied index is written last,
// with the sync, once the trailer verified.
func (s *Store) loadRecords(sr *snapReader, dir string) (records int64, err error) {
	db, err := s.openDB(dir, openLoad)
	if err != nil {
		return 0, err
	}
	defer func() {
		if cerr := db.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("storage: restore: %w", cerr))
		}
	}()
	batch := db.NewBatch()
	defer func() { batch.Close() }()
	var applied []byte
	var count uint64
	for {
		tag := sr.read(1)
		if sr.err != nil {
			return 0, sr.err
		}
		if tag[0] == tagTrailer {
			break
		}
		if tag[0] != tagPair {
			return 0, fmt.Errorf("%w: bad frame tag %#x", ErrCorrupt, tag[0])
		}
		k := sr.field(maxSnapKey)
		v := sr.field(maxSnapValue)
		if sr.err != nil {
			return 0, sr.err
		}
		count++
		if bytes.Equal(k, keyApplied) {
			applied = v
			continue
		}
		if err := batch.Set(k, v, nil); err != nil {
			return 0, err
		}
		if batch.Len() >= restoreBatchBytes {
			if err := guard(func() error { return batch.Commit(pebble.NoSync) }); err != nil {
				return 0, fmt.Errorf("storage: restore: %w", err)
			}
			batch.Close()
			batch = db.NewBatch()
		}
	}
	want := binary.BigEndian.Uint64(sr.read(8))
	if err := sr.trailerEnd(); err != nil {
		return 0, err
	}
	if want != count {
		return 0, fmt.Errorf("%w: trailer says %d pairs, stream had %d", ErrCorrupt, want, count)
	}
	if applied != nil {
		if err := batch.Set(keyApplied, applied, nil); err != nil {
			return 0, err
		}
	}
	if err := guard(func() error { return batch.Commit(pebble.Sync) }); err != nil {
		return 0, fmt.Errorf("storage: restore: %w", err)
	}
	// The stream carries the count when its store kept one; one that did not is
	// counted now.
	return ensureRecordCount(db, s.logger)
}

// appliedInRecords finds the applied index among the first pairs of a version-1 stream
// (the header read): keys come in order, and only the in-doubt index ("d/") sorts
// before it.
func appliedInRecords(sr *snapReader) (index, term uint64, err error) {
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
