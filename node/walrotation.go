package node

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// raft-wal rotates its last segment in two steps. The append that fills the segment
// seals its file (an index block, then the commit frame, synced with the entries);
// then a goroutine records the rotation in the meta store: the old segment sealed, a
// new one after it. A crash between the two, or a failed meta commit, leaves a sealed
// file that the meta store still lists as the open tail. raft-wal's recovery finds the
// index block, keeps the segment sealed, and never rotates it: every append after the
// restart fails with "segment is sealed", for good (seen in TestPowerLossOnLazyFS: a
// cut of the whole rack while two followers rotated left them refusing every entry,
// and the cluster never committed again).
//
// rotatingMeta is raft-wal's meta store with that repair on Load, before raft-wal
// reads the state: a sealed tail has its rotation finished, exactly as raft-wal would
// have recorded it, in one meta commit. A tail whose index block does not match its
// entries was torn while it was being sealed (its commit frame never became durable):
// the index frame's header is zeroed, so the segment reads as unsealed again and the
// torn batch as the uncommitted write it was.
type rotatingMeta struct {
	*metadb.BoltMetaDB
	sf           *segment.Filer
	vfs          types.VFS
	dir          string
	segmentBytes int
	log          hclog.Logger
}

// newRotatingMeta is the meta store of the raft-wal log in dir, whose files are vfs's,
// opened by sf.
func newRotatingMeta(dir string, vfs types.VFS, sf *segment.Filer, segmentBytes int, log hclog.Logger) *rotatingMeta {
	return &rotatingMeta{BoltMetaDB: &metadb.BoltMetaDB{}, sf: sf, vfs: vfs, dir: dir, segmentBytes: segmentBytes, log: log}
}

// Load loads the persisted state and finishes an interrupted rotation of its tail.
func (m *rotatingMeta) Load(dir string) (types.PersistentState, error) {
	ps, err := m.BoltMetaDB.Load(dir)
	if err != nil {
		return ps, err
	}
	fixed, changed, err := m.finishRotation(ps)
	if err == nil && changed {
		err = m.BoltMetaDB.CommitState(fixed)
	}
	if err != nil {
		// raft-wal does not close its meta store when Open fails.
		return ps, errors.Join(fmt.Errorf("finishing an interrupted segment rotation: %w", err), m.BoltMetaDB.Close())
	}
	return fixed, nil
}

// finishRotation returns ps with its tail's rotation finished when the tail's file is
// sealed, and whether it changed ps.
func (m *rotatingMeta) finishRotation(ps types.PersistentState) (types.PersistentState, bool, error) {
	if len(ps.Segments) == 0 {
		return ps, false, nil
	}
	tail := ps.Segments[len(ps.Segments)-1]
	if !tail.SealTime.IsZero() {
		return ps, false, nil // raft-wal opens a new tail after a sealed one itself
	}
	w, err := m.sf.RecoverTail(tail)
	if errors.Is(err, fs.ErrNotExist) {
		return ps, false, nil // raft-wal creates it
	}
	if err != nil {
		return ps, false, err
	}
	sealed, indexStart, err := w.Sealed()
	last := w.LastIndex()
	// The writer's own offsets, from its scan of the frames up to the last intact
	// commit, against the index block the seal wrote.
	var matches bool
	if err == nil && sealed {
		matches, err = m.indexMatches(tail, w, indexStart, last)
	}
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil || !sealed {
		return ps, false, err
	}
	name := segment.FileName(tail)
	f, err := m.vfs.OpenWriter(m.dir, name)
	if err != nil {
		return ps, false, err
	}
	if !matches {
		if indexStart < walFrameHeaderBytes {
			return ps, false, errors.Join(fmt.Errorf("segment %s is sealed with its index at offset %d", name, indexStart), f.Close())
		}
		// Torn while being sealed: forget the index frame. Nothing after the last
		// intact commit was ever acknowledged.
		_, err := f.WriteAt(make([]byte, walFrameHeaderBytes), int64(indexStart)-walFrameHeaderBytes)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			m.log.Warn("raft log: dropped the torn index block of the last segment", "segment", name, "last_index", last)
		}
		return ps, false, err
	}
	// The seal was synced with the append that wrote it; after a process crash it
	// may still be only in the page cache, so make it durable before the meta store
	// says the segment is sealed.
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return ps, false, err
	}
	now := time.Now()
	segs := append([]types.SegmentInfo(nil), ps.Segments...)
	sealedTail := tail
	sealedTail.SealTime, sealedTail.MaxIndex, sealedTail.IndexStart = now, last, indexStart
	segs[len(segs)-1] = sealedTail
	segs = append(segs, types.SegmentInfo{
		ID: ps.NextSegmentID, BaseIndex: last + 1, MinIndex: last + 1,
		SizeLimit: uint32(m.segmentBytes), Codec: wal.CodecBinaryV1, CreateTime: now,
	})
	m.log.Warn("raft log: finished the rotation of a sealed last segment that a crash interrupted",
		"segment", name, "last_index", last, "next_segment", ps.NextSegmentID)
	return types.PersistentState{NextSegmentID: ps.NextSegmentID + 1, Segments: segs}, true, nil
}

// frameOffsets is the part of raft-wal's segment writer that reports where each
// entry's frame starts.
type frameOffsets interface {
	OffsetForFrame(idx uint64) (uint32, error)
}

// indexMatches reports whether the index block of tail at indexStart is a whole index
// frame listing, for every entry up to last, the offset w found by scanning.
func (m *rotatingMeta) indexMatches(tail types.SegmentInfo, w types.SegmentWriter, indexStart, last uint64) (bool, error) {
	ow, ok := w.(frameOffsets)
	if !ok {
		return false, fmt.Errorf("raft-wal's segment writer %T reports no frame offsets", w)
	}
	if last < tail.BaseIndex || indexStart < walFrameHeaderBytes {
		return false, nil // no entry committed, or no room for a frame header
	}
	r, err := m.vfs.OpenReader(m.dir, segment.FileName(tail))
	if err != nil {
		return false, err
	}
	defer r.Close() //nolint:errcheck // read only
	n := last - tail.BaseIndex + 1
	buf := make([]byte, walFrameHeaderBytes+4*n)
	got, err := r.ReadAt(buf, int64(indexStart)-walFrameHeaderBytes)
	if errors.Is(err, io.EOF) && got < len(buf) {
		return false, nil // the file ends inside the index
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	if buf[0] != walFrameIndex || uint64(binary.LittleEndian.Uint32(buf[4:8])) < 4*n {
		return false, nil
	}
	for idx := max(tail.BaseIndex, tail.MinIndex); idx <= last; idx++ {
		want, err := ow.OffsetForFrame(idx)
		if err != nil {
			return false, err
		}
		at := walFrameHeaderBytes + 4*(idx-tail.BaseIndex)
		if binary.LittleEndian.Uint32(buf[at:at+4]) != want {
			return false, nil
		}
	}
	return true, nil
}

// A rotation can also fail while the node runs: raft-wal records it in the meta store,
// then creates the new segment's file, and a failure of either (a failed write of
// wal-meta.db, a full disk when the file is preallocated) is only logged, as "rotate
// error". The last segment stays sealed and every later append fails with ErrSealed;
// it is the only way raft-wal's writer answers ErrSealed, as an append waits for the
// rotation its predecessor started. Raft takes each failure as a passing one, so the
// node would go on refusing every entry, with /readyz answering ready. A restart
// finishes the rotation (above); until then the node halts, as for a storage error
// while applying: Raft stops, and /readyz and the log say why.

// sealedWAL is raft-wal's log store, halting the node when an append finds the last
// segment sealed.
type sealedWAL struct {
	*wal.WAL
	halt func(error) error
}

// haltWhenSealed returns s, with appends that find raft-wal's last segment sealed
// halting the node through halt; a store of the other backend is returned as it is.
func haltWhenSealed(s raftLogStore, halt func(error) error) raftLogStore {
	w, ok := s.(*wal.WAL)
	if !ok {
		return s
	}
	return sealedWAL{WAL: w, halt: halt}
}

func (s sealedWAL) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

func (s sealedWAL) StoreLogs(logs []*raft.Log) error {
	err := s.WAL.StoreLogs(logs)
	if errors.Is(err, wal.ErrSealed) {
		return s.halt(fmt.Errorf("raft log: the last segment is sealed and raft-wal failed to rotate it (its \"rotate error\" says why); a restart finishes the rotation: %w", err))
	}
	return err
}
