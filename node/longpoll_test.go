package node_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// parkLongPolls reserves n records (pending, 60 s leases) and parks one long-poll of
// wait on each, until ctx ends. It returns once every poll is waiting.
func parkLongPolls(t testing.TB, ctx context.Context, nd *node.Node, n int, wait time.Duration) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		key := fmt.Sprintf("parked-%d", i)
		req := reserveReq(key, "a-"+key, "sha256:"+key)
		req.LeaseTTLMs = 60_000
		if _, err := nd.Reserve(ctx, req); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := nd.Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: key, Wait: wait})
			if err != nil && ctx.Err() == nil {
				t.Error(err)
			}
		}()
	}
	if err := testcluster.Eventually(30*time.Second, func() error {
		if got := nd.LongPolling(); got < n {
			return fmt.Errorf("%d of %d long-polls parked", got, n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return &wg
}

func wakeups(t testing.TB, c *testcluster.Cluster, i int) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Metrics(i).LongPollWakeups.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestLongPollsWakePerKey: every applied batch used to wake every long-poll, each of
// which then took a read index (issue 13, defect 8). Writes to other records now wake
// none of them; a write to a polled record wakes that poll alone.
func TestLongPollsWakePerKey(t *testing.T) {
	c := testcluster.Start(t, 1)
	nd := c.Node(0)
	ctx, cancel := context.WithCancel(ctxT(t))
	const parked, writes = 200, 50
	wg := parkLongPolls(t, ctx, nd, parked, time.Minute)
	defer func() { cancel(); wg.Wait() }()

	for i := range writes {
		if _, err := reserveAndCommit(ctx, nd, fmt.Sprintf("other-%d", i), true); err != nil {
			t.Fatal(err)
		}
	}
	if w := wakeups(t, c, 0); w != 0 {
		t.Errorf("%d writes to other records woke long-polls %v times, want 0", writes, w)
	}
	if _, err := nd.Heartbeat(ctx, &idemkv.HeartbeatRequest{Tenant: "acme", Key: "parked-7", Fence: fenceOf(t, ctx, nd, "parked-7")}); err != nil {
		t.Fatal(err)
	}
	if err := testcluster.Eventually(10*time.Second, func() error {
		if w := wakeups(t, c, 0); w != 1 {
			return fmt.Errorf("a heartbeat of one polled record woke %v polls, want 1", w)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

func fenceOf(t testing.TB, ctx context.Context, nd *node.Node, key string) uint64 {
	t.Helper()
	rec, err := nd.Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: key})
	if err != nil {
		t.Fatal(err)
	}
	return rec.Fence
}

// TestMeasureLongPollHerd measures other callers' reserve latency with 2,000
// long-polls parked on a 3-node cluster, against none. It is a measurement, not a
// check: IDEMKV_MEASURE=1 runs it.
func TestMeasureLongPollHerd(t *testing.T) {
	if os.Getenv("IDEMKV_MEASURE") == "" {
		t.Skip("a measurement; set IDEMKV_MEASURE=1")
	}
	parked := 2000
	if v, err := strconv.Atoi(os.Getenv("IDEMKV_MEASURE_PARKED")); err == nil {
		parked = v
	}
	c := testcluster.Start(t, 3)
	nd := c.Node(c.WaitLeader())
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	measure := func(label string) {
		const n = 300
		lat := make([]time.Duration, 0, n)
		for i := range n {
			key := fmt.Sprintf("%s-%d", label, i)
			start := time.Now()
			if _, err := nd.Reserve(ctx, reserveReq(key, "a-"+key, "sha256:"+key)); err != nil {
				t.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		t.Logf("%s: reserve p50 %v p90 %v p99 %v (%d sequential reserves)", label, lat[n/2], lat[n*9/10], lat[n*99/100], n)
	}
	measure("idle")
	wg := parkLongPolls(t, ctx, nd, parked, 5*time.Minute)
	measure(fmt.Sprintf("with-%d-parked", parked))
	li := c.WaitLeader()
	t.Logf("long-poll wakeups during the second run: %v", wakeups(t, c, li))
	cancel()
	wg.Wait()
	if err := ctx.Err(); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
