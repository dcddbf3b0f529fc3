package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
)

var timestampRE = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)

func wantTimestamp(t *testing.T, what string, v any) {
	t.Helper()
	s, _ := v.(string)
	if !timestampRE.MatchString(s) {
		t.Errorf("%s = %v, want RFC 3339 UTC with milliseconds", what, v)
	}
}

func TestReserveExecuteShape(t *testing.T) {
	var got idemkv.ReserveRequest
	fake := &FakeStore{ReserveFunc: func(_ context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
		got = *req
		rec := pendingRecord(req.Key)
		return &idemkv.ReserveResult{Decision: idemkv.DecisionExecute, Fence: rec.Fence, AttemptID: rec.AttemptID,
			LeaseExpiresAt: rec.LeaseExpiresAt, Record: rec}, nil
	}}
	n := startNode(t, fake, nil)

	m := do(t, "POST", n.url+"/v1/reserve", validReserve(), nil).object(t, http.StatusOK)
	wantKeys(t, "reserve answer", m, "decision", "fence", "attempt_id", "lease_expires_at", "record")
	if m["decision"] != "execute" || m["fence"] != float64(7) {
		t.Errorf("decision %v fence %v, want execute 7", m["decision"], m["fence"])
	}
	wantTimestamp(t, "lease_expires_at", m["lease_expires_at"])
	rec := object(t, "record", m["record"])
	wantKeys(t, "record", rec, pendingKeys...)
	for _, f := range []string{"created_at", "updated_at", "lease_expires_at", "expires_at"} {
		wantTimestamp(t, "record."+f, rec[f])
	}
	if rec["status"] != "pending" || rec["idempotency_key"] != testKey {
		t.Errorf("record %v", rec)
	}

	// The store got the request as sent, with the defaults of docs/protocol.md section 2 filled.
	if got.Tenant != testTenant || got.Key != testKey || got.Tool != testTool || got.Actor != "agent-7" || got.Fingerprint != testFP {
		t.Errorf("store got %+v", got)
	}
	if got.LeaseTTLMs != 30_000 || got.TTLMs != 86_400_000 {
		t.Errorf("defaults: lease %d ttl %d, want 30000 and 86400000", got.LeaseTTLMs, got.TTLMs)
	}
	if v := n.decisions(t, testTool, idemkv.DecisionExecute); v != 1 {
		t.Errorf("decisions{execute} = %v, want 1", v)
	}
}

func TestReserveWithEffectPassesItThrough(t *testing.T) {
	var got idemkv.ReserveRequest
	fake := &FakeStore{ReserveFunc: func(_ context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
		got = *req
		return &idemkv.ReserveResult{Decision: idemkv.DecisionExecute, Fence: 1, Record: pendingRecord(req.Key)}, nil
	}}
	n := startNode(t, fake, nil)
	body := with(validReserve(), "effect_fingerprint", remove, "effect", map[string]any{"title": "Disk full", "severity": 2})
	do(t, "POST", n.url+"/v1/reserve", body, nil).object(t, http.StatusOK)
	var effect map[string]any
	if err := json.Unmarshal(got.Effect, &effect); err != nil || effect["title"] != "Disk full" || got.Fingerprint != "" {
		t.Errorf("store got effect %s (%v), fingerprint %q", got.Effect, err, got.Fingerprint)
	}
}

func TestReserveReplayAndConflictShapes(t *testing.T) {
	committed := committedRecord()
	fake := &FakeStore{ReserveFunc: func(_ context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
		if req.Fingerprint == testFP {
			return &idemkv.ReserveResult{Decision: idemkv.DecisionReplay, Receipt: committed.Outcome(), Record: committed}, nil
		}
		return &idemkv.ReserveResult{Decision: idemkv.DecisionConflict, Record: committed, Conflict: &idemkv.Conflict{
			Status: "conflict", Reason: idemkv.ReasonDifferentEffect,
			ExistingFingerprint: testFP, ReceivedFingerprint: req.Fingerprint, ExistingRemoteID: "LIN-1842",
		}}, nil
	}}
	n := startNode(t, fake, nil)

	m := do(t, "POST", n.url+"/v1/reserve", validReserve(), nil).object(t, http.StatusOK)
	wantKeys(t, "replay answer", m, "decision", "receipt", "record")
	receipt := object(t, "receipt", m["receipt"])
	wantKeys(t, "receipt", receipt, receiptKeys...)
	if receipt["status"] != "committed" || receipt["remote_id"] != "LIN-1842" || receipt["committed_at"] != "2026-07-29T13:00:13.000Z" {
		t.Errorf("receipt %v", receipt)
	}
	if res := object(t, "result", receipt["result"]); res["number"] != float64(1842) {
		t.Errorf("result %v", res)
	}
	wantKeys(t, "committed record", object(t, "record", m["record"]), "tenant", "idempotency_key", "effect_fingerprint",
		"tool", "actor", "status", "fence", "attempt_id", "attempts", "created_at", "updated_at", "expires_at", "receipt")

	m = do(t, "POST", n.url+"/v1/reserve", with(validReserve(), "effect_fingerprint", otherFP), nil).object(t, http.StatusOK)
	wantKeys(t, "conflict answer", m, "decision", "conflict", "record")
	conflict := object(t, "conflict", m["conflict"])
	wantKeys(t, "conflict", conflict, "status", "reason", "existing_fingerprint", "received_fingerprint", "existing_remote_id")
	if conflict["status"] != "conflict" || conflict["reason"] != "idempotency_key_reused_with_different_effect" ||
		conflict["received_fingerprint"] != otherFP {
		t.Errorf("conflict %v", conflict)
	}
	if n.decisions(t, testTool, idemkv.DecisionReplay) != 1 || n.decisions(t, testTool, idemkv.DecisionConflict) != 1 {
		t.Errorf("decision counters: replay %v conflict %v, want 1 and 1",
			n.decisions(t, testTool, idemkv.DecisionReplay), n.decisions(t, testTool, idemkv.DecisionConflict))
	}
}

func TestCommitShape(t *testing.T) {
	var got idemkv.CommitRequest
	fake := &FakeStore{CommitFunc: func(_ context.Context, req *idemkv.CommitRequest) (*idemkv.Receipt, error) {
		got = *req
		return committedRecord().Outcome(), nil
	}}
	n := startNode(t, fake, nil)
	m := do(t, "POST", n.url+"/v1/commit", validCommit(), nil).object(t, http.StatusOK)
	wantKeys(t, "commit answer", m, receiptKeys...)
	if m["status"] != "committed" || m["remote_url"] != "https://linear.example/issue/LIN-1842" {
		t.Errorf("receipt %v", m)
	}
	if got.Fence != 7 || got.RemoteSystem != "linear" || got.RemoteID != "LIN-1842" || string(got.Result) != `{"number":1842}` {
		t.Errorf("store got %+v (result %s)", got, got.Result)
	}
}

func TestFailShape(t *testing.T) {
	var got idemkv.FailRequest
	fake := &FakeStore{FailFunc: func(_ context.Context, req *idemkv.FailRequest) (*idemkv.Record, error) {
		got = *req
		rec := pendingRecord(req.Key)
		rec.Status, rec.LeaseExpiresAt, rec.Error = idemkv.StatusFailed, 0, &req.Error
		return rec, nil
	}}
	n := startNode(t, fake, nil)
	m := do(t, "POST", n.url+"/v1/fail", validFail(), nil).object(t, http.StatusOK)
	if m["status"] != "failed" {
		t.Errorf("status %v, want failed", m["status"])
	}
	e := object(t, "error", m["error"])
	wantKeys(t, "record error", e, "code", "message", "details")
	if e["code"] != "quota_exceeded" || got.Error.Message != "project is full" || string(got.Error.Details) != `{"limit":10}` {
		t.Errorf("error %v; store got %+v", e, got.Error)
	}
}

func TestReleaseShape(t *testing.T) {
	fake := &FakeStore{ReleaseFunc: func(_ context.Context, req *idemkv.ReleaseRequest) (*idemkv.ReleaseResult, error) {
		if req.Fence != 7 || req.Fingerprint != testFP {
			return nil, idemkv.Errorf(idemkv.ErrFenced, "wrong request %+v", req)
		}
		return &idemkv.ReleaseResult{Released: true}, nil
	}}
	n := startNode(t, fake, nil)
	r := do(t, "POST", n.url+"/v1/release", validRelease(), nil)
	r.object(t, http.StatusOK)
	if strings.TrimSpace(string(r.body)) != `{"released":true}` {
		t.Errorf("release answer %s, want {\"released\":true}", r.body)
	}
}

func TestHeartbeatShapeAndDefaultLease(t *testing.T) {
	var leases []int64
	fake := &FakeStore{HeartbeatFunc: func(_ context.Context, req *idemkv.HeartbeatRequest) (*idemkv.Record, error) {
		leases = append(leases, req.LeaseTTLMs)
		return pendingRecord(req.Key), nil
	}}
	n := startNode(t, fake, nil)
	m := do(t, "POST", n.url+"/v1/heartbeat", validHeartbeat(), nil).object(t, http.StatusOK)
	wantKeys(t, "heartbeat answer", m, pendingKeys...)
	do(t, "POST", n.url+"/v1/heartbeat", with(validHeartbeat(), "lease_ttl_ms", remove), nil).object(t, http.StatusOK)
	if len(leases) != 2 || leases[0] != 60_000 || leases[1] != 30_000 {
		t.Errorf("leases the store got: %v, want [60000 30000]", leases)
	}
}

func TestGetShapeAndNotFound(t *testing.T) {
	var got idemkv.GetRequest
	fake := &FakeStore{GetFunc: func(_ context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) {
		got = *req
		if req.Key == "missing" {
			return nil, idemkv.Errorf(idemkv.ErrNotFound, "no record %s/%s", req.Tenant, req.Key)
		}
		return committedRecord(), nil
	}}
	n := startNode(t, fake, nil)

	m := do(t, "GET", n.url+"/v1/records/acme/"+testKey+"?wait_ms=1500", nil, nil).object(t, http.StatusOK)
	if m["status"] != "committed" || object(t, "receipt", m["receipt"])["remote_id"] != "LIN-1842" {
		t.Errorf("record %v", m)
	}
	if got.Tenant != testTenant || got.Key != testKey || got.Wait != 1500*time.Millisecond || got.Consistency != idemkv.Linearizable {
		t.Errorf("store got %+v", got)
	}
	do(t, "GET", n.url+"/v1/records/acme/"+testKey+"?consistency=stale", nil, nil).object(t, http.StatusOK)
	if got.Consistency != idemkv.Stale || got.Wait != 0 {
		t.Errorf("store got %+v, want a stale read without wait", got)
	}

	do(t, "GET", n.url+"/v1/records/acme/missing", nil, nil).wantError(t, http.StatusNotFound, idemkv.CodeNotFound, "")
}

func TestListShape(t *testing.T) {
	var got idemkv.ListRequest
	fake := &FakeStore{ListFunc: func(_ context.Context, req *idemkv.ListRequest) (*idemkv.ListResult, error) {
		got = *req
		if req.Prefix == "none" {
			return &idemkv.ListResult{}, nil
		}
		return &idemkv.ListResult{Records: []*idemkv.Record{pendingRecord("a:1"), pendingRecord("a:2")}, Next: "a:2"}, nil
	}}
	n := startNode(t, fake, nil)

	m := do(t, "GET", n.url+"/v1/records/acme?prefix=a%3A&status=pending&limit=2&after=a%3A0", nil, nil).object(t, http.StatusOK)
	wantKeys(t, "list answer", m, "records", "next")
	records, _ := m["records"].([]any)
	if len(records) != 2 || m["next"] != "a:2" {
		t.Fatalf("list answer %v", m)
	}
	wantKeys(t, "listed record", object(t, "records[0]", records[0]), pendingKeys...)
	if got.Tenant != testTenant || got.Prefix != "a:" || got.Status != idemkv.StatusPending || got.Limit != 2 || got.After != "a:0" {
		t.Errorf("store got %+v", got)
	}

	r := do(t, "GET", n.url+"/v1/records/acme?prefix=none", nil, nil)
	wantKeys(t, "empty page", r.object(t, http.StatusOK), "records")
	if strings.TrimSpace(string(r.body)) != `{"records":[]}` {
		t.Errorf("empty page %s, want {\"records\":[]}", r.body)
	}
	if got.Limit != idemkv.DefaultListLimit {
		t.Errorf("default limit %d, want %d", got.Limit, idemkv.DefaultListLimit)
	}
}

func TestClusterJoinRemoveShapes(t *testing.T) {
	var joined idemkv.JoinRequest
	var removed idemkv.RemoveRequest
	fake := &FakeStore{
		ClusterFunc: func(context.Context) (*idemkv.ClusterInfo, error) { return sampleCluster(), nil },
		JoinFunc: func(_ context.Context, req *idemkv.JoinRequest) (*idemkv.ClusterInfo, error) {
			joined = *req
			return sampleCluster(), nil
		},
		RemoveFunc: func(_ context.Context, req *idemkv.RemoveRequest) (*idemkv.ClusterInfo, error) {
			removed = *req
			return sampleCluster(), nil
		},
	}
	n := startNode(t, fake, nil)
	check := func(what string, m map[string]any) {
		t.Helper()
		wantKeys(t, what, m, "leader", "nodes", "term", "commit_index", "applied_index")
		wantKeys(t, what+".leader", object(t, "leader", m["leader"]), "id", "api_addr")
		nodes, _ := m["nodes"].([]any)
		if len(nodes) != 2 {
			t.Fatalf("%s.nodes = %v", what, m["nodes"])
		}
		wantKeys(t, what+".nodes[0]", object(t, "node", nodes[0]), "id", "raft_addr", "api_addr", "suffrage", "state")
		if m["term"] != float64(3) || m["commit_index"] != float64(42) || m["applied_index"] != float64(41) {
			t.Errorf("%s: %v", what, m)
		}
	}
	check("cluster", do(t, "GET", n.url+"/v1/cluster", nil, nil).object(t, http.StatusOK))
	check("join", do(t, "POST", n.url+"/v1/cluster/join",
		map[string]any{"id": "n3", "raft_addr": "127.0.0.1:7441", "api_addr": "127.0.0.1:7440"}, nil).object(t, http.StatusOK))
	check("remove", do(t, "POST", n.url+"/v1/cluster/remove", map[string]any{"id": "n2"}, nil).object(t, http.StatusOK))
	if joined != (idemkv.JoinRequest{ID: "n3", RaftAddr: "127.0.0.1:7441", APIAddr: "127.0.0.1:7440"}) || removed.ID != "n2" {
		t.Errorf("store got join %+v, remove %+v", joined, removed)
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	var notReady error
	fake := &FakeStore{
		ReadyFunc: func() error { return notReady },
		ReserveFunc: func(_ context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
			return &idemkv.ReserveResult{Decision: idemkv.DecisionInProgress, Record: pendingRecord(req.Key)}, nil
		},
	}
	n := startNode(t, fake, nil)

	if m := do(t, "GET", n.url+"/healthz", nil, nil).object(t, http.StatusOK); m["status"] != "ok" {
		t.Errorf("healthz %v", m)
	}
	if m := do(t, "GET", n.url+"/readyz", nil, nil).object(t, http.StatusOK); m["status"] != "ready" {
		t.Errorf("readyz %v", m)
	}
	notReady = idemkv.Errorf(idemkv.ErrUnavailable, "catching up: applied 3 of 9")
	e := do(t, "GET", n.url+"/readyz", nil, nil).wantError(t, http.StatusServiceUnavailable, idemkv.CodeUnavailable, "")
	if !strings.Contains(e["message"].(string), "catching up") {
		t.Errorf("readyz message %v", e["message"])
	}
	// A plain error from Ready means "not ready", not an internal failure.
	notReady = context.DeadlineExceeded
	do(t, "GET", n.url+"/readyz", nil, nil).wantError(t, http.StatusServiceUnavailable, idemkv.CodeUnavailable, "")
	// Healthz answers while the node is not ready.
	do(t, "GET", n.url+"/healthz", nil, nil).object(t, http.StatusOK)

	do(t, "POST", n.url+"/v1/reserve", validReserve(), nil).object(t, http.StatusOK)
	r := do(t, "GET", n.url+"/metrics", nil, nil)
	if r.status != http.StatusOK {
		t.Fatalf("metrics status %d", r.status)
	}
	for _, want := range []string{
		`idemkv_decisions_total{decision="in_progress",tool="create_ticket"} 1`,
		`idemkv_http_request_duration_seconds_count{code="200",endpoint="POST /v1/reserve"} 1`,
		`idemkv_http_request_duration_seconds_count{code="503",endpoint="GET /readyz"} 2`,
	} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestEveryAnswerNamesTheLeader(t *testing.T) {
	fake := &FakeStore{LeaderFunc: func() (string, bool) { return "10.0.0.1:7420", true }}
	n := startNode(t, fake, nil)
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/v1/records/acme/k", "/nope"} {
		if got := do(t, "GET", n.url+path, nil, nil).header.Get(api.HeaderLeader); got != "10.0.0.1:7420" {
			t.Errorf("GET %s: %s = %q", path, api.HeaderLeader, got)
		}
	}
	// A new leader is named from the next answer on (answers share the header's
	// value while the leader stays).
	fake.LeaderFunc = func() (string, bool) { return "10.0.0.2:7420", false }
	for _, path := range []string{"/healthz", "/v1/records/acme/k", "/nope"} {
		if got := do(t, "GET", n.url+path, nil, nil).header.Values(api.HeaderLeader); len(got) != 1 || got[0] != "10.0.0.2:7420" {
			t.Errorf("GET %s after the leader changed: %s = %q", path, api.HeaderLeader, got)
		}
	}
	fake.LeaderFunc = func() (string, bool) { return "", false }
	if got := do(t, "GET", n.url+"/healthz", nil, nil).header.Values(api.HeaderLeader); len(got) != 0 {
		t.Errorf("no leader known, but %s = %q", api.HeaderLeader, got)
	}
}

func TestUnknownRoutesAnswerInTheErrorShape(t *testing.T) {
	n := startNode(t, &FakeStore{}, nil)
	do(t, "GET", n.url+"/v2/whatever", nil, nil).wantError(t, http.StatusNotFound, idemkv.CodeNotFound, "")
	r := do(t, "GET", n.url+"/v1/reserve", nil, nil)
	r.wantError(t, http.StatusMethodNotAllowed, idemkv.CodeInvalidArgument, "")
	if allow := r.header.Get("Allow"); allow != "POST" {
		t.Errorf("Allow %q, want POST", allow)
	}
	if n.fake.Calls() != 0 {
		t.Errorf("store called %d times", n.fake.Calls())
	}
}

func TestNewHTTPServerTimeouts(t *testing.T) {
	h := http.NotFoundHandler()
	s := api.NewHTTPServer("127.0.0.1:0", h)
	if s.Addr != "127.0.0.1:0" || s.Handler == nil {
		t.Errorf("addr %q handler %v", s.Addr, s.Handler)
	}
	if s.ReadHeaderTimeout != 5*time.Second || s.ReadTimeout != 30*time.Second || s.IdleTimeout != 120*time.Second ||
		s.MaxHeaderBytes != 64<<10 {
		t.Errorf("timeouts %v %v %v, max header %d", s.ReadHeaderTimeout, s.ReadTimeout, s.IdleTimeout, s.MaxHeaderBytes)
	}
	// The longest long-poll must end before the server cuts the answer off.
	if s.WriteTimeout != idemkv.MaxWait+30*time.Second || s.WriteTimeout <= idemkv.MaxWait+api.DefaultForwardTimeout {
		t.Errorf("WriteTimeout %v does not leave room for a %v long-poll forwarded with %v",
			s.WriteTimeout, idemkv.MaxWait, api.DefaultForwardTimeout)
	}
}

// TestToolLabelsAreBounded: the tool label comes from requests; 1,000 made-up tool
// names made 1,000 series that lived until restart (issue 13, defect 9). Past the cap
// they count as "other".
func TestToolLabelsAreBounded(t *testing.T) {
	fake := &FakeStore{ReserveFunc: func(_ context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
		return &idemkv.ReserveResult{Decision: idemkv.DecisionExecute, Fence: 1, Record: pendingRecord(req.Key)}, nil
	}}
	const max = 10
	n := startNode(t, fake, func(c *api.Config) { c.Metrics.Tools.SetMax(max, max) })
	const sent = 1000
	for i := range sent {
		do(t, "POST", n.url+"/v1/reserve", with(validReserve(), "tool", fmt.Sprintf("tool-%d", i)), nil).object(t, http.StatusOK)
	}
	tools := decisionsByTool(t, n)
	if len(tools) != max+1 {
		t.Errorf("%d tool series, want %d and other", len(tools), max)
	}
	if tools["tool-0"] != 1 || tools["other"] != sent-max {
		t.Errorf("tool-0 counted %v, other %v; want 1 and %d", tools["tool-0"], tools["other"], sent-max)
	}
}

// decisionsByTool sums the node's reserve decisions by their tool label.
func decisionsByTool(t *testing.T, n *testNode) map[string]float64 {
	t.Helper()
	families, err := n.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	tools := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "idemkv_decisions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "tool" {
					tools[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return tools
}

// TestOneTenantCannotTakeEveryToolLabel: with a cap in all only, one tenant sending
// made-up tool names took every series, and every other tenant's tools counted as
// "other" until restart (issue 22, point 9). A tenant claims at most its share; a name
// one tenant claimed counts for every tenant.
func TestOneTenantCannotTakeEveryToolLabel(t *testing.T) {
	fake := &FakeStore{ReserveFunc: func(_ context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
		return &idemkv.ReserveResult{Decision: idemkv.DecisionExecute, Fence: 1, Record: pendingRecord(req.Key)}, nil
	}}
	const max, perTenant = 10, 4
	n := startNode(t, fake, func(c *api.Config) { c.Metrics.Tools.SetMax(max, perTenant) })
	reserve := func(tenant, tool string) {
		t.Helper()
		do(t, "POST", n.url+"/v1/reserve", with(validReserve(), "tenant", tenant, "tool", tool), nil).object(t, http.StatusOK)
	}
	for i := range 1000 {
		reserve("hostile", fmt.Sprintf("made-up-%d", i))
	}
	for _, tool := range []string{"create_ticket", "send_email", "refund"} {
		reserve("acme", tool)
	}
	reserve("beta", "made-up-0") // claimed by another tenant: its series, no claim of beta's
	for _, tool := range []string{"t1", "t2", "t3", "t4", "t5"} {
		reserve("beta", tool)
	}
	tools := decisionsByTool(t, n)
	for _, tool := range []string{"create_ticket", "send_email", "refund", "t1", "t2", "t3"} {
		if tools[tool] != 1 {
			t.Errorf("%s counted %v under its own name, want 1; series: %v", tool, tools[tool], tools)
		}
	}
	if tools["made-up-0"] != 2 || tools["made-up-3"] != 1 || tools["made-up-4"] != 0 {
		t.Errorf("the hostile tenant's first names counted %v, %v, %v; want 2, 1 and no series past its share of %d",
			tools["made-up-0"], tools["made-up-3"], tools["made-up-4"], perTenant)
	}
	// beta's fifth new name is past the cap in all (4 + 3 + 3 = 10).
	if tools["t4"] != 0 || tools["t5"] != 0 || tools["other"] != 1000-perTenant+2 {
		t.Errorf("past the cap in all: t4 %v, t5 %v, other %v; want 0, 0 and %d", tools["t4"], tools["t5"], tools["other"], 1000-perTenant+2)
	}
	if len(tools) != max+1 {
		t.Errorf("%d tool series, want %d and other: %v", len(tools), max, tools)
	}
}

// The API checks and fills requests with the limits the store enforces, not with a
// copy of its own: a node configured for two-hour leases accepts a 90-minute lease,
// and a reserve without one gets the node's default.
func TestLimitsComeFromTheStore(t *testing.T) {
	var got idemkv.ReserveRequest
	fake := &FakeStore{
		LimitsValue: idemkv.Limits{MaxLeaseTTL: 2 * time.Hour, DefaultLeaseTTL: 45 * time.Second},
		ReserveFunc: func(_ context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
			got = *req
			rec := pendingRecord(req.Key)
			return &idemkv.ReserveResult{Decision: idemkv.DecisionExecute, Fence: rec.Fence, AttemptID: rec.AttemptID,
				LeaseExpiresAt: rec.LeaseExpiresAt, Record: rec}, nil
		},
	}
	n := startNode(t, fake, nil)

	long := validReserve()
	long["lease_ttl_ms"] = 90 * 60_000
	do(t, "POST", n.url+"/v1/reserve", long, nil).object(t, http.StatusOK)
	if got.LeaseTTLMs != 90*60_000 {
		t.Errorf("store got lease %d, want 5400000", got.LeaseTTLMs)
	}
	do(t, "POST", n.url+"/v1/reserve", validReserve(), nil).object(t, http.StatusOK)
	if got.LeaseTTLMs != 45_000 {
		t.Errorf("store got default lease %d, want the store's 45000", got.LeaseTTLMs)
	}
	long["lease_ttl_ms"] = 2*3_600_000 + 1
	do(t, "POST", n.url+"/v1/reserve", long, nil).wantError(t, http.StatusBadRequest, idemkv.CodeInvalidArgument, "lease_ttl_ms")
}
