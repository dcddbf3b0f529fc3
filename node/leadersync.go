package node

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
)

// A leader's own log write and its followers' writes of the same entries are two
// syncs, and hashicorp/raft makes them in a row: its leader loop appends and syncs a
// batch, and only then hands it to the replication goroutines. PostgreSQL's primary
// streams WAL to its standbys while it flushes it. logSync gives the leader the same:
// on the leader, a batch of command entries is written to the wal backend without its
// sync, which a goroutine of its own makes at once, while Raft replicates the batch.
//
// Raft then counts the leader's copy towards a quorum before it is durable, so nothing
// may treat an entry as committed until the leader's sync of it is done too: Raft's
// quorum is the leader and enough followers, each of which synced before it answered,
// so with the leader's sync a majority of copies is on disk, the rule Raft's safety
// rests on. Everything that exposes a committed entry goes through one of two doors,
// and both wait:
//
//   - the state machine: durableFSM applies an entry on the leader only once the
//     leader's sync of it is done (a client's answer, a read's wait for an applied
//     index, the state that snapshots hold: all come from what was applied);
//   - the followers: every AppendEntries the leader sends (commitClamp) carries a
//     commit index no higher than the leader's own durable index, so no follower
//     applies an entry the leader could still lose.
//
// A leader that crashes before its sync loses at most entries nobody has seen
// applied, as a leader that crashed before its write would. Only command entries are
// written this way: a configuration change, a no-op or a barrier, each of which Raft
// acts on when it commits without the state machine, is synced before Raft hears it
// was stored, together with everything written before it. A follower syncs every
// write before it answers, as before; so does any node for anything but the leader's
// append (a follower's entries, a truncation, a log emptied for a snapshot).
//
// Only the wal backend's syncs can be put off (its files call deferSync); a bolt log
// syncs inside bbolt's commit, so there logSync just keeps the durable index.
type logSync struct {
	inner raft.LogStore
	// deferrable says the log's file syncs come through deferSync (the wal backend).
	deferrable bool
	// isLeader says whether this node's Raft is leader now. Raft stores entries on
	// its main goroutine only, where it also changes state, so a leader's append and
	// a follower's store are told apart exactly.
	isLeader func() bool
	// fail is called once when a put-off sync fails: the entries Raft counted as
	// stored may be lost, so the replica must stop (the node halts its state machine).
	fail func(error)
	// took observes how long each round of put-off syncs took (leader_sync).
	took func(time.Duration)

	// mu serialises the log's writes (stores and truncations), so that deferring is
	// set only while this wrapper's own append runs.
	mu        sync.Mutex
	deferring atomic.Bool

	// pendingMu guards the files written since their last sync and the last index
	// written with its sync put off.
	pendingMu sync.Mutex
	pending   []syncer
	written   uint64

	// syncMu makes one round of syncs at a time; durable only moves under it.
	syncMu sync.Mutex
	// durable is the index up to which every entry of this node's log is synced.
	durable atomic.Uint64
	// deferred is the last index written with its sync put off (written, read without
	// the lock by the state machine's gate).
	deferred atomic.Uint64
	failed   atomic.Bool
	// waitMu and waitCh wake whoever waits for durable to move (waitCh is closed and
	// replaced each time it moves).
	waitMu sync.Mutex
	waitCh chan struct{}

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
}

// syncer is a wal file as logSync keeps it to sync later.
type syncer interface {
	realSync() error
	same(syncer) bool
}

func newLogSync(deferrable bool) *logSync {
	return &logSync{
		deferrable: deferrable,
		waitCh:     make(chan struct{}),
		kick:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
	}
}

// start puts s in front of inner, whose entries are all durable now (it was just
// opened), and starts the goroutine that makes the put-off syncs.
func (s *logSync) start(inner raft.LogStore, isLeader func() bool, fail func(error), took func(time.Duration)) error {
	last, err := inner.LastIndex()
	if err != nil {
		return err
	}
	s.inner, s.isLeader, s.fail, s.took = inner, isLeader, fail, took
	s.durable.Store(last)
	go s.run()
	return nil
}

// close makes the last put-off syncs and stops the goroutine. The log must not be
// written after.
func (s *logSync) close() {
	if s.inner == nil {
		return // never started
	}
	select {
	case <-s.stop:
		return
	default:
	}
	close(s.stop)
	<-s.done
}

func (s *logSync) run() {
	defer close(s.done)
	for {
		select {
		case <-s.stop:
			s.round()
			return
		case <-s.kick:
			s.round()
		}
	}
}

// deferSync is a wal file's Sync asking whether to put itself off: yes while the
// leader's append is being written.
func (s *logSync) deferSync(f syncer) bool {
	if s == nil || !s.deferring.Load() {
		return false
	}
	s.pendingMu.Lock()
	defer s.pendingMu.Unlock()
	for _, p := range s.pending {
		if p.same(f) {
			return true
		}
	}
	s.pending = append(s.pending, f)
	return true
}

// round syncs every file written since its last sync, then moves durable up to what
// they hold. A failed sync stops the replica: durable stays where it was, so nothing
// that waits on it goes on.
func (s *logSync) round() {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if s.failed.Load() {
		return
	}
	s.pendingMu.Lock()
	files, target := s.pending, s.written
	s.pending = nil
	s.pendingMu.Unlock()
	if len(files) > 0 {
		start := time.Now()
		defer func() { s.took(time.Since(start)) }()
	}
	for _, f := range files {
		if err := f.realSync(); err != nil {
			s.failed.Store(true)
			s.fail(fmt.Errorf("syncing the raft log up to entry %d: %w", target, err))
			s.wake()
			return
		}
	}
	if target > s.durable.Load() {
		s.setDurable(target)
	}
}

// setDurable moves durable (under syncMu) and wakes its waiters.
func (s *logSync) setDurable(i uint64) {
	s.durable.Store(i)
	s.wake()
}

func (s *logSync) wake() {
	s.waitMu.Lock()
	close(s.waitCh)
	s.waitCh = make(chan struct{})
	s.waitMu.Unlock()
}

// Durable is the index up to which this node's log is synced.
func (s *logSync) Durable() uint64 { return s.durable.Load() }

// waitDurable returns once the entry at idx is synced, if its sync was put off (an
// entry written otherwise was synced before Raft heard of it), or once a sync has
// failed: false then.
func (s *logSync) waitDurable(idx uint64) bool {
	target := min(idx, s.deferred.Load())
	for {
		s.waitMu.Lock()
		ch := s.waitCh
		s.waitMu.Unlock()
		if s.failed.Load() {
			return false
		}
		if s.durable.Load() >= target {
			return true
		}
		<-ch
	}
}

// onlyCommands says whether every entry of logs is a command: the state machine's,
// which no one acts on before it is applied.
func onlyCommands(logs []*raft.Log) bool {
	for _, l := range logs {
		if l.Type != raft.LogCommand {
			return false
		}
	}
	return true
}

// StoreLog stores one entry as StoreLogs does.
func (s *logSync) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// StoreLogs writes logs. On the leader, a batch of commands is written with its sync
// put off to the sync goroutine; anything else is synced before it returns, after
// every write before it.
func (s *logSync) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	last := logs[len(logs)-1].Index
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed.Load() {
		return errLogSyncFailed
	}
	if s.deferrable && onlyCommands(logs) && s.isLeader() {
		s.deferring.Store(true)
		err := s.inner.StoreLogs(logs)
		s.deferring.Store(false)
		s.pendingMu.Lock()
		if err == nil {
			s.written = last
		}
		s.pendingMu.Unlock()
		if err == nil {
			s.deferred.Store(last)
		}
		// Files written before a failed append are synced too.
		select {
		case s.kick <- struct{}{}:
		default:
		}
		return err
	}
	s.round()
	if s.failed.Load() {
		return errLogSyncFailed
	}
	if err := s.inner.StoreLogs(logs); err != nil {
		return err
	}
	s.syncMu.Lock()
	s.setDurable(last)
	s.syncMu.Unlock()
	return nil
}

// DeleteRange removes entries, after syncing every write before it. Removing the
// log's tail (a follower's conflicting entries, the whole log before a snapshot's
// entries) lowers durable with it: entries written again at those indexes are not
// synced yet.
func (s *logSync) DeleteRange(lo, hi uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.round()
	if s.failed.Load() {
		return errLogSyncFailed
	}
	last, err := s.inner.LastIndex()
	if err != nil {
		return err
	}
	err = s.inner.DeleteRange(lo, hi)
	if hi >= last && lo > 0 {
		s.syncMu.Lock()
		s.pendingMu.Lock()
		s.written = min(s.written, lo-1)
		s.pendingMu.Unlock()
		s.deferred.Store(min(s.deferred.Load(), lo-1))
		if s.durable.Load() >= lo {
			s.setDurable(lo - 1)
		}
		s.syncMu.Unlock()
	}
	return err
}

// FirstIndex, LastIndex and GetLog read the log underneath.
func (s *logSync) FirstIndex() (uint64, error)        { return s.inner.FirstIndex() }
func (s *logSync) LastIndex() (uint64, error)         { return s.inner.LastIndex() }
func (s *logSync) GetLog(i uint64, l *raft.Log) error { return s.inner.GetLog(i, l) }

var errLogSyncFailed = fmt.Errorf("node: the raft log could not be synced; the node must restart")

// durableFSM is the state machine as Raft drives it: an entry is applied once this
// node's own copy of it is synced (logSync).
type durableFSM struct {
	raft.BatchingFSM
	sync *logSync
}

func (d durableFSM) Apply(l *raft.Log) any { return d.ApplyBatch([]*raft.Log{l})[0] }

func (d durableFSM) ApplyBatch(logs []*raft.Log) []any {
	if len(logs) > 0 && !d.sync.waitDurable(logs[len(logs)-1].Index) {
		out := make([]any, len(logs))
		err := idemkv.Errorf(idemkv.ErrOutcomeUnknown, "%v", errLogSyncFailed)
		for i := range out {
			out[i] = &fsm.Result{Err: err}
		}
		return out
	}
	return d.BatchingFSM.ApplyBatch(logs)
}

// durableFSM is the state machine Raft drives on this node.
func (n *Node) durableFSM() raft.FSM {
	return durableFSM{BatchingFSM: n.raftFSM().(raft.BatchingFSM), sync: n.logSync}
}

// commitClamp is the transport as Raft uses it: every AppendEntries carries a commit
// index no higher than this node's durable index (logSync), so no follower applies an
// entry the leader could still lose.
type commitClamp struct {
	raftTransport
	sync *logSync
}

// raftTransport is what Raft asks of idemkv's transport (raft.NetworkTransport): the
// optional interfaces too, which Raft finds by type assertion.
type raftTransport interface {
	raft.Transport
	raft.WithClose
	raft.WithPreVote
}

func (c commitClamp) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if d := c.sync.Durable(); args.LeaderCommitIndex > d {
		clamped := *args
		clamped.LeaderCommitIndex = d
		args = &clamped
	}
	return c.raftTransport.AppendEntries(id, target, args, resp)
}

// AppendEntriesPipeline is refused: a pipelined request would pass the clamp by
// (pipelining is off anyway: MaxRPCsInFlight 1).
func (c commitClamp) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}
