// Package fsm is idemkv's replicated state machine: it applies committed Raft log
// entries to the store, through the pure decision functions of decide.go.
//
// Applying an entry must never read a clock, touch the network or depend on anything
// but the entries applied and the state they built: every replica that applies the
// same entries must end in the same state (StateHash proves it).
package fsm

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/metrics"
	"github.com/idemkv/idemkv/storage"
)

// Result is what Apply returns for each command entry (raft ApplyFuture.Response()).
type Result struct {
	Reserve  *idemkv.ReserveResult // OpReserve
	Record   *idemkv.Record        // OpFail, OpHeartbeat, OpDoubt: the record after the transition
	Receipt  *idemkv.Receipt       // OpCommit, OpResolve committed: the stored outcome (committed, or the stored failure if fail won)
	Released bool                  // OpRelease, OpResolve not_executed
	Swept    int                   // OpSweep: records and tombstones deleted
	More     bool                  // OpSweep: expired records or tombstones remain (<= Now) after this entry
	Asked    bool                  // OpReserve: the entry stored a new approval request
	Err      error                 // wraps ErrFenced, ErrFingerprintMismatch, ErrNotPending, ErrNotFound, ErrInvalidArgument or ErrInternal
}

// FSM implements raft.BatchingFSM over a storage.Store.
//
// Raft calls Apply, ApplyBatch, Snapshot and Restore from one goroutine; the read
// methods may run concurrently with them and read Pebble directly, which is consistent
// because each batch commits atomically.
type FSM struct {
	st     *storage.Store
	m      *metrics.Metrics
	logger *slog.Logger

	mu      sync.RWMutex
	applied uint64
	term    uint64
	clock   idemkv.Timestamp
	nodes   []idemkv.NodeInfo // sorted by ID
	changed chan struct{}
	// format is the cluster's data format (format.go); formats what each node
	// advertised, by id.
	format  int
	formats map[string]int
	// reads is the highest format this replica reads: FormatVersion, unless a test
	// lowered it (ReadFormat) to stand for the release before.
	reads int

	// halted is why the state machine stopped applying (nil while it applies); see
	// halt. haltedCh is closed when it is set.
	halted   error
	haltedCh chan struct{}

	watch watchers
}

var _ raft.BatchingFSM = (*FSM)(nil)

// Log attribute keys.
const (
	logKeyIndex = "index"
	logKeyOp    = "op"
	logKeyErr   = "err"
)

// New returns a state machine over st, resuming from the applied index and clock
// stored there.
func New(st *storage.Store, m *metrics.Metrics, logger *slog.Logger) (*FSM, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if m == nil {
		m = metrics.New()
	}
	f := &FSM{st: st, m: m, logger: logger.With("component", "fsm"), changed: make(chan struct{}), haltedCh: make(chan struct{}),
		reads: FormatVersion}
	if err := f.load(); err != nil {
		return nil, err
	}
	// Pebble's fatal error halts the state machine on whichever goroutine met it: a
	// backup's, a snapshot's, one of Pebble's own (issue 22, point 4).
	st.OnFailure(func(err error) { f.halt(err) })
	return f, nil
}

// load reads the bookkeeping back from the store: at start and after a restore.
func (f *FSM) load() error {
	applied, term, err := f.st.Applied()
	if err != nil {
		return fmt.Errorf("fsm: load applied index: %w", err)
	}
	clock, err := f.st.Clock()
	if err != nil {
		return fmt.Errorf("fsm: load clock: %w", err)
	}
	nodes, err := f.st.Nodes()
	if err != nil {
		return fmt.Errorf("fsm: load nodes: %w", err)
	}
	format, set, err := f.st.ClusterFormat()
	if err != nil {
		return fmt.Errorf("fsm: load cluster format: %w", err)
	}
	if !set {
		format = FormatApprovals
	}
	formats, err := f.st.NodeFormats()
	if err != nil {
		return fmt.Errorf("fsm: load node formats: %w", err)
	}
	f.mu.Lock()
	f.applied, f.term, f.clock, f.nodes = applied, term, clock, nodes
	f.format, f.formats = format, formats
	f.mu.Unlock()
	f.m.ClusterFormat.Set(float64(format))
	return nil
}

// ReadFormat makes this replica read format at most, as a node of the release whose
// format it is: it halts on an entry that needs more, or on a restored store that
// holds what that release could not decode, and skips the entries that release did
// not know but could skip (an advertisement). Only tests lower it (node.Config's
// AsFormat), before Raft starts; a node of this build reads FormatVersion.
func (f *FSM) ReadFormat(format int) {
	f.mu.Lock()
	f.reads = min(format, FormatVersion)
	f.mu.Unlock()
}

// Format is the cluster's data format.
func (f *FSM) Format() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.format
}

// Apply applies one entry.
func (f *FSM) Apply(l *raft.Log) any { return f.ApplyBatch([]*raft.Log{l})[0] }

// ApplyBatch applies logs in ONE Pebble batch, with the applied index and clock, so a
// crash leaves either all of them or none. Entries at or below the applied index were
// applied before a restart (Raft replays from its last snapshot) and are skipped.
//
// Only deterministic outcomes become per-entry results: a decision error, an entry
// that does not decode. A storage error (a failed read, a failed commit) is this
// replica's alone; answering it per entry while the others apply the command would
// make the replicas diverge. It halts the state machine instead: nothing of the batch
// is stored, and Raft's log replays it after a restart (issue 12, defect 3).
func (f *FSM) ApplyBatch(logs []*raft.Log) []any {
	out := make([]any, len(logs))
	f.mu.RLock()
	applied, term, clock := f.applied, f.term, f.clock
	nodes := f.nodes
	format, formats, reads := f.format, f.formats, f.reads
	halted := f.halted
	f.mu.RUnlock()
	if halted != nil {
		return haltedResults(out, halted)
	}
	startClock, startFormat := clock, format
	nodesChanged, formatsChanged := false, false
	var keys []recordKey
	wakeAll := false

	b := f.st.NewBatch()
	defer b.Close()
	n := 0
	for i, l := range logs {
		if l.Index <= applied {
			continue
		}
		applied, term = l.Index, l.Term
		n++
		if l.Type != raft.LogCommand {
			continue
		}
		cmd, err := DecodeCommand(l.Data)
		if err == nil && reads < FormatVersion {
			err = f.readsAsOlder(cmd, reads)
			if errors.Is(err, idemkv.ErrOutcomeUnknown) {
				return haltedResults(out, f.halt(fmt.Errorf("entry %d: %w", l.Index, err)))
			}
		}
		if err != nil {
			f.logger.Error("undecodable log entry", logKeyIndex, l.Index, logKeyErr, err)
			out[i] = &Result{Err: err}
			continue
		}
		clock = max(clock, cmd.Now)
		switch cmd.Op {
		case OpAdvertise:
			out[i] = &Result{}
			if cmd.Node.ID == "" {
				out[i] = &Result{Err: idemkv.Invalid("id", "node id is required")}
				continue
			}
			if err := b.PutNodeFormat(cmd.Node.ID, cmd.Node.Format); err != nil {
				return haltedResults(out, f.halt(fmt.Errorf("applying %s at %d: %w", cmd.Op, l.Index, err)))
			}
			if !formatsChanged {
				formats, formatsChanged = maps.Clone(formats), true
			}
			formats[cmd.Node.ID] = cmd.Node.Format
			continue
		case OpSetFormat:
			// Never lowered: a lower or equal format changes nothing, so a leader that
			// raced another's raise is harmless.
			out[i] = &Result{}
			if cmd.Format > FormatVersion {
				// Only a build that reads it proposes it; this one cannot apply anything
				// after it as its proposer meant.
				return haltedResults(out, f.halt(fmt.Errorf("entry %d raises the cluster format to %d; this build reads %d", l.Index, cmd.Format, FormatVersion)))
			}
			if cmd.Format > format {
				if err := b.SetClusterFormat(cmd.Format); err != nil {
					return haltedResults(out, f.halt(fmt.Errorf("applying %s at %d: %w", cmd.Op, l.Index, err)))
				}
				format = cmd.Format
			}
			continue
		}
		if k, all := touched(cmd); all {
			wakeAll = true
		} else if k != (recordKey{}) {
			keys = append(keys, k)
		}
		res, nodeUpdate, err := f.applyCommand(b, cmd, clock, l.Index, format)
		if err != nil {
			return haltedResults(out, f.halt(fmt.Errorf("applying %s at %d: %w", cmd.Op, l.Index, err)))
		}
		if nodeUpdate != nil {
			nodes = nodeUpdate(nodes)
			nodesChanged = true
		}
		if cmd.Op == OpRemoveNode {
			if _, advertised := formats[cmd.Node.ID]; advertised {
				if !formatsChanged {
					formats, formatsChanged = maps.Clone(formats), true
				}
				delete(formats, cmd.Node.ID)
			}
		}
		out[i] = res
	}
	if n == 0 {
		return out
	}
	err := b.SetApplied(applied, term)
	if err == nil && clock != startClock {
		err = b.SetClock(clock)
	}
	if err == nil {
		err = b.Commit()
	}
	if err != nil {
		return haltedResults(out, f.halt(fmt.Errorf("storing entries up to %d: %w", applied, err)))
	}
	f.m.ApplyBatch.Observe(float64(n))

	f.mu.Lock()
	f.applied, f.term, f.clock = applied, term, clock
	if nodesChanged {
		f.nodes = nodes
	}
	if formatsChanged {
		f.formats = formats
	}
	f.format = format
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
	if format != startFormat {
		f.m.ClusterFormat.Set(float64(format))
		f.logger.Info("cluster format raised", "format", format, "from", startFormat, logKeyIndex, applied)
	}
	f.watch.wake(keys, wakeAll)
	return out
}

// readsAsOlder is how a replica that reads format reads at most (ReadFormat) takes
// cmd: an op its release did not know it refuses as that release did (a
// malformed-command error: the entry is skipped), and an entry that needs a newer
// format halts it (ErrOutcomeUnknown). That release skips a command of version 3 as
// undecodable too, and would silently diverge from the others; halting instead makes
// any such entry impossible to miss in a test.
func (f *FSM) readsAsOlder(cmd *Command, format int) error {
	if cmd.Op == OpAdvertise {
		return fmt.Errorf("%w: unknown %s", ErrMalformedCommand, cmd.Op)
	}
	need := CommandFormat(cmd)
	if cmd.Op == OpSetFormat {
		need = cmd.Format
	}
	if need > format {
		return idemkv.Errorf(idemkv.ErrOutcomeUnknown, "a %s entry needs data format %d; this node reads %d", cmd.Op, need, format)
	}
	return nil
}

// halt stops the state machine for good: it applies, snapshots and reads nothing more
// until a restore succeeds (or the process restarts). The replica's state is then
// behind (a batch that was not stored, or a snapshot that failed to restore over it) or
// closed (a restore that failed while replacing it), and either way Raft must not count
// it as applied: no snapshot may label it, so the log that replays it after a restart
// stays. The node watches Halted and stops Raft.
func (f *FSM) halt(err error) error {
	err = idemkv.Errorf(idemkv.ErrOutcomeUnknown, "state machine halted: %v; the node must restart", err)
	f.mu.Lock()
	if f.halted == nil {
		f.halted = err
		close(f.haltedCh)
		close(f.changed)
		f.changed = make(chan struct{})
	} else {
		err = f.halted
	}
	f.mu.Unlock()
	f.watch.wake(nil, true)
	f.logger.Error("state machine halted", logKeyErr, err)
	return err
}

// Halt halts the state machine for a failure outside it that leaves this replica unable
// to go on, as a storage error while applying does: the store of Raft's log refusing
// every append for good (node/walrotation.go). It returns the error the state machine
// now reports.
func (f *FSM) Halt(err error) error { return f.halt(err) }

// haltedResults answers every entry of a batch that was not stored: the entries are
// committed in Raft and the other replicas apply them, so for the proposer the
// outcome is unknown.
func haltedResults(out []any, err error) []any {
	for i := range out {
		out[i] = &Result{Err: err}
	}
	return out
}

// Halted is closed once the state machine halts.
func (f *FSM) Halted() <-chan struct{} {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.haltedCh
}

// Err is why the state machine halted, nil while it applies.
func (f *FSM) Err() error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.halted
}

// errFormat refuses a command that needs data format need at cluster format format:
// its proposer checked the format first, so only a proposer of another build gets it.
func errFormat(cmd *Command, need, format int) error {
	return idemkv.Errorf(idemkv.ErrUnavailable, "a %s entry needs data format %d and the cluster's is %d: every member must run a release that reads it first", cmd.Op, need, format)
}

// errUnfilled refuses a reserve or heartbeat proposed without its lease and TTL. The
// proposer fills them from the limits it owns (EnsureDefaults) and the state machine
// owns no defaults; deciding on zeros would store a record born expired. Every
// proposer has always filled them, so no log holds such an entry.
var errUnfilled = idemkv.Invalid("lease_ttl_ms", "a reserve or heartbeat was proposed without its lease and TTL filled in")

// applyCommand stages cmd's effect in b. A nodeUpdate, when returned, is applied to
// the in-memory membership once the batch commits. storeErr is a storage error,
// which must halt the state machine; every other outcome is in res.
func (f *FSM) applyCommand(b *storage.Batch, cmd *Command, now idemkv.Timestamp, index uint64, format int) (res *Result, nodeUpdate func([]idemkv.NodeInfo) []idemkv.NodeInfo, storeErr error) {
	if k, ok := recordOf(cmd); ok {
		res, err := applyToRecord(b, k, cmd, now, index, format)
		return res, nil, err
	}
	switch cmd.Op {
	case OpSetApprovalRule, OpRemoveApprovalRule:
		if need := CommandFormat(cmd); need > format {
			return &Result{Err: errFormat(cmd, need, format)}, nil, nil
		}
		res, err := applyRule(b, cmd)
		return res, nil, err
	case OpSweep:
		swept, more, err := sweep(b, now, cmd.Sweep.Limit)
		if err != nil {
			return nil, nil, err
		}
		return &Result{Swept: swept, More: more}, nil, nil
	case OpSetNode:
		n := idemkv.NodeInfo{ID: cmd.Node.ID, RaftAddr: cmd.Node.RaftAddr, APIAddr: cmd.Node.APIAddr}
		if n.ID == "" {
			return &Result{Err: idemkv.Invalid("id", "node id is required")}, nil, nil
		}
		if err := b.PutNode(n); err != nil {
			return nil, nil, err
		}
		return &Result{}, func(nodes []idemkv.NodeInfo) []idemkv.NodeInfo {
			nodes = slices.DeleteFunc(slices.Clone(nodes), func(o idemkv.NodeInfo) bool { return o.ID == n.ID })
			nodes = append(nodes, n)
			slices.SortFunc(nodes, func(a, b idemkv.NodeInfo) int { return strings.Compare(a.ID, b.ID) })
			return nodes
		}, nil
	case OpRemoveNode:
		id := cmd.Node.ID
		if err := b.DeleteNode(id); err != nil {
			return nil, nil, err
		}
		return &Result{}, func(nodes []idemkv.NodeInfo) []idemkv.NodeInfo {
			return slices.DeleteFunc(slices.Clone(nodes), func(o idemkv.NodeInfo) bool { return o.ID == id })
		}, nil
	}
	return &Result{}, nil, nil
}

// applyToRecord decides cmd on the stored record of k and stages what the decision
// says. A refusal changes nothing. storeErr is a storage error.
func applyToRecord(b *storage.Batch, k recordKey, cmd *Command, now idemkv.Timestamp, index uint64, format int) (res *Result, storeErr error) {
	cur, err := b.Record(k.tenant, k.key)
	if err != nil {
		return nil, err
	}
	var tomb *idemkv.Tombstone
	if cmd.Op == OpReserve {
		if cmd, err = withRule(b, cmd); err != nil {
			return nil, err
		}
		// Only an absent key can hold a tombstone: the record that takes it again
		// removes it.
		if Expired(cur, now) {
			if tomb, err = b.Tombstone(k.tenant, k.key); err != nil {
				return nil, err
			}
		}
	}
	d := decideOn(cur, tomb, cmd, now, index)
	if d.err != nil {
		return &Result{Err: d.err}, nil
	}
	// The decision functions know no formats; what the cluster format cannot store is
	// taken off the record they made, which the answer shares. A tombstone lives only
	// with a history (RecordsHistory, the one predicate).
	AtFormat(d.put, format)
	if !RecordsHistory(format) {
		d.tomb = nil
	}
	if d.put != nil {
		if err := b.PutRecord(d.put); err != nil {
			return nil, err
		}
		if tomb != nil {
			// Live or not, the tombstone's history is the new record's now (or, past
			// its expiry, gone): the key holds a record again.
			if _, err := b.DeleteTombstone(k.tenant, k.key); err != nil {
				return nil, err
			}
		}
	}
	if d.release {
		if _, err := b.DeleteRecord(k.tenant, k.key); err != nil {
			return nil, err
		}
		if d.tomb != nil {
			if err := b.PutTombstone(d.tomb); err != nil {
				return nil, err
			}
		}
	}
	return d.res, nil
}

// decision is what a decision function of decide.go says of one record: the record to
// store (nil: none), whether to delete it and the tombstone it leaves (nil: none), the
// answer, or why the command is refused.
type decision struct {
	put     *idemkv.Record
	release bool
	tomb    *idemkv.Tombstone
	res     *Result
	err     error
}

// decideOn runs the decision function of cmd's op on cur; tomb is the key's tombstone
// (read for a reserve on an absent key only).
func decideOn(cur *idemkv.Record, tomb *idemkv.Tombstone, cmd *Command, now idemkv.Timestamp, index uint64) decision {
	switch cmd.Op {
	case OpReserve:
		r := cmd.Reserve
		if r.LeaseTTLMs <= 0 || (r.TTLMs <= 0 && r.ExpiresAt == 0) {
			return decision{err: errUnfilled}
		}
		if r.Approval != nil && r.Approval.Required && (len(r.Effect) == 0 || r.Approval.TTLMs <= 0) {
			return decision{err: errNoEffect(r)}
		}
		next, rr := DecideOver(cur, tomb, r, now, index)
		asked := next != nil && rr.Decision == idemkv.DecisionNeedsApproval
		return decision{put: next, res: &Result{Reserve: rr, Asked: asked}}
	case OpCommit:
		next, receipt, err := DecideCommit(cur, cmd.Commit, now)
		return decision{put: next, res: &Result{Receipt: receipt}, err: err}
	case OpFail:
		next, rec, err := DecideFail(cur, cmd.Fail, now)
		return decision{put: next, res: &Result{Record: rec}, err: err}
	case OpRelease:
		release, err := DecideRelease(cur, cmd.Release, now)
		d := decision{release: release, res: &Result{Released: release}, err: err}
		if release {
			d.tomb = ReleaseTombstone(cur, now)
		}
		return d
	case OpHeartbeat:
		if cmd.Heartbeat.LeaseTTLMs <= 0 {
			return decision{err: errUnfilled}
		}
		next, err := DecideHeartbeat(cur, cmd.Heartbeat, now)
		return decision{put: next, res: &Result{Record: next}, err: err}
	case OpDoubt:
		next, rec, err := DecideDoubt(cur, cmd.Doubt, now)
		return decision{put: next, res: &Result{Record: rec}, err: err}
	case OpResolve:
		next, receipt, release, err := DecideResolve(cur, cmd.Resolve, now)
		d := decision{put: next, release: release, res: &Result{Receipt: receipt, Released: release}, err: err}
		if release {
			d.tomb = NotExecutedTombstone(cur, cmd.Resolve, now)
		}
		return d
	case OpDecideApproval:
		next, err := DecideApproval(cur, cmd.Approval, now)
		return decision{put: next, res: &Result{Record: next}, err: err}
	}
	// Unreachable: recordOf names no other op.
	return decision{err: idemkv.Errorf(idemkv.ErrInternal, "fsm: no decision for %s", cmd.Op)}
}

// sweep deletes up to limit records and tombstones expired at now, records first.
// swept counts both; more says some of either remain.
func sweep(b *storage.Batch, now idemkv.Timestamp, limit int) (swept int, more bool, err error) {
	if limit <= 0 {
		limit = DefaultSweepLimit
	}
	swept, more, err = sweepRecords(b, now, limit)
	if err != nil || more {
		return swept, more, err
	}
	// Whatever budget the records left; none left still looks for one, to tell more.
	tombs, more, err := sweepTombstones(b, now, limit-swept)
	return swept + tombs, more, err
}

// sweepRecords deletes up to limit records expired at now. It reads limit+1 index
// entries so it can tell whether any remain without a second scan.
func sweepRecords(b *storage.Batch, now idemkv.Timestamp, limit int) (swept int, more bool, err error) {
	entries, err := b.Expired(now, limit+1)
	if err != nil {
		return 0, false, err
	}
	if len(entries) > limit {
		entries, more = entries[:limit], true
	}
	for _, e := range entries {
		rec, err := b.Record(e.Tenant, e.Key)
		if err != nil {
			return swept, more, err
		}
		// The index is written with the record, so a mismatch is a bug; deleting
		// only the stray entry keeps a live record from being swept by it.
		if rec == nil || rec.ExpiresAt != e.ExpiresAt || !Expired(rec, now) {
			if err := b.DeleteExpiry(e); err != nil {
				return swept, more, err
			}
			continue
		}
		if _, err := b.DeleteRecord(e.Tenant, e.Key); err != nil {
			return swept, more, err
		}
		swept++
	}
	if len(entries) > 0 {
		// Every entry up to the last one read is gone now: later scans skip them.
		if err := b.MarkSwept(entries[len(entries)-1]); err != nil {
			return swept, more, err
		}
	}
	return swept, more, nil
}

// sweepTombstones deletes up to limit tombstones expired at now (limit 0: none, but
// more still tells whether any are due), as sweepRecords deletes records.
func sweepTombstones(b *storage.Batch, now idemkv.Timestamp, limit int) (swept int, more bool, err error) {
	entries, err := b.ExpiredTombstones(now, limit+1)
	if err != nil {
		return 0, false, err
	}
	if len(entries) > limit {
		entries, more = entries[:limit], true
	}
	for _, e := range entries {
		t, err := b.Tombstone(e.Tenant, e.Key)
		if err != nil {
			return swept, more, err
		}
		if t == nil || t.ExpiresAt != e.ExpiresAt || !TombstoneExpired(t, now) {
			if err := b.DeleteTombstoneExpiry(e); err != nil {
				return swept, more, err
			}
			continue
		}
		if _, err := b.DeleteTombstone(e.Tenant, e.Key); err != nil {
			return swept, more, err
		}
		swept++
	}
	if len(entries) > 0 {
		if err := b.MarkTombstonesSwept(entries[len(entries)-1]); err != nil {
			return swept, more, err
		}
	}
	return swept, more, nil
}

// SkipTo records index (of term) as applied when it is ahead of the applied index,
// for log entries that never reach the state machine. Raft hands it only commands
// and configurations; the no-op and barrier entries a new leader appends are counted
// in Raft's applied index, and so in the index of a snapshot taken right after them.
// The caller must know that no entry up to index changes the state.
func (f *FSM) SkipTo(index, term uint64) error {
	f.mu.RLock()
	applied, halted := f.applied, f.halted
	f.mu.RUnlock()
	if halted != nil {
		return fmt.Errorf("fsm: skip to %d: %w", index, halted)
	}
	if index <= applied {
		return nil
	}
	b := f.st.NewBatch()
	defer b.Close()
	if err := b.SetApplied(index, term); err != nil {
		return fmt.Errorf("fsm: skip to %d: %w", index, err)
	}
	if err := b.Commit(); err != nil {
		return fmt.Errorf("fsm: skip to %d: %w", index, err)
	}
	f.mu.Lock()
	f.applied, f.term = index, term
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
	f.watch.wake(nil, true)
	return nil
}

// AppliedIndex is the last log index whose effects are stored.
func (f *FSM) AppliedIndex() uint64 {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.applied
}

// Clock is the maximum of the stamped times applied so far; it never decreases.
func (f *FSM) Clock() idemkv.Timestamp {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.clock
}

// Changed returns a channel that is closed once the next batch is applied (or a
// snapshot restored). Long-polls on one record use Watch instead. Take it before checking the condition you wait for, or a change
// between the check and the wait is missed.
func (f *FSM) Changed() <-chan struct{} {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.changed
}

// readable refuses reads of a halted state machine: its store may be behind the
// snapshot Raft installed (a restore failed), and "not found" from there could hand out
// a second execute.
func (f *FSM) readable() error {
	if err := f.Err(); err != nil {
		return idemkv.Errorf(idemkv.ErrUnavailable, "%v", err)
	}
	return nil
}

// Get returns the record of (tenant, key), or ErrNotFound if there is none or it is
// past expires_at at max(now, Clock()): expired records vanish before the sweeper
// deletes them.
func (f *FSM) Get(tenant, key string, now idemkv.Timestamp) (*idemkv.Record, error) {
	rec, err := f.lookup(tenant, key, now, true)
	if err == nil && rec == nil {
		return nil, fmt.Errorf("%w: %s/%s", idemkv.ErrNotFound, tenant, key)
	}
	return rec, err
}

// Lookup is Get for the write paths, which ask about every new key before they
// propose it and answer a replay or a conflict from what they find: a record that is
// absent or expired is (nil, nil), without the error Get builds for it (its message
// names the key: an allocation and a format for each new operation on every node that
// looks), and a record comes without its history. A reserve's answer never carries
// the history, and a decision that would carry it into a next record is proposed and
// made by the batch, which reads the record whole: what Decide makes of a looked-up
// record is for telling whether the decision changes it, never to be stored.
func (f *FSM) Lookup(tenant, key string, now idemkv.Timestamp) (*idemkv.Record, error) {
	return f.lookup(tenant, key, now, false)
}

func (f *FSM) lookup(tenant, key string, now idemkv.Timestamp, history bool) (*idemkv.Record, error) {
	if err := f.readable(); err != nil {
		return nil, err
	}
	now = max(now, f.Clock())
	var rec *idemkv.Record
	var err error
	if history {
		rec, err = f.st.Record(tenant, key)
	} else {
		rec, err = f.st.RecordWithoutHistory(tenant, key)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", idemkv.ErrInternal, err)
	}
	if Expired(rec, now) {
		return nil, nil
	}
	return rec, nil
}

// Tombstone returns the tombstone a released record left for (tenant, key), or
// ErrNotFound if there is none or it is past its expires_at at max(now, Clock()). A
// key that holds a live record has none.
func (f *FSM) Tombstone(tenant, key string, now idemkv.Timestamp) (*idemkv.Tombstone, error) {
	if err := f.readable(); err != nil {
		return nil, err
	}
	now = max(now, f.Clock())
	t, err := f.st.Tombstone(tenant, key)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", idemkv.ErrInternal, err)
	}
	if TombstoneExpired(t, now) {
		return nil, fmt.Errorf("%w: %s/%s", idemkv.ErrNotFound, tenant, key)
	}
	return t, nil
}

// listScanBudget bounds how many stored records one List call reads, so that a
// status filter that matches little cannot turn a page into a full scan; the page then
// comes back short with Next set.
const listScanBudget = 10 * idemkv.MaxListLimit

// List returns one page of the tenant's live records in key order. req is already
// validated (Limit filled).
func (f *FSM) List(req *idemkv.ListRequest, now idemkv.Timestamp) (*idemkv.ListResult, error) {
	if err := f.readable(); err != nil {
		return nil, err
	}
	now = max(now, f.Clock())
	page := *req
	page.EnsureDefaults() // the root package owns the default page size
	limit := page.Limit
	res := &idemkv.ListResult{Records: []*idemkv.Record{}}
	scanned, lastKey := 0, ""
	scan := f.st.ScanRecords
	if req.InDoubt {
		scan = f.st.ScanInDoubt
	}
	err := scan(req.Tenant, req.Prefix, req.After, func(rec *idemkv.Record) (bool, error) {
		if len(res.Records) == limit || scanned == listScanBudget {
			// Something is left: resume after the last key looked at.
			res.Next = lastKey
			return false, nil
		}
		scanned++
		lastKey = rec.Key
		if Expired(rec, now) || (req.Status != "" && rec.Status != req.Status) {
			return true, nil
		}
		res.Records = append(res.Records, rec)
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", idemkv.ErrInternal, err)
	}
	return res, nil
}

// ListInDoubt returns one page of the in-doubt records of every tenant, oldest
// in_doubt_since first (idemkv.DoubtPosition order), as List pages one tenant's: records
// past expires_at at max(now, Clock()) are left out, so a page may come back short with
// Next set. req is already validated.
func (f *FSM) ListInDoubt(req *idemkv.InDoubtRequest, now idemkv.Timestamp) (*idemkv.ListResult, error) {
	if err := f.readable(); err != nil {
		return nil, err
	}
	now = max(now, f.Clock())
	page := *req
	page.EnsureDefaults() // the root package owns the default page size
	limit := page.Limit
	var after *idemkv.DoubtPosition
	if req.After != "" {
		p, err := idemkv.ParseDoubtPosition(req.After)
		if err != nil {
			return nil, err
		}
		after = &p
	}
	recs, more, err := f.st.OldestInDoubt(after, limit)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", idemkv.ErrInternal, err)
	}
	res := &idemkv.ListResult{Records: make([]*idemkv.Record, 0, len(recs))}
	for _, rec := range recs {
		if !Expired(rec, now) {
			res.Records = append(res.Records, rec)
		}
	}
	if more {
		// Resume after the last entry looked at, listed or expired.
		res.Next = idemkv.DoubtPositionOf(recs[len(recs)-1]).String()
	}
	return res, nil
}

// Nodes returns the replicated node metadata (id, raft_addr, api_addr and the format
// the node advertised, 0 if it never did), sorted by id.
func (f *FSM) Nodes() []idemkv.NodeInfo {
	f.mu.RLock()
	defer f.mu.RUnlock()
	nodes := slices.Clone(f.nodes)
	for i := range nodes {
		nodes[i].Format = f.formats[nodes[i].ID]
	}
	return nodes
}

// APIAddr is the API address node id registered together with Raft address raftAddr,
// or "" if no registration pairs the two. It copies nothing: followers ask on every
// request they serve.
func (f *FSM) APIAddr(id, raftAddr string) string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	for _, n := range f.nodes {
		if n.ID == id && n.RaftAddr == raftAddr {
			return n.APIAddr
		}
	}
	return ""
}

// Advertised is the format node id advertised, FormatApprovals if it never did.
func (f *FSM) Advertised(id string) int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if v, ok := f.formats[id]; ok {
		return v
	}
	return FormatApprovals
}

// backlogCap bounds the work of one Backlog call.
const backlogCap = 1_000_000

// Backlog reports the records past expires_at at max(now, Clock()) that are not swept
// yet (counting stops at one million) and the earliest expiry among them.
func (f *FSM) Backlog(now idemkv.Timestamp) (count int, oldest idemkv.Timestamp) {
	count, oldest, err := f.st.Overdue(max(now, f.Clock()), backlogCap)
	if err != nil {
		f.logger.Error("reading the expiry backlog", logKeyErr, err)
	}
	return count, oldest
}

// InDoubt reports how many records are in doubt and the earliest in_doubt_since among
// them (0 if none). It reads the in-doubt index only.
func (f *FSM) InDoubt() (count int, oldest idemkv.Timestamp) {
	count, oldest, err := f.st.InDoubtStats()
	if err != nil {
		f.logger.Error("reading the in-doubt index", logKeyErr, err)
	}
	return count, oldest
}

// StateHash digests all records, tombstones, rules and node metadata (not the applied index or clock):
// replicas that applied the same entries have equal hashes.
func (f *FSM) StateHash() ([32]byte, error) { return f.st.Hash() }

// CheckExpiryIndex verifies that the expiry index matches the records one to one.
func (f *FSM) CheckExpiryIndex() error { return f.st.CheckExpiryIndex() }

// Close releases nothing: the store belongs to whoever opened it.
func (f *FSM) Close() error { return nil }

// Snapshot captures the state (storage.Store.NewSnapshot: a Pebble snapshot, no I/O);
// Persist does the I/O, off Raft's FSM goroutine, and what it writes is exactly the
// state captured here, whatever is applied meanwhile.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	// A snapshot of a halted state machine would let Raft compact away the entries it
	// did not store.
	if err := f.Err(); err != nil {
		return nil, fmt.Errorf("fsm: no snapshot: %w", err)
	}
	snap := f.st.NewSnapshot()
	index, _ := snap.Applied()
	return &fsmSnapshot{st: f.st, snap: snap, logger: f.logger, index: index}, nil
}

// Restore replaces the state with a snapshot stream written by Persist (or by an older
// version). A restore that fails leaves this replica's store as it was, behind the
// snapshot Raft has already installed, or (an I/O error in the middle of replacing it)
// closed; applying log entries on top of either would diverge from the other replicas
// (and, once it leads, could answer execute for keys that were committed): it halts
// the state machine until a restore succeeds (issue 12, defect 2).
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	restoreErr := f.st.Restore(rc)
	// Reload and wake waiters even on failure: anyone watching must see the halt, and
	// the bookkeeping must match whatever store is there.
	err := errors.Join(restoreErr, f.load())
	if err == nil {
		err = f.readableAtFormat()
	}
	if err != nil {
		err = fmt.Errorf("fsm: restore: %w", err)
		f.halt(err)
		return err
	}
	f.mu.Lock()
	if f.halted != nil {
		f.logger.Info("restore succeeded; the state machine applies again", logKeyErr, f.halted)
		f.halted = nil
		f.haltedCh = make(chan struct{})
	}
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
	f.watch.wake(nil, true)
	f.logger.Info("restored snapshot", logKeyIndex, f.AppliedIndex())
	return nil
}

// readableAtFormat refuses a restored store of a cluster format above what this node
// reads, and one that a replica reading an older format (ReadFormat) could not read,
// as that release would fail on it.
func (f *FSM) readableAtFormat() error {
	f.mu.RLock()
	reads, format := f.reads, f.format
	f.mu.RUnlock()
	// First, whatever this node reads: a backup or snapshot of a newer release (one
	// restored after a rollback) holds what this binary cannot read.
	if format > reads {
		return fmt.Errorf("the snapshot's cluster format is %d; this node reads %d", format, reads)
	}
	if reads >= FormatVersion {
		return nil
	}
	what, err := f.st.HoldsNewerThanApprovals()
	if err == nil && what != "" {
		err = fmt.Errorf("the snapshot holds a %s, which data format %d cannot read", what, reads)
	}
	return err
}

type fsmSnapshot struct {
	st     *storage.Store
	snap   *storage.Snapshot
	logger *slog.Logger
	index  uint64
}

// Persist syncs the store first: once Raft holds this snapshot it may truncate the log
// entries it covers, and the store wrote them without sync.
func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	start := time.Now()
	err := s.st.Sync()
	if err == nil {
		_, err = s.snap.WriteTo(sink)
	}
	if err != nil {
		return errors.Join(fmt.Errorf("fsm: persist snapshot: %w", err), sink.Cancel())
	}
	if err := sink.Close(); err != nil {
		return fmt.Errorf("fsm: persist snapshot: %w", err)
	}
	s.logger.Info("persisted snapshot", logKeyIndex, s.index, "took", time.Since(start))
	return nil
}

func (s *fsmSnapshot) Release() {
	if err := s.snap.Close(); err != nil {
		s.logger.Error("releasing snapshot", logKeyErr, err)
	}
}
