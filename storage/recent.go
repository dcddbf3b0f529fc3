package storage

import "sync"

// recentRecords holds the stored values of the records the state machine wrote or
// read last, so that the reads which follow a write almost at once (the commit after a
// reserve, a retried reserve, a get of a fresh receipt) cost a map lookup instead of a
// walk down Pebble's memtables. Under load those walks were the largest single CPU cost
// of every node: a point lookup descends a skiplist per memtable, missing the CPU
// cache at almost every step.
//
// Only the state machine's batches fill it, and the state machine is the store's only
// writer, so a value it holds is always the committed one: a batch puts what it read
// (nothing can have changed it since) and, once its commit is in Pebble, what it wrote
// or deleted. Readers on other goroutines only look. Between a batch's Pebble commit
// and its update here a reader can still get the value from before the batch, which
// is the state at the applied index the state machine still announces.
//
// Eviction is first in, first out: the working set is the records touched in the last
// few seconds, which is what insertion order approximates.
type recentRecords struct {
	mu   sync.RWMutex
	vals map[string][]byte // record key → stored value
	ring []string          // keys in insertion order; ring[next] is evicted next
	next int
}

// recentCapacity bounds the records held; a variable so tests can make eviction
// happen all the time. With recentMaxValue it bounds the cache at 64 MiB even when
// every record carries a large result; typical records are about 200 bytes, so it is
// usually a few MiB. Reserve-to-commit takes milliseconds, so a few thousand records
// cover every operation in flight at thousands per second.
var recentCapacity = 1 << 14

// recentMaxValue is the largest stored value held; bigger records (results near the
// 64 KiB limit) are read from Pebble every time.
const recentMaxValue = 4 << 10

func newRecentRecords(capacity int) *recentRecords {
	return &recentRecords{vals: make(map[string][]byte, capacity), ring: make([]string, capacity)}
}

// get returns the value of record key k, and whether it is held. The value must not
// be modified.
func (c *recentRecords) get(k []byte) ([]byte, bool) {
	c.mu.RLock()
	v, ok := c.vals[string(k)]
	c.mu.RUnlock()
	return v, ok
}

// put holds v (which the cache now owns) as the value of record key k.
func (c *recentRecords) put(k string, v []byte) {
	if len(v) > recentMaxValue {
		return
	}
	c.mu.Lock()
	c.putLocked(k, v)
	c.mu.Unlock()
}

func (c *recentRecords) putLocked(k string, v []byte) {
	if _, ok := c.vals[k]; ok {
		c.vals[k] = v
		return
	}
	if old := c.ring[c.next]; old != "" {
		delete(c.vals, old)
	}
	c.ring[c.next] = k
	c.next = (c.next + 1) % len(c.ring)
	c.vals[k] = v
}

// update applies a committed batch's writes: a nil value is a deletion.
func (c *recentRecords) update(writes map[string][]byte) {
	if len(writes) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, v := range writes {
		if v == nil || len(v) > recentMaxValue {
			// Deleted, or too big to hold: forget any older copy. The ring keeps
			// the key until its slot comes round; the slot then deletes nothing or,
			// if k was held again since, the newer copy (early).
			delete(c.vals, k)
			continue
		}
		c.putLocked(k, v)
	}
}

// clear forgets everything: for writes that bypass batches (restore).
func (c *recentRecords) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.vals)
	clear(c.ring)
	c.next = 0
}
