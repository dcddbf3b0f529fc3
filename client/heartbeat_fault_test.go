package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testlog"
)

// heartbeatBlackhole is a proxy in front of a node that, while cut is set, answers
// every heartbeat 503 unavailable: the worker behind it cannot renew its lease, and
// the cluster never hears from it.
func heartbeatBlackhole(t *testing.T, endpoint string, cut *atomic.Bool) string {
	t.Helper()
	target, err := url.Parse("http://" + endpoint)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	// The worker must stay behind the proxy, not follow the node's leader header.
	proxy.ModifyResponse = func(r *http.Response) error { r.Header.Del(client.HeaderLeader); return nil }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cut.Load() && r.URL.Path == "/v1/heartbeat" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":{"code":"unavailable","message":"partitioned"}}`))
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// A worker whose heartbeats fail (unavailable, not fenced) for longer than its lease
// no longer holds the key: another worker recovers it, probes, finds nothing and runs
// the tool. The first worker's tool must have been told to stop by then (its context
// cancelled when the lease ran out by the worker's own clock); a tool that honours its
// context then does not create a second ticket.
func TestHeartbeatsFailingPastTheLeaseStopTheTool(t *testing.T) {
	e := startEnv(t, 1)
	var cut atomic.Bool
	cut.Store(true)
	cut1, err := client.New(client.Config{
		Endpoints: []string{heartbeatBlackhole(t, e.cluster.Endpoint(0), &cut)},
		Timeout:   time.Second,
		Logger:    testlog.New(t),
		Run:       client.RunConfig{BackoffMin: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cut1.Close() })

	key := "conversation_9:approval_40:create_ticket"
	op := createTicket(key, "Partitioned worker")
	op.LeaseTTL = time.Second
	op.Probe = e.api.probe(key)

	running, proceed := make(chan struct{}), make(chan struct{})
	var cause atomic.Value
	first := make(chan error, 1)
	go func() {
		_, err := cut1.Do(timeout(t, 20*time.Second), op, func(ctx context.Context) (*client.Result, error) {
			close(running)
			// A long call downstream: it checks its context before the step that
			// cannot be undone.
			select {
			case <-ctx.Done():
				cause.Store(context.Cause(ctx))
				return nil, ctx.Err()
			case <-proceed:
			}
			if ctx.Err() != nil {
				cause.Store(context.Cause(ctx))
				return nil, ctx.Err()
			}
			return e.api.create(key), nil
		})
		first <- err
	}()
	<-running

	// The second worker waits out the first one's lease, recovers, probes (nothing
	// yet) and creates the ticket.
	out, err := e.client.Do(timeout(t, 20*time.Second), op, e.create(key))
	if err != nil || out.Decision != idemkv.DecisionRecover {
		t.Fatalf("second worker: %+v, %v", out, err)
	}
	close(proceed)
	err = <-first
	if e.api.count(key) != 1 {
		t.Fatalf("%d tickets for one operation: the first worker's tool ran on after its lease ran out (its context: %v); Do: %v",
			e.api.count(key), cause.Load(), err)
	}
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Fatalf("first worker: %v, want outcome_unknown", err)
	}
	if c, _ := cause.Load().(error); !errors.Is(c, client.ErrLeaseExpired) {
		t.Fatalf("the tool's context cause %v, want ErrLeaseExpired", c)
	}
}

// A Do that waits for an approval while the node stops answering reads (the long-poll
// hangs until the client's attempt timeout) returns within the approval's Wait plus
// StoreWait, as every wait for an unresponsive store is bounded, not after the HTTP
// client's every attempt has waited the whole long-poll again.
func TestApprovalWaitOnAHangingStoreIsBoundedByStoreWait(t *testing.T) {
	var hang atomic.Bool
	c := testcluster.Start(t, 1, testcluster.WithAPIMiddleware(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if hang.Load() && r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/records/") {
				<-r.Context().Done()
				return
			}
			next.ServeHTTP(w, r)
		})
	}))
	const wait, storeWait = time.Second, time.Second
	agent, err := client.New(client.Config{
		Endpoints: c.Endpoints(),
		Timeout:   200 * time.Millisecond,
		StoreWait: storeWait,
		Logger:    testlog.New(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { agent.Close() })
	hang.Store(true)
	start := time.Now()
	_, err = agent.Do(timeout(t, time.Minute), refundOp("order_17:refund:hang", 40, wait), mustNotRun(t))
	took := time.Since(start)
	if !errors.Is(err, client.ErrStoreUnavailable) {
		t.Fatalf("Do: %v (kind %q), want store_unavailable", err, client.KindOf(err))
	}
	if limit := wait + storeWait + time.Second; took > limit {
		t.Fatalf("Do returned after %s, beyond the approval wait plus StoreWait (%s)", took.Round(time.Millisecond), limit)
	}
}
