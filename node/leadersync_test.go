package node

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"
	walfs "github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"

	"github.com/idemkv/idemkv/fsm"
)

// heldVFS is a wal filesystem whose files' syncs wait, while held, until released,
// and fail with failWith when it is set.
type heldVFS struct {
	types.VFS
	h *syncHold
}

type syncHold struct {
	mu       sync.Mutex
	held     bool
	release  chan struct{}
	syncs    atomic.Int64
	failWith atomic.Pointer[error]
}

func newSyncHold() *syncHold { return &syncHold{release: make(chan struct{})} }

// hold makes every sync from now on wait until let.
func (h *syncHold) hold() {
	h.mu.Lock()
	h.held, h.release = true, make(chan struct{})
	h.mu.Unlock()
}

// let releases the syncs waiting and stops holding new ones.
func (h *syncHold) let() {
	h.mu.Lock()
	if h.held {
		h.held = false
		close(h.release)
	}
	h.mu.Unlock()
}

func (h *syncHold) sync(f types.WritableFile) error {
	h.mu.Lock()
	held, release := h.held, h.release
	h.mu.Unlock()
	if held {
		<-release
	}
	h.syncs.Add(1)
	if err := h.failWith.Load(); err != nil {
		return *err
	}
	return f.Sync()
}

type heldFile struct {
	types.WritableFile
	h *syncHold
}

func (f heldFile) Sync() error { return f.h.sync(f.WritableFile) }

func (v heldVFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	f, err := v.VFS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	return heldFile{f, v.h}, nil
}

func (v heldVFS) OpenWriter(dir, name string) (types.WritableFile, error) {
	f, err := v.VFS.OpenWriter(dir, name)
	if err != nil {
		return nil, err
	}
	return heldFile{f, v.h}, nil
}

// syncedLog is a wal log in a temp dir behind a logSync, whose file syncs h holds.
type syncedLog struct {
	s      *logSync
	h      *syncHold
	leader atomic.Bool
	failed atomic.Pointer[error]
}

func newSyncedLog(t *testing.T) *syncedLog {
	t.Helper()
	l := &syncedLog{h: newSyncHold()}
	l.s = newLogSync(true)
	dir := t.TempDir()
	armed := new(atomic.Bool)
	fsys := shortReadWALFS{heldVFS{walfs.New(), l.h}, armed, l.s}
	w, err := wal.Open(dir, wal.WithLogger(hclog.NewNullLogger()), wal.WithSegmentSize(1<<20), wal.WithSegmentFiler(segment.NewFiler(dir, fsys)))
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	if err := l.s.start(w, l.leader.Load, func(err error) { l.failed.Store(&err) }, func(time.Duration) {}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		l.h.let()
		l.s.close()
		w.Close()
	})
	return l
}

func commands(from, to uint64) []*raft.Log {
	var logs []*raft.Log
	for i := from; i <= to; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: smallEntry(int(i))})
	}
	return logs
}

// async runs f on a goroutine; its error arrives on the channel.
func async(f func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f() }()
	return ch
}

// returned reports whether ch delivers within d, and what.
func returned(ch <-chan error, d time.Duration) (error, bool) {
	select {
	case err := <-ch:
		return err, true
	case <-time.After(d):
		return nil, false
	}
}

// within runs f and reports whether it returned within d.
func within(d time.Duration, f func()) bool {
	done := make(chan struct{})
	go func() { f(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

func TestLeaderAppendIsSyncedBesideIt(t *testing.T) {
	l := newSyncedLog(t)
	l.leader.Store(true)
	if err := l.s.StoreLogs(commands(1, 4)); err != nil {
		t.Fatal(err)
	}
	if !within(2*time.Second, func() { l.s.waitDurable(4) }) || l.s.Durable() != 4 {
		t.Fatalf("durable %d after a held-free append, want 4", l.s.Durable())
	}

	l.h.hold()
	if err, ok := returned(async(func() error { return l.s.StoreLogs(commands(5, 8)) }), 2*time.Second); !ok || err != nil {
		t.Fatalf("the leader's append with its sync held: returned %v, %v; want at once", ok, err)
	}
	if got := l.s.Durable(); got != 4 {
		t.Fatalf("durable %d while the sync of 5-8 is held, want 4", got)
	}
	var e raft.Log
	if err := l.s.GetLog(8, &e); err != nil {
		t.Fatalf("entry 8, written and not yet synced, reads back: %v", err)
	}
	if within(100*time.Millisecond, func() { l.s.waitDurable(8) }) {
		t.Fatal("waitDurable(8) returned while its sync is held")
	}
	if !within(time.Second, func() { l.s.waitDurable(4) }) {
		t.Fatal("waitDurable(4) waited for a later entry's sync")
	}
	l.h.let()
	if !within(2*time.Second, func() { l.s.waitDurable(8) }) {
		t.Fatal("waitDurable(8) did not return once the sync went through")
	}
	if got := l.s.Durable(); got != 8 {
		t.Fatalf("durable %d after the sync, want 8", got)
	}
}

func TestFollowerStoreIsSyncedBeforeItReturns(t *testing.T) {
	l := newSyncedLog(t)
	l.h.hold()
	done := async(func() error { return l.s.StoreLogs(commands(1, 3)) })
	if _, ok := returned(done, 200*time.Millisecond); ok {
		t.Fatal("a follower's store returned before its sync")
	}
	l.h.let()
	if err, ok := returned(done, 2*time.Second); !ok || err != nil {
		t.Fatalf("the store once released: returned %v, %v", ok, err)
	}
	if got := l.s.Durable(); got != 3 {
		t.Fatalf("durable %d, want 3", got)
	}
}

// Entries Raft acts on when they commit, without the state machine, are synced before
// Raft hears they are stored, and so is every command written before them.
func TestNonCommandEntriesAreSyncedWithEverythingBefore(t *testing.T) {
	for _, typ := range []raft.LogType{raft.LogConfiguration, raft.LogNoop, raft.LogBarrier} {
		t.Run(typ.String(), func(t *testing.T) {
			l := newSyncedLog(t)
			l.leader.Store(true)
			l.h.hold()
			if err := l.s.StoreLogs(commands(1, 2)); err != nil {
				t.Fatal(err)
			}
			mixed := append(commands(3, 3), &raft.Log{Index: 4, Term: 1, Type: typ})
			done := async(func() error { return l.s.StoreLogs(mixed) })
			if _, ok := returned(done, 200*time.Millisecond); ok {
				t.Fatalf("a batch with a %s entry returned before it was synced", typ)
			}
			l.h.let()
			if err, ok := returned(done, 2*time.Second); !ok || err != nil {
				t.Fatalf("the batch once released: returned %v, %v", ok, err)
			}
			if got := l.s.Durable(); got != 4 {
				t.Fatalf("durable %d after the %s batch, want 4", got, typ)
			}
		})
	}
}

func TestLogTruncationLowersDurable(t *testing.T) {
	l := newSyncedLog(t)
	l.leader.Store(true)
	if err := l.s.StoreLogs(commands(1, 6)); err != nil {
		t.Fatal(err)
	}
	l.s.waitDurable(6)
	l.leader.Store(false)
	// A follower's conflicting tail goes; the entries written again at its indexes
	// (by the next leader, say) are not synced yet.
	if err := l.s.DeleteRange(4, 6); err != nil {
		t.Fatal(err)
	}
	if got := l.s.Durable(); got != 3 {
		t.Fatalf("durable %d after removing 4-6, want 3", got)
	}
	l.leader.Store(true)
	l.h.hold()
	if err := l.s.StoreLogs(commands(4, 5)); err != nil {
		t.Fatal(err)
	}
	if got := l.s.Durable(); got != 3 {
		t.Fatalf("durable %d while 4-5 written again are held, want 3", got)
	}
	l.h.let()
	l.s.waitDurable(5)
	// The head's removal (compaction) changes nothing.
	if err := l.s.DeleteRange(1, 2); err != nil {
		t.Fatal(err)
	}
	if got := l.s.Durable(); got != 5 {
		t.Fatalf("durable %d after compacting 1-2, want 5", got)
	}
}

func TestFailedLeaderSyncStopsTheReplica(t *testing.T) {
	l := newSyncedLog(t)
	l.leader.Store(true)
	l.h.hold()
	if err := l.s.StoreLogs(commands(1, 3)); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("injected sync failure")
	l.h.failWith.Store(&boom)
	l.h.let()
	waited := make(chan bool, 1)
	go func() { waited <- l.s.waitDurable(3) }()
	var ok bool
	select {
	case ok = <-waited:
	case <-time.After(2 * time.Second):
		t.Fatal("waitDurable hung after a failed sync")
	}
	if ok {
		t.Fatal("waitDurable reported entry 3 durable after its sync failed")
	}
	if l.failed.Load() == nil || !errors.Is(*l.failed.Load(), boom) {
		t.Fatalf("fail called with %v, want the sync's error", l.failed.Load())
	}
	if got := l.s.Durable(); got != 0 {
		t.Fatalf("durable %d after the failed sync, want 0", got)
	}
	if err := l.s.StoreLogs(commands(4, 4)); !errors.Is(err, errLogSyncFailed) {
		t.Fatalf("a store after the failure: %v, want errLogSyncFailed", err)
	}
}

// recordingFSM records the last index of each batch applied.
type recordingFSM struct {
	mu      sync.Mutex
	applied []uint64
}

func (r *recordingFSM) Apply(l *raft.Log) any { return r.ApplyBatch([]*raft.Log{l})[0] }
func (r *recordingFSM) ApplyBatch(logs []*raft.Log) []any {
	r.mu.Lock()
	r.applied = append(r.applied, logs[len(logs)-1].Index)
	r.mu.Unlock()
	return make([]any, len(logs))
}
func (r *recordingFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, errors.New("no") }
func (r *recordingFSM) Restore(io.ReadCloser) error         { return nil }

func TestLeaderAppliesOnlyWhatItSynced(t *testing.T) {
	l := newSyncedLog(t)
	l.leader.Store(true)
	rec := &recordingFSM{}
	d := durableFSM{BatchingFSM: rec, sync: l.s}
	l.h.hold()
	if err := l.s.StoreLogs(commands(1, 3)); err != nil {
		t.Fatal(err)
	}
	done := async(func() error { d.ApplyBatch(commands(1, 3)); return nil })
	if _, ok := returned(done, 200*time.Millisecond); ok {
		t.Fatal("the leader applied entries whose sync is held")
	}
	l.h.let()
	if _, ok := returned(done, 2*time.Second); !ok {
		t.Fatal("the apply did not go on once synced")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.applied) != 1 || rec.applied[0] != 3 {
		t.Fatalf("applied %v once synced, want [3]", rec.applied)
	}
}

func TestFailedSyncAppliesNothing(t *testing.T) {
	l := newSyncedLog(t)
	l.leader.Store(true)
	rec := &recordingFSM{}
	d := durableFSM{BatchingFSM: rec, sync: l.s}
	l.h.hold()
	if err := l.s.StoreLogs(commands(1, 2)); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("injected")
	l.h.failWith.Store(&boom)
	l.h.let()
	out := d.ApplyBatch(commands(1, 2))
	for i, r := range out {
		if res, ok := r.(*fsm.Result); !ok || res.Err == nil {
			t.Fatalf("result %d after the failed sync: %#v, want an error", i, r)
		}
	}
	if len(rec.applied) != 0 {
		t.Fatalf("applied %v after the failed sync", rec.applied)
	}
}

// fakeTransport records the AppendEntries requests sent through it.
type fakeTransport struct {
	raftTransport
	mu   sync.Mutex
	sent []raft.AppendEntriesRequest
}

func (f *fakeTransport) AppendEntries(_ raft.ServerID, _ raft.ServerAddress, args *raft.AppendEntriesRequest, _ *raft.AppendEntriesResponse) error {
	f.mu.Lock()
	f.sent = append(f.sent, *args)
	f.mu.Unlock()
	return nil
}

func TestFollowersLearnNoCommitBeyondTheLeadersSync(t *testing.T) {
	l := newSyncedLog(t)
	l.leader.Store(true)
	if err := l.s.StoreLogs(commands(1, 2)); err != nil {
		t.Fatal(err)
	}
	l.s.waitDurable(2)
	l.h.hold()
	if err := l.s.StoreLogs(commands(3, 5)); err != nil {
		t.Fatal(err)
	}
	ft := &fakeTransport{}
	c := commitClamp{raftTransport: ft, sync: l.s}
	// Raft counted its own unsynced copy: entries up to 5 look committed.
	req := &raft.AppendEntriesRequest{Term: 1, PrevLogEntry: 2, Entries: commands(3, 5), LeaderCommitIndex: 5}
	if err := c.AppendEntries("n2", "addr", req, &raft.AppendEntriesResponse{}); err != nil {
		t.Fatal(err)
	}
	if got := ft.sent[0].LeaderCommitIndex; got != 2 {
		t.Fatalf("commit index sent %d while the leader's sync of 3-5 is held, want 2", got)
	}
	if req.LeaderCommitIndex != 5 {
		t.Fatalf("the clamp changed Raft's own request (%d)", req.LeaderCommitIndex)
	}
	l.h.let()
	l.s.waitDurable(5)
	if err := c.AppendEntries("n2", "addr", req, &raft.AppendEntriesResponse{}); err != nil {
		t.Fatal(err)
	}
	if got := ft.sent[1].LeaderCommitIndex; got != 5 {
		t.Fatalf("commit index sent %d once synced, want 5", got)
	}
	if _, err := c.AppendEntriesPipeline("n2", "addr"); !errors.Is(err, raft.ErrPipelineReplicationNotSupported) {
		t.Fatalf("pipeline: %v, want refused", err)
	}
}
