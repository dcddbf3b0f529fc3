package storage

import (
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// ruleCache holds every approval rule's stored value in memory. Each reserve looks
// up its tenant and tool's rule on the node that takes it, and again in the state
// machine's batch, and almost always finds none: a walk down Pebble's memtables that
// ends in a miss, 3% of a loaded leader's CPU. Rules are few (an admin sets them) and
// change only through the state machine's batches, which update the cache after
// their Pebble commit, so a value it holds is the committed one (between a commit and
// its update a reader sees the rule from before, the state at the applied index the
// state machine still announces). It loads on first use and again after a restore.
type ruleCache struct {
	mu     sync.RWMutex
	loaded bool
	vals   map[string][]byte // ruleKey → encoded rule
}

// get returns the stored value of rule key k (nil: no rule), loading the cache from db
// first if needed. db must stay open for the call.
func (c *ruleCache) get(db pebble.Reader, k []byte) ([]byte, error) {
	c.mu.RLock()
	if c.loaded {
		v := c.vals[string(k)]
		c.mu.RUnlock()
		return v, nil
	}
	c.mu.RUnlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.loaded {
		// Under the write lock: a batch's update after its commit waits for the
		// load, whichever state of the rule it scanned.
		vals := map[string][]byte{}
		it, err := db.NewIter(prefixIter(prefixRule))
		if err != nil {
			return nil, fmt.Errorf("storage: approval rules: %w", err)
		}
		for it.First(); it.Valid(); it.Next() {
			vals[string(it.Key())] = append([]byte(nil), it.Value()...)
		}
		if err := it.Close(); err != nil {
			return nil, fmt.Errorf("storage: approval rules: %w", err)
		}
		c.vals, c.loaded = vals, true
	}
	return c.vals[string(k)], nil
}

// update applies a committed batch's rule writes (nil: deleted). A cache not loaded
// yet has nothing to update: its load will read them.
func (c *ruleCache) update(writes map[string][]byte) {
	if len(writes) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.loaded {
		return
	}
	for k, v := range writes {
		if v == nil {
			delete(c.vals, k)
		} else {
			c.vals[k] = v
		}
	}
}

// clear forgets every rule: for a restore, which replaces the store under it.
func (c *ruleCache) clear() {
	c.mu.Lock()
	c.loaded, c.vals = false, nil
	c.mu.Unlock()
}
