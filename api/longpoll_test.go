package api_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
	"github.com/idemkv/idemkv/internal/testcluster"
)

// keyedCaller may do anything and is counted apart under its name.
type keyedCaller string

func (keyedCaller) Allow(api.Operation, string) error { return nil }
func (c keyedCaller) LimitKey() string                { return string(c) }

// TestLongPollsAreCapped: nothing bounded long-polls, and 2,000 of them held 2,000 file
// descriptors (issue 13, defect 8). Beyond the per-token and per-node caps the answer
// is 429 resource_exhausted; a read without wait_ms is never refused; a slot comes back
// when its poll is answered.
func TestLongPollsAreCapped(t *testing.T) {
	p := newParkingStore(t, func(c *api.Config) {
		c.MaxLongPolls, c.MaxLongPollsPerCaller, c.MaxLongPollsPerTenant = 5, 2, 5
	})
	refused := func(caller, why string) {
		t.Helper()
		t.Log(why)
		p.poll("acme", caller).wantError(t, http.StatusTooManyRequests, idemkv.CodeResourceExhausted, "")
	}
	p.park("acme", "a", 1)
	p.park("acme", "a", 2)
	refused("a", "a's third poll: the per-token cap")
	p.park("acme", "b", 3)
	p.park("acme", "b", 4)
	p.park("acme", "c", 5)
	refused("c", "c's second poll: the node's cap")
	do(t, "GET", p.n.url+"/v1/records/acme/k", nil, map[string]string{"X-Caller": "a"}).object(t, http.StatusOK)

	// Answered polls give their slots back.
	p.releaseAll()
	p.wg.Wait()
	for range 5 {
		p.poll("acme", "c").object(t, http.StatusOK)
	}
}

// One tenant's tokens together hold at most the tenant's share of a node's long-polls:
// a tenant with four tokens held the whole node's, and every other tenant got 429s.
func TestLongPollsAreCappedPerTenant(t *testing.T) {
	p := newParkingStore(t, func(c *api.Config) {
		c.MaxLongPolls, c.MaxLongPollsPerCaller = 6, 2 // a tenant's share: 3
	})
	p.park("noisy", "t1", 1)
	p.park("noisy", "t1", 2)
	p.park("noisy", "t2", 3)
	p.poll("noisy", "t3").wantError(t, http.StatusTooManyRequests, idemkv.CodeResourceExhausted, "")
	p.park("quiet", "q1", 4)
	p.park("quiet", "q1", 5)
}

// parkingStore is a store whose long-polls park until released, and a node on it
// whose callers are named by the X-Caller header (keyedCaller) and capped as cfg says.
type parkingStore struct {
	t       *testing.T
	n       *testNode
	parked  atomic.Int64
	release chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

func newParkingStore(t *testing.T, cfg func(*api.Config)) *parkingStore {
	p := &parkingStore{t: t, release: make(chan struct{})}
	fake := &FakeStore{GetFunc: func(ctx context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) {
		if req.Wait > 0 {
			p.parked.Add(1)
			defer p.parked.Add(-1)
			select {
			case <-p.release:
			case <-ctx.Done():
			}
		}
		return pendingRecord(req.Key), nil
	}}
	p.n = startNode(t, fake, func(c *api.Config) {
		cfg(c)
		inner := c.Middleware
		c.Middleware = func(next http.Handler) http.Handler {
			h := inner(next)
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				h.ServeHTTP(w, r.WithContext(api.WithCaller(r.Context(), keyedCaller(r.Header.Get("X-Caller")))))
			})
		}
	})
	t.Cleanup(func() { p.releaseAll(); p.wg.Wait() })
	return p
}

// poll long-polls a record of tenant as caller.
func (p *parkingStore) poll(tenant, caller string) response {
	return do(p.t, "GET", p.n.url+"/v1/records/"+tenant+"/k?wait_ms=60000", nil, map[string]string{"X-Caller": caller})
}

// park starts a long-poll of tenant's record as caller and waits until want are parked.
func (p *parkingStore) park(tenant, caller string, want int64) {
	p.t.Helper()
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.poll(tenant, caller) }()
	if err := testcluster.Eventually(10*time.Second, func() error {
		if got := p.parked.Load(); got != want {
			return fmt.Errorf("%d polls parked, want %d", got, want)
		}
		return nil
	}); err != nil {
		p.t.Fatal(err)
	}
}

// releaseAll answers every parked poll, and every later one at once.
func (p *parkingStore) releaseAll() { p.once.Do(func() { close(p.release) }) }
