package node_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// A follower answers a replay of, or a conflict with, a committed or failed record
// from its own state, with no read index and no leader (docs/protocol.md "Followers"),
// and nothing else: not a pending record (its answer changes with the next commit the
// follower may not have applied), not a record within node.LocalAnswerMargin of its
// expiry by this node's wall clock (a lagging follower's applied clock proves nothing).
// Node.Reserve on a follower never forwards, so an answer instead of ErrNotLeader is a
// local one; the HTTP answers are checked with the leader and the other follower
// stopped, where no read index or forward could succeed.
func TestFollowerAnswersSettledRecordsLocally(t *testing.T) {
	var ahead [3]atomic.Int64 // each node's wall clock offset
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(i int, cfg *node.Config) {
		cfg.Now = func() time.Time { return time.Now().Add(time.Duration(ahead[i].Load())) }
	}))
	ctx := ctxT(t)
	li := c.LeaderIndex(t)
	fi, oi := (li+1)%3, (li+2)%3
	leader, f := c.Node(li), c.Node(fi)

	settle(t, leader, reserveReq("done", "a1", fp("done")), idemkv.StatusCommitted)
	settle(t, leader, reserveReq("failed", "a1", fp("failed")), idemkv.StatusFailed)
	pending := reserveReq("pending", "a1", fp("pending"))
	pending.LeaseTTLMs = (10 * time.Minute).Milliseconds() // live throughout the test
	settle(t, leader, pending, idemkv.StatusPending)
	// Expires exactly one margin after it was stamped: within the margin of any later
	// time. The other one minute past the margin: outside it for the test's length.
	settle(t, leader, withTTL(reserveReq("near", "a1", fp("near")), node.LocalAnswerMargin), idemkv.StatusCommitted)
	settle(t, leader, withTTL(reserveReq("beyond", "a1", fp("beyond")), node.LocalAnswerMargin+time.Minute), idemkv.StatusCommitted)
	want := leader.AppliedIndex()
	waitFor(t, 10*time.Second, "the follower applies the writes", func() error {
		if got := f.AppliedIndex(); got < want {
			return fmt.Errorf("follower at %d, leader at %d", got, want)
		}
		return nil
	})

	ask := func(key, fingerprint string) (*idemkv.ReserveResult, error) {
		t.Helper()
		return f.Reserve(ctx, reserveReq(key, "a2", fingerprint))
	}
	answered := func(key, fingerprint string, decision idemkv.Decision) *idemkv.ReserveResult {
		t.Helper()
		res, err := ask(key, fingerprint)
		if err != nil || res.Decision != decision {
			t.Fatalf("follower reserve of %s: %+v, %v; want %s from its own state", key, res, err, decision)
		}
		return res
	}
	refused := func(key, fingerprint, why string) {
		t.Helper()
		if res, err := ask(key, fingerprint); !errors.Is(err, idemkv.ErrNotLeader) {
			t.Fatalf("follower reserve of %s (%s): %+v, %v; want ErrNotLeader", key, why, res, err)
		}
	}

	if res := answered("done", fp("done"), idemkv.DecisionReplay); res.Receipt == nil || res.Receipt.RemoteID != "LIN-done" {
		t.Errorf("replay of a committed record: receipt %+v", res.Receipt)
	}
	if res := answered("done", fp("other"), idemkv.DecisionConflict); res.Conflict == nil || res.Conflict.ExistingFingerprint != fp("done") {
		t.Errorf("conflict with a committed record: %+v", res.Conflict)
	}
	if res := answered("failed", fp("failed"), idemkv.DecisionReplay); res.Receipt == nil ||
		res.Receipt.Status != idemkv.StatusFailed || res.Receipt.Error == nil || res.Receipt.Error.Code != "rejected" {
		t.Errorf("replay of a failed record: %+v", res.Receipt)
	}
	answered("beyond", fp("beyond"), idemkv.DecisionReplay)
	refused("pending", fp("pending"), "pending: in_progress is the leader's to say")
	refused("pending", fp("other"), "a conflict with a pending record, which a release may end")
	refused("near", fp("near"), "expires within the margin")
	refused("nobody", fp("nobody"), "absent: only the leader grants")

	// A follower whose wall clock says the record is within the margin of its expiry
	// does not answer, whatever the state it applied says: that is how a follower that
	// lags far behind sees that the cluster's clock may have moved on.
	ahead[fi].Store(int64(24*time.Hour - node.LocalAnswerMargin/2))
	refused("done", fp("done"), "the follower's wall clock is within the margin of its expiry")
	ahead[fi].Store(0)
	answered("done", fp("done"), idemkv.DecisionReplay)

	m := c.Metrics(fi)
	if r, k := metricValue(t, m.LocalAnswers.WithLabelValues("replay")), metricValue(t, m.LocalAnswers.WithLabelValues("conflict")); r != 4 || k != 1 {
		t.Errorf("local answers counted: %v replays, %v conflicts; want 4 and 1", r, k)
	}

	// Over HTTP, with the cluster up: answered by the follower (counted there), with the
	// same headers as any answer.
	var res idemkv.ReserveResult
	resp := postReserve(t, c.Endpoint(fi), reserveReq("done", "a3", fp("done")), &res)
	if resp.StatusCode != http.StatusOK || res.Decision != idemkv.DecisionReplay || res.Record == nil || res.Record.Fence == 0 {
		t.Fatalf("HTTP replay on the follower: %d %+v", resp.StatusCode, res)
	}
	if got := resp.Header.Get(idemkv.HeaderLeader); got != c.Endpoint(li) {
		t.Errorf("%s = %q, want the leader %q", idemkv.HeaderLeader, got, c.Endpoint(li))
	}
	if resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("headers of a local answer: %v", resp.Header)
	}
	if d := metricValue(t, m.Decisions.WithLabelValues("create_ticket", "replay")); d != 1 {
		t.Errorf("the follower counted %v replay decisions, want 1", d)
	}

	// With the leader and the other follower gone there is no leader, no quorum and
	// no read index: the follower still replays and conflicts, and refuses the rest.
	c.Stop(oi)
	c.Stop(li)
	waitFor(t, 10*time.Second, "the follower no longer leads", func() error {
		if f.IsLeader() {
			return errors.New("still leader")
		}
		return nil
	})
	for _, tc := range []struct {
		key, fp  string
		decision idemkv.Decision
	}{{"done", fp("done"), idemkv.DecisionReplay}, {"failed", fp("failed"), idemkv.DecisionReplay}, {"done", fp("other"), idemkv.DecisionConflict}} {
		var res idemkv.ReserveResult
		if resp := postReserve(t, c.Endpoint(fi), reserveReq(tc.key, "a4", tc.fp), &res); resp.StatusCode != http.StatusOK || res.Decision != tc.decision {
			t.Errorf("HTTP reserve of %s with no leader: %d %s, want %s", tc.key, resp.StatusCode, res.Decision, tc.decision)
		}
	}
	for _, key := range []string{"pending", "near"} {
		if resp := postReserve(t, c.Endpoint(fi), reserveReq(key, "a4", fp(key)), nil); resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("HTTP reserve of %s with no leader: %d, want 503", key, resp.StatusCode)
		}
	}
}

// postReserve posts req to endpoint and decodes a 200 answer into out (when not nil).
func postReserve(t *testing.T, endpoint string, req *idemkv.ReserveRequest, out *idemkv.ReserveResult) *http.Response {
	t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+endpoint+"/v1/reserve", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("reserve %s on %s: %v", req.Key, endpoint, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	t.Logf("reserve %s on %s: %d %s", req.Key, endpoint, resp.StatusCode, raw)
	if resp.StatusCode == http.StatusOK && out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("decode: %v: %s", err, raw)
		}
	}
	return resp
}
