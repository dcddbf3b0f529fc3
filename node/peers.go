package node

import (
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// peerContacts is when each peer last answered one of this node's Raft RPCs: what a
// leader knows of whom it reaches. It is positive evidence only. Raft's own
// FailedHeartbeatObservation, which this used to follow, comes once a heartbeat fails:
// a refused dial fails at once, but a paused or partitioned peer holds the RPC until the
// transport's 10 s timeout, and a new leader knows nothing of its followers until then.
// Meanwhile the removal guard counted such a peer as reachable and allowed a removal
// that left the cluster without a quorum.
type peerContacts struct {
	last   sync.Map // raft.ServerID → *atomic.Int64: the last answer, in nanoseconds since contactBase
	stores sync.Map // raft.ServerID → *storeMark: the last append it stored
}

// storeMark is a peer's last successful answer to an append that carried entries: the
// index of the last of them, which it had stored before answering, and when.
type storeMark struct {
	mu    sync.Mutex
	index uint64
	at    time.Time
}

// contactBase is what answers are timed from, on the monotonic clock: a wall clock
// stepped back an hour made every answer before the step look an hour young, and a
// dead peer reached.
var contactBase = time.Now()

// answered records that id answered an RPC at t, a time.Now() reading.
func (p *peerContacts) answered(id raft.ServerID, t time.Time) {
	v, ok := p.last.Load(id)
	if !ok {
		v, _ = p.last.LoadOrStore(id, new(atomic.Int64))
	}
	v.(*atomic.Int64).Store(int64(t.Sub(contactBase)) + 1) // 0 stays "never"
}

// stored records that id answered at t that it stored entries up to index.
func (p *peerContacts) stored(id raft.ServerID, index uint64, t time.Time) {
	v, ok := p.stores.Load(id)
	if !ok {
		v, _ = p.stores.LoadOrStore(id, new(storeMark))
	}
	m := v.(*storeMark)
	m.mu.Lock()
	m.index, m.at = index, t
	m.mu.Unlock()
}

// storedAfter reports whether id, since asked, answered that it stored an entry past
// index: a peer whose disk completes writes. (Any answer is not enough: a voter whose
// disk stopped still answers heartbeats, which Raft handles beside the loop that waits
// in the append.)
func (p *peerContacts) storedAfter(id raft.ServerID, asked time.Time, index uint64) bool {
	v, ok := p.stores.Load(id)
	if !ok {
		return false
	}
	m := v.(*storeMark)
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.at.After(asked) && m.index > index
}

// lastAnswer is when id last answered, zero if never; it carries the monotonic reading.
func (p *peerContacts) lastAnswer(id raft.ServerID) time.Time {
	v, ok := p.last.Load(id)
	if !ok {
		return time.Time{}
	}
	return contactBase.Add(time.Duration(v.(*atomic.Int64).Load() - 1))
}

// reachWindow is how recently a peer must have answered to count as reached: twice
// the heartbeat timeout. A leader heartbeats every follower ten times per timeout, on
// a goroutine of its own that a busy replication does not hold up, and a follower not
// heard for a whole timeout starts an election of its own.
func (n *Node) reachWindow() time.Duration { return 2 * n.cfg.HeartbeatTimeout }

// reaches reports whether this node reaches id, as /v1/cluster shows it: itself, or a
// peer that answered within reachWindow, and when id last answered. (A change of the
// membership asks afresh: reachQuorum.)
func (n *Node) reaches(id raft.ServerID, now time.Time) (last time.Time, ok bool) {
	if string(id) == n.cfg.ID {
		return now, true
	}
	last = n.peers.lastAnswer(id)
	age := now.Sub(last)
	return last, !last.IsZero() && age >= 0 && age <= n.reachWindow()
}

// AppendEntries sends an append (or a heartbeat: Raft sends both through here) and
// records an answer, whatever it says: a refusal still shows the peer is there. A
// success to an append that carried entries also records what the peer stored.
func (t *heartbeatTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if t.appends != nil && t.appends.held() {
		return errOwnDiskStalled
	}
	err := t.NetworkTransport.AppendEntries(id, target, args, resp)
	if err == nil && t.contacts != nil {
		now := time.Now()
		t.contacts.answered(id, now)
		if resp.Success && len(args.Entries) > 0 {
			t.contacts.stored(id, args.Entries[len(args.Entries)-1].Index, now)
		}
	}
	return err
}

// InstallSnapshot sends a snapshot and records an answer, as AppendEntries does.
func (t *heartbeatTransport) InstallSnapshot(id raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest, resp *raft.InstallSnapshotResponse, data io.Reader) error {
	if t.appends != nil && t.appends.held() {
		return errOwnDiskStalled
	}
	err := t.NetworkTransport.InstallSnapshot(id, target, args, resp, data)
	if err == nil && t.contacts != nil {
		t.contacts.answered(id, time.Now())
	}
	return err
}
