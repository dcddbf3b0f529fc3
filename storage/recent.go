package storage

import "sync"

// recentRecords holds the stored values of the records the state machine wrote or
// read last, and of those a reader looked up, so that the reads which follow a write
// almost at once (the commit after a reserve, a retried reserve, a get of a fresh
// receipt) and the retries of an operation cost a map lookup instead of a walk down
// Pebble's memtables. Under load those walks were the largest single CPU cost of every
// node: a point lookup descends a skiplist per memtable, missing the CPU cache at
// almost every step, and one that ends in a miss (every new key) walks them all.
//
// It holds absence too: a nil value says the key has no record. A new reserve is
// looked up by the node's API before it is proposed and again by the state machine as
// it applies it; the second look finds the first's answer here.
//
// The state machine is the store's only writer, so what its batches put is always the
// committed state: a batch puts what it read (nothing can have changed it since) and,
// once its commit is in Pebble, what it wrote or deleted. A reader on another goroutine
// may have read Pebble before a batch committed and hold the value from before it, so
// it puts what it read only if no batch updated the cache since it began (fill, with
// the generation it took before reading). Between a batch's Pebble commit and its
// update here a reader can still get the value from before the batch, which is the
// state at the applied index the state machine still announces.
//
// Eviction is first in, first out: the working set is the records touched in the last
// few seconds, which is what insertion order approximates.
type recentRecords struct {
	mu   sync.RWMutex
	vals map[string][]byte // record key → stored value (nil: no record)
	ring []string          // keys in insertion order; ring[next] is evicted next
	next int
	// gen counts the updates and clears: a reader's fill is void if it moved.
	gen uint64
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

// get returns the value of record key k (nil: the key has no record), and whether it
// is held. The value must not be modified.
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

// generation is what a reader takes before it reads Pebble, to fill with after.
func (c *recentRecords) generation() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.gen
}

// fill holds v (nil: absent), which a reader read from Pebble after it took gen, unless
// a batch updated the cache since: its value might be older than the batch's.
func (c *recentRecords) fill(k string, v []byte, gen uint64) {
	if len(v) > recentMaxValue {
		return
	}
	c.mu.Lock()
	if c.gen == gen {
		c.putLocked(k, v)
	}
	c.mu.Unlock()
}

// update applies a committed batch's writes: a nil value is a deletion, after which
// the key is known to have no record.
func (c *recentRecords) update(writes map[string][]byte) {
	if len(writes) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for k, v := range writes {
		if len(v) > recentMaxValue {
			// Too big to hold: forget any older copy. The ring keeps the key
			// until its slot comes round; the slot then deletes nothing or, if k
			// was held again since, the newer copy (early).
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
	c.gen++
	clear(c.vals)
	clear(c.ring)
	c.next = 0
}
