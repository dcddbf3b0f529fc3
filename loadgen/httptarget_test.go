package loadgen

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testlog"
)

func newTestTarget(t *testing.T, endpoints ...string) *HTTPTarget {
	t.Helper()
	tgt, err := NewHTTPTarget(t.Context(), HTTPConfig{Endpoints: endpoints, Tenant: "acme", Conns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tgt.Close() })
	return tgt
}

func TestHTTPTargetSpeaksTheAPI(t *testing.T) {
	api := newFakeAPI(t, newMemStore())
	tgt := newTestTarget(t, api.addr())
	ctx := t.Context()
	key, fp := "run/new/conv_9:approval/17", fingerprint("k")

	res, err := tgt.Reserve(ctx, &Reserve{Key: key, Tool: "create_ticket", Fingerprint: fp, AttemptID: "a1", LeaseTTLMs: 5000})
	if err != nil || res.Decision != idemkv.DecisionExecute || res.Fence == 0 {
		t.Fatalf("first reserve = %+v, %v; want execute with a fence", res, err)
	}
	sent := api.lastReserve.Load()
	if sent.Tenant != "acme" || sent.Key != key || sent.Fingerprint != fp || sent.AttemptID != "a1" ||
		sent.Tool != "create_ticket" || sent.LeaseTTLMs != 5000 {
		t.Errorf("reserve sent %+v", sent)
	}
	if err := tgt.Commit(ctx, &Commit{Key: key, Fingerprint: fingerprint("other"), Reservation: res, RemoteSystem: "x", RemoteID: "1"}); !errors.Is(err, idemkv.ErrFingerprintMismatch) {
		t.Errorf("commit with another fingerprint = %v, want fingerprint mismatch", err)
	}
	stale := res
	stale.Fence--
	if err := tgt.Commit(ctx, &Commit{Key: key, Fingerprint: fp, Reservation: stale, RemoteSystem: "x", RemoteID: "1"}); !errors.Is(err, idemkv.ErrFenced) {
		t.Errorf("commit with an old fence = %v, want fenced", err)
	}
	if err := tgt.Commit(ctx, &Commit{Key: key, Fingerprint: fp, Reservation: res, RemoteSystem: "x", RemoteID: "1"}); err != nil {
		t.Fatalf("commit: %v", err)
	}
	for fp, want := range map[string]idemkv.Decision{fp: idemkv.DecisionReplay, fingerprint("other"): idemkv.DecisionConflict} {
		res, err := tgt.Reserve(ctx, &Reserve{Key: key, Tool: "create_ticket", Fingerprint: fp, AttemptID: "a2"})
		if err != nil || res.Decision != want {
			t.Errorf("reserve after commit = %+v, %v; want %s", res, err, want)
		}
	}
	if err := tgt.Commit(ctx, &Commit{Key: "run/absent", Fingerprint: fp, Reservation: res, RemoteSystem: "x", RemoteID: "1"}); !errors.Is(err, idemkv.ErrNotFound) {
		t.Errorf("commit of an absent key = %v, want not found", err)
	}
}

func TestHTTPTargetGoesToTheLeader(t *testing.T) {
	leader := newFakeAPI(t, newMemStore())
	follower := newFakeAPI(t, newMemStore())
	addr := leader.addr()
	follower.leader.Store(&addr)

	tgt := newTestTarget(t, follower.addr())
	if got := tgt.Leader(); got != "http://"+leader.addr() {
		t.Fatalf("leader %s, want %s", got, leader.addr())
	}
	for i := range 10 {
		if _, err := tgt.Reserve(t.Context(), &Reserve{Key: "k" + string(rune('a'+i)), Tool: "t", Fingerprint: "f", AttemptID: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	if l, f := leader.served("/v1/reserve"), follower.served("/v1/reserve"); l != 10 || f != 0 {
		t.Errorf("leader served %d reserves, follower %d; want 10 and 0", l, f)
	}
}

func TestHTTPTargetPinnedKeepsEachWorkerOnItsNode(t *testing.T) {
	// One store behind three nodes, as a cluster is: what one node commits, the others
	// replay. Every answer names the first as the leader.
	store := newMemStore()
	nodes := []*fakeAPI{newFakeAPI(t, store), newFakeAPI(t, store), newFakeAPI(t, store)}
	leader := nodes[0].addr()
	for _, n := range nodes[1:] {
		n.leader.Store(&leader)
	}
	tgt, err := NewHTTPTarget(t.Context(), HTTPConfig{Endpoints: []string{nodes[0].addr(), nodes[1].addr(), nodes[2].addr()},
		Tenant: "acme", Conns: 6, Pinned: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tgt.Close() })
	const workers = 6
	rep, err := Run(t.Context(), Config{Target: tgt, Name: "idemkv", Concurrency: workers, Ops: 600, Duration: time.Minute,
		Warmup: -1, Keys: 30, Mix: Mix{Replay: 1}, RunID: "run", Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Errors != 0 || rep.Kind("replay").Ops == 0 {
		t.Fatalf("errors %d, kinds %+v", rep.Errors, rep.Kinds)
	}
	// Replays carry attempt IDs run/a/<worker>/<seq>: worker w must only reach node w%3.
	for i, n := range nodes {
		replays := 0
		for _, a := range n.reserveAttempts() {
			w, ok := strings.CutPrefix(a, "run/a/")
			if !ok {
				continue
			}
			replays++
			if id, _, _ := strings.Cut(w, "/"); id != strconv.Itoa(i) && id != strconv.Itoa(i+3) {
				t.Errorf("node %d served worker %s's replay", i, id)
			}
		}
		if replays == 0 {
			t.Errorf("node %d served no replay", i)
		}
	}
}

func TestHTTPTargetFollowsTheLeaderHeader(t *testing.T) {
	next := newFakeAPI(t, newMemStore())
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/cluster" {
			writeJSON(w, http.StatusOK, idemkv.ClusterInfo{Leader: idemkv.LeaderInfo{APIAddr: r.Host}})
			return
		}
		// Leadership moved: this node names the new leader and cannot serve.
		w.Header().Set("Idemkv-Leader", next.addr())
		writeErr(w, idemkv.Errorf(idemkv.ErrUnavailable, "leadership lost"))
	}))
	t.Cleanup(old.Close)
	tgt := newTestTarget(t, old.URL)
	_, err := tgt.Reserve(t.Context(), &Reserve{Key: "k", Tool: "t", Fingerprint: "f", AttemptID: "a"})
	if !errors.Is(err, idemkv.ErrUnavailable) {
		t.Fatalf("reserve on the old leader = %v, want unavailable (never retried)", err)
	}
	res, err := tgt.Reserve(t.Context(), &Reserve{Key: "k", Tool: "t", Fingerprint: "f", AttemptID: "a"})
	if err != nil || res.Decision != idemkv.DecisionExecute {
		t.Fatalf("reserve after the header = %+v, %v", res, err)
	}
	if n := next.served("/v1/reserve"); n != 1 {
		t.Errorf("new leader served %d reserves, want 1", n)
	}
}

func TestHTTPTargetMapsBareErrors(t *testing.T) {
	status := http.StatusServiceUnavailable
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/cluster" {
			writeJSON(w, http.StatusOK, idemkv.ClusterInfo{Leader: idemkv.LeaderInfo{APIAddr: r.Host}})
			return
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte("not json"))
	}))
	t.Cleanup(srv.Close)
	tgt := newTestTarget(t, srv.URL)
	if _, err := tgt.Reserve(t.Context(), &Reserve{Key: "k", Tool: "t", Fingerprint: "f"}); !errors.Is(err, idemkv.ErrUnavailable) {
		t.Errorf("bare 503 = %v, want unavailable", err)
	}
	status = http.StatusBadGateway
	if _, err := tgt.Reserve(t.Context(), &Reserve{Key: "k", Tool: "t", Fingerprint: "f"}); !errors.Is(err, idemkv.ErrInternal) {
		t.Errorf("bare 502 = %v, want internal", err)
	}
}

func TestNewHTTPTargetNeedsALeader(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, idemkv.ClusterInfo{})
	}))
	t.Cleanup(srv.Close)
	if _, err := NewHTTPTarget(t.Context(), HTTPConfig{Endpoints: []string{srv.URL}, Tenant: "acme"}); !errors.Is(err, idemkv.ErrUnavailable) {
		t.Errorf("no leader: %v, want unavailable", err)
	}
	srv.Close()
	if _, err := NewHTTPTarget(t.Context(), HTTPConfig{Endpoints: []string{srv.URL}, Tenant: "acme"}); !errors.Is(err, idemkv.ErrUnavailable) {
		t.Errorf("server down: %v, want unavailable", err)
	}
	if _, err := NewHTTPTarget(t.Context(), HTTPConfig{Endpoints: []string{srv.URL}, Tenant: "bad tenant!"}); !errors.Is(err, idemkv.ErrInvalidArgument) {
		t.Errorf("bad tenant: %v, want invalid argument", err)
	}
}

func TestHTTPTargetKeepsAConnectionPerWorker(t *testing.T) {
	api := newFakeAPI(t, newMemStore())
	tgt := newTestTarget(t, api.addr())
	const workers, ops = 4, 2000
	rep, err := Run(t.Context(), Config{Target: tgt, Name: "idemkv", Concurrency: workers, Ops: ops,
		Duration: time.Minute, Warmup: -1, Keys: 20, Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Ops != ops || rep.Errors != 0 {
		t.Fatalf("ops %d errors %d: %+v", rep.Ops, rep.Errors, rep.Kinds)
	}
	// Each worker reuses its connection; a handful more may open while a finished
	// request hands its connection back, but never one per request.
	if n := api.conns.Load(); n > 2*workers {
		t.Errorf("%d connections for %d workers and %d operations", n, workers, ops)
	}
}
