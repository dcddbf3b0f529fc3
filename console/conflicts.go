package console

import (
	"context"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
)

// DefaultConflictsKept is how many recent conflicts a node keeps for the console.
const DefaultConflictsKept = 500

// Conflicts is a bounded ring of the conflicts this node answered, newest kept. No
// store keeps conflicts (a conflict changes no record and is never written to the
// log), so this is what the console can honestly show: what this node answered since
// it started, the oldest dropped first; other nodes keep their own. Feed it with
// Observe as api.Config.OnReserve.
type Conflicts struct {
	mu      sync.Mutex
	ring    []ConflictEntry
	next    int    // where the next entry goes
	seq     uint64 // of the newest entry
	dropped uint64
}

// ConflictEntry is one conflict answer. Seq numbers them from 1 in arrival order; the
// console pages by it.
type ConflictEntry struct {
	Seq      uint64
	At       time.Time
	Tenant   string
	Key      string
	Tool     string
	Actor    string
	Conflict idemkv.Conflict
}

// NewConflicts returns a ring of n entries (DefaultConflictsKept when n <= 0).
func NewConflicts(n int) *Conflicts {
	if n <= 0 {
		n = DefaultConflictsKept
	}
	return &Conflicts{ring: make([]ConflictEntry, 0, n)}
}

// Observe keeps res when it is a conflict. Its signature is api.Config.OnReserve's.
func (c *Conflicts) Observe(_ context.Context, req *idemkv.ReserveRequest, res *idemkv.ReserveResult) {
	if res == nil || res.Decision != idemkv.DecisionConflict || res.Conflict == nil {
		return
	}
	e := ConflictEntry{At: time.Now(), Tenant: req.Tenant, Key: req.Key, Tool: req.Tool, Actor: req.Actor, Conflict: *res.Conflict}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	e.Seq = c.seq
	if len(c.ring) < cap(c.ring) {
		c.ring = append(c.ring, e)
		return
	}
	c.ring[c.next] = e
	c.next = (c.next + 1) % len(c.ring)
	c.dropped++
}

// Page returns up to limit entries that visible lets through, newest first, older
// than before (0: from the newest), and the Seq to ask for the next page before (0
// when there is none). Kept is how many the ring holds, Dropped how many it let go.
func (c *Conflicts) Page(before uint64, limit int, visible func(*ConflictEntry) bool) (page []ConflictEntry, next uint64, kept int, dropped uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.ring)
	// Newest first: the entry before c.next when the ring is full, else the last.
	for i := range n {
		idx := (c.next - 1 - i + 2*n) % n
		if len(c.ring) < cap(c.ring) {
			idx = n - 1 - i
		}
		e := &c.ring[idx]
		if before != 0 && e.Seq >= before {
			continue
		}
		if !visible(e) {
			continue
		}
		if len(page) == limit {
			next = page[len(page)-1].Seq
			break
		}
		page = append(page, *e)
	}
	return page, next, n, c.dropped
}

func (c *Conflicts) capacity() int { return cap(c.ring) }

// count returns how many kept entries visible lets through.
func (c *Conflicts) count(visible func(*ConflictEntry) bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for i := range c.ring {
		if visible(&c.ring[i]) {
			n++
		}
	}
	return n
}
