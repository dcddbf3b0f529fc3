package node

import (
	"time"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv/metrics"
)

// RegisterMetrics adds this node's Raft figures (state, term, commit and applied index,
// last contact) and the number of stored records to m, read on every scrape. Call it
// once per Metrics; the scraper (the API) must stop before Close, as every other caller
// of the node must.
func (n *Node) RegisterMetrics(m *metrics.Metrics) error {
	return m.RegisterNode(func() metrics.NodeStats {
		if n.ctx.Err() != nil {
			return metrics.NodeStats{State: "shutdown", LastContact: -1}
		}
		state := n.raft.State()
		s := metrics.NodeStats{
			State:        stateName(state),
			Term:         n.raft.CurrentTerm(),
			CommitIndex:  n.raft.CommitIndex(),
			AppliedIndex: n.fsm.AppliedIndex(),
			LastLogIndex: n.raft.LastIndex(),
			LastContact:  -1,
			Records:      int(n.store.RecordCount()),

			VotesWithheld: n.WithholdsVotes(),
		}
		if count, oldest := n.fsm.InDoubt(); count > 0 {
			s.InDoubt = count
			s.InDoubtOldestAge = max(n.now().Time().Sub(oldest.Time()), 0)
		}
		cs := n.clock.state()
		s.ClockMeasured, s.ClockOffset = cs.Measured, cs.Offset
		s.LocalAnswers = n.localRefusal() == ""
		if count, oldest := n.fsm.WaitingApprovals(n.now()); count > 0 {
			s.ApprovalsWaiting = count
			s.ApprovalOldestAge = max(n.now().Time().Sub(oldest.Time()), 0)
		}
		if state == raft.Leader {
			s.LastContact = 0
		} else if lc := n.raft.LastContact(); !lc.IsZero() {
			s.LastContact = time.Since(lc)
		}
		return s
	})
}
