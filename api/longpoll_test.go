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
	var parked atomic.Int64
	release := make(chan struct{})
	fake := &FakeStore{GetFunc: func(ctx context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) {
		if req.Wait > 0 {
			parked.Add(1)
			defer parked.Add(-1)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return pendingRecord(req.Key), nil
	}}
	n := startNode(t, fake, func(c *api.Config) {
		c.MaxLongPolls, c.MaxLongPollsPerCaller, c.MaxLongPollsPerTenant = 5, 2, 5
		inner := c.Middleware
		c.Middleware = func(next http.Handler) http.Handler {
			h := inner(next)
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				h.ServeHTTP(w, r.WithContext(api.WithCaller(r.Context(), keyedCaller(r.Header.Get("X-Caller")))))
			})
		}
	})
	var wg sync.WaitGroup
	defer wg.Wait()
	releaseAll := sync.OnceFunc(func() { close(release) })
	defer releaseAll()
	park := func(caller string, want int64) {
		t.Helper()
		wg.Add(1)
		go func() {
			defer wg.Done()
			do(t, "GET", n.url+"/v1/records/acme/k?wait_ms=60000", nil, map[string]string{"X-Caller": caller})
		}()
		if err := testcluster.Eventually(10*time.Second, func() error {
			if got := parked.Load(); got != want {
				return fmt.Errorf("%d polls parked, want %d", got, want)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(caller, why string) {
		t.Helper()
		t.Log(why)
		do(t, "GET", n.url+"/v1/records/acme/k?wait_ms=60000", nil, map[string]string{"X-Caller": caller}).
			wantError(t, http.StatusTooManyRequests, idemkv.CodeResourceExhausted, "")
	}
	park("a", 1)
	park("a", 2)
	refused("a", "a's third poll: the per-token cap")
	park("b", 3)
	park("b", 4)
	park("c", 5)
	refused("c", "c's second poll: the node's cap")
	do(t, "GET", n.url+"/v1/records/acme/k", nil, map[string]string{"X-Caller": "a"}).object(t, http.StatusOK)

	// Answered polls give their slots back.
	releaseAll()
	wg.Wait()
	for range 5 {
		do(t, "GET", n.url+"/v1/records/acme/k?wait_ms=60000", nil, map[string]string{"X-Caller": "c"}).object(t, http.StatusOK)
	}
}

// One tenant's tokens together hold at most the tenant's share of a node's long-polls:
// a tenant with four tokens held the whole node's, and every other tenant got 429s.
func TestLongPollsAreCappedPerTenant(t *testing.T) {
	release := make(chan struct{})
	var parked atomic.Int64
	fake := &FakeStore{GetFunc: func(ctx context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) {
		if req.Wait > 0 {
			parked.Add(1)
			defer parked.Add(-1)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return pendingRecord(req.Key), nil
	}}
	n := startNode(t, fake, func(c *api.Config) {
		c.MaxLongPolls, c.MaxLongPollsPerCaller = 6, 2 // a tenant's share: 3
		inner := c.Middleware
		c.Middleware = func(next http.Handler) http.Handler {
			h := inner(next)
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				h.ServeHTTP(w, r.WithContext(api.WithCaller(r.Context(), keyedCaller(r.Header.Get("X-Caller")))))
			})
		}
	})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(release)
	poll := func(tenant, caller string) response {
		return do(t, "GET", n.url+"/v1/records/"+tenant+"/k?wait_ms=60000", nil, map[string]string{"X-Caller": caller})
	}
	park := func(tenant, caller string, want int64) {
		t.Helper()
		wg.Add(1)
		go func() { defer wg.Done(); poll(tenant, caller) }()
		if err := testcluster.Eventually(10*time.Second, func() error {
			if got := parked.Load(); got != want {
				return fmt.Errorf("%d polls parked, want %d", got, want)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	park("noisy", "t1", 1)
	park("noisy", "t1", 2)
	park("noisy", "t2", 3)
	poll("noisy", "t3").wantError(t, http.StatusTooManyRequests, idemkv.CodeResourceExhausted, "")
	park("quiet", "q1", 4)
	park("quiet", "q1", 5)
}
