package api_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
)

// pair starts a leader serving leaderFake and a follower serving followerFake whose
// Leader points at the leader (unless followerFake brings its own LeaderFunc).
func pair(t *testing.T, leaderFake, followerFake *FakeStore, tweakFollower func(*api.Config)) (leader, follower *testNode) {
	t.Helper()
	leader = startNode(t, leaderFake, nil)
	if followerFake.LeaderFunc == nil {
		followerFake.LeaderFunc = func() (string, bool) { return leader.addr, false }
	}
	follower = startNode(t, followerFake, tweakFollower)
	return leader, follower
}

func executeFake() *FakeStore {
	return &FakeStore{ReserveFunc: func(_ context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
		rec := pendingRecord(req.Key)
		return &idemkv.ReserveResult{Decision: idemkv.DecisionExecute, Fence: rec.Fence, AttemptID: rec.AttemptID,
			LeaseExpiresAt: rec.LeaseExpiresAt, Record: rec}, nil
	}}
}

func TestFollowerForwardsWrites(t *testing.T) {
	leader, follower := pair(t, executeFake(), &FakeStore{}, nil)
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	hdr := map[string]string{"Authorization": "Bearer tok-123", "Traceparent": traceparent}

	r := do(t, "POST", follower.url+"/v1/reserve", validReserve(), hdr)
	m := r.object(t, http.StatusOK)
	if m["decision"] != "execute" || m["fence"] != float64(7) {
		t.Errorf("forwarded reserve answered %v", m)
	}
	if got := r.header.Get(api.HeaderLeader); got != leader.addr {
		t.Errorf("%s = %q, want %q", api.HeaderLeader, got, leader.addr)
	}
	if leader.fake.Calls() != 1 || follower.fake.Calls() != 0 {
		t.Errorf("store calls: leader %d follower %d, want 1 and 0", leader.fake.Calls(), follower.fake.Calls())
	}

	seen := leader.seen()
	if len(seen) != 1 {
		t.Fatalf("leader saw %d requests, want 1", len(seen))
	}
	in := seen[0]
	if in.Method != "POST" || in.URL.Path != "/v1/reserve" {
		t.Errorf("leader got %s %s", in.Method, in.URL.Path)
	}
	for k, want := range map[string]string{
		"Authorization": "Bearer tok-123", "Traceparent": traceparent, api.HeaderForwarded: "1", "Content-Type": "application/json",
	} {
		if got := in.Header.Get(k); got != want {
			t.Errorf("leader got %s = %q, want %q", k, got, want)
		}
	}

	// The decision is counted where it was made, once.
	if l, f := leader.decisions(t, testTool, idemkv.DecisionExecute), follower.decisions(t, testTool, idemkv.DecisionExecute); l != 1 || f != 0 {
		t.Errorf("decisions: leader %v follower %v, want 1 and 0", l, f)
	}
	if c := follower.requestCount(t, "POST /v1/reserve", "200"); c != 1 {
		t.Errorf("follower timed %d reserves, want 1", c)
	}
}

func TestFollowerRelaysTheLeadersErrors(t *testing.T) {
	leaderFake := &FakeStore{CommitFunc: func(context.Context, *idemkv.CommitRequest) (*idemkv.Receipt, error) {
		return nil, idemkv.Errorf(idemkv.ErrFenced, "fence 7 is older than 9")
	}}
	leader, follower := pair(t, leaderFake, &FakeStore{}, nil)
	e := do(t, "POST", follower.url+"/v1/commit", validCommit(), nil).wantError(t, 409, idemkv.CodeFenced, "")
	if e["message"] != "fence 7 is older than 9" {
		t.Errorf("message %v", e["message"])
	}
	if leader.fake.Calls() != 1 {
		t.Errorf("leader store calls %d", leader.fake.Calls())
	}
	// The follower validates before it forwards: a bad request costs no hop.
	do(t, "POST", follower.url+"/v1/commit", with(validCommit(), "fence", 0), nil).wantError(t, 400, idemkv.CodeInvalidArgument, "fence")
	if len(leader.seen()) != 1 {
		t.Errorf("leader saw %d requests, want 1", len(leader.seen()))
	}
}

func TestForwardWhenTheStoreSaysNotLeader(t *testing.T) {
	// The follower still believes it leads; its store knows better and refuses.
	var deposed atomic.Bool
	leader := startNode(t, &FakeStore{HeartbeatFunc: func(_ context.Context, req *idemkv.HeartbeatRequest) (*idemkv.Record, error) {
		return pendingRecord(req.Key), nil
	}}, nil)
	followerFake := &FakeStore{
		LeaderFunc: func() (string, bool) { return leader.addr, !deposed.Load() },
		HeartbeatFunc: func(context.Context, *idemkv.HeartbeatRequest) (*idemkv.Record, error) {
			deposed.Store(true)
			return nil, fmt.Errorf("node: heartbeat: %w", idemkv.ErrNotLeader)
		},
	}
	follower := startNode(t, followerFake, nil)

	m := do(t, "POST", follower.url+"/v1/heartbeat", validHeartbeat(), nil).object(t, http.StatusOK)
	if m["status"] != "pending" || m["fence"] != float64(7) {
		t.Errorf("answer %v", m)
	}
	if leader.fake.Calls() != 1 || follower.fake.Calls() != 1 {
		t.Errorf("store calls: leader %d follower %d, want 1 and 1", leader.fake.Calls(), follower.fake.Calls())
	}
}

func TestLinearizableReadsForwardStaleReadsStayLocal(t *testing.T) {
	var leaderGot idemkv.GetRequest
	var listGot idemkv.ListRequest
	leaderFake := &FakeStore{
		GetFunc: func(_ context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) {
			leaderGot = *req
			if req.Key == "missing" {
				return nil, idemkv.Errorf(idemkv.ErrNotFound, "no such record")
			}
			return committedRecord(), nil
		},
		ListFunc: func(_ context.Context, req *idemkv.ListRequest) (*idemkv.ListResult, error) {
			listGot = *req
			return &idemkv.ListResult{Records: []*idemkv.Record{committedRecord()}}, nil
		},
	}
	followerFake := &FakeStore{
		GetFunc: func(_ context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) {
			rec := pendingRecord(req.Key) // the follower lags: it has not applied the commit yet
			return rec, nil
		},
		ListFunc: func(context.Context, *idemkv.ListRequest) (*idemkv.ListResult, error) {
			return &idemkv.ListResult{Records: []*idemkv.Record{pendingRecord("a"), pendingRecord("b")}}, nil
		},
		ClusterFunc: func(context.Context) (*idemkv.ClusterInfo, error) { return sampleCluster(), nil },
	}
	leader, follower := pair(t, leaderFake, followerFake, nil)

	m := do(t, "GET", follower.url+"/v1/records/acme/"+testKey+"?wait_ms=250", nil, nil).object(t, http.StatusOK)
	if m["status"] != "committed" {
		t.Errorf("linearizable read answered %v, want the leader's committed record", m["status"])
	}
	if leaderGot.Key != testKey || leaderGot.Wait != 250*time.Millisecond || leaderGot.Consistency != idemkv.Linearizable {
		t.Errorf("leader got %+v", leaderGot)
	}
	do(t, "GET", follower.url+"/v1/records/acme/missing", nil, nil).wantError(t, 404, idemkv.CodeNotFound, "")

	m = do(t, "GET", follower.url+"/v1/records/acme?prefix=conv&status=committed&limit=5&after=a", nil, nil).object(t, http.StatusOK)
	if recs, _ := m["records"].([]any); len(recs) != 1 {
		t.Errorf("list answered %v", m)
	}
	if listGot.Prefix != "conv" || listGot.Status != idemkv.StatusCommitted || listGot.Limit != 5 || listGot.After != "a" {
		t.Errorf("leader got list %+v", listGot)
	}
	leaderRequests := len(leader.seen())
	if leaderRequests != 3 || follower.fake.Calls() != 0 {
		t.Errorf("leader saw %d requests (want 3), follower store called %d times (want 0)", leaderRequests, follower.fake.Calls())
	}

	// Stale reads, the cluster view and the probes are this node's own.
	m = do(t, "GET", follower.url+"/v1/records/acme/"+testKey+"?consistency=stale", nil, nil).object(t, http.StatusOK)
	if m["status"] != "pending" {
		t.Errorf("stale read answered %v, want the follower's own pending record", m["status"])
	}
	m = do(t, "GET", follower.url+"/v1/records/acme?consistency=stale", nil, nil).object(t, http.StatusOK)
	if recs, _ := m["records"].([]any); len(recs) != 2 {
		t.Errorf("stale list answered %v, want the follower's two records", m)
	}
	do(t, "GET", follower.url+"/v1/cluster", nil, nil).object(t, http.StatusOK)
	do(t, "GET", follower.url+"/healthz", nil, nil).object(t, http.StatusOK)
	do(t, "GET", follower.url+"/readyz", nil, nil).object(t, http.StatusOK)
	if r := do(t, "GET", follower.url+"/metrics", nil, nil); r.status != 200 || !strings.Contains(string(r.body), "idemkv_http_request_duration_seconds") {
		t.Errorf("metrics: %d", r.status)
	}
	if got := len(leader.seen()); got != leaderRequests {
		t.Errorf("local requests reached the leader: it saw %d, want %d", got, leaderRequests)
	}
	if follower.fake.Calls() != 3 {
		t.Errorf("follower store calls %d, want 3 (stale get, stale list, cluster)", follower.fake.Calls())
	}
}

func TestMembershipChangesForward(t *testing.T) {
	var joined idemkv.JoinRequest
	leaderFake := &FakeStore{JoinFunc: func(_ context.Context, req *idemkv.JoinRequest) (*idemkv.ClusterInfo, error) {
		joined = *req
		return sampleCluster(), nil
	}}
	leader, follower := pair(t, leaderFake, &FakeStore{}, nil)
	body := map[string]any{"id": "n3", "raft_addr": "127.0.0.1:7441", "api_addr": "127.0.0.1:7440"}
	do(t, "POST", follower.url+"/v1/cluster/join", body, nil).object(t, http.StatusOK)
	if joined.ID != "n3" || leader.fake.Calls() != 1 || follower.fake.Calls() != 0 {
		t.Errorf("leader got %+v; calls leader %d follower %d", joined, leader.fake.Calls(), follower.fake.Calls())
	}
}

func TestNoDoubleForwarding(t *testing.T) {
	// Mid-election, a and b each believe the other leads.
	var a, b *testNode
	aFake := &FakeStore{LeaderFunc: func() (string, bool) { return b.addr, false }}
	bFake := &FakeStore{LeaderFunc: func() (string, bool) { return a.addr, false }}
	a = startNode(t, aFake, nil)
	b = startNode(t, bFake, nil)

	do(t, "POST", a.url+"/v1/reserve", validReserve(), nil).wantError(t, 503, idemkv.CodeUnavailable, "")
	do(t, "GET", a.url+"/v1/records/acme/k", nil, nil).wantError(t, 503, idemkv.CodeUnavailable, "")
	if got := len(a.seen()); got != 2 {
		t.Errorf("a saw %d requests, want 2 (the callers' only)", got)
	}
	if got := len(b.seen()); got != 2 {
		t.Errorf("b saw %d requests, want 2 (one forward each)", got)
	}
	for _, r := range b.seen() {
		if r.Header.Get(api.HeaderForwarded) != "1" {
			t.Errorf("b got a request without %s", api.HeaderForwarded)
		}
	}
	if aFake.Calls()+bFake.Calls() != 0 {
		t.Errorf("stores called: a %d b %d", aFake.Calls(), bFake.Calls())
	}
}

func TestNoLeaderIsUnavailable(t *testing.T) {
	fake := &FakeStore{
		LeaderFunc: func() (string, bool) { return "", false },
		GetFunc: func(_ context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) {
			return pendingRecord(req.Key), nil
		},
	}
	n := startNode(t, fake, nil)
	do(t, "POST", n.url+"/v1/reserve", validReserve(), nil).wantError(t, 503, idemkv.CodeUnavailable, "")
	do(t, "POST", n.url+"/v1/commit", validCommit(), nil).wantError(t, 503, idemkv.CodeUnavailable, "")
	do(t, "GET", n.url+"/v1/records/acme/k", nil, nil).wantError(t, 503, idemkv.CodeUnavailable, "")
	do(t, "GET", n.url+"/v1/records/acme", nil, nil).wantError(t, 503, idemkv.CodeUnavailable, "")
	if fake.Calls() != 0 {
		t.Errorf("store called %d times", fake.Calls())
	}
	// A stale read needs no leader.
	do(t, "GET", n.url+"/v1/records/acme/k?consistency=stale", nil, nil).object(t, http.StatusOK)
}

func TestUnreachableLeaderIsUnavailable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	n := startNode(t, &FakeStore{LeaderFunc: func() (string, bool) { return gone, false }}, nil)
	e := do(t, "POST", n.url+"/v1/release", validRelease(), nil).wantError(t, 503, idemkv.CodeUnavailable, "")
	if !strings.Contains(e["message"].(string), gone) {
		t.Errorf("message %v does not name the leader %s", e["message"], gone)
	}
}

func TestForwardDeadlineAllowsTheLongPoll(t *testing.T) {
	// The leader takes 600 ms to answer a read. The follower allows 150 ms per forward
	// plus the caller's wait: enough with wait_ms=2000, too little without.
	leaderFake := &FakeStore{GetFunc: func(ctx context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) {
		select {
		case <-time.After(600 * time.Millisecond):
			return committedRecord(), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}}
	_, follower := pair(t, leaderFake, &FakeStore{}, func(c *api.Config) { c.ForwardTimeout = 150 * time.Millisecond })

	m := do(t, "GET", follower.url+"/v1/records/acme/k?wait_ms=2000", nil, nil).object(t, http.StatusOK)
	if m["status"] != "committed" {
		t.Errorf("long-poll answered %v", m)
	}
	start := time.Now()
	do(t, "GET", follower.url+"/v1/records/acme/k", nil, nil).wantError(t, 503, idemkv.CodeUnavailable, "")
	if d := time.Since(start); d > 550*time.Millisecond {
		t.Errorf("the forward without wait took %v; its deadline is 150ms", d)
	}
}

func TestForwardSchemeIsUsed(t *testing.T) {
	// A leader speaking plain HTTP cannot answer a TLS handshake: the configured scheme
	// must be the one used.
	leader, follower := pair(t, executeFake(), &FakeStore{}, func(c *api.Config) { c.ForwardScheme = "https" })
	do(t, "POST", follower.url+"/v1/reserve", validReserve(), nil).wantError(t, 503, idemkv.CodeUnavailable, "")
	if leader.fake.Calls() != 0 {
		t.Errorf("the leader's store was called over the wrong scheme")
	}
}

// TestForwardOutcomeUnknownOnlyAfterSending: a forwarded write whose request reached the
// leader but got no answer (the leader hung, or the connection dropped after the request
// went out) may have happened: outcome_unknown. One that never reached the leader is
// unavailable, and so is a read whatever happened (issue 12, defect 6).
func TestForwardOutcomeUnknownOnlyAfterSending(t *testing.T) {
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				_, _ = c.Read(buf) // take the request, never answer
				<-hang
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	hung := ln.Addr().String()
	n := startNode(t, &FakeStore{LeaderFunc: func() (string, bool) { return hung, false }},
		func(c *api.Config) { c.ForwardTimeout = 200 * time.Millisecond })
	for _, w := range []struct {
		path string
		body map[string]any
	}{{"/v1/reserve", validReserve()}, {"/v1/commit", validCommit()}, {"/v1/release", validRelease()}} {
		e := do(t, "POST", n.url+w.path, w.body, nil).wantError(t, 503, idemkv.CodeOutcomeUnknown, "")
		if !strings.Contains(e["message"].(string), "attempt_id") {
			t.Errorf("%s: message %v does not tell the caller to keep the attempt_id", w.path, e["message"])
		}
	}
	do(t, "GET", n.url+"/v1/records/acme/k", nil, nil).wantError(t, 503, idemkv.CodeUnavailable, "")
	if accepted.Load() == 0 {
		t.Fatal("the hung leader accepted nothing: the scenario is wrong")
	}

	// A leader that closes the connection once it has read the request.
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln2.Close() })
	go func() {
		for {
			c, err := ln2.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 4096)
			_, _ = c.Read(buf)
			c.Close()
		}
	}()
	dropped := ln2.Addr().String()
	n2 := startNode(t, &FakeStore{LeaderFunc: func() (string, bool) { return dropped, false }}, nil)
	do(t, "POST", n2.url+"/v1/reserve", validReserve(), nil).wantError(t, 503, idemkv.CodeOutcomeUnknown, "")
}

// A reserve the node's own state settles (ReserveLocal says so) is answered where it
// arrives, on a follower too, with the headers of any answer and counted there; one it
// does not settle is forwarded as before; an invalid one never reaches either.
func TestReserveAnsweredLocallyOnAnyNode(t *testing.T) {
	replayLocally := func(req *idemkv.ReserveRequest) (*idemkv.ReserveResult, bool) {
		if req.Key != testKey {
			return nil, false
		}
		rec := committedRecord()
		return &idemkv.ReserveResult{Decision: idemkv.DecisionReplay, Receipt: rec.Outcome(), Record: rec}, true
	}
	leaderFake := executeFake()
	leaderFake.ReserveLocalFunc = replayLocally
	leader, follower := pair(t, leaderFake, &FakeStore{ReserveLocalFunc: replayLocally}, nil)

	for _, n := range []*testNode{follower, leader} {
		r := do(t, "POST", n.url+"/v1/reserve", validReserve(), nil)
		if m := r.object(t, http.StatusOK); m["decision"] != "replay" {
			t.Errorf("local answer %v", m)
		}
		if got := r.header.Get(api.HeaderLeader); got != leader.addr {
			t.Errorf("%s = %q, want %q", api.HeaderLeader, got, leader.addr)
		}
		if r.header.Get("Cache-Control") != "no-store" {
			t.Errorf("headers %v", r.header)
		}
		if d := n.decisions(t, testTool, idemkv.DecisionReplay); d != 1 {
			t.Errorf("%v replays counted where answered, want 1", d)
		}
	}
	if len(leader.seen()) != 1 || leader.fake.Calls()+follower.fake.Calls() != 0 {
		t.Errorf("leader saw %d requests (want its own 1); store calls %d, %d (want none)",
			len(leader.seen()), leader.fake.Calls(), follower.fake.Calls())
	}

	// Not settled locally: forwarded to the leader, whose store decides.
	do(t, "POST", follower.url+"/v1/reserve", with(validReserve(), "idempotency_key", "other"), nil).object(t, http.StatusOK)
	if len(leader.seen()) != 2 || leader.fake.Calls() != 1 || follower.fake.Calls() != 0 {
		t.Errorf("unsettled reserve: leader saw %d requests, store calls %d, %d; want 2, 1, 0",
			len(leader.seen()), leader.fake.Calls(), follower.fake.Calls())
	}

	// Sent to the leader and not settled locally: its store is asked once, and
	// answers the local question itself on the way (ReserveLocal is not called first).
	localBefore, callsBefore := leader.fake.LocalCalls(), leader.fake.Calls()
	do(t, "POST", leader.url+"/v1/reserve", with(validReserve(), "idempotency_key", "other"), nil).object(t, http.StatusOK)
	if l, c := leader.fake.LocalCalls()-localBefore, leader.fake.Calls()-callsBefore; l != 1 || c != 1 {
		t.Errorf("a new reserve at the leader: %d local look-ups and %d store calls, want 1 and 1", l, c)
	}

	// Invalid: refused before anything is asked.
	before := follower.fake.LocalCalls()
	do(t, "POST", follower.url+"/v1/reserve", with(validReserve(), "tool", ""), nil).wantError(t, 400, idemkv.CodeInvalidArgument, "tool")
	if got := follower.fake.LocalCalls(); got != before {
		t.Errorf("an invalid reserve reached ReserveLocal")
	}
}
