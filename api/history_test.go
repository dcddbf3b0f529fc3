package api_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
	"github.com/idemkv/idemkv/client"
)

// withHistory is committedRecord with the history the state machine would have
// written: its execute and its commit.
func withHistory() *idemkv.Record {
	r := committedRecord()
	r.AddEvent(idemkv.HistoryEvent{At: t0, Event: idemkv.EventExecute, Fence: 7, AttemptID: "att-1", Actor: "agent-7"})
	r.AddEvent(idemkv.HistoryEvent{At: t13, Event: idemkv.EventCommit, Fence: 7, AttemptID: "att-1", Actor: "agent-7", Detail: "linear LIN-1842"})
	r.HistoryDropped = 3
	return r
}

// TestGetHistoryOptIn: GET of a record carries its history only with ?history=true;
// every other answer that holds the record (a get without it, a reserve, a list)
// leaves it out. A history value that is not true or false is a 400 naming it.
func TestGetHistoryOptIn(t *testing.T) {
	fake := &FakeStore{
		GetFunc: func(_ context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) { return withHistory(), nil },
		ReserveFunc: func(context.Context, *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
			return &idemkv.ReserveResult{Decision: idemkv.DecisionReplay, Receipt: withHistory().Outcome(), Record: withHistory()}, nil
		},
		ListFunc: func(context.Context, *idemkv.ListRequest) (*idemkv.ListResult, error) {
			return &idemkv.ListResult{Records: []*idemkv.Record{withHistory(), withHistory()}}, nil
		},
	}
	n := startNode(t, fake, nil)
	path := n.url + "/v1/records/" + testTenant + "/" + url.PathEscape(testKey)

	plain := do(t, http.MethodGet, path, nil, nil).object(t, http.StatusOK)
	if _, ok := plain["history"]; ok {
		t.Errorf("a get without ?history=true carries the history: %v", plain["history"])
	}
	if _, ok := plain["history_dropped"]; ok {
		t.Errorf("a get without ?history=true carries history_dropped")
	}

	full := do(t, http.MethodGet, path+"?history=true", nil, nil).object(t, http.StatusOK)
	events, ok := full["history"].([]any)
	if !ok || len(events) != 2 || full["history_dropped"] != float64(3) {
		t.Fatalf("history %v dropped %v", full["history"], full["history_dropped"])
	}
	first := object(t, "event", events[0])
	wantKeys(t, "execute event", first, "at", "event", "fence", "attempt_id", "actor")
	if first["event"] != "execute" || first["at"] != t0.String() || first["fence"] != float64(7) {
		t.Errorf("first event %v", first)
	}
	second := object(t, "event", events[1])
	wantKeys(t, "commit event", second, "at", "event", "fence", "attempt_id", "actor", "detail")
	if second["event"] != "commit" || second["detail"] != "linear LIN-1842" {
		t.Errorf("second event %v", second)
	}

	do(t, http.MethodGet, path+"?history=yes", nil, nil).wantError(t, http.StatusBadRequest, "invalid_argument", "history")

	res := do(t, http.MethodPost, n.url+"/v1/reserve", validReserve(), nil).object(t, http.StatusOK)
	if rec := object(t, "record", res["record"]); rec["history"] != nil || rec["history_dropped"] != nil {
		t.Errorf("a reserve's record carries the history: %v", rec)
	}
	list := do(t, http.MethodGet, n.url+"/v1/records/"+testTenant, nil, nil).object(t, http.StatusOK)
	for _, r := range list["records"].([]any) {
		if rec := object(t, "listed", r); rec["history"] != nil {
			t.Errorf("a listed record carries the history: %v", rec)
		}
	}
}

// identifiedCaller may do anything and names itself.
type identifiedCaller struct{ id string }

func (c identifiedCaller) Allow(_ api.Operation, _ string) error { return nil }
func (c identifiedCaller) Identity() string                      { return c.id }

// TestResolveNamesTheToken: a resolve's By (the history's who) is the authenticated
// caller's identity; the body cannot set it, and without authentication it is empty.
func TestResolveNamesTheToken(t *testing.T) {
	var got []string
	fake := &FakeStore{ResolveFunc: func(_ context.Context, req *idemkv.ResolveRequest) (*idemkv.ResolveResult, error) {
		got = append(got, req.By)
		return &idemkv.ResolveResult{Released: true}, nil
	}}
	body := map[string]any{"tenant": testTenant, "idempotency_key": testKey, "effect_fingerprint": testFP, "outcome": "not_executed"}
	authed := startNode(t, fake, withCaller(identifiedCaller{id: "oncall-ana (admin)"}))
	do(t, http.MethodPost, authed.url+"/v1/resolve", body, nil).object(t, http.StatusOK)
	open := startNode(t, fake, nil)
	do(t, http.MethodPost, open.url+"/v1/resolve", body, nil).object(t, http.StatusOK)
	// A body naming someone else is refused as an unknown field, never believed.
	if r := do(t, http.MethodPost, open.url+"/v1/resolve", with(body, "by", "mallory"), nil); r.status == http.StatusOK {
		t.Errorf("a body with \"by\" was accepted: %s", r.body)
	}
	if len(got) < 2 || got[0] != "oncall-ana (admin)" || got[1] != "" {
		t.Fatalf("By = %q, want the caller's identity, then none", got)
	}
	for _, by := range got[2:] {
		if by == "mallory" {
			t.Fatalf("the body set By: %q", got)
		}
	}
}

// TestStoreEffectAndRuleOptionsChecked: store_effect with only a fingerprint, and rule
// options that cannot work, are 400s naming the field, before the store sees them.
func TestStoreEffectAndRuleOptionsChecked(t *testing.T) {
	fake := &FakeStore{}
	n := startNode(t, fake, nil)
	do(t, http.MethodPost, n.url+"/v1/reserve", with(validReserve(), "store_effect", true), nil).
		wantError(t, http.StatusBadRequest, "invalid_argument", "effect")
	rule := map[string]any{"tenant": testTenant, "tool": "pay"}
	for _, tc := range []struct {
		body  map[string]any
		field string
	}{
		{with(rule, "mask", []string{"card/number"}), "mask"},
		{with(rule, "mask", []string{"/card/~2"}), "mask"},
		{with(rule, "mask", []string{""}), "mask"},
		{with(rule, "require_approval", false), "require_approval"},
		{with(rule, "require_approval", false, "store_effect", true, "ttl_ms", 60000), "ttl_ms"},
		{with(rule, "remove", true, "store_effect", true), "store_effect"},
		{with(rule, "remove", true, "ttl_ms", 60000), "ttl_ms"},
	} {
		do(t, http.MethodPost, n.url+"/v1/approval-rules", tc.body, nil).wantError(t, http.StatusBadRequest, "invalid_argument", tc.field)
	}
	if fake.Calls() != 0 {
		t.Fatalf("the store was called %d times", fake.Calls())
	}
}

// TestGetOfAReleasedKey: the not_found of GET ?history=true for a released key
// carries the tombstone in error.details.released, in exactly the documented shape
// (docs/protocol.md "History"), and the Go client hands it back as it was; without
// ?history=true the not_found is the plain error shape.
func TestGetOfAReleasedKey(t *testing.T) {
	tomb := &idemkv.Tombstone{Tenant: testTenant, Key: testKey, Tool: testTool, Fingerprint: testFP, ReleasedAt: t13,
		ExpiresAt: t0 + 86_400_000, History: []idemkv.HistoryEvent{
			{At: t0, Event: idemkv.EventExecute, Fence: 7, AttemptID: "att-1", Actor: "agent-7"},
			{At: t13, Event: idemkv.EventRelease, Fence: 7, AttemptID: "att-1", Actor: "agent-7", Detail: "the effect did not happen"}}}
	fake := &FakeStore{GetFunc: func(_ context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) {
		if req.History {
			return nil, idemkv.ReleasedNotFound(tomb)
		}
		return nil, idemkv.Errorf(idemkv.ErrNotFound, "%s/%s", req.Tenant, req.Key)
	}}
	n := startNode(t, fake, nil)
	path := n.url + "/v1/records/" + testTenant + "/" + url.PathEscape(testKey)
	do(t, http.MethodGet, path, nil, nil).wantError(t, http.StatusNotFound, "not_found", "")

	m := do(t, http.MethodGet, path+"?history=true", nil, nil).object(t, http.StatusNotFound)
	e := object(t, "error", m["error"])
	wantKeys(t, "error", e, "code", "message", "details")
	if e["code"] != "not_found" {
		t.Errorf("code %v", e["code"])
	}
	released := object(t, "released", object(t, "details", e["details"])["released"])
	wantKeys(t, "released", released, "tenant", "idempotency_key", "tool", "effect_fingerprint", "released_at", "expires_at",
		"history", "history_dropped")
	if released["released_at"] != t13.String() || released["history_dropped"] != float64(0) {
		t.Errorf("released %v", released)
	}
	events, _ := released["history"].([]any)
	if len(events) != 2 {
		t.Fatalf("history %v", released["history"])
	}
	rel := object(t, "release event", events[1])
	wantKeys(t, "release event", rel, "at", "event", "fence", "attempt_id", "actor", "detail")
	if rel["event"] != "release" || rel["fence"] != float64(7) {
		t.Errorf("release event %v", rel)
	}

	c, err := client.New(client.Config{Endpoints: []string{n.url}, MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Get(context.Background(), &idemkv.GetRequest{Tenant: testTenant, Key: testKey, History: true})
	var ce *idemkv.Error
	if !errors.Is(err, idemkv.ErrNotFound) || !errors.As(err, &ce) || ce.Details == nil || !reflect.DeepEqual(ce.Details.Released, tomb) {
		t.Fatalf("client get: %v (%+v)", err, ce)
	}
}

// TestApprovalNamesTheToken: a decision's approver names the token that decided as
// well as the person the body names: any holder of an approver token could record a
// decision as anyone's ("cfo-alice"), in the record, its history and a denial's
// details. A body naming the token's holder, and a server without authentication,
// record the one name.
func TestApprovalNamesTheToken(t *testing.T) {
	var got []string
	fake := &FakeStore{DecideApprovalFunc: func(_ context.Context, req *idemkv.DecideApprovalRequest) (*idemkv.Record, error) {
		got = append(got, req.Approver)
		return &idemkv.Record{Tenant: req.Tenant, Key: req.Key}, nil
	}}
	decide := func(url, approver string) {
		t.Helper()
		body := map[string]any{"approval_id": "apr_7", "effect_fingerprint": testFP, "decision": "approve", "approver": approver}
		do(t, http.MethodPost, url+"/v1/approvals/"+testTenant+"/"+testKey, body, nil).object(t, http.StatusOK)
	}
	authed := startNode(t, fake, withCaller(identifiedCaller{id: "ana (approver)"}))
	decide(authed.url, "cfo-alice")
	decide(authed.url, "ana")
	decide(authed.url, strings.Repeat("é", 64)) // 128 bytes: clipped to fit beside the token
	long := startNode(t, fake, withCaller(identifiedCaller{id: strings.Repeat("t", idemkv.MaxActorLen)}))
	decide(long.url, "cfo-alice")
	decide(startNode(t, fake, nil).url, "cfo-alice")
	want := []string{"cfo-alice via ana (approver)", "ana (approver)",
		strings.Repeat("é", 54) + " via ana (approver)", strings.Repeat("t", idemkv.MaxActorLen), "cfo-alice"}
	if !slices.Equal(got, want) {
		t.Fatalf("approvers %q, want %q", got, want)
	}
	for _, a := range got {
		if len(a) > idemkv.MaxApproverLen {
			t.Errorf("approver of %d bytes, more than %d", len(a), idemkv.MaxApproverLen)
		}
	}
}
