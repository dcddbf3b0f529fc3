package node

import (
	"math"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/metrics"
)

// recordsRecount is the least time between two counts of the stored records. Counting
// walks the expiry index, one small key per record, so a scrape must not do it every
// time on a large store.
const recordsRecount = 2 * time.Second

// RegisterMetrics adds this node's Raft figures (state, term, commit and applied index,
// last contact) and the number of stored records to m, read on every scrape. Call it
// once per Metrics; the scraper (the API) must stop before Close, as every other caller
// of the node must.
func (n *Node) RegisterMetrics(m *metrics.Metrics) error {
	var (
		mu          sync.Mutex
		counted     time.Time
		countedAt   uint64
		recordCount int
	)
	records := func() int {
		mu.Lock()
		defer mu.Unlock()
		applied := n.fsm.AppliedIndex()
		if counted.IsZero() || (applied != countedAt && time.Since(counted) >= recordsRecount) {
			// Every record has exactly one expiry index entry, so counting the entries
			// up to the end of time counts the records without decoding any.
			recordCount, _ = n.fsm.Backlog(idemkv.Timestamp(math.MaxInt64))
			counted, countedAt = time.Now(), applied
		}
		return recordCount
	}
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
			Records:      records(),
		}
		if state == raft.Leader {
			s.LastContact = 0
		} else if lc := n.raft.LastContact(); !lc.IsZero() {
			s.LastContact = time.Since(lc)
		}
		return s
	})
}
