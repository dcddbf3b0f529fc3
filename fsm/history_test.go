package fsm

import (
	"reflect"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
)

// withoutEvent checks that got's history is prior with want appended (want.Event
// empty: prior unchanged) and returns got without its history, for the rows' other
// comparisons. A want.Detail, when set, must be contained in the event's detail.
func withoutEvent(t *testing.T, what string, got *idemkv.Record, prior []idemkv.HistoryEvent, want idemkv.HistoryEvent) *idemkv.Record {
	t.Helper()
	if got == nil {
		return nil
	}
	h := got.History
	if want.Event == "" {
		if !reflect.DeepEqual(h, prior) {
			t.Errorf("%s: history changed without an event:\n got %+v\nwant %+v", what, h, prior)
		}
	} else {
		if len(h) != len(prior)+1 || !reflect.DeepEqual(h[:len(prior)], prior) && len(prior) > 0 {
			t.Fatalf("%s: history %+v is not %+v and one event", what, h, prior)
		}
		ev := h[len(h)-1]
		detail := ev.Detail
		if want.Detail == "" || strings.Contains(ev.Detail, want.Detail) {
			ev.Detail = want.Detail
		}
		if ev != want {
			t.Errorf("%s: event %+v (detail %q), want %+v", what, ev, detail, want)
		}
	}
	return got.WithoutHistory()
}

// priorHistory is the history a record about to change at now continues: none when it
// counts as absent.
func priorHistory(cur *idemkv.Record, now idemkv.Timestamp) []idemkv.HistoryEvent {
	if Expired(cur, now) {
		return nil
	}
	return cur.History
}

func TestHistoryKeepsTheLatest(t *testing.T) {
	rec := &idemkv.Record{}
	for i := range idemkv.MaxHistory + 5 {
		before := rec.History
		rec.AddEvent(idemkv.HistoryEvent{At: idemkv.Timestamp(i + 1), Event: idemkv.EventRecover, Fence: uint64(i + 1)})
		if len(before) > 0 && &before[0] == &rec.History[0] && len(before) == len(rec.History) {
			t.Fatalf("AddEvent wrote into the slice it was given")
		}
	}
	if len(rec.History) != idemkv.MaxHistory || rec.HistoryDropped != 5 {
		t.Fatalf("history of %d, dropped %d; want %d and 5", len(rec.History), rec.HistoryDropped, idemkv.MaxHistory)
	}
	for i, ev := range rec.History {
		if ev.Fence != uint64(i+6) {
			t.Fatalf("event %d has fence %d, want %d (oldest first, the latest kept)", i, ev.Fence, i+6)
		}
	}
	long := strings.Repeat("é", idemkv.MaxEventDetail)
	rec.AddEvent(idemkv.HistoryEvent{Event: idemkv.EventFail, Detail: long})
	if d := rec.History[len(rec.History)-1].Detail; len(d) > idemkv.MaxEventDetail {
		t.Fatalf("detail of %d bytes kept, bound %d", len(d), idemkv.MaxEventDetail)
	}
}

// TestHistoryOfALife follows one key through the decision functions, as the state
// machine applies them, and checks its history at the end: each grant and end of
// ownership, in order, with the fences and attempts involved, the actor and the
// stamped time.
func TestHistoryOfALife(t *testing.T) {
	r1 := reserveReq(func(r *idemkv.ReserveRequest) { r.AttemptID = "att-1"; r.Actor = "worker-1" })
	rec, res := Decide(nil, r1, t0, 10)
	if res.Decision != idemkv.DecisionExecute {
		t.Fatalf("decision %s", res.Decision)
	}
	// The same attempt again: no grant, no event.
	rec, _ = Decide(rec, r1, t0+5, 11)
	r2 := reserveReq(func(r *idemkv.ReserveRequest) { r.AttemptID = "att-2"; r.Actor = "worker-2" })
	rec, res = Decide(rec, r2, t0+lease+6, 12)
	if res.Decision != idemkv.DecisionRecover {
		t.Fatalf("decision %s", res.Decision)
	}
	// The first attempt's late commit is fenced and writes nothing.
	if next, _, err := DecideCommit(rec, &idemkv.CommitRequest{Tenant: tenant, Key: key, Fingerprint: fpA, Fence: 10}, t0+lease+6); err == nil || next != nil {
		t.Fatalf("stale commit: %v %v", next, err)
	}
	rec, _, _ = DecideDoubt(rec, &idemkv.DoubtRequest{Tenant: tenant, Key: key, Fingerprint: fpA, Fence: 12}, t0+lease+7)
	rec, _, _, err := DecideResolve(rec, &idemkv.ResolveRequest{Tenant: tenant, Key: key, Fingerprint: fpA,
		Outcome: idemkv.ResolveCommitted, RemoteSystem: "stripe", RemoteID: "re_1", By: "oncall (admin)"}, t0+lease+8)
	if err != nil {
		t.Fatal(err)
	}
	want := []idemkv.HistoryEvent{
		{At: t0, Event: idemkv.EventExecute, Fence: 10, AttemptID: "att-1", Actor: "worker-1"},
		{At: t0 + lease + 6, Event: idemkv.EventRecover, Fence: 12, AttemptID: "att-2", Actor: "worker-2",
			Detail: "replaced fence 10"},
		{At: t0 + lease + 7, Event: idemkv.EventDoubt, Fence: 12, AttemptID: "att-2", Actor: "worker-2",
			Detail: "the attempt cannot learn whether the effect happened"},
		{At: t0 + lease + 8, Event: idemkv.EventResolve, Fence: 12, AttemptID: "att-2", Actor: "oncall (admin)",
			Detail: "committed: stripe re_1"},
	}
	if !reflect.DeepEqual(rec.History, want) {
		t.Fatalf("history:\n got %+v\nwant %+v", rec.History, want)
	}
}
