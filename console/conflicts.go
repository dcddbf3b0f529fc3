package console

import (
	"context"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
)

// DefaultConflictsKept is how many recent conflicts a node keeps for the console.
const DefaultConflictsKept = 500

// Conflicts keeps the conflicts this node answered, a bounded number. No store keeps
// conflicts (a conflict changes no record and is never written to the log), so this is
// what the console can honestly show: what this node answered since it started; other
// nodes keep their own. When full, the oldest entry of the tenant holding the most
// goes, so that one tenant's flood of conflicting reserves cannot push every other
// tenant's out. Feed it with Observe as api.Config.OnReserve.
type Conflicts struct {
	mu       sync.Mutex
	entries  []ConflictEntry // oldest first
	max      int
	byTenant map[string]int // entries held per tenant
	seq      uint64         // of the newest entry
	dropped  uint64
}

// ConflictEntry is one conflict answer. Seq orders them by arrival: the time it came,
// in Unix nanoseconds, moved on by a nanosecond when it would not be later than the
// entry before. The console pages by it, so a viewer sees it: a count of every entry
// would tell a viewer of one tenant, by the gaps between its own entries' numbers, how
// many conflicts the other tenants got in between.
type ConflictEntry struct {
	Seq      uint64
	At       time.Time
	Tenant   string
	Key      string
	Tool     string
	Actor    string
	Conflict idemkv.Conflict
}

// NewConflicts keeps n entries (DefaultConflictsKept when n <= 0).
func NewConflicts(n int) *Conflicts {
	if n <= 0 {
		n = DefaultConflictsKept
	}
	return &Conflicts{entries: make([]ConflictEntry, 0, n), max: n, byTenant: map[string]int{}}
}

// Observe keeps res when it is a conflict. Its signature is api.Config.OnReserve's.
func (c *Conflicts) Observe(_ context.Context, req *idemkv.ReserveRequest, res *idemkv.ReserveResult) {
	if res == nil || res.Decision != idemkv.DecisionConflict || res.Conflict == nil {
		return
	}
	e := ConflictEntry{At: time.Now(), Tenant: req.Tenant, Key: req.Key, Tool: req.Tool, Actor: req.Actor, Conflict: *res.Conflict}
	c.mu.Lock()
	defer c.mu.Unlock()
	e.Seq = max(uint64(max(e.At.UnixNano(), 0)), c.seq+1)
	c.seq = e.Seq
	if len(c.entries) >= c.max {
		most := e.Tenant
		for t, n := range c.byTenant {
			if n > c.byTenant[most] {
				most = t
			}
		}
		for i := range c.entries {
			if c.entries[i].Tenant == most {
				c.entries = append(c.entries[:i], c.entries[i+1:]...)
				break
			}
		}
		if c.byTenant[most]--; c.byTenant[most] == 0 {
			delete(c.byTenant, most)
		}
		c.dropped++
	}
	c.entries = append(c.entries, e)
	c.byTenant[e.Tenant]++
}

// Page returns up to limit entries that visible lets through, newest first, older
// than before (0: from the newest), and the Seq to ask for the next page before (0
// when there is none). Kept is how many of those visible lets through are held,
// Dropped how many entries of any tenant were let go: the caller shows it only to a
// viewer of every tenant.
func (c *Conflicts) Page(before uint64, limit int, visible func(*ConflictEntry) bool) (page []ConflictEntry, next uint64, kept int, dropped uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.entries) - 1; i >= 0; i-- {
		e := &c.entries[i]
		if !visible(e) {
			continue
		}
		kept++
		if before != 0 && e.Seq >= before {
			continue
		}
		switch {
		case len(page) < limit:
			page = append(page, *e)
		case next == 0:
			next = page[len(page)-1].Seq
		}
	}
	return page, next, kept, c.dropped
}

func (c *Conflicts) capacity() int { return c.max }

// count returns how many kept entries visible lets through.
func (c *Conflicts) count(visible func(*ConflictEntry) bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for i := range c.entries {
		if visible(&c.entries[i]) {
			n++
		}
	}
	return n
}
