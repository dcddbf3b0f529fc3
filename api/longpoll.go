package api

import (
	"net/http"
	"sync"

	"github.com/idemkv/idemkv"
)

// Caps on long-polls (GET of a record with wait_ms). Each holds a connection, a file
// descriptor and a goroutine for up to idemkv.MaxWait; 2,000 of them used 2,000 file
// descriptors on one node. Beyond a cap the answer is 429 resource_exhausted.
const (
	// DefaultMaxLongPolls caps the long-polls one node holds at once.
	DefaultMaxLongPolls = 1000
	// DefaultMaxLongPollsPerCaller caps those of one token, so that one tenant's
	// agents cannot take every slot.
	DefaultMaxLongPollsPerCaller = 250
)

// DefaultMaxLongPollsPerTenant caps the long-polls of one tenant's records, of every
// token together, when a node holds max at most: half of them. A tenant with four
// client tokens otherwise held all 1,000, and every other tenant got 429s.
func DefaultMaxLongPollsPerTenant(nodeMax int) int { return max(nodeMax/2, 1) }

// LimitKeyer is implemented by Callers that per-caller caps should count apart (a
// token's name). Callers without it, and requests without a Caller, share the node's
// cap only.
type LimitKeyer interface {
	LimitKey() string
}

// longPolls counts the long-polls in progress on this node.
type longPolls struct {
	max, maxPerCaller, maxPerTenant int

	mu        sync.Mutex
	total     int
	perCaller map[string]int
	perTenant map[string]int
}

func newLongPolls(max, maxPerCaller, maxPerTenant int) *longPolls {
	if max <= 0 {
		max = DefaultMaxLongPolls
	}
	if maxPerCaller <= 0 {
		maxPerCaller = DefaultMaxLongPollsPerCaller
	}
	if maxPerTenant <= 0 {
		maxPerTenant = DefaultMaxLongPollsPerTenant(max)
	}
	return &longPolls{max: max, maxPerCaller: maxPerCaller, maxPerTenant: maxPerTenant,
		perCaller: map[string]int{}, perTenant: map[string]int{}}
}

// acquire takes a slot for a long-poll of r's caller on a record of tenant, or fails
// with resource_exhausted. The caller must call release when the poll has been
// answered. A refusal names only the caller's own cap or its tenant's: that the node's
// is full says others poll, but not who.
func (l *longPolls) acquire(r *http.Request, tenant string) (release func(), err error) {
	key, keyed := "", false
	if c, ok := CallerFrom(r.Context()); ok {
		if k, ok := c.(LimitKeyer); ok {
			key, keyed = k.LimitKey(), true
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.total >= l.max:
		return nil, idemkv.Errorf(idemkv.ErrResourceExhausted,
			"this node holds %d long-polls, its cap; retry later, or read without wait_ms", l.max)
	case keyed && l.perCaller[key] >= l.maxPerCaller:
		return nil, idemkv.Errorf(idemkv.ErrResourceExhausted,
			"this token holds %d long-polls on this node, its cap; retry later, or read without wait_ms", l.maxPerCaller)
	case l.perTenant[tenant] >= l.maxPerTenant:
		return nil, idemkv.Errorf(idemkv.ErrResourceExhausted,
			"this node holds %d long-polls on tenant %s's records, its cap for one tenant; retry later, or read without wait_ms", l.maxPerTenant, tenant)
	}
	l.total++
	l.perTenant[tenant]++
	if keyed {
		l.perCaller[key]++
	}
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.total--
		if l.perTenant[tenant]--; l.perTenant[tenant] == 0 {
			delete(l.perTenant, tenant)
		}
		if keyed {
			if l.perCaller[key]--; l.perCaller[key] == 0 {
				delete(l.perCaller, key)
			}
		}
	}, nil
}
