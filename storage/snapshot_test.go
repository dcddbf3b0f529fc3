package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/idemkv/idemkv"
)

// assertOnlyStore checks that nothing but the store ("pebble") is left in dir: no
// received files, no replaced store, no snapshot checkpoint.
func assertOnlyStore(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "pebble" {
			t.Errorf("%s left beside the store", e.Name())
		}
	}
}

// fill writes n records (keys prefix0000…) and the applied index in batches of 1,000.
func fill(t testing.TB, s *Store, prefix string, n int, applied uint64) {
	t.Helper()
	for i := 0; i < n; {
		b := s.NewBatch()
		for j := 0; j < 1000 && i < n; j++ {
			r := fullRecord()
			r.Key = fmt.Sprintf("%s%07d", prefix, i)
			r.ExpiresAt = ts + idemkv.Timestamp(i)
			if err := b.PutRecord(r); err != nil {
				t.Fatal(err)
			}
			i++
		}
		if err := errors.Join(b.SetApplied(applied, 1), b.Commit()); err != nil {
			t.Fatal(err)
		}
	}
}

// flush moves the memtable into tables, so that a snapshot holds both tables and log.
func flush(t testing.TB, s *Store) {
	t.Helper()
	db, err := s.open()
	if err != nil {
		t.Fatal(err)
	}
	defer s.mu.RUnlock()
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
}

type storeState struct {
	hash           [32]byte
	index, term    uint64
	records        int64
	recordsCounted int64
}

func stateOf(t *testing.T, s *Store) storeState {
	t.Helper()
	var st storeState
	var err error
	if st.hash, err = s.Hash(); err != nil {
		t.Fatal(err)
	}
	if st.index, st.term, err = s.Applied(); err != nil {
		t.Fatal(err)
	}
	st.records = s.RecordCount()
	db, err := s.open()
	if err != nil {
		t.Fatal(err)
	}
	defer s.mu.RUnlock()
	if st.recordsCounted, err = countKeys(db, prefixRecord); err != nil {
		t.Fatal(err)
	}
	return st
}

// frame is one frame of a version-2 stream, as the tests see it.
type frame struct {
	tag        byte
	name       string
	start, end int // the frame's bytes
	content    int // offset of a file's content
}

// framesOf splits a version-2 stream into its frames; the header is frame 0.
func framesOf(t *testing.T, data []byte) []frame {
	t.Helper()
	frames := []frame{{start: 0, end: 29}}
	p := 29
	for data[p] != tagTrailer {
		f := frame{tag: data[p], start: p}
		p++
		klen, w := binary.Uvarint(data[p:])
		p += w
		name := string(data[p : p+int(klen)])
		p += int(klen)
		switch f.tag {
		case tagFile:
			f.name = name
			size := int(binary.BigEndian.Uint64(data[p:]))
			f.content = p + 8
			p += 8 + size + 4
		case tagFixup:
			f.name = name
			if data[p] == 1 {
				vlen, w := binary.Uvarint(data[p+1:])
				p += 1 + w + int(vlen)
			} else {
				p++
			}
		default:
			t.Fatalf("tag %#x at %d", f.tag, f.start)
		}
		f.end = p
		frames = append(frames, f)
	}
	return append(frames, frame{tag: tagTrailer, start: p, end: len(data)})
}

// withoutFixups rebuilds a version-2 stream with its fixups left out, trailer and all.
func withoutFixups(t *testing.T, data []byte) []byte {
	t.Helper()
	var out []byte
	files := 0
	for _, f := range framesOf(t, data) {
		switch f.tag {
		case tagFixup:
			continue
		case tagFile:
			files++
		case tagTrailer:
			out = binary.BigEndian.AppendUint64(append(out, tagTrailer), uint64(files))
			out = binary.BigEndian.AppendUint64(out, 0)
			return binary.BigEndian.AppendUint32(out, crc32.Checksum(out, castagnoli))
		}
		out = append(out, data[f.start:f.end]...)
	}
	return out
}

func TestSnapshotRoundTripManyRecords(t *testing.T) {
	src := openStore(t, t.TempDir())
	fill(t, src, "k", 25_000, 50_000)
	flush(t, src)
	fill(t, src, "l", 5_000, 60_000)
	want := stateOf(t, src)
	data := snapshotOf(t, src)
	if i, term, err := SnapshotApplied(bytes.NewReader(data[:29])); err != nil || i != 60_000 || term != 1 {
		t.Fatalf("SnapshotApplied from the header alone: %d/%d %v", i, term, err)
	}
	files := 0
	for _, f := range framesOf(t, data) {
		if f.tag == tagFile && strings.HasSuffix(f.name, ".sst") {
			files++
		}
	}
	if files == 0 || !bytes.Contains(data, []byte(".log")) {
		t.Fatal("the snapshot holds no tables or no log: the checkpoint is not what is streamed")
	}

	dir := t.TempDir()
	dst := openStore(t, filepath.Join(dir, "pebble"))
	fill(t, dst, "other", 500, 7) // gone after the restore
	if err := dst.Restore(bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, dst); got != want {
		t.Fatalf("restored %+v, want %+v", got, want)
	}
	if err := dst.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
	assertOnlyStore(t, dir)
	// The restored store is a store: it takes writes and survives a reopen.
	fill(t, dst, "after", 10, 60_001)
	if dst.RecordCount() != 30_010 {
		t.Fatalf("%d records after more writes", dst.RecordCount())
	}
}

// TestSnapshotIsPointInTime: writes committed after the capture (updates, deletes,
// new records, the applied index) are in the checkpoint WriteTo takes, and the fixups
// put every one of them back: the restored state is the captured one. Without the
// fixups, the header's applied index does not match the received store and the
// restore refuses it.
func TestSnapshotIsPointInTime(t *testing.T) {
	src := openStore(t, t.TempDir())
	fill(t, src, "k", 2000, 4000)
	want := stateOf(t, src)
	sn := src.NewSnapshot()
	defer sn.Close()

	b := src.NewBatch()
	r := fullRecord()
	r.Key, r.ExpiresAt = "k0000001", ts+99 // moves its expiry entry too
	if err := b.PutRecord(r); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DeleteRecord(r.Tenant, "k0000002"); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(b.SetApplied(4001, 2), b.Commit()); err != nil {
		t.Fatal(err)
	}
	fill(t, src, "new", 50, 4002)

	var buf bytes.Buffer
	if _, err := sn.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	fixups := 0
	for _, f := range framesOf(t, data) {
		if f.tag == tagFixup {
			fixups++
		}
	}
	// 50 new records and their expiry entries, the updated record and its two expiry
	// entries, the deleted one and its entry, applied index, record count.
	if fixups < 100+3+2+2 {
		t.Fatalf("%d fixups: writes after the capture went unnoticed", fixups)
	}
	dst := openStore(t, t.TempDir())
	if err := dst.Restore(bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, dst); got != want {
		t.Fatalf("restored %+v, want the captured %+v", got, want)
	}
	if err := dst.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
	if err := dst.Restore(bytes.NewReader(withoutFixups(t, data))); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("restore without the fixups: %v, want corrupt", err)
	}
}

// TestSnapshotWhileCommitting writes a snapshot while a writer commits all the time:
// whatever lands in the checkpoint, the restore holds the captured state.
func TestSnapshotWhileCommitting(t *testing.T) {
	src := openStore(t, t.TempDir())
	fill(t, src, "k", 5000, 10_000)
	want := stateOf(t, src)
	sn := src.NewSnapshot()
	defer sn.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var commits atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			b := src.NewBatch()
			r := fullRecord()
			r.Key = fmt.Sprintf("k%07d", i%7000) // updates and new records
			r.Attempts = uint32(i)
			if err := errors.Join(b.PutRecord(r), b.SetApplied(uint64(10_001+i), 1), b.Commit()); err != nil {
				t.Error(err)
				return
			}
			commits.Add(1)
		}
	}()
	// Let the writer get going, so that commits land before and during the checkpoint.
	for commits.Load() < 100 {
		if t.Failed() {
			break
		}
	}
	var buf bytes.Buffer
	_, err := sn.WriteTo(&buf)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	dst := openStore(t, t.TempDir())
	if err := dst.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, dst); got != want {
		t.Fatalf("restored %+v, want the captured %+v (%d commits meanwhile)", got, want, commits.Load())
	}
}

// TestRestoreRefusesCorruptStreams: a byte flipped in any part of a version-2 stream,
// or a stream cut at any frame boundary or inside a frame, fails the restore as
// corrupt and leaves the store as it was.
func TestRestoreRefusesCorruptStreams(t *testing.T) {
	src := openStore(t, t.TempDir())
	fill(t, src, "k", 3000, 6000)
	flush(t, src)
	sn := src.NewSnapshot()
	fill(t, src, "late", 3, 6001) // so that the stream has fixups
	var buf bytes.Buffer
	if _, err := sn.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	sn.Close()
	data := buf.Bytes()
	frames := framesOf(t, data)

	dir := t.TempDir()
	dst := openStore(t, filepath.Join(dir, "pebble"))
	fill(t, dst, "mine", 20, 40)
	before := stateOf(t, dst)
	flip := func(i int) []byte {
		b := bytes.Clone(data)
		b[i] ^= 0x10
		return b
	}
	cases := map[string][]byte{"trailing byte": append(bytes.Clone(data), 0)}
	sawTable := false
	for i, f := range frames {
		switch {
		case f.tag == tagFile && strings.HasSuffix(f.name, ".sst") && !sawTable:
			sawTable = true
			cases["table content"] = flip(f.content + (f.end-4-f.content)/2)
			cases["table name"] = flip(f.start + 3)
			cases["table size"] = flip(f.content - 2)
			cases["table checksum"] = flip(f.end - 1)
		case f.tag == tagFile && strings.HasPrefix(f.name, "MANIFEST"):
			cases["manifest"] = flip(f.content)
		case f.tag == tagFixup:
			cases["fixup"] = flip(f.end - 1)
		case f.tag == tagTrailer:
			cases["trailer count"] = flip(f.start + 8)
			cases["trailer checksum"] = flip(f.end - 2)
		case i == 0:
			cases["magic"] = flip(2)
			cases["version"] = flip(8)
			cases["header index"] = flip(15)
		}
		cases[fmt.Sprintf("cut before frame %d", i)] = data[:f.start]
		cases[fmt.Sprintf("cut inside frame %d", i)] = data[:(f.start+f.end)/2]
	}
	for _, k := range []string{"table content", "manifest", "fixup", "trailer count"} {
		if cases[k] == nil {
			t.Fatalf("no %s case: the stream is not what the test expects", k)
		}
	}
	for name, b := range cases {
		err := dst.Restore(bytes.NewReader(b))
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err = %v, want corrupt", name, err)
		}
		if got := stateOf(t, dst); got != before {
			t.Fatalf("%s: the store changed: %+v, was %+v", name, got, before)
		}
		assertOnlyStore(t, dir)
	}
	if err := dst.Restore(bytes.NewReader(data)); err != nil {
		t.Fatalf("the intact stream after all that: %v", err)
	}
}

// TestRestoreReadsVersion1: Raft snapshots and backups of older versions restore, and
// restoreIfBehind reads their applied index.
func TestRestoreReadsVersion1(t *testing.T) {
	src := openStore(t, t.TempDir())
	fill(t, src, "k", 1500, 3000)
	want := stateOf(t, src)
	data := recordsOf(t, src)
	if data[8] != snapVersionRecords {
		t.Fatalf("version byte %d", data[8])
	}
	if i, term, err := SnapshotApplied(bytes.NewReader(data)); err != nil || i != 3000 || term != 1 {
		t.Fatalf("SnapshotApplied of a version-1 stream: %d/%d %v", i, term, err)
	}
	dir := t.TempDir()
	dst := openStore(t, filepath.Join(dir, "pebble"))
	fill(t, dst, "mine", 20, 40)
	if err := dst.Restore(bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, dst); got != want {
		t.Fatalf("restored %+v, want %+v", got, want)
	}
	assertOnlyStore(t, dir)
}

// TestSnapshotOfReplacedStoreFails: a restore that replaces the store under a snapshot
// not yet written fails the snapshot (its Pebble view is of a closed database)
// instead of writing the new state under the old one's index.
func TestSnapshotOfReplacedStoreFails(t *testing.T) {
	src := openStore(t, t.TempDir())
	fill(t, src, "k", 100, 200)
	data := snapshotOf(t, src)
	dst := openStore(t, t.TempDir())
	fill(t, dst, "mine", 100, 150)
	sn := dst.NewSnapshot()
	if err := dst.Restore(bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.WriteTo(&bytes.Buffer{}); !errors.Is(err, errReplaced) {
		t.Fatalf("WriteTo of a replaced store's snapshot: %v", err)
	}
	if err := sn.Close(); err != nil {
		t.Fatal(err)
	}
	// A snapshot outstanding when the store closes does not keep Pebble open.
	sn = dst.NewSnapshot()
	if err := dst.Close(); err != nil {
		t.Fatalf("close with a snapshot outstanding: %v", err)
	}
	if _, err := sn.WriteTo(&bytes.Buffer{}); err == nil {
		t.Fatal("a snapshot of a closed store was written")
	}
	if err := sn.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.Record("t", "k"); !errors.Is(err, errClosed) {
		t.Fatalf("read of a closed store: %v", err)
	}
	if err := dst.Restore(bytes.NewReader(data)); !errors.Is(err, errClosed) {
		t.Fatalf("restore into a closed store: %v", err)
	}
}

func TestOpenRemovesLeftovers(t *testing.T) {
	dir := t.TempDir()
	s, closeNow := openClosable(t, filepath.Join(dir, "pebble"))
	fill(t, s, "k", 10, 20)
	closeNow()
	for _, name := range []string{"pebble.snapshot-3", "pebble.restore-new", "pebble.restore-old"} {
		if err := os.MkdirAll(filepath.Join(dir, name, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "pebble.other"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, filepath.Join(dir, "pebble"))
	if s.RecordCount() != 10 {
		t.Fatalf("%d records", s.RecordCount())
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "pebble,pebble.other" {
		t.Fatalf("after open: %v", names)
	}
}

// TestCrashDuringRestoreFindsOldOrNew crashes a restore at every write it makes to
// the filesystem (a crash clone keeps only what was synced) and reopens the store
// from each: it must hold either the old state or the new one, whole.
func TestCrashDuringRestoreFindsOldOrNew(t *testing.T) {
	src := openStore(t, t.TempDir())
	fill(t, src, "k", 300, 600)
	want := stateOf(t, src)
	data := snapshotOf(t, src)

	mem := vfs.NewCrashableMem()
	var mu sync.Mutex // Pebble's background goroutines write too
	var clones []*vfs.MemFS
	var armed atomic.Bool
	fs := errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if armed.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			c := mem.CrashClone(vfs.CrashCloneCfg{})
			mu.Lock()
			clones = append(clones, c)
			mu.Unlock()
		}
		return nil
	}))
	const dir = "/data/pebble"
	dst := openOn(t, fs, dir)
	fill(t, dst, "mine", 50, 77)
	if err := dst.Sync(); err != nil {
		t.Fatal(err)
	}
	old := stateOf(t, dst)
	armed.Store(true)
	if err := dst.Restore(bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	armed.Store(false)
	// A restore that returned is durable.
	done := mem.CrashClone(vfs.CrashCloneCfg{})
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	clones = append(clones, done)
	mu.Unlock()
	sawOld, sawNew := 0, 0
	for i, c := range clones {
		s := openOn(t, c, dir)
		switch got := stateOf(t, s); got {
		case old:
			sawOld++
		case want:
			sawNew++
		default:
			t.Fatalf("crash %d of %d: state %+v is neither the old %+v nor the new %+v", i, len(clones), got, old, want)
		}
		if c == done && sawNew == 0 {
			t.Fatal("a crash after the restore returned found the old store")
		}
		if err := s.CheckExpiryIndex(); err != nil {
			t.Fatalf("crash %d: %v", i, err)
		}
		if names, _ := c.List("/data"); len(names) != 1 {
			t.Fatalf("crash %d: %v beside the store after reopening", i, names)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if sawOld == 0 || sawNew == 0 || len(clones) < 20 {
		t.Fatalf("%d crashes: %d old, %d new; the test crashed too little", len(clones), sawOld, sawNew)
	}
	t.Logf("%d crash points: %d found the old store, %d the new one", len(clones), sawOld, sawNew)
}

// TestSwapErrors injects an I/O error into each step of the swap: the restore fails,
// the store is left open on the old state when the error comes before the new store
// took its place, and otherwise closed (reads fail, none panics) until a reopen finds
// a whole store.
func TestSwapErrors(t *testing.T) {
	src := openStore(t, t.TempDir())
	fill(t, src, "k", 200, 400)
	want := stateOf(t, src)
	data := snapshotOf(t, src)
	for _, tc := range []struct {
		name   string
		fail   func(op errorfs.Op, n int) bool
		closed bool
	}{
		{"rename the store away", func(op errorfs.Op, n int) bool { return op.Kind == errorfs.OpRename && n == 1 }, false},
		{"rename the new store in", func(op errorfs.Op, n int) bool { return op.Kind == errorfs.OpRename && n == 2 }, false},
		{"open the new store", func(op errorfs.Op, n int) bool {
			return op.Kind == errorfs.OpLock && strings.HasSuffix(op.Path, "pebble/LOCK")
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var armed atomic.Bool
			var renames atomic.Int64
			fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
				if !armed.Load() {
					return nil
				}
				n := int(renames.Load())
				if op.Kind == errorfs.OpRename {
					n = int(renames.Add(1))
				}
				if tc.fail(op, n) {
					return errorfs.ErrInjected
				}
				return nil
			}))
			const dir = "/data/pebble"
			dst := openOn(t, fs, dir)
			fill(t, dst, "mine", 30, 60)
			old := stateOf(t, dst)
			armed.Store(true)
			err := dst.Restore(bytes.NewReader(data))
			armed.Store(false)
			if !errors.Is(err, errorfs.ErrInjected) {
				t.Fatalf("restore: %v, want the injected error", err)
			}
			if tc.closed {
				if _, err := dst.Hash(); !errors.Is(err, errClosed) {
					t.Fatalf("read after a failed reopen: %v", err)
				}
				if _, err := dst.NewSnapshot().WriteTo(&bytes.Buffer{}); err == nil {
					t.Fatal("snapshot of a closed store")
				}
			} else if got := stateOf(t, dst); got != old {
				t.Fatalf("after the failed swap: %+v, want the old %+v", got, old)
			}
			if err := dst.Close(); err != nil {
				t.Fatal(err)
			}
			s := openOn(t, fs, dir)
			defer s.Close()
			got := stateOf(t, s)
			if got != old && got != want {
				t.Fatalf("reopened: %+v", got)
			}
			if names, _ := fs.List("/data"); len(names) != 1 {
				t.Fatalf("%v beside the store after reopening", names)
			}
		})
	}
}

// A disk that fills while the received files are opened (their write-ahead log must
// be flushed) fails the restore: Pebble retries the flush for good inside Open, and a
// restore, a backup's check or a snapshot install hung with it.
func TestRestoreOnAFullDiskFails(t *testing.T) {
	src := openStore(t, t.TempDir())
	fill(t, src, "k", 300, 600) // in the memtable: the stream carries its log
	data := snapshotOf(t, src)

	var full atomic.Bool
	fs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if full.Load() && op.Kind == errorfs.OpCreate && strings.HasSuffix(op.Path, ".sst") {
			return syscall.ENOSPC
		}
		return nil
	}))
	dst := openOn(t, fs, "/data/pebble")
	full.Store(true)
	done := make(chan error, 1)
	go func() { done <- dst.Restore(bytes.NewReader(data)) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "no space left") {
			t.Fatalf("a restore on a full disk: %v, want an error naming it", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a restore on a full disk still runs after 30 s")
	}
}
