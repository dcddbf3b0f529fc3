package node

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	walfs "github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// frameAt puts an entry frame with payload at off in file and returns the offset after
// it, padded to 8 as raft-wal pads.
func frameAt(file []byte, off int, payload []byte) int {
	file[off] = walFrameEntry
	binary.LittleEndian.PutUint32(file[off+4:], uint32(len(payload)))
	copy(file[off+walFrameHeaderBytes:], payload)
	return off + walFrameHeaderBytes + (len(payload)+7)/8*8
}

// TestReadFrameAtReadsOnlyWhatIsSafeShort: readFrameAt, on a file laid out as raft-wal
// lays out a segment. A speculative read finds a small frame and returns it alone; it
// reads in full a frame larger than the probe, any read before the log is armed, any
// read of another length, and a read near the file's end. And the second read of a
// frame whose payload is exactly walReadBufBytes long, whose first bytes look like a
// small frame's header, is read in full: shortened, raft-wal's reader would fail on it.
func TestReadFrameAtReadsOnlyWhatIsSafeShort(t *testing.T) {
	file := make([]byte, 256<<10)
	small := bytes.Repeat([]byte("s"), 100)
	big := bytes.Repeat([]byte("b"), frameProbeBytes)
	exact := make([]byte, walReadBufBytes)
	for i := range exact {
		exact[i] = byte(i)
	}
	// The exact payload starts like the header of a 16-byte entry frame.
	copy(exact, []byte{walFrameEntry, 0, 0, 0, 16, 0, 0, 0})
	offSmall := 32
	offBig := frameAt(file, offSmall, small)
	offExact := frameAt(file, offBig, big)
	offFits := frameAt(file, offExact, exact)
	offOver := frameAt(file, offFits, big[:frameProbeBytes-walFrameHeaderBytes])
	offCommit := frameAt(file, offOver, big[:frameProbeBytes-walFrameHeaderBytes+1])
	// A commit frame (type 3, a checksum where an entry's length would be).
	copy(file[offCommit:], []byte{3, 0, 0, 0, 16, 0, 0, 0})
	offTail := offCommit + walFrameHeaderBytes
	frameAt(file, offTail, small)
	tailFile := file[:offTail+walFrameHeaderBytes+len(small)+frameProbeBytes/2]

	for _, tc := range []struct {
		name    string
		file    []byte
		armed   bool
		off     int
		size    int
		wantN   int
		wantEOF bool
	}{
		{"small frame", file, true, offSmall, walReadBufBytes, walFrameHeaderBytes + len(small), true},
		{"small frame, not armed", file, false, offSmall, walReadBufBytes, walReadBufBytes, false},
		{"frame larger than the probe", file, true, offBig, walReadBufBytes, walReadBufBytes, false},
		{"frame exactly the probe", file, true, offFits, walReadBufBytes, frameProbeBytes, true},
		{"frame a byte over the probe", file, true, offOver, walReadBufBytes, walReadBufBytes, false},
		{"commit frame", file, true, offCommit, walReadBufBytes, walReadBufBytes, false},
		{"second read of an exactly 64 KiB payload", file, true, offExact + walFrameHeaderBytes, walReadBufBytes, walReadBufBytes, false},
		{"another length", file, true, offSmall, walReadBufBytes - 8, walReadBufBytes - 8, false},
		{"near the file's end", tailFile, true, offTail, walReadBufBytes, len(tailFile) - offTail, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := make([]byte, tc.size)
			n, err := readFrameAt(bytes.NewReader(tc.file), tc.armed, p, int64(tc.off))
			if n != tc.wantN || (err == io.EOF) != tc.wantEOF || (err != nil && err != io.EOF) {
				t.Fatalf("read %d bytes, %v; want %d bytes, EOF %v", n, err, tc.wantN, tc.wantEOF)
			}
			if !bytes.Equal(p[:n], tc.file[tc.off:tc.off+n]) {
				t.Fatal("the bytes read are not the file's")
			}
		})
	}
}

// smallEntry is the data of entry i of walOfSmallEntries: 300 bytes, as a command is.
func smallEntry(i int) []byte { return fmt.Appendf(nil, "%0300d", i) }

// walOfSmallEntries opens raft-wal on fsys in a new dir, holding entries 1 to n of
// smallEntry's data; it is closed when tb ends.
func walOfSmallEntries(tb testing.TB, fsys types.VFS, n int) *wal.WAL {
	tb.Helper()
	dir := tb.TempDir()
	w, err := wal.Open(dir, wal.WithSegmentFiler(segment.NewFiler(dir, fsys)))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { w.Close() })
	var logs []*raft.Log
	for i := 1; i <= n; i++ {
		logs = append(logs, &raft.Log{Index: uint64(i), Term: 1, Type: raft.LogCommand, Data: smallEntry(i)})
	}
	if err := w.StoreLogs(logs); err != nil {
		tb.Fatal(err)
	}
	return w
}

// countingVFS counts the bytes its files' ReadAt return.
type countingVFS struct {
	types.VFS
	read *atomic.Int64
}

type countingFile struct {
	types.WritableFile
	read *atomic.Int64
}

func (f countingFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.WritableFile.ReadAt(p, off)
	f.read.Add(int64(n))
	return n, err
}

func (c countingVFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	f, err := c.VFS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	return countingFile{f, c.read}, nil
}

// TestWALReadsBackAnEntryWithoutItsBuffer: through raft-wal itself, reading back an
// entry of a few hundred bytes reads about a page, not raft-wal's 64 KiB buffer, once
// the files are armed, and all 64 KiB before. It fails when raft-wal reads otherwise
// (another buffer size, no short reads): the read-back is then what it was before
// walread.go, and the constants there need a look.
func TestWALReadsBackAnEntryWithoutItsBuffer(t *testing.T) {
	var read atomic.Int64
	armed := new(atomic.Bool)
	const entries = 100
	w := walOfSmallEntries(t, shortReadWALFS{countingVFS{walfs.New(), &read}, armed}, entries)
	readAll := func() int64 {
		t.Helper()
		read.Store(0)
		for i := 1; i <= entries; i++ {
			var l raft.Log
			if err := w.GetLog(uint64(i), &l); err != nil {
				t.Fatal(err)
			}
			if want := smallEntry(i); !bytes.Equal(l.Data, want) {
				t.Fatalf("entry %d: %q, want %q", i, l.Data, want)
			}
		}
		return read.Load()
	}
	if got := readAll(); got < entries*walReadBufBytes {
		t.Fatalf("not armed: %d bytes read for %d entries, want raft-wal's %d each", got, entries, walReadBufBytes)
	}
	armed.Store(true)
	if got := readAll(); got > entries*(walFrameHeaderBytes+frameProbeBytes) {
		t.Fatalf("armed: %d bytes read for %d entries of 300 bytes, want at most %d each", got, entries, walFrameHeaderBytes+frameProbeBytes)
	}
}

// TestWALReadsEveryEntrySizeBack: entries of every size around the probe's and raft-wal's
// buffer's bounds, in segments of 1 MiB (so most are read from sealed segments), read
// back whole through openRaftLog's files, before and after a reopen (whose recovery of
// the last segment reads with the files not yet armed).
func TestWALReadsEveryEntrySizeBack(t *testing.T) {
	hlog := newHCLogger(slog.New(slog.DiscardHandler))
	var sizes []int
	for _, around := range []int{frameProbeBytes, walReadBufBytes} {
		for d := around - 64; d <= around+16; d++ {
			sizes = append(sizes, d)
		}
	}
	sizes = append(sizes, 0, 1, 300, 3*walReadBufBytes)
	data := func(i int) []byte {
		b := make([]byte, sizes[i])
		for j := range b {
			b[j] = byte(i + j)
		}
		return b
	}
	dir := t.TempDir()
	s, err := openRaftLog(dir, RaftLogWAL, 1<<20, hlog)
	if err != nil {
		t.Fatal(err)
	}
	for i := range sizes {
		if err := s.StoreLog(&raft.Log{Index: uint64(i + 1), Term: 1, Type: raft.LogCommand, Data: data(i)}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(s raftLogStore) {
		t.Helper()
		for i := range sizes {
			var l raft.Log
			if err := s.GetLog(uint64(i+1), &l); err != nil {
				t.Fatalf("entry %d (%d bytes): %v", i+1, sizes[i], err)
			}
			if !bytes.Equal(l.Data, data(i)) {
				t.Fatalf("entry %d (%d bytes): read %d bytes, not the entry's", i+1, sizes[i], len(l.Data))
			}
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = openRaftLog(dir, RaftLogWAL, 1<<20, hlog); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check(s)
}

// BenchmarkWALGetLog reads back entries of 300 bytes, as the log verifier does, with the
// files' short reads (armed) and without.
func BenchmarkWALGetLog(b *testing.B) {
	for _, armedNow := range []bool{false, true} {
		b.Run(fmt.Sprintf("armed=%v", armedNow), func(b *testing.B) {
			armed := new(atomic.Bool)
			const entries = 4096
			w := walOfSmallEntries(b, shortReadWALFS{walfs.New(), armed}, entries)
			armed.Store(armedNow)
			b.ReportAllocs()
			var l raft.Log
			for i := 0; b.Loop(); i++ {
				if err := w.GetLog(uint64(i%entries+1), &l); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestWALRecoversABatchOfTheProbedLength: raft-wal's recovery of the last segment reads
// the last committed batch back to check its checksum, a read as long as the batch. A
// batch of exactly walReadBufBytes, read short, would fail the open ("failed to read
// last committed batch"): the files are armed only once the log is open. The batch here
// is a small entry's frame and a large one's, walReadBufBytes in all, after a first batch
// (raft-wal's first commit of a segment is checked with the file's header, from offset 0).
func TestWALRecoversABatchOfTheProbedLength(t *testing.T) {
	hlog := newHCLogger(slog.New(slog.DiscardHandler))
	at := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	entry := func(i uint64, size int) *raft.Log {
		return &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: bytes.Repeat([]byte{byte(i)}, size), AppendedAt: at}
	}
	frame := func(l *raft.Log) int {
		var b bytes.Buffer
		if err := (&wal.BinaryCodec{}).Encode(l, &b); err != nil {
			t.Fatal(err)
		}
		return walFrameHeaderBytes + (b.Len()+7)/8*8
	}
	before := entry(1, 100)
	first := entry(2, 100)
	second := entry(3, walReadBufBytes-frame(first)-64)
	for frame(first)+frame(second) < walReadBufBytes {
		second = entry(3, len(second.Data)+1)
	}
	if got := frame(first) + frame(second); got != walReadBufBytes {
		t.Fatalf("the batch's frames are %d bytes, want %d", got, walReadBufBytes)
	}
	dir := t.TempDir()
	s, err := openRaftLog(dir, RaftLogWAL, DefaultRaftWALSegmentBytes, hlog)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLog(before); err != nil {
		t.Fatal(err)
	}
	if err := s.StoreLogs([]*raft.Log{first, second}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = openRaftLog(dir, RaftLogWAL, DefaultRaftWALSegmentBytes, hlog); err != nil {
		t.Fatalf("reopening a log whose last batch is %d bytes: %v", walReadBufBytes, err)
	}
	defer s.Close()
	for _, want := range []*raft.Log{before, first, second} {
		var got raft.Log
		if err := s.GetLog(want.Index, &got); err != nil || !bytes.Equal(got.Data, want.Data) {
			t.Fatalf("entry %d: %d bytes, %v; want %d bytes", want.Index, len(got.Data), err, len(want.Data))
		}
	}
}

// TestWALReadsBackWhileAppending: the verifier reads the tail segment back while Raft
// appends to it. Each entry read while later ones are appended is whole (and the race
// detector sees the files' probe buffers shared by no two reads).
func TestWALReadsBackWhileAppending(t *testing.T) {
	hlog := newHCLogger(slog.New(slog.DiscardHandler))
	s, err := openRaftLog(t.TempDir(), RaftLogWAL, 1<<20, hlog)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const entries = 2000
	data := func(i uint64) []byte { return fmt.Appendf(nil, "%0*d", 100+int(i%5000), i) }
	var stored atomic.Uint64
	var failed atomic.Bool
	done := make(chan error, 3)
	go func() {
		for i := uint64(1); i <= entries; i++ {
			if err := s.StoreLog(&raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: data(i)}); err != nil {
				failed.Store(true)
				done <- err
				return
			}
			stored.Store(i)
		}
		done <- nil
	}()
	for range 2 {
		go func() {
			for next := uint64(1); next <= entries; {
				if next > stored.Load() {
					if failed.Load() {
						break
					}
					runtime.Gosched()
					continue
				}
				var l raft.Log
				if err := s.GetLog(next, &l); err != nil {
					done <- fmt.Errorf("entry %d: %w", next, err)
					return
				}
				if !bytes.Equal(l.Data, data(next)) {
					done <- fmt.Errorf("entry %d: %d bytes, not the entry's", next, len(l.Data))
					return
				}
				next++
			}
			done <- nil
		}()
	}
	for range 3 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
