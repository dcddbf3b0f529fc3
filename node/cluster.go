package node

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
)

// ID returns the node's ID.
func (n *Node) ID() string { return n.cfg.ID }

// IsLeader reports whether this node is the Raft leader.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Leader returns the API address of the current leader ("" if unknown) and whether
// this node is it.
func (n *Node) Leader() (apiAddr string, isLeader bool) {
	_, id := n.raft.LeaderWithID()
	if id == "" {
		return "", false
	}
	if string(id) == n.cfg.ID {
		return n.cfg.APIAddr, n.raft.State() == raft.Leader
	}
	// Followers forward callers' bearer tokens to this address, so it must belong to
	// the member Raft knows as the leader: its ID in the current configuration, and
	// the API address recorded together with the Raft address that configuration
	// holds for it (a leader's own registration, or the join that added it). Anything
	// else is "no leader known", never a guess.
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return "", false
	}
	var raftAddr raft.ServerAddress
	for _, s := range f.Configuration().Servers {
		if s.ID == id {
			raftAddr = s.Address
		}
	}
	if raftAddr == "" {
		return "", false
	}
	return n.fsm.APIAddr(string(id), string(raftAddr)), false
}

// Ready reports nil when a leader is known and this node has applied everything it
// knows to be committed (a leader: once its first barrier applied).
func (n *Node) Ready() error {
	if err := n.fsm.Err(); err != nil {
		return idemkv.Errorf(idemkv.ErrUnavailable, "%v", err)
	}
	_, id := n.raft.LeaderWithID()
	if id == "" {
		return idemkv.Errorf(idemkv.ErrUnavailable, "no leader known")
	}
	if n.raft.State() == raft.Leader && n.readyTerm.Load() != n.raft.CurrentTerm() {
		return idemkv.Errorf(idemkv.ErrUnavailable, "leader has not applied its first barrier yet")
	}
	if ci := n.raft.CommitIndex(); !n.caughtUp(ci) {
		return idemkv.Errorf(idemkv.ErrUnavailable, "applied index %d behind commit index %d", n.fsm.AppliedIndex(), ci)
	}
	return nil
}

// Halted returns why this node's state machine halted, or nil (api.Halter): such a
// node serves nothing more until it restarts.
func (n *Node) Halted() error { return n.fsm.Err() }

// Cluster describes the members as this node sees them.
func (n *Node) Cluster(ctx context.Context) (*idemkv.ClusterInfo, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, n.readError(err)
	}
	meta := map[string]idemkv.NodeInfo{}
	for _, ni := range n.fsm.Nodes() {
		meta[ni.ID] = ni
	}
	leaderAddr, _ := n.Leader()
	_, leaderID := n.raft.LeaderWithID()
	info := &idemkv.ClusterInfo{
		Leader:       idemkv.LeaderInfo{ID: string(leaderID), APIAddr: leaderAddr},
		Term:         n.raft.CurrentTerm(),
		CommitIndex:  n.raft.CommitIndex(),
		AppliedIndex: n.fsm.AppliedIndex(),
		Format:       n.fsm.Format(),
		Clock:        n.ClockInfo(),
	}
	for _, s := range f.Configuration().Servers {
		ni := idemkv.NodeInfo{
			ID:       string(s.ID),
			RaftAddr: string(s.Address),
			APIAddr:  meta[string(s.ID)].APIAddr,
			Format:   n.fsm.Advertised(string(s.ID)),
			Suffrage: suffrage(s.Suffrage),
			State:    "unknown",
		}
		n.describePeer(&ni, s.ID, leaderID)
		info.Nodes = append(info.Nodes, ni)
	}
	sort.Slice(info.Nodes, func(i, j int) bool { return info.Nodes[i].ID < info.Nodes[j].ID })
	return info, nil
}

// describePeer fills in what this node knows of member id's state. Only a leader hears
// from every member; a follower knows itself and its leader, and calls the others
// "unknown" rather than guess (a stopped node used to be listed as a follower).
func (n *Node) describePeer(ni *idemkv.NodeInfo, id, leaderID raft.ServerID) {
	yes, no := true, false
	switch {
	case string(id) == n.cfg.ID:
		ni.State = stateName(n.raft.State())
		ni.Reachable = &yes
	case n.raft.State() == raft.Leader:
		last, ok := n.reaches(id, time.Now())
		if ok {
			ni.State, ni.Reachable = "follower", &yes
		} else {
			ni.State, ni.Reachable = "unreachable", &no
			if !last.IsZero() {
				ni.LastContact = idemkv.TimestampOf(last).String()
			}
		}
	case id == leaderID:
		ni.State = "leader"
		if last := n.raft.LastContact(); !last.IsZero() {
			ni.LastContact = idemkv.TimestampOf(last).String()
		}
	default:
		ni.State = "unknown"
	}
}

func suffrage(s raft.ServerSuffrage) string {
	switch s {
	case raft.Voter:
		return "voter"
	case raft.Nonvoter:
		return "nonvoter"
	default:
		return "staging"
	}
}

func stateName(s raft.RaftState) string {
	switch s {
	case raft.Leader:
		return "leader"
	case raft.Follower:
		return "follower"
	case raft.Candidate:
		return "candidate"
	default:
		return "shutdown"
	}
}

// Join adds a node as a voter and records its API address. Joining again with the
// same addresses is a no-op; a join that would change a member's addresses is refused.
func (n *Node) Join(ctx context.Context, req *idemkv.JoinRequest) (*idemkv.ClusterInfo, error) {
	if req.ID == "" {
		return nil, idemkv.Invalid("id", "id is required")
	}
	if req.RaftAddr == "" {
		return nil, idemkv.Invalid("raft_addr", "raft_addr is required")
	}
	if req.APIAddr == "" {
		return nil, idemkv.Invalid("api_addr", "api_addr is required")
	}
	switch req.Stage {
	case "", idemkv.JoinLearner, idemkv.JoinPromote:
	default:
		return nil, idemkv.Invalid("stage", "stage %q is neither %s nor %s", req.Stage, idemkv.JoinLearner, idemkv.JoinPromote)
	}
	if n.raft.State() != raft.Leader {
		return nil, idemkv.ErrNotLeader
	}
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, n.readError(err)
	}
	// A join never changes a member: moving one's addresses is a remove and a join.
	// Otherwise a join with a live member's ID and a new api_addr would make every
	// follower forward callers' requests, bearer tokens included, to that address.
	member, voter := false, false
	for _, s := range f.Configuration().Servers {
		switch {
		case s.ID == raft.ServerID(req.ID) && s.Address == raft.ServerAddress(req.RaftAddr):
			member, voter = true, s.Suffrage == raft.Voter
		case s.ID == raft.ServerID(req.ID):
			return nil, idemkv.Invalid("raft_addr", "%s is a member at raft_addr %s; a join cannot move it: remove it first", req.ID, s.Address)
		case s.Address == raft.ServerAddress(req.RaftAddr):
			return nil, idemkv.Invalid("raft_addr", "raft_addr %s belongs to member %s; remove it first", req.RaftAddr, s.ID)
		}
	}
	if member {
		for _, ni := range n.fsm.Nodes() {
			if ni.ID == req.ID && ni.APIAddr != "" && ni.APIAddr != req.APIAddr {
				return nil, idemkv.Invalid("api_addr", "%s is a member with api_addr %s; a join cannot move it: remove it first", req.ID, ni.APIAddr)
			}
		}
	}
	if !member && req.HoldsState != nil && *req.HoldsState {
		return nil, idemkv.Invalid("holds_state", "node %s is not a member and holds Raft state or records of its own: another cluster's, or its own from before it was removed; it could lead with entries this cluster never committed. Empty its data dir and join it again (it is sent this cluster's state)", req.ID)
	}
	if err := n.checkJoinFormat(req); err != nil {
		return nil, err
	}
	if !member && req.Stage == idemkv.JoinPromote {
		return nil, idemkv.Invalid("stage", "node %s is not a member at raft_addr %s: join it as a %s first", req.ID, req.RaftAddr, idemkv.JoinLearner)
	}
	id, addr := raft.ServerID(req.ID), raft.ServerAddress(req.RaftAddr)
	switch {
	case !member && req.Stage == idemkv.JoinLearner:
		if err := n.changeMembership(ctx, "adding learner "+req.ID, func(timeout time.Duration) raft.Future {
			return n.raft.AddNonvoter(id, addr, 0, timeout)
		}); err != nil {
			return nil, err
		}
		n.log.Info("added nonvoter", "id", req.ID, "raft_addr", req.RaftAddr, "api_addr", req.APIAddr)
	case !member, member && !voter && req.Stage == idemkv.JoinPromote:
		if member {
			if err := n.checkPromotion(ctx, f.Configuration(), id); err != nil {
				return nil, err
			}
		}
		if err := n.changeMembership(ctx, "adding voter "+req.ID, func(timeout time.Duration) raft.Future {
			return n.raft.AddVoter(id, addr, 0, timeout)
		}); err != nil {
			return nil, err
		}
		n.log.Info("added voter", "id", req.ID, "raft_addr", req.RaftAddr, "api_addr", req.APIAddr, "promoted", member)
	}
	ni := idemkv.NodeInfo{ID: req.ID, RaftAddr: req.RaftAddr, APIAddr: req.APIAddr}
	if _, err := n.propose(ctx, &fsm.Command{Op: fsm.OpSetNode, Node: &ni}); err != nil {
		return nil, err
	}
	if err := n.advertiseJoined(ctx, req); err != nil {
		return nil, err
	}
	return n.Cluster(ctx)
}

// checkPromotion refuses to make learner id a voter when the voters it would make
// are short of a quorum this leader reaches: a learner that went away since it caught
// up, promoted while another voter is down, leaves the cluster unable to commit, its
// own removal included. It is unavailable, not invalid: the learner asks again, and
// once the others are back the promotion goes through. (A join of a node that is not
// a member as a voter at once, from a release before learners, cannot be judged: the
// leader has never heard from it.)
func (n *Node) checkPromotion(ctx context.Context, cfg raft.Configuration, id raft.ServerID) error {
	voters := []raft.ServerID{id}
	for _, s := range cfg.Servers {
		if s.Suffrage == raft.Voter {
			voters = append(voters, s.ID)
		}
	}
	reach, quorum, err := n.reachQuorum(ctx, voters)
	if err != nil {
		return err
	}
	if reach < quorum {
		return idemkv.Errorf(idemkv.ErrUnavailable, "promoting %s would make %d voters, of which this leader reaches %d, short of their quorum of %d: the cluster could commit nothing. Bring the others back first; a learner that joined with serve --join asks again", id, len(voters), reach, quorum)
	}
	return nil
}

// HeldState reports whether this node started with state of its own: a Raft log,
// term or snapshot, or records applied. Its join says so (JoinRequest.HoldsState), and
// a cluster it is not a member of refuses it.
func (n *Node) HeldState() bool { return n.heldState }

// Remove takes a node out of the cluster.
func (n *Node) Remove(ctx context.Context, req *idemkv.RemoveRequest) (*idemkv.ClusterInfo, error) {
	if req.ID == "" {
		return nil, idemkv.Invalid("id", "id is required")
	}
	if n.raft.State() != raft.Leader {
		return nil, idemkv.ErrNotLeader
	}
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, n.readError(err)
	}
	found := false
	var left []raft.ServerID // the voters after the removal
	for _, s := range f.Configuration().Servers {
		found = found || s.ID == raft.ServerID(req.ID)
		if s.ID != raft.ServerID(req.ID) && s.Suffrage == raft.Voter {
			left = append(left, s.ID)
		}
	}
	if !found {
		return nil, idemkv.Errorf(idemkv.ErrNotFound, "no member with id %q (a removal retried after an outcome_unknown answer may already have happened)", req.ID)
	}
	if req.Force {
		n.log.Warn("removing a member by force: the voters left are not checked", "id", req.ID)
	} else if reach, quorum, err := n.reachQuorum(ctx, left); err != nil {
		return nil, err
	} else if reach < quorum {
		// Raft commits the removal, and everything after it, with a quorum of the
		// voters left: removing a live follower while another was down left the
		// leader a candidate for good.
		return nil, idemkv.Invalid("id", "removing %s would leave %d voters, of which this leader reaches %d, short of their quorum of %d: the cluster could commit nothing, the removal included. Bring the others back first, or force it", req.ID, len(left), reach, quorum)
	}
	if err := n.changeMembership(ctx, "removing "+req.ID, func(timeout time.Duration) raft.Future {
		return n.raft.RemoveServer(raft.ServerID(req.ID), 0, timeout)
	}); err != nil {
		return nil, err
	}
	n.log.Info("removed member", "id", req.ID)
	ni := idemkv.NodeInfo{ID: req.ID}
	if req.ID != n.cfg.ID {
		if _, err := n.propose(ctx, &fsm.Command{Op: fsm.OpRemoveNode, Node: &ni}); err != nil {
			return nil, err
		}
	}
	return n.Cluster(ctx)
}

// reachQuorum reports how many of voters this leader reaches and their quorum,
// counting itself and each peer that stores an entry appended after the question was
// asked. A peer heard a second ago may have stopped since (paused, cut off by the same
// event that made the operator remove another), and a recent answer counted it then; a
// peer whose disk stopped completing writes still answers heartbeats, and counting any
// answer counted it. So the leader appends a barrier, which every voter is sent at
// once, and waits up to a reach window for them to store it. The barrier is not waited
// on: it commits only with a quorum of the voters as they are, and this asks about the
// voters as they would be. (It never reaches the state machine; caughtUp looks past
// such entries.) An ended ctx is an error, not a lost quorum.
func (n *Node) reachQuorum(ctx context.Context, voters []raft.ServerID) (reach, quorum int, err error) {
	asked, after := time.Now(), n.raft.LastIndex()
	n.raft.Barrier(n.reachWindow())
	reach, quorum, err = n.awaitStored(ctx, voters, asked, after)
	if err == nil && reach < quorum && n.raft.State() != raft.Leader {
		return reach, quorum, idemkv.ErrNotLeader
	}
	return reach, quorum, err
}

// awaitStored counts this node and each of voters that, since asked, stored an entry
// past index after, waiting up to a reach window from now for a quorum of them (the
// barrier's enqueue before it may itself have waited, on a full queue).
func (n *Node) awaitStored(ctx context.Context, voters []raft.ServerID, asked time.Time, after uint64) (reach, quorum int, err error) {
	quorum = len(voters)/2 + 1
	deadline := time.Now().Add(n.reachWindow())
	for {
		reach = 0
		for _, id := range voters {
			if string(id) == n.cfg.ID || n.peers.storedAfter(id, asked, after) {
				reach++
			}
		}
		if reach >= quorum || !time.Now().Before(deadline) {
			return reach, quorum, nil
		}
		select {
		case <-ctx.Done():
			return reach, quorum, idemkv.Errorf(idemkv.ErrUnavailable, "gave up waiting to hear from the voters (%v): nothing was changed", context.Cause(ctx))
		case <-time.After(n.cfg.HeartbeatTimeout / 20):
		}
	}
}

// changeMembership hands Raft a membership change (change, given the enqueue timeout)
// and waits for it (waitMembership). Raft takes a timeout that is not positive for
// none: a change whose request's deadline had passed by then (an ended request, or one
// that spent its time in the removal guard) waited for good to be enqueued while the
// leader's loop could not take it, behind a change that cannot commit or in an append
// its disk never completes (TestMembershipChangeWithAPassedDeadlineEnds). It is not
// proposed then, so unavailable.
//
// Raft's enqueue ends a little before ctx does. Timed out together, the wait saw ctx
// end first and answered outcome_unknown for a change Raft never took (unavailable
// before waitMembership, and by the contract: certainly not applied).
func (n *Node) changeMembership(ctx context.Context, what string, change func(timeout time.Duration) raft.Future) error {
	timeout := n.timeout(ctx)
	if timeout <= 0 {
		return idemkv.Errorf(idemkv.ErrUnavailable, "deadline passed before %s was proposed: nothing was changed", what)
	}
	return n.waitMembership(ctx, what, change(timeout-min(timeout/4, enqueueMargin)))
}

// enqueueMargin is how long before the request's end at most Raft's enqueue of a
// membership change gives up, so that its answer is heard before the request ends.
const enqueueMargin = 100 * time.Millisecond

// waitMembership waits for a membership change handed to Raft. Raft's timeout bounds
// only its enqueueing: a change whose voters cannot commit it (a forced removal that
// left no quorum) held the request for good. It waits for ctx, or ApplyTimeout when ctx
// has no deadline; after that the change may still take effect.
func (n *Node) waitMembership(ctx context.Context, what string, f raft.Future) error {
	ctx, cancel := n.bounded(ctx)
	defer cancel()
	err, ended := waitFuture(ctx, f)
	switch {
	case ended != nil:
		return idemkv.Errorf(idemkv.ErrOutcomeUnknown, "gave up waiting for %s to commit (%v): the voters it leaves may not reach a quorum; it may still take effect, GET /v1/cluster shows whether it did", what, ended)
	case err != nil:
		return n.raftError(err)
	}
	return nil
}

// CaughtUpTo reports whether this node's state machine reflects every entry up to
// index (no-ops and barriers, which never reach it, aside): how a joining node knows
// it holds what the cluster had committed when it joined.
func (n *Node) CaughtUpTo(index uint64) bool { return n.caughtUp(index) }

// Voter reports whether this node's Raft configuration makes it a voter.
func (n *Node) Voter() bool {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == n.cfg.ID {
			return s.Suffrage == raft.Voter
		}
	}
	return false
}

// bounded is ctx, ended after ApplyTimeout when it has no deadline of its own: how
// long a wait for Raft may last that Raft's own timeouts, which bound only enqueueing,
// leave open.
func (n *Node) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, n.cfg.ApplyTimeout)
}

func (n *Node) timeout(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return time.Until(dl)
	}
	return n.cfg.ApplyTimeout
}

// Sweep proposes one sweep entry that deletes at most limit expired records; more
// reports that expired records remain. It is the expiry sweeper's way in.
func (n *Node) Sweep(ctx context.Context, limit int) (swept int, more bool, err error) {
	res, err := n.propose(ctx, &fsm.Command{Op: fsm.OpSweep, Sweep: &fsm.SweepArgs{Limit: limit}})
	if err != nil {
		return 0, false, err
	}
	return res.Swept, res.More, nil
}

// Backlog counts records past expires_at that are not swept yet, and the expiry of
// the oldest, as of now.
func (n *Node) Backlog() (count int, oldest idemkv.Timestamp, now idemkv.Timestamp) {
	now = n.now()
	count, oldest = n.fsm.Backlog(now)
	return count, oldest, now
}

// LongPolling counts the records that long-polls are waiting on.
func (n *Node) LongPolling() int { return n.fsm.Watching() }

// AppliedIndex is the index of the last entry the state machine applied.
func (n *Node) AppliedIndex() uint64 { return n.fsm.AppliedIndex() }

// StateHash hashes every record and the membership metadata, for convergence checks.
func (n *Node) StateHash() (string, error) {
	h, err := n.fsm.StateHash()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%x", h), nil
}

// CheckExpiryIndex verifies that the expiry index and the records agree.
func (n *Node) CheckExpiryIndex() error { return n.fsm.CheckExpiryIndex() }

// Snapshot forces a Raft snapshot (and log compaction per TrailingLogs).
func (n *Node) Snapshot() error {
	if err := n.raft.Snapshot().Error(); err != nil {
		return fmt.Errorf("node: snapshot: %w", err)
	}
	return nil
}

// FirstLogIndex is the oldest entry still in this node's Raft log; entries before it
// were compacted into a snapshot.
func (n *Node) FirstLogIndex() (uint64, error) {
	return n.logs.FirstIndex()
}

// RaftStats returns Raft's own figures (state, term, indexes, last contact …).
func (n *Node) RaftStats() map[string]string { return n.raft.Stats() }
