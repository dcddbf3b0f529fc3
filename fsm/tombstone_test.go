package fsm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"testing"

	"github.com/idemkv/idemkv"
)

func releaseCmd(now idemkv.Timestamp, k string, fence uint64) *Command {
	return &Command{Op: OpRelease, Now: now, Release: &idemkv.ReleaseRequest{Tenant: tenant, Key: k, Fingerprint: fpA, Fence: fence}}
}

// tombstoneAt reads the tombstone of k at now, failing the test on anything but
// not_found.
func tombstoneAt(t *testing.T, h *harness, k string, now idemkv.Timestamp) *idemkv.Tombstone {
	t.Helper()
	ts, err := h.f.Tombstone(tenant, k, now)
	if errors.Is(err, idemkv.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// TestReleaseLeavesHistoryTheNextExecuteContinues: a reserve, its release, and a
// reserve of the key again, applied. The key is absent after the release for every
// read and decision as before, but a tombstone keeps the execute and the release
// (with the release's stamp, fence, attempt and actor); the next execute's record
// starts from those two events, and the tombstone is gone.
func TestReleaseLeavesHistoryTheNextExecuteContinues(t *testing.T) {
	h := newHarness(t)
	rs := h.apply(reserveCmd(t0, tenant, key, "att-1", func(r *idemkv.ReserveRequest) { r.Actor = "worker-1" }))
	mustOK(t, rs...)
	fence := rs[0].Reserve.Fence
	rs = h.apply(releaseCmd(t0+100, key, fence))
	mustOK(t, rs...)
	if !rs[0].Released {
		t.Fatalf("release: %+v", rs[0])
	}
	now := t0 + 200
	if _, err := h.f.Get(tenant, key, now); !errors.Is(err, idemkv.ErrNotFound) {
		t.Fatalf("get after release: %v", err)
	}
	list, err := h.f.List(&idemkv.ListRequest{Tenant: tenant, Limit: 100}, now)
	if err != nil || len(list.Records) != 0 {
		t.Fatalf("list after release: %+v %v", list, err)
	}
	// Every fenced op on the released key is not_found, as before tombstones.
	for _, c := range []*Command{releaseCmd(now, key, fence), commitCmd(now, tenant, key, fence, "LIN-1"),
		{Op: OpHeartbeat, Now: now, Heartbeat: &idemkv.HeartbeatRequest{Tenant: tenant, Key: key, Fence: fence, LeaseTTLMs: lease}}} {
		if rs := h.apply(c); !errors.Is(rs[0].Err, idemkv.ErrNotFound) {
			t.Fatalf("%s on a released key: %+v", c.Op, rs[0])
		}
	}
	ts := tombstoneAt(t, h, key, now)
	want := []idemkv.HistoryEvent{
		{At: t0, Event: idemkv.EventExecute, Fence: fence, AttemptID: "att-1", Actor: "worker-1"},
		{At: t0 + 100, Event: idemkv.EventRelease, Fence: fence, AttemptID: "att-1", Actor: "worker-1", Detail: "the effect did not happen"},
	}
	if ts == nil || !reflect.DeepEqual(ts.History, want) || ts.HistoryDropped != 0 || ts.ReleasedAt != t0+100 ||
		ts.ExpiresAt != t0+ttl || ts.Tool != "create_ticket" || ts.Fingerprint != fpA {
		t.Fatalf("tombstone %+v\nwant history %+v", ts, want)
	}
	if err := h.f.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}

	rs = h.apply(reserveCmd(now, tenant, key, "att-2", func(r *idemkv.ReserveRequest) { r.Actor = "worker-2" }))
	mustOK(t, rs...)
	if d := rs[0].Reserve.Decision; d != idemkv.DecisionExecute {
		t.Fatalf("reserve after release: %s", d)
	}
	rec, err := h.f.Get(tenant, key, now)
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, idemkv.HistoryEvent{At: now, Event: idemkv.EventExecute, Fence: rs[0].Reserve.Fence, AttemptID: "att-2", Actor: "worker-2"})
	if !reflect.DeepEqual(rec.History, want) || rec.HistoryDropped != 0 {
		t.Fatalf("history of the new record:\n got %+v\nwant %+v", rec.History, want)
	}
	if ts := tombstoneAt(t, h, key, now); ts != nil {
		t.Fatalf("the tombstone outlived the record that took the key: %+v", ts)
	}
	if err := h.f.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
}

// TestResolveNotExecutedLeavesHistory: an in-doubt record resolved not executed
// leaves its execute, doubt and the resolve (by the resolver) in its tombstone; one
// resolved committed leaves none (it is not deleted).
func TestResolveNotExecutedLeavesHistory(t *testing.T) {
	h := newHarness(t)
	resolve := func(now idemkv.Timestamp, k string, outcome idemkv.ResolveOutcome) *Command {
		return &Command{Op: OpResolve, Now: now, Resolve: &idemkv.ResolveRequest{Tenant: tenant, Key: k, Fingerprint: fpA,
			Outcome: outcome, RemoteSystem: "psp", RemoteID: "rf_1", By: "oncall (admin)"}}
	}
	for _, k := range []string{"gone", "kept"} {
		rs := h.apply(reserveCmd(t0, tenant, k, "att-1"))
		mustOK(t, rs...)
		mustOK(t, h.apply(&Command{Op: OpDoubt, Now: t0 + 10, Doubt: &idemkv.DoubtRequest{Tenant: tenant, Key: k, Fingerprint: fpA, Fence: rs[0].Reserve.Fence}})...)
	}
	mustOK(t, h.apply(resolve(t0+20, "gone", idemkv.ResolveNotExecuted), resolve(t0+20, "kept", idemkv.ResolveCommitted))...)
	ts := tombstoneAt(t, h, "gone", t0+30)
	if ts == nil || len(ts.History) != 3 {
		t.Fatalf("tombstone %+v", ts)
	}
	last := ts.History[2]
	if ts.History[1].Event != idemkv.EventDoubt || last.Event != idemkv.EventResolve || last.Actor != "oncall (admin)" ||
		last.Detail != "not executed" || last.At != t0+20 || last.AttemptID != "att-1" {
		t.Fatalf("history %+v", ts.History)
	}
	if ts := tombstoneAt(t, h, "kept", t0+30); ts != nil {
		t.Fatalf("a committed record left a tombstone: %+v", ts)
	}
	listed, err := h.f.ListInDoubt(&idemkv.InDoubtRequest{Limit: 100}, t0+30)
	if err != nil || len(listed.Records) != 0 {
		t.Fatalf("in-doubt list: %+v %v", listed, err)
	}
}

// TestTombstoneIsBoundedAndSoIsItsContinuation: a record with a full history leaves
// the latest 16 events (the release among them) and counts the rest; the next
// execute keeps 16 again.
func TestTombstoneIsBoundedAndSoIsItsContinuation(t *testing.T) {
	h := newHarness(t)
	now := t0
	rs := h.apply(reserveCmd(now, tenant, key, "att-0"))
	mustOK(t, rs...)
	// 20 recoveries: 21 events, 16 kept.
	for i := 1; i <= 20; i++ {
		now += lease + 1
		rs = h.apply(reserveCmd(now, tenant, key, fmt.Sprintf("att-%d", i)))
		mustOK(t, rs...)
	}
	mustOK(t, h.apply(releaseCmd(now+1, key, rs[0].Reserve.Fence))...)
	ts := tombstoneAt(t, h, key, now+1)
	if ts == nil {
		t.Fatal("no tombstone")
	}
	if len(ts.History) != idemkv.MaxHistory || ts.HistoryDropped != 6 || ts.History[idemkv.MaxHistory-1].Event != idemkv.EventRelease {
		t.Fatalf("tombstone of %d events, %d dropped: %+v", len(ts.History), ts.HistoryDropped, ts)
	}
	mustOK(t, h.apply(reserveCmd(now+2, tenant, key, "att-new"))...)
	rec, err := h.f.Get(tenant, key, now+2)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.History) != idemkv.MaxHistory || rec.HistoryDropped != 7 ||
		!reflect.DeepEqual(rec.History[:idemkv.MaxHistory-1], ts.History[1:]) || rec.History[idemkv.MaxHistory-1].AttemptID != "att-new" {
		t.Fatalf("history of %d events, %d dropped: %+v", len(rec.History), rec.HistoryDropped, rec.History)
	}
}

// TestRecordWithoutHistoryLeavesNoTombstone: a record written before histories (stored
// without one) is released as before, leaving nothing.
func TestRecordWithoutHistoryLeavesNoTombstone(t *testing.T) {
	h := newHarness(t)
	b := h.st.NewBatch()
	if err := b.PutRecord(&idemkv.Record{Tenant: tenant, Key: key, Fingerprint: fpA, Tool: "create_ticket", Status: idemkv.StatusPending,
		Fence: 1, Attempts: 1, CreatedAt: t0, UpdatedAt: t0, LeaseExpiresAt: t0 + lease, ExpiresAt: t0 + ttl}); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	rs := h.apply(releaseCmd(t0+10, key, 1))
	mustOK(t, rs...)
	if !rs[0].Released {
		t.Fatalf("release %+v", rs[0])
	}
	if ts := tombstoneAt(t, h, key, t0+10); ts != nil {
		t.Fatalf("a record without history left %+v", ts)
	}
	mustOK(t, h.apply(reserveCmd(t0+20, tenant, key, "b"))...)
	if rec, err := h.f.Get(tenant, key, t0+20); err != nil || len(rec.History) != 1 {
		t.Fatalf("record %+v %v", rec, err)
	}
}

// TestTombstoneExpiresWithItsRecordsExpiry: the tombstone counts as gone at the
// expires_at its record had: a reserve then starts a history of its own (and removes
// the stale tombstone); otherwise the sweeper deletes it, counted in the backlog and in
// swept, and the indexes stay in step.
func TestTombstoneExpiresWithItsRecordsExpiry(t *testing.T) {
	h := newHarness(t)
	short := func(r *idemkv.ReserveRequest) { r.TTLMs = 60_000 }
	rs := h.apply(reserveCmd(t0, tenant, "a", "a1", short), reserveCmd(t0, tenant, "b", "b1", short))
	mustOK(t, rs...)
	mustOK(t, h.apply(releaseCmd(t0+10, "a", rs[0].Reserve.Fence), releaseCmd(t0+10, "b", rs[1].Reserve.Fence))...)
	if ts := tombstoneAt(t, h, "a", t0+59_999); ts == nil {
		t.Fatal("no tombstone before its expiry")
	}
	after := t0 + 60_000
	if ts := tombstoneAt(t, h, "a", after); ts != nil {
		t.Fatalf("tombstone visible at its expiry: %+v", ts)
	}
	if n, oldest := h.f.Backlog(after); n != 2 || oldest != after {
		t.Fatalf("backlog %d oldest %s", n, oldest)
	}
	// A reserve of "a" past the expiry: its own history only; the tombstone goes.
	mustOK(t, h.apply(reserveCmd(after, tenant, "a", "a2"))...)
	rec, err := h.f.Get(tenant, "a", after)
	if err != nil || len(rec.History) != 1 || rec.History[0].AttemptID != "a2" {
		t.Fatalf("record %+v %v", rec, err)
	}
	if err := h.f.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
	rs = h.apply(&Command{Op: OpSweep, Now: after, Sweep: &SweepArgs{Limit: 10}})
	mustOK(t, rs...)
	if rs[0].Swept != 1 || rs[0].More {
		t.Fatalf("sweep: %+v", rs[0])
	}
	if ts, err := h.st.Tombstone(tenant, "b"); err != nil || ts != nil {
		t.Fatalf("tombstone of b after the sweep: %+v %v", ts, err)
	}
	if n, _ := h.f.Backlog(after); n != 0 {
		t.Fatalf("backlog after the sweep: %d", n)
	}
	if err := h.f.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
}

// TestSweepSharesItsLimitWithTombstones: records go first; tombstones take what the
// limit leaves, and more stays true while any are due.
func TestSweepSharesItsLimitWithTombstones(t *testing.T) {
	h := newHarness(t)
	short := func(r *idemkv.ReserveRequest) { r.TTLMs = 60_000 }
	var cmds []*Command
	for i := range 3 {
		cmds = append(cmds, reserveCmd(t0, tenant, fmt.Sprintf("dead-%d", i), "d", short), reserveCmd(t0, tenant, fmt.Sprintf("rel-%d", i), "r", short))
	}
	rs := h.apply(cmds...)
	mustOK(t, rs...)
	for i := range 3 {
		mustOK(t, h.apply(releaseCmd(t0+1, fmt.Sprintf("rel-%d", i), rs[2*i+1].Reserve.Fence))...)
	}
	now := t0 + 70_000
	sweepInTurns(t, h, now, 2, []sweptWant{{2, true}, {2, true}, {2, false}, {0, false}})
}

// TestSnapshotCarriesTombstones: a snapshot restored elsewhere holds the same
// tombstones (and the same state hash, which covers them), and the restored state
// machine continues their history.
func TestSnapshotCarriesTombstones(t *testing.T) {
	src := newHarness(t)
	rs := src.apply(reserveCmd(t0, tenant, key, "att-1"))
	mustOK(t, rs...)
	mustOK(t, src.apply(releaseCmd(t0+5, key, rs[0].Reserve.Fence))...)
	want := tombstoneAt(t, src, key, t0+5)
	if want == nil {
		t.Fatal("no tombstone")
	}
	data, wantState := snapshotBytes(t, src)
	dst := newHarness(t)
	if err := dst.f.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, dst.f); got.hash != wantState.hash {
		t.Fatal("state hash differs after restore")
	}
	if got := tombstoneAt(t, dst, key, t0+5); !reflect.DeepEqual(got, want) {
		t.Fatalf("restored tombstone %+v, want %+v", got, want)
	}
	// The hash covers tombstones: deleting this one changes it.
	before := stateOf(t, dst.f).hash
	b := dst.st.NewBatch()
	if ok, err := b.DeleteTombstone(tenant, key); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if stateOf(t, dst.f).hash == before {
		t.Fatal("the state hash does not cover tombstones")
	}
}

// TestApprovalAskedAfterAReleaseContinuesItsHistory: a reserve that must ask for an
// approval on a released key asks (the decision is needs_approval, as on any absent
// key), and the record awaiting approval starts from the tombstone's events.
func TestApprovalAskedAfterAReleaseContinuesItsHistory(t *testing.T) {
	h := newHarness(t)
	rs := h.apply(reserveCmd(t0, tenant, key, "att-1", func(r *idemkv.ReserveRequest) { r.Tool = "refund" }))
	mustOK(t, rs...)
	mustOK(t, h.apply(releaseCmd(t0+1, key, rs[0].Reserve.Fence))...)
	rs = h.apply(askCmd(t0+2, key, "att-2"))
	mustOK(t, rs...)
	if d := rs[0].Reserve.Decision; d != idemkv.DecisionNeedsApproval || !rs[0].Asked {
		t.Fatalf("reserve with approval after release: %s (asked %v)", d, rs[0].Asked)
	}
	rec, err := h.f.Get(tenant, key, t0+2)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []idemkv.EventKind
	for _, ev := range rec.History {
		kinds = append(kinds, ev.Event)
	}
	if want := []idemkv.EventKind{idemkv.EventExecute, idemkv.EventRelease, idemkv.EventApprovalRequested}; !reflect.DeepEqual(kinds, want) {
		t.Fatalf("events %v, want %v", kinds, want)
	}
	if ts := tombstoneAt(t, h, key, t0+2); ts != nil {
		t.Fatalf("tombstone left beside the record: %+v", ts)
	}
	if err := h.f.CheckExpiryIndex(); err != nil {
		t.Fatal(err)
	}
}
