package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/node"
)

// TestHistorySurvivesLeaderChangeAndSnapshotInstall follows one key on three nodes:
// executed under one leader, recovered and marked in doubt under the next, resolved
// after a follower was away long enough to be sent a snapshot (SnapshotThreshold 16,
// TrailingLogs 8). Every node then holds the same history, stamped by the leaders
// that proposed it, with the resolving token named.
func TestHistorySurvivesLeaderChangeAndSnapshotInstall(t *testing.T) {
	c := testcluster.Start(t, 3, testcluster.WithConfig(func(_ int, cfg *node.Config) {
		cfg.SnapshotThreshold, cfg.TrailingLogs = 16, 8
	}))
	ctx := ctxT(t)
	const key = "refund:order-17"
	fp := "sha256:history"
	req := func(attempt, actor string) *idemkv.ReserveRequest {
		r := reserveReq(key, attempt, fp)
		r.Actor, r.LeaseTTLMs = actor, 1000
		return r
	}
	var first *idemkv.ReserveResult
	if err := c.OnLeader(func(n *node.Node) (err error) { first, err = n.Reserve(ctx, req("att-1", "worker-1")); return err }); err != nil {
		t.Fatal(err)
	}
	old := c.LeaderIndex(t)
	c.Stop(old)
	c.Restart(old) // a follower now; the leadership moved
	var second *idemkv.ReserveResult
	if err := testcluster.Eventually(20*time.Second, func() error {
		return c.OnLeader(func(n *node.Node) (err error) {
			second, err = n.Reserve(ctx, req("att-2", "worker-2"))
			if err == nil && second.Decision != idemkv.DecisionRecover {
				return fmt.Errorf("decision %s (waiting for the first lease to run out)", second.Decision)
			}
			return err
		})
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.OnLeader(func(n *node.Node) error {
		_, err := n.Doubt(ctx, &idemkv.DoubtRequest{Tenant: "acme", Key: key, Fingerprint: fp, Fence: second.Fence})
		return err
	}); err != nil {
		t.Fatal(err)
	}

	leader := c.LeaderIndex(t)
	lagger := (leader + 1) % 3
	lagApplied := c.Node(lagger).AppliedIndex()
	c.Stop(lagger)
	writeFillers(t, c, ctx, 60)
	if err := c.OnLeader(func(n *node.Node) error {
		_, err := n.Resolve(ctx, &idemkv.ResolveRequest{Tenant: "acme", Key: key, Fingerprint: fp, Outcome: idemkv.ResolveCommitted,
			RemoteSystem: "stripe", RemoteID: "re_17", By: "oncall-ana (admin)"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	snapshotPast(t, c, lagApplied)
	c.Restart(lagger)
	c.WaitConverged()

	var want []idemkv.HistoryEvent
	for i := range c.Len() {
		rec, err := c.Node(i).Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: key, Consistency: idemkv.Stale})
		if err != nil {
			t.Fatalf("%s: %v", c.ID(i), err)
		}
		if i == 0 {
			want = rec.History
			continue
		}
		if !reflect.DeepEqual(rec.History, want) {
			t.Fatalf("%s holds history\n %+v\n%s holds\n %+v", c.ID(i), rec.History, c.ID(0), want)
		}
	}
	kinds := make([]idemkv.EventKind, len(want))
	for i, ev := range want {
		kinds[i] = ev.Event
	}
	wantKinds := []idemkv.EventKind{idemkv.EventExecute, idemkv.EventRecover, idemkv.EventDoubt, idemkv.EventResolve}
	if !reflect.DeepEqual(kinds, wantKinds) {
		t.Fatalf("events %v, want %v", kinds, wantKinds)
	}
	ex, rc, dt, rs := want[0], want[1], want[2], want[3]
	if ex.Fence != first.Fence || ex.AttemptID != "att-1" || ex.Actor != "worker-1" ||
		rc.Fence != second.Fence || rc.AttemptID != "att-2" || rc.Actor != "worker-2" || rc.Detail != fmt.Sprintf("replaced fence %d", first.Fence) ||
		dt.Fence != second.Fence || rs.Actor != "oncall-ana (admin)" || rs.Detail != "committed: stripe re_17" {
		t.Fatalf("history %+v", want)
	}
	if !(ex.At < rc.At && rc.At <= dt.At && dt.At <= rs.At) || rc.At-ex.At < 1000 {
		t.Fatalf("stamps %s %s %s %s: not in order, or the recover came before the lease of 1 s ran out", ex.At, rc.At, dt.At, rs.At)
	}
}

// TestConflictExplainsItself: with store_effect, a conflicting reserve gets the diff
// from whichever path answers: the leader's read, a follower's local answer against a
// committed record, and a forward. A rule of the tool stores effects without the
// request asking, and masks the card number in the record and in every diff.
func TestConflictExplainsItself(t *testing.T) {
	c := testcluster.Start(t, 3)
	ctx := ctxT(t)
	stored := json.RawMessage(`{"order":17,"amount":{"value":40,"currency":"EUR"},"note":"x"}`)
	received := json.RawMessage(`{"order":17,"amount":{"value":45,"currency":"EUR"},"reason":"late"}`)
	reserve := func(key string, effect json.RawMessage, store bool) *idemkv.ReserveRequest {
		return &idemkv.ReserveRequest{Tenant: "acme", Key: key, Tool: "refund", Actor: "agent", Effect: effect, StoreEffect: store, AttemptID: "a-" + key}
	}
	wantDiff := []idemkv.DiffEntry{
		{Path: "/amount/value", Stored: json.RawMessage(`40`), Received: json.RawMessage(`45`)},
		{Path: "/note", Stored: json.RawMessage(`"x"`)},
		{Path: "/reason", Received: json.RawMessage(`"late"`)},
	}
	var res *idemkv.ReserveResult
	if err := c.OnLeader(func(n *node.Node) (err error) { res, err = n.Reserve(ctx, reserve("r1", stored, true)); return err }); err != nil {
		t.Fatal(err)
	}
	if string(res.Record.Effect) != `{"amount":{"currency":"EUR","value":40},"note":"x","order":17}` {
		t.Fatalf("stored effect %s", res.Record.Effect)
	}
	// Pending: the leader answers the conflict from a read.
	var conflict *idemkv.ReserveResult
	if err := c.OnLeader(func(n *node.Node) (err error) {
		conflict, err = n.Reserve(ctx, reserve("r1", received, false))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if conflict.Decision != idemkv.DecisionConflict || !reflect.DeepEqual(conflict.Conflict.Diff, wantDiff) {
		t.Fatalf("leader's conflict %+v", conflict.Conflict)
	}
	if err := c.OnLeader(func(n *node.Node) error {
		_, err := n.Commit(ctx, &idemkv.CommitRequest{Tenant: "acme", Key: "r1", Fingerprint: res.Record.Fingerprint, Fence: res.Fence, RemoteSystem: "psp", RemoteID: "rf_1"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c.WaitConverged()
	follower := (c.LeaderIndex(t) + 1) % 3
	if local, ok := c.Node(follower).ReserveLocal(reserve("r1", received, false)); !ok || !reflect.DeepEqual(local.Conflict.Diff, wantDiff) ||
		local.Conflict.ExistingRemoteID != "rf_1" {
		t.Fatalf("follower's local conflict %v %+v", ok, local)
	}
	// Over HTTP through the follower, as a client sees it.
	var wire idemkv.ReserveResult
	if code, raw := httpCall(t, http.MethodPost, c.Endpoint(follower), "/v1/reserve", reserve("r1", received, false), &wire); code != http.StatusOK ||
		!reflect.DeepEqual(wire.Conflict.Diff, wantDiff) {
		t.Fatalf("HTTP conflict %d %s", code, raw)
	}
	// Without a stored effect, a conflict stays as it was.
	if err := c.OnLeader(func(n *node.Node) (err error) { _, err = n.Reserve(ctx, reserve("r2", stored, false)); return err }); err != nil {
		t.Fatal(err)
	}
	if err := c.OnLeader(func(n *node.Node) (err error) {
		conflict, err = n.Reserve(ctx, reserve("r2", received, false))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if conflict.Decision != idemkv.DecisionConflict || conflict.Conflict.Diff != nil || len(conflict.Record.Effect) != 0 {
		t.Fatalf("conflict without a stored effect %+v, record effect %s", conflict.Conflict, conflict.Record.Effect)
	}
	// store_effect with only a fingerprint is refused, naming the effect.
	if err := c.OnLeader(func(n *node.Node) (err error) {
		_, err = n.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "acme", Key: "r3", Tool: "refund", Fingerprint: "sha256:x", StoreEffect: true})
		return err
	}); !errors.Is(err, idemkv.ErrInvalidArgument) {
		t.Fatalf("store_effect without the effect: %v", err)
	}

	// A rule: every reserve of pay stores its effect, with the card masked; no approval.
	no := false
	if err := c.OnLeader(func(n *node.Node) error {
		_, err := n.SetApprovalRule(ctx, &idemkv.SetApprovalRuleRequest{ApprovalRule: idemkv.ApprovalRule{Tenant: "acme", Tool: "pay",
			RequireApproval: &no, StoreEffect: true, Mask: []string{"/card/number"}}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c.WaitConverged()
	pay := func(effect string) *idemkv.ReserveRequest {
		return &idemkv.ReserveRequest{Tenant: "acme", Key: "p1", Tool: "pay", Effect: json.RawMessage(effect), AttemptID: "a-p1"}
	}
	if err := c.OnLeader(func(n *node.Node) (err error) {
		res, err = n.Reserve(ctx, pay(`{"card":{"number":"4111111111111111","exp":"12/29"},"amount":40}`))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if res.Decision != idemkv.DecisionExecute || string(res.Record.Effect) != `{"amount":40,"card":{"exp":"12/29","number":"***"}}` ||
		!reflect.DeepEqual(res.Record.EffectMask, []string{"/card/number"}) {
		t.Fatalf("the rule's reserve: %s, effect %s mask %v", res.Decision, res.Record.Effect, res.Record.EffectMask)
	}
	for _, tc := range []struct {
		effect string
		want   []idemkv.DiffEntry
	}{
		{`{"card":{"number":"5500000000000004","exp":"12/29"},"amount":45}`,
			[]idemkv.DiffEntry{{Path: "/amount", Stored: json.RawMessage(`40`), Received: json.RawMessage(`45`)}}},
		{`{"card":{"number":"5500000000000004","exp":"12/29"},"amount":40}`,
			[]idemkv.DiffEntry{{Path: "/card/number", Stored: idemkv.MaskedValue, Received: idemkv.MaskedValue}}},
	} {
		var got *idemkv.ReserveResult
		if err := c.OnLeader(func(n *node.Node) (err error) { got, err = n.Reserve(ctx, pay(tc.effect)); return err }); err != nil {
			t.Fatal(err)
		}
		if got.Decision != idemkv.DecisionConflict || !reflect.DeepEqual(got.Conflict.Diff, tc.want) {
			t.Fatalf("%s: %s %+v, want diff %+v", tc.effect, got.Decision, got.Conflict, tc.want)
		}
	}
	// The card number is nowhere in what a reader of the record gets.
	code, raw := httpCall(t, http.MethodGet, c.Endpoint(follower), "/v1/records/acme/p1?history=true", nil, nil)
	if code != http.StatusOK || bytes.Contains(raw, []byte("4111")) || !bytes.Contains(raw, []byte(`"effect_mask":["/card/number"]`)) {
		t.Fatalf("GET of the masked record: %d %s", code, raw)
	}
}

// writeFillers commits n reserves of keys filler-0… through the leader, so that a
// snapshot taken next compacts the log past a node that is away.
func writeFillers(t *testing.T, c *testcluster.Cluster, ctx context.Context, n int) {
	t.Helper()
	for i := range n {
		k := fmt.Sprintf("filler-%d", i)
		if err := c.OnLeader(func(n *node.Node) error { _, err := n.Reserve(ctx, reserveReq(k, "a-"+k, "sha256:f")); return err }); err != nil {
			t.Fatal(err)
		}
	}
}

// snapshotPast snapshots the leader and checks that its log now starts past applied+1,
// so that a node that applied only up to applied must be sent the snapshot; it returns
// the leader.
func snapshotPast(t *testing.T, c *testcluster.Cluster, applied uint64) *node.Node {
	t.Helper()
	ln := c.Node(c.LeaderIndex(t))
	if err := ln.Snapshot(); err != nil {
		t.Fatal(err)
	}
	if first, err := ln.FirstLogIndex(); err != nil || first <= applied+1 {
		t.Fatalf("the leader's log starts at %d (%v), the node away applied %d: it would not need a snapshot", first, err, applied)
	}
	return ln
}

// A rule's masks keep the masked values out of the Raft log too (docs/protocol.md:
// "no replica, snapshot or backup ever holds them"): the proposer masks before it
// proposes. And a reserve that asks for approval without naming a wait gets the rule's,
// not the default.
func TestRuleMasksKeepSecretsOutOfTheLog(t *testing.T) {
	c := testcluster.Start(t, 3)
	ctx := ctxT(t)
	yes := true
	if err := c.OnLeader(func(n *node.Node) error {
		_, err := n.SetApprovalRule(ctx, &idemkv.SetApprovalRuleRequest{ApprovalRule: idemkv.ApprovalRule{Tenant: "acme", Tool: "pay",
			RequireApproval: &yes, TTLMs: (4 * time.Hour).Milliseconds(), Mask: []string{"/card/number"}}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c.WaitConverged()
	const secret = "4111111111111111"
	var res *idemkv.ReserveResult
	if err := c.OnLeader(func(n *node.Node) (err error) {
		res, err = n.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "acme", Key: "p1", Tool: "pay", AttemptID: "a-p1",
			Effect: json.RawMessage(`{"card":{"number":"` + secret + `"},"amount":40}`), Approval: &idemkv.ApprovalAsk{Required: true}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if res.Decision != idemkv.DecisionNeedsApproval || res.Approval == nil {
		t.Fatalf("reserve: %s %+v", res.Decision, res.Approval)
	}
	if wait := time.Duration(res.Approval.ExpiresAt-res.Approval.RequestedAt) * time.Millisecond; wait != 4*time.Hour {
		t.Errorf("the approval waits %s, want the rule's 4h", wait)
	}
	// Over HTTP too, where the API layer fills the request's other defaults first.
	var wire idemkv.ReserveResult
	if code, raw := httpCall(t, http.MethodPost, c.Endpoint(c.LeaderIndex(t)), "/v1/reserve", &idemkv.ReserveRequest{Tenant: "acme", Key: "p2",
		Tool: "pay", AttemptID: "a-p2", Effect: json.RawMessage(`{"card":{"number":"` + secret + `"},"amount":41}`),
		Approval: &idemkv.ApprovalAsk{Required: true}}, &wire); code != http.StatusOK || wire.Approval == nil {
		t.Fatalf("reserve over HTTP: %d %s", code, raw)
	}
	if wait := time.Duration(wire.Approval.ExpiresAt-wire.Approval.RequestedAt) * time.Millisecond; wait != 4*time.Hour {
		t.Errorf("over HTTP the approval waits %s, want the rule's 4h", wait)
	}
	c.WaitConverged()
	for i := range 3 {
		err := filepath.WalkDir(c.DataDir(i), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if bytes.Contains(b, []byte(secret)) {
				t.Errorf("node %d: %s holds the masked card number", i, path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
