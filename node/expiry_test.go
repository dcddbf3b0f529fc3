package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// testClock is a node's wall clock under the test's control: it stands still unless the
// test moves it, so leases and TTLs of minutes run out without waiting for them.
type testClock struct {
	base   time.Time
	offset atomic.Int64
}

func newTestClock(base time.Time) *testClock {
	return &testClock{base: base.Truncate(time.Millisecond)}
}

func (c *testClock) Now() time.Time { return c.base.Add(time.Duration(c.offset.Load())) }

func (c *testClock) Advance(d time.Duration) { c.offset.Add(int64(d)) }

// Elapsed is the node's monotonic clock: it moves only as Advance moves Now, so the
// bound on stamps (fsm.BoundStamp) sees the test's time pass as real.
func (c *testClock) Elapsed() time.Duration { return time.Duration(c.offset.Load()) }

func (c *testClock) At(d time.Duration) idemkv.Timestamp { return idemkv.TimestampOf(c.base.Add(d)) }

// metricValue reads a counter, a gauge, or a histogram's sample count.
func metricValue(tb testing.TB, c prometheus.Metric) float64 {
	tb.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		tb.Fatal(err)
	}
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	tb.Fatalf("unexpected metric %v", &m)
	return 0
}

func waitFor(tb testing.TB, timeout time.Duration, what string, f func() error) {
	tb.Helper()
	if err := testcluster.Eventually(timeout, f); err != nil {
		tb.Fatalf("%s: %v", what, err)
	}
}

// settle runs a record of each status into place: pending, committed, or failed.
func settle(t *testing.T, n *node.Node, req *idemkv.ReserveRequest, status idemkv.Status) *idemkv.ReserveResult {
	t.Helper()
	ctx := ctxT(t)
	res, err := n.Reserve(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Decision != idemkv.DecisionExecute {
		t.Fatalf("reserve %s: %s, want execute", req.Key, res.Decision)
	}
	switch status {
	case idemkv.StatusCommitted:
		_, err = n.Commit(ctx, &idemkv.CommitRequest{Tenant: req.Tenant, Key: req.Key, Fingerprint: req.Fingerprint,
			Fence: res.Fence, RemoteSystem: "linear", RemoteID: "LIN-" + req.Key})
	case idemkv.StatusFailed:
		_, err = n.Fail(ctx, &idemkv.FailRequest{Tenant: req.Tenant, Key: req.Key, Fingerprint: req.Fingerprint,
			Fence: res.Fence, Error: idemkv.ErrorInfo{Code: "rejected", Message: "downstream said no"}})
	}
	if err != nil {
		t.Fatalf("settling %s as %s: %v", req.Key, status, err)
	}
	return res
}

func withTTL(r *idemkv.ReserveRequest, ttl time.Duration) *idemkv.ReserveRequest {
	r.TTLMs = ttl.Milliseconds()
	return r
}

// Pending, committed and failed records all expire: at expires_at they are absent to
// reads and to every command, before any sweep; an expired key can be reserved again,
// with a fence above every earlier one; the sweep deletes the rest in bounded entries.
func TestEveryStatusExpires(t *testing.T) {
	clock := newTestClock(time.Now())
	c := testcluster.Start(t, 1, testcluster.WithConfig(func(i int, cfg *node.Config) {
		cfg.Now, cfg.Monotonic = clock.Now, clock.Elapsed
		cfg.Sweep.Disabled = true // the test sweeps by hand, to see the state before
	}))
	n := c.Node(0)
	ctx := ctxT(t)
	statuses := []idemkv.Status{idemkv.StatusPending, idemkv.StatusCommitted, idemkv.StatusFailed}
	// Set "again" is reserved anew before any sweep; set "swept" is swept first.
	type rec struct {
		key   string
		fence uint64
	}
	var again, swept []rec
	for _, st := range statuses {
		for name, set := range map[string]*[]rec{"again": &again, "swept": &swept} {
			key := fmt.Sprintf("%s-%s", st, name)
			res := settle(t, n, withTTL(reserveReq(key, "first", "sha256:"+key), time.Minute), st)
			*set = append(*set, rec{key, res.Fence})
		}
	}
	maxFence := swept[len(swept)-1].fence
	expiresAt := clock.At(time.Minute)

	clock.Advance(time.Minute - time.Millisecond)
	for _, r := range append(again, swept...) {
		got, err := n.Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: r.key})
		if err != nil || got.ExpiresAt != expiresAt {
			t.Fatalf("%s a millisecond before expiry: %v %+v", r.key, err, got)
		}
	}
	if count, _, _ := n.Backlog(); count != 0 {
		t.Fatalf("backlog before expiry = %d", count)
	}

	clock.Advance(time.Millisecond) // exactly expires_at: gone
	for _, r := range append(again, swept...) {
		if _, err := n.Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: r.key}); !errors.Is(err, idemkv.ErrNotFound) {
			t.Errorf("get %s at expires_at: %v, want not found", r.key, err)
		}
		code, raw := httpCall(t, http.MethodGet, c.Endpoint(0), "/v1/records/acme/"+url.PathEscape(r.key), nil, nil)
		if code != http.StatusNotFound || !strings.Contains(string(raw), idemkv.CodeNotFound) {
			t.Errorf("GET %s at expires_at: %d %s, want 404 not_found", r.key, code, raw)
		}
	}
	list, err := n.List(ctx, &idemkv.ListRequest{Tenant: "acme"})
	if err != nil || len(list.Records) != 0 {
		t.Fatalf("list at expiry: %v, %d records", err, len(list.Records))
	}
	if count, oldest, now := n.Backlog(); count != 6 || oldest != expiresAt || now != expiresAt {
		t.Fatalf("backlog = %d, oldest %s, now %s; want 6, %s, %s", count, oldest, now, expiresAt, expiresAt)
	}
	// Commands other than reserve meet an absent record.
	for _, r := range swept {
		_, err := n.Commit(ctx, &idemkv.CommitRequest{Tenant: "acme", Key: r.key, Fingerprint: "sha256:" + r.key,
			Fence: r.fence, RemoteSystem: "s", RemoteID: "late"})
		if !errors.Is(err, idemkv.ErrNotFound) {
			t.Errorf("commit on expired %s: %v, want not found", r.key, err)
		}
		_, err = n.Heartbeat(ctx, &idemkv.HeartbeatRequest{Tenant: "acme", Key: r.key, Fence: r.fence})
		if !errors.Is(err, idemkv.ErrNotFound) {
			t.Errorf("heartbeat on expired %s: %v, want not found", r.key, err)
		}
	}

	reserveAgain := func(r rec, fp string) {
		t.Helper()
		res, err := n.Reserve(ctx, reserveReq(r.key, "second", fp))
		if err != nil {
			t.Fatal(err)
		}
		if res.Decision != idemkv.DecisionExecute || res.Fence <= maxFence || res.Record.Attempts != 1 ||
			res.Record.Status != idemkv.StatusPending || res.Record.CreatedAt != expiresAt {
			t.Fatalf("reserve of expired %s: %+v (record %+v), want a fresh execute with a fence above %d",
				r.key, res, res.Record, maxFence)
		}
		maxFence = res.Fence
		// The first attempt, if it ever reports back, is fenced off the new record.
		_, err = n.Commit(ctx, &idemkv.CommitRequest{Tenant: "acme", Key: r.key, Fingerprint: fp,
			Fence: r.fence, RemoteSystem: "s", RemoteID: "late"})
		if !errors.Is(err, idemkv.ErrFenced) {
			t.Errorf("late commit of the first attempt on %s: %v, want fenced", r.key, err)
		}
	}
	// Reserved again before the sweep, once with the old effect (no replay of the
	// expired receipt) and once with another (no conflict with it).
	for i, r := range again {
		fp := "sha256:" + r.key
		if i%2 == 1 {
			fp = "sha256:other-effect"
		}
		reserveAgain(r, fp)
	}
	if err := n.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
	if count, _, _ := n.Backlog(); count != 3 {
		t.Fatalf("backlog after reserving three keys again = %d, want 3", count)
	}

	for i, want := range []struct {
		swept int
		more  bool
	}{{2, true}, {1, false}, {0, false}} {
		got, more, err := n.Sweep(ctx, 2)
		if err != nil || got != want.swept || more != want.more {
			t.Fatalf("sweep %d: %d %v %v, want %d %v", i, got, more, err, want.swept, want.more)
		}
	}
	if err := n.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
	if count, _, _ := n.Backlog(); count != 0 {
		t.Fatalf("backlog after the sweep = %d", count)
	}
	for _, r := range again {
		if got, err := n.Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: r.key}); err != nil || got.Status != idemkv.StatusPending {
			t.Errorf("%s, reserved again, after the sweep: %v %+v", r.key, err, got)
		}
	}
	for _, r := range swept {
		reserveAgain(r, "sha256:"+r.key)
	}
}

// A live lease answers in_progress up to the millisecond it ends; from then on the
// next attempt recovers with a new fence, and the old attempt is fenced.
func TestLeaseExpiryOnOneNode(t *testing.T) {
	clock := newTestClock(time.Now())
	c := testcluster.Start(t, 1, testcluster.WithConfig(func(i int, cfg *node.Config) { cfg.Now, cfg.Monotonic = clock.Now, clock.Elapsed }))
	n := c.Node(0)
	ctx := ctxT(t)
	first := reserveReq("lease", "a1", "sha256:l")
	first.LeaseTTLMs = 5000
	granted, err := n.Reserve(ctx, first)
	if err != nil || granted.Decision != idemkv.DecisionExecute {
		t.Fatalf("first reserve: %v %+v", err, granted)
	}
	leaseEnd := clock.At(5 * time.Second)
	if granted.LeaseExpiresAt != leaseEnd {
		t.Fatalf("lease_expires_at = %s, want %s", granted.LeaseExpiresAt, leaseEnd)
	}

	clock.Advance(5*time.Second - time.Millisecond)
	busy, err := n.Reserve(ctx, reserveReq("lease", "a2", "sha256:l"))
	if err != nil || busy.Decision != idemkv.DecisionInProgress || busy.LeaseExpiresAt != leaseEnd {
		t.Fatalf("reserve while the lease lives: %v %+v, want in_progress until %s", err, busy, leaseEnd)
	}

	clock.Advance(time.Millisecond)
	rec, err := n.Reserve(ctx, reserveReq("lease", "a2", "sha256:l"))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Decision != idemkv.DecisionRecover || rec.Fence <= granted.Fence || rec.Record.Attempts != 2 ||
		rec.AttemptID != "a2" || rec.LeaseExpiresAt != leaseEnd+30_000 {
		t.Fatalf("reserve at lease end: %+v, want recover with a fence above %d and a default lease from now", rec, granted.Fence)
	}
	_, err = n.Commit(ctx, &idemkv.CommitRequest{Tenant: "acme", Key: "lease", Fingerprint: "sha256:l",
		Fence: granted.Fence, RemoteSystem: "s", RemoteID: "old"})
	if !errors.Is(err, idemkv.ErrFenced) {
		t.Fatalf("commit of the attempt whose lease ran out: %v, want fenced", err)
	}
	rc, err := n.Commit(ctx, &idemkv.CommitRequest{Tenant: "acme", Key: "lease", Fingerprint: "sha256:l",
		Fence: rec.Fence, RemoteSystem: "s", RemoteID: "new"})
	if err != nil || rc.RemoteID != "new" {
		t.Fatalf("commit of the recovering attempt: %v %+v", err, rc)
	}
}

// A leader whose clock runs ten minutes ahead grants leases and moves the replicated
// clock; the node that takes over has a clock ten minutes behind. Time must not run
// backwards: the lease that had run out per the old leader's clock stays expired
// (recover), the one that had not stays live (in_progress), and new records are not
// born expired.
func TestLeaseExpiryAcrossLeaderChangeWithClockBehind(t *testing.T) {
	base := time.Now()
	clocks := []*testClock{newTestClock(base), newTestClock(base), newTestClock(base)}
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) { cfg.Now, cfg.Monotonic = clocks[i].Now, clocks[i].Elapsed }))
	ctx := ctxT(t)
	leader := c.LeaderIndex(t)
	ahead := clocks[leader]
	ahead.Advance(10 * time.Minute)
	old := c.Node(leader)
	short := reserveReq("short", "s1", "sha256:s")
	short.LeaseTTLMs = 2000
	shortRes, err := old.Reserve(ctx, short)
	if err != nil || shortRes.Decision != idemkv.DecisionExecute {
		t.Fatalf("reserve short: %v %+v", err, shortRes)
	}
	long := reserveReq("long", "l1", "sha256:l")
	long.LeaseTTLMs = time.Hour.Milliseconds()
	longRes, err := old.Reserve(ctx, long)
	if err != nil || longRes.Decision != idemkv.DecisionExecute {
		t.Fatalf("reserve long: %v %+v", err, longRes)
	}
	// Per the old leader's clock the short lease runs out; a write stamps that time.
	ahead.Advance(3 * time.Second)
	lastStamp := ahead.At(10*time.Minute + 3*time.Second)
	tick, err := old.Reserve(ctx, reserveReq("tick", "t1", "sha256:t"))
	if err != nil || tick.Record.CreatedAt != lastStamp {
		t.Fatalf("stamping write: %v %+v", err, tick)
	}
	c.WaitConverged()

	c.Stop(leader)
	leader = c.LeaderIndex(t)
	nl := c.Node(leader)
	if got := idemkv.TimestampOf(clocks[leader].Now()); lastStamp-got != idemkv.Timestamp((10*time.Minute + 3*time.Second).Milliseconds()) {
		t.Fatalf("new leader's clock is %s, the replicated clock %s: the test lost its premise", got, lastStamp)
	}

	recovered, err := nl.Reserve(ctx, reserveReq("short", "s2", "sha256:s"))
	if err != nil {
		t.Fatal(err)
	}
	if recovered.Decision != idemkv.DecisionRecover || recovered.Fence <= tick.Fence {
		t.Fatalf("short lease on the new leader: %+v, want recover with a fence above %d", recovered, tick.Fence)
	}
	if recovered.Record.UpdatedAt < lastStamp || recovered.LeaseExpiresAt < lastStamp+30_000 {
		t.Fatalf("recovered at %s with a lease to %s: the clock ran back from %s",
			recovered.Record.UpdatedAt, recovered.LeaseExpiresAt, lastStamp)
	}
	busy, err := nl.Reserve(ctx, reserveReq("long", "l2", "sha256:l"))
	if err != nil || busy.Decision != idemkv.DecisionInProgress || busy.LeaseExpiresAt != longRes.LeaseExpiresAt {
		t.Fatalf("long lease on the new leader: %v %+v, want in_progress until %s", err, busy, longRes.LeaseExpiresAt)
	}
	// The first short attempt is fenced; the new one commits.
	if _, err := nl.Commit(ctx, &idemkv.CommitRequest{Tenant: "acme", Key: "short", Fingerprint: "sha256:s",
		Fence: shortRes.Fence, RemoteSystem: "s", RemoteID: "old"}); !errors.Is(err, idemkv.ErrFenced) {
		t.Fatalf("commit of the expired attempt: %v, want fenced", err)
	}
	// A minute-long TTL granted by the slow clock would already be over by the
	// replicated clock; it must count from the replicated clock instead.
	fresh, err := nl.Reserve(ctx, withTTL(reserveReq("fresh", "f1", "sha256:f"), time.Minute))
	if err != nil || fresh.Decision != idemkv.DecisionExecute || fresh.Record.ExpiresAt < lastStamp+60_000 {
		t.Fatalf("fresh reserve on the slow leader: %v %+v", err, fresh)
	}
	if _, err := nl.Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: "fresh"}); err != nil {
		t.Fatalf("fresh record right after its reserve: %v", err)
	}
}

// The sweeper runs on the leader only. Once the leader is stopped, the new leader
// takes over sweeping; followers never sweep. Its metrics report the work.
//
// On a starved machine a leader can lose leadership in the middle of a round; the
// answer of the sweep entry in flight is then lost, though the entry may apply, and the
// counts come out short. The exact counts are required when leadership stayed put;
// the rules that hold regardless (a node that never led swept nothing, nothing is swept
// twice, everything expired is gone) always are.
func TestSweeperRunsOnTheLeaderOnly(t *testing.T) {
	clock := newTestClock(time.Now())
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
		cfg.Now, cfg.Monotonic = clock.Now, clock.Elapsed
		cfg.Sweep.Interval = 20 * time.Millisecond
		// One record per entry: a round then lasts long enough to watch its gauges.
		cfg.Sweep.BatchLimit = 1
	}))
	ctx := ctxT(t)
	leader := c.LeaderIndex(t)
	ln := c.Node(leader)
	running := func() []int {
		var out []int
		for i := range c.Len() {
			if c.Node(i) != nil {
				out = append(out, i)
			}
		}
		return out
	}
	swept := func(i int) float64 { return metricValue(t, c.Metrics(i).Swept) }
	changes := func(i int) float64 { return metricValue(t, c.Metrics(i).LeaderChanges) }
	// sweepPhase waits until the current leader sees no backlog, then checks what
	// each running node swept since before.
	sweepPhase := func(name string, want int, before map[int]float64) (delta map[int]float64) {
		t.Helper()
		waitFor(t, 30*time.Second, name, func() error {
			if count, _, _ := c.Node(c.LeaderIndex(t)).Backlog(); count != 0 {
				return fmt.Errorf("backlog %d", count)
			}
			return nil
		})
		c.WaitConverged()
		delta = map[int]float64{}
		total := 0.0
		for _, i := range running() {
			delta[i] = swept(i) - before[i]
			total += delta[i]
			if changes(i) == 0 && swept(i) != 0 {
				t.Errorf("%s: %s never led but swept %v records", name, c.ID(i), swept(i))
			}
			n := c.Node(i)
			if count, _, _ := n.Backlog(); count != 0 {
				t.Errorf("%s: %s: backlog %d after the sweep replicated", name, c.ID(i), count)
			}
			if err := n.CheckExpiryIndex(); err != nil {
				t.Errorf("%s: %s: %v", name, c.ID(i), err)
			}
		}
		if total < 1 || total > float64(want) {
			t.Errorf("%s: %v records counted as swept, want between 1 and %d", name, total, want)
		}
		return delta
	}

	const first = 100
	for i := range first {
		key := fmt.Sprintf("first-%03d", i)
		settle(t, ln, withTTL(reserveReq(key, "a", "sha256:"+key), time.Minute), idemkv.StatusCommitted)
	}
	clock.Advance(2 * time.Minute)
	m := c.Metrics(leader)
	// The gauges hold the figures of the round's start for a while; poll tightly.
	var seenBacklog, seenOverdue float64
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Microsecond) {
		seenBacklog, seenOverdue = metricValue(t, m.SweepBacklog), metricValue(t, m.OldestOverdue)
		if seenBacklog != 0 || time.Now().After(deadline) {
			break
		}
	}
	delta := sweepPhase("the leader sweeps", first, nil)
	stable := changes(leader) == 1
	for _, i := range running() {
		stable = stable && (i == leader || changes(i) == 0)
	}
	if !stable {
		t.Logf("leadership moved during the sweep; exact counts not required")
	}
	if stable && (seenBacklog != first || seenOverdue != 60) {
		t.Errorf("leader's gauges during the sweep: backlog %v, oldest overdue %v s; want %d, 60", seenBacklog, seenOverdue, first)
	}
	if stable && delta[leader] != first {
		t.Errorf("the leader swept %v records, want %d", delta[leader], first)
	}
	rounds := 0.0
	for _, i := range running() {
		rounds += metricValue(t, c.Metrics(i).SweepDuration)
	}
	if rounds < 1 {
		t.Errorf("no sweep round was timed")
	}
	for _, i := range running() {
		if _, err := c.Node(i).Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: "first-000", Consistency: idemkv.Stale}); !errors.Is(err, idemkv.ErrNotFound) {
			t.Errorf("%s: swept record still readable: %v", c.ID(i), err)
		}
	}
	_, raw := httpCall(t, http.MethodGet, c.Endpoint(leader), "/metrics", nil, nil)
	if want := fmt.Sprintf("idemkv_expiry_swept_records_total %v\n", swept(leader)); swept(leader) == 0 || !strings.Contains(string(raw), want) {
		t.Errorf("/metrics of the leader lacks %q:\n%s", want, grepLines(string(raw), "idemkv_expiry"))
	}

	const second = 30
	leader = c.LeaderIndex(t)
	ln = c.Node(leader)
	for i := range second {
		key := fmt.Sprintf("second-%03d", i)
		settle(t, ln, withTTL(reserveReq(key, "a", "sha256:"+key), time.Minute), idemkv.StatusFailed)
	}
	stoppedSwept := swept(leader)
	c.Stop(leader)
	next := c.LeaderIndex(t)
	before := map[int]float64{}
	beforeChanges := map[int]float64{}
	for _, i := range running() {
		before[i], beforeChanges[i] = swept(i), changes(i)
	}
	clock.Advance(2 * time.Minute)
	delta = sweepPhase("the new leader sweeps", second, before)
	stable = true
	for _, i := range running() {
		stable = stable && changes(i) == beforeChanges[i]
	}
	if !stable {
		t.Logf("leadership moved during the second sweep; exact counts not required")
	}
	if stable && delta[next] != second {
		t.Errorf("the new leader %s swept %v records, want %d", c.ID(next), delta[next], second)
	}
	if stable {
		for _, i := range running() {
			if i != next && delta[i] != 0 {
				t.Errorf("%s, a follower, swept %v records", c.ID(i), delta[i])
			}
		}
	}
	if got := swept(leader); got != stoppedSwept {
		t.Errorf("the stopped leader's count moved from %v to %v", stoppedSwept, got)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// After a snapshot install and after a restart of every node, the expiry index agrees
// with the records, on every node, in a state that holds swept, expired-but-unswept,
// reserved-again and lease-extended records.
func TestExpiryIndexSurvivesSnapshotInstallAndRestart(t *testing.T) {
	clock := newTestClock(time.Now())
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
		cfg.Now, cfg.Monotonic = clock.Now, clock.Elapsed
		cfg.Sweep.Disabled = true // sweeps happen by hand, so the backlog is known
	}))
	ctx := ctxT(t)
	leader := c.LeaderIndex(t)
	lagger := (leader + 1) % 3
	lagApplied := c.Node(lagger).AppliedIndex()
	c.Stop(lagger)
	ln := c.Node(leader)

	const total = 240
	statuses := []idemkv.Status{idemkv.StatusPending, idemkv.StatusCommitted, idemkv.StatusFailed}
	fences := map[string]uint64{}
	for i := range total {
		key := fmt.Sprintf("k%03d", i)
		ttl := time.Hour
		if i%2 == 0 {
			ttl = time.Minute
		}
		fences[key] = settle(t, ln, withTTL(reserveReq(key, "a", "sha256:"+key), ttl), statuses[i%3]).Fence
	}
	clock.Advance(2 * time.Minute)
	expired := total / 2
	if count, _, _ := ln.Backlog(); count != expired {
		t.Fatalf("backlog %d, want %d", count, expired)
	}
	if swept, more, err := ln.Sweep(ctx, 40); err != nil || swept != 40 || !more {
		t.Fatalf("partial sweep: %d %v %v", swept, more, err)
	}
	// The sweep removed the oldest 40 entries; reserve 20 of the expired keys that are
	// left (index entries move) and extend the lease of live pending records past
	// their expiry (index entries move again).
	// All of them expire at the same instant, so index order is key order: the
	// sweep took the even keys k000..k078.
	const reserved = 20
	for j := range reserved {
		key := fmt.Sprintf("k%03d", 80+2*j)
		res, err := ln.Reserve(ctx, reserveReq(key, "b", "sha256:"+key))
		if err != nil {
			t.Fatal(err)
		}
		if res.Decision != idemkv.DecisionExecute || res.Fence <= fences[key] || res.Record.Attempts != 1 {
			t.Fatalf("reserve of expired %s: %+v", key, res)
		}
	}
	extended := 0
	for i := 3; i < total; i += 6 { // odd (an hour's TTL) and i%3 == 0 (pending)
		key := fmt.Sprintf("k%03d", i)
		rec, err := ln.Heartbeat(ctx, &idemkv.HeartbeatRequest{Tenant: "acme", Key: key, Fence: fences[key],
			LeaseTTLMs: time.Hour.Milliseconds()})
		if err != nil {
			t.Fatalf("heartbeat %s: %v", key, err)
		}
		if rec.ExpiresAt != clock.At(2*time.Minute+time.Hour) {
			t.Fatalf("heartbeat %s did not move expires_at: %+v", key, rec)
		}
		extended++
	}
	if extended == 0 {
		t.Fatal("no record had its lease extended: the scenario is wrong")
	}
	backlog := expired - 40 - reserved
	count, oldest, _ := ln.Backlog()
	if count != backlog {
		t.Fatalf("backlog %d, want %d", count, backlog)
	}
	if err := ln.Snapshot(); err != nil {
		t.Fatal(err)
	}
	if first, err := ln.FirstLogIndex(); err != nil || first <= lagApplied+1 {
		t.Fatalf("leader's log starts at %d (%v); the lagger (applied %d) would not need a snapshot", first, err, lagApplied)
	}

	checkAll := func(when string, wantBacklog int) {
		t.Helper()
		c.WaitConverged()
		for i := range c.Len() {
			n := c.Node(i)
			if err := n.CheckExpiryIndex(); err != nil {
				t.Fatalf("%s, %s: %v", when, c.ID(i), err)
			}
			gotCount, gotOldest, _ := n.Backlog()
			if gotCount != wantBacklog || (wantBacklog > 0 && gotOldest != oldest) {
				t.Fatalf("%s, %s: backlog %d oldest %s, want %d %s", when, c.ID(i), gotCount, gotOldest, wantBacklog, oldest)
			}
		}
	}
	c.Restart(lagger)
	checkAll("after the snapshot install", backlog)

	for i := range c.Len() {
		c.Stop(i)
	}
	for i := range c.Len() {
		c.Restart(i)
	}
	c.WaitLeader()
	checkAll("after restarting every node", backlog)

	ln = c.Node(c.LeaderIndex(t))
	swept := 0
	for {
		n, more, err := ln.Sweep(ctx, 25)
		if err != nil {
			t.Fatal(err)
		}
		swept += n
		if !more {
			break
		}
	}
	if swept != backlog {
		t.Fatalf("final sweep removed %d, want %d", swept, backlog)
	}
	checkAll("after sweeping the rest", 0)
	list, err := ln.List(ctx, &idemkv.ListRequest{Tenant: "acme", Limit: idemkv.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	if want := total - expired + reserved; len(list.Records) != want {
		t.Fatalf("%d records left, want %d live plus %d reserved again", len(list.Records), total-expired, reserved)
	}
}

// Retention bounds come from the node's limits and are enforced at the HTTP API with a
// 400 that names the field; a TTL shorter than the lease is refused.
func TestRetentionLimitsOverHTTP(t *testing.T) {
	limits := idemkv.Limits{
		DefaultTTL: 2 * time.Hour, MinTTL: 10 * time.Minute, MaxTTL: 48 * time.Hour,
		DefaultLeaseTTL: 20 * time.Second, MinLeaseTTL: 2 * time.Second, MaxLeaseTTL: 30 * time.Minute,
	}
	c := testcluster.Start(t, 1, testcluster.WithConfig(func(i int, cfg *node.Config) { cfg.Limits = limits }))
	ep := c.Endpoint(0)
	now := time.Now()
	at := func(d time.Duration) string { return now.Add(d).UTC().Format(idemkv.TimeFormat) }
	type body = map[string]any
	req := func(key string, extra body) body {
		b := body{"tenant": "acme", "idempotency_key": key, "tool": "t", "effect_fingerprint": "sha256:" + key}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	refused := []struct {
		name  string
		path  string
		body  body
		field string
	}{
		{"ttl shorter than the lease", "/v1/reserve", req("r1", body{"ttl_ms": ms(15 * time.Minute), "lease_ttl_ms": ms(20 * time.Minute)}), "ttl_ms"},
		{"expiry before the lease ends", "/v1/reserve", req("r2", body{"expires_at": at(15 * time.Minute), "lease_ttl_ms": ms(20 * time.Minute)}), "expires_at"},
		{"ttl below the minimum", "/v1/reserve", req("r3", body{"ttl_ms": ms(5 * time.Minute)}), "ttl_ms"},
		{"ttl above the maximum", "/v1/reserve", req("r4", body{"ttl_ms": ms(49 * time.Hour)}), "ttl_ms"},
		{"negative ttl", "/v1/reserve", req("r5", body{"ttl_ms": -1}), "ttl_ms"},
		{"expiry in the past", "/v1/reserve", req("r6", body{"expires_at": at(-time.Minute)}), "expires_at"},
		{"expiry beyond the maximum", "/v1/reserve", req("r7", body{"expires_at": at(49 * time.Hour)}), "expires_at"},
		{"ttl and expiry both", "/v1/reserve", req("r8", body{"ttl_ms": ms(time.Hour), "expires_at": at(time.Hour)}), "expires_at"},
		{"lease below the minimum", "/v1/reserve", req("r9", body{"lease_ttl_ms": 1000}), "lease_ttl_ms"},
		{"lease above the maximum", "/v1/reserve", req("r10", body{"lease_ttl_ms": ms(31 * time.Minute)}), "lease_ttl_ms"},
		{"heartbeat lease above the maximum", "/v1/heartbeat", body{"tenant": "acme", "idempotency_key": "ok-default", "fence": 1, "lease_ttl_ms": ms(31 * time.Minute)}, "lease_ttl_ms"},
	}
	for _, r := range refused {
		code, raw := httpCall(t, http.MethodPost, ep, r.path, r.body, nil)
		var e struct {
			Error idemkv.Error `json:"error"`
		}
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatalf("%s: %d %s: %v", r.name, code, raw, err)
		}
		if code != http.StatusBadRequest || e.Error.Code != idemkv.CodeInvalidArgument || e.Error.Field != r.field {
			t.Errorf("%s: %d %+v, want 400 invalid_argument naming %s", r.name, code, e.Error, r.field)
		}
	}

	accepted := []struct {
		key           string
		extra         body
		ttl, lease    time.Duration
		wantExpiresAt string
	}{
		{"ok-default", nil, limits.DefaultTTL, limits.DefaultLeaseTTL, ""},
		{"ok-max", body{"ttl_ms": ms(48 * time.Hour), "lease_ttl_ms": ms(30 * time.Minute)}, 48 * time.Hour, 30 * time.Minute, ""},
		{"ok-min", body{"ttl_ms": ms(10 * time.Minute), "lease_ttl_ms": ms(2 * time.Second)}, 10 * time.Minute, 2 * time.Second, ""},
		{"ok-lease-equals-ttl", body{"ttl_ms": ms(20 * time.Minute), "lease_ttl_ms": ms(20 * time.Minute)}, 20 * time.Minute, 20 * time.Minute, ""},
		{"ok-at", body{"expires_at": at(3 * time.Hour)}, 0, limits.DefaultLeaseTTL, at(3 * time.Hour)},
	}
	for _, a := range accepted {
		var res idemkv.ReserveResult
		code, raw := httpCall(t, http.MethodPost, ep, "/v1/reserve", req(a.key, a.extra), &res)
		if code != http.StatusOK || res.Decision != idemkv.DecisionExecute {
			t.Fatalf("%s: %d %s", a.key, code, raw)
		}
		r := res.Record
		if got := r.LeaseExpiresAt.Time().Sub(r.CreatedAt.Time()); got != a.lease {
			t.Errorf("%s: lease of %s, want %s", a.key, got, a.lease)
		}
		if a.wantExpiresAt != "" {
			if r.ExpiresAt.String() != a.wantExpiresAt {
				t.Errorf("%s: expires_at %s, want %s", a.key, r.ExpiresAt, a.wantExpiresAt)
			}
		} else if got := r.ExpiresAt.Time().Sub(r.CreatedAt.Time()); got != a.ttl {
			t.Errorf("%s: retained for %s, want %s", a.key, got, a.ttl)
		}
	}
	list, err := c.Node(0).List(ctxT(t), &idemkv.ListRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Records) != len(accepted) {
		t.Fatalf("%d records stored, want only the %d accepted ones", len(list.Records), len(accepted))
	}
}

// Retention settings that contradict each other keep a node from starting, before it
// touches its data dir.
func TestOpenRefusesContradictoryRetention(t *testing.T) {
	for name, l := range map[string]idemkv.Limits{
		"default ttl shorter than the default lease": {DefaultTTL: time.Minute, DefaultLeaseTTL: 2 * time.Minute},
		"min ttl above max ttl":                      {MinTTL: 2 * time.Hour, MaxTTL: time.Hour, DefaultTTL: time.Hour},
		"default ttl above max":                      {DefaultTTL: 31 * 24 * time.Hour},
		"default lease above max":                    {DefaultLeaseTTL: 2 * time.Hour},
	} {
		cfg := node.DefaultConfig()
		cfg.DataDir = filepath.Join(t.TempDir(), "data")
		cfg.RaftAddr = "127.0.0.1:0"
		cfg.Limits = l
		n, err := node.Open(cfg)
		if err == nil {
			n.Close()
			t.Errorf("%s: node opened", name)
			continue
		}
		if _, statErr := os.Stat(cfg.DataDir); !errors.Is(statErr, os.ErrNotExist) {
			t.Errorf("%s: data dir created (%v) by a node that refused to start", name, statErr)
		}
	}
}

// Sweeping is the leader's work: a follower's node refuses to propose a sweep.
func TestSweepOnAFollowerIsRefused(t *testing.T) {
	c := testcluster.Start(t, 3)
	f := c.Node((c.LeaderIndex(t) + 1) % 3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := f.Sweep(ctx, 10); !errors.Is(err, idemkv.ErrNotLeader) {
		t.Fatalf("sweep on a follower: %v, want ErrNotLeader", err)
	}
}
