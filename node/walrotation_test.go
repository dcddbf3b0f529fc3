package node

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	walfs "github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// TestRaftWALFinishesAnInterruptedRotation: the crash TestPowerLossOnLazyFS once hit
// (a rack cut while followers rotated their last segment). The append that fills a
// segment seals its file; the meta store learns of the rotation only afterwards. With
// the file sealed and the meta store still naming it the open tail, raft-wal v0.4.2
// opens the log and then refuses every append ("segment is sealed"), so the node could
// never store an entry again. The log must open, keep every entry the seal committed,
// and take appends, across a second restart too.
//
// The torn case: the seal's commit never became durable (its index block is garbage).
// raft-wal then keeps only the entries of the commit before, yet still reads the
// segment as sealed; the log must drop the torn index and take appends after the last
// intact commit.
func TestRaftWALFinishesAnInterruptedRotation(t *testing.T) {
	for _, torn := range []bool{false, true} {
		t.Run(fmt.Sprintf("torn=%v", torn), func(t *testing.T) { interruptedRotation(t, torn) })
	}
}

func interruptedRotation(t *testing.T, torn bool) {
	dataDir := t.TempDir()
	walDir := filepath.Join(dataDir, walLogDir)
	entry := func(i uint64) *raft.Log { return testEntry(i, 3) }
	open := func() raftLogStore { return mustOpenRaftLog(t, dataDir, RaftLogWAL, walTestSegmentBytes) }
	check := func(s raftLogStore, last uint64) {
		t.Helper()
		if l, err := s.LastIndex(); err != nil || l != last {
			t.Fatalf("last index %d (%v), want %d", l, err, last)
		}
		for i := uint64(1); i <= last; i++ {
			var got raft.Log
			if err := s.GetLog(i, &got); err != nil {
				t.Fatalf("entry %d: %v", i, err)
			}
			if want := entry(i); !bytes.Equal(got.Data, want.Data) {
				t.Fatalf("entry %d: %q, want %q", i, got.Data, want.Data)
			}
		}
	}

	// A log with a few entries in its first segment.
	s := open()
	const first = 5
	for i := uint64(1); i <= first; i++ {
		if err := s.StoreLogs([]*raft.Log{entry(i)}); err != nil {
			t.Fatal(err)
		}
	}
	mustClose(t, s)

	// Then, as raft-wal's writer does, appends until one seals the segment, and a
	// crash before the rotation reaches the meta store.
	ps := walMeta(t, walDir)
	tail := ps.Segments[len(ps.Segments)-1]
	w, err := segment.NewFiler(walDir, walfs.New()).RecoverTail(tail)
	if err != nil {
		t.Fatal(err)
	}
	var codec wal.BinaryCodec
	last := uint64(first)
	var indexStart uint64
	for sealed := false; !sealed; {
		last++
		var buf bytes.Buffer
		if err := codec.Encode(entry(last), &buf); err != nil {
			t.Fatal(err)
		}
		if err := w.Append([]types.LogEntry{{Index: last, Data: buf.Bytes()}}); err != nil {
			t.Fatal(err)
		}
		if sealed, indexStart, err = w.Sealed(); err != nil {
			t.Fatal(err)
		}
	}
	mustClose(t, w)
	if torn {
		// The seal's index block half written: its commit's checksum fails, and the
		// entry of the sealing append was never durable.
		f, err := walfs.New().OpenWriter(walDir, segment.FileName(tail))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(bytes.Repeat([]byte{0xa5}, 8), int64(indexStart)); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		last--
	}
	t.Logf("segment sealed at index %d with its index at offset %d", last, indexStart)

	for restart := range 2 {
		s = open()
		check(s, last)
		for range 40 { // past the next segment's end too
			last++
			if err := s.StoreLogs([]*raft.Log{entry(last)}); err != nil {
				if errors.Is(err, wal.ErrSealed) {
					t.Fatalf("restart %d: append %d: %v: the interrupted rotation was never finished", restart, last, err)
				}
				t.Fatalf("restart %d: append %d: %v", restart, last, err)
			}
		}
		check(s, last)
		mustClose(t, s)
	}
}

// TestRaftWALHaltsWhenARotationFails: a rotation that fails while the node runs (here
// the new segment's file cannot be created: a directory holds its name) leaves the
// last segment sealed, and raft-wal refuses every later append. The store must halt
// the node at the first refusal, with an error that says so, rather than let Raft take
// the refusals for passing ones; a restart, with the disk healthy again, must keep
// every entry stored and take appends.
func TestRaftWALHaltsWhenARotationFails(t *testing.T) {
	dataDir := t.TempDir()
	walDir := filepath.Join(dataDir, walLogDir)
	entry := func(i uint64) *raft.Log { return testEntry(i, 2) }
	open := func() raftLogStore { return mustOpenRaftLog(t, dataDir, RaftLogWAL, walTestSegmentBytes) }
	mustClose(t, open())
	ps := walMeta(t, walDir)
	// Whichever append fills the first segment, the next one's file is taken.
	var decoys []string
	for base := uint64(2); base <= 200; base++ {
		d := filepath.Join(walDir, segment.FileName(types.SegmentInfo{BaseIndex: base, ID: ps.NextSegmentID}))
		decoys = append(decoys, d)
	}
	s := open()
	for _, d := range decoys {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	var halted error
	g := haltWhenSealed(s, func(err error) error { halted = err; return err })
	var stored uint64
	for i := uint64(1); i <= 200; i++ {
		if err := g.StoreLogs([]*raft.Log{entry(i)}); err != nil {
			if !errors.Is(err, wal.ErrSealed) {
				t.Fatalf("append %d: %v, want the sealed segment's error", i, err)
			}
			break
		}
		stored = i
	}
	if stored == 200 {
		t.Fatal("200 appends and no rotation failed: the test proved nothing")
	}
	if halted == nil || !errors.Is(halted, wal.ErrSealed) {
		t.Fatalf("append %d was refused for a sealed segment and the store did not halt the node (halt got %v)", stored+1, halted)
	}
	t.Logf("halted after %d appends: %v", stored, halted)
	mustClose(t, g)

	for _, d := range decoys {
		if err := os.Remove(d); err != nil {
			t.Fatal(err)
		}
	}
	s = open()
	defer s.Close() //nolint:errcheck // a test's store
	for i := uint64(1); i <= stored; i++ {
		var got raft.Log
		if err := s.GetLog(i, &got); err != nil || !bytes.Equal(got.Data, entry(i).Data) {
			t.Fatalf("after the restart, entry %d: %q (%v)", i, got.Data, err)
		}
	}
	for i := stored + 1; i <= stored+60; i++ {
		if err := s.StoreLogs([]*raft.Log{entry(i)}); err != nil {
			t.Fatalf("after the restart, append %d: %v", i, err)
		}
	}
}

// mustOpenRaftLog opens dataDir's Raft log in backend, failing the test on an error.
func mustOpenRaftLog(t testing.TB, dataDir, backend string, walSegmentBytes int) raftLogStore {
	t.Helper()
	s, err := openRaftLog(dataDir, backend, walSegmentBytes, newHCLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// mustClose closes a test's log store, failing the test on an error.
func mustClose(t testing.TB, s io.Closer) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// walMeta is the state in dir's raft-wal meta store (the log must be closed).
func walMeta(t testing.TB, dir string) types.PersistentState {
	t.Helper()
	var meta metadb.BoltMetaDB
	ps, err := meta.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	mustClose(t, &meta)
	return ps
}

// testEntry is entry i of a test's log, about 120 bytes.
func testEntry(i, term uint64) *raft.Log {
	return &raft.Log{Index: i, Term: term, Type: raft.LogCommand, Data: fmt.Appendf(nil, "entry-%d-%0100d", i, i)}
}

// walTestSegmentBytes makes segments of a few dozen test entries.
const walTestSegmentBytes = 4 << 10
