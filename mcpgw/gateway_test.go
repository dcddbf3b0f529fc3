package mcpgw_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/mcpgw"
)

// ticketPolicy protects create_ticket with a key template over the incident and a
// probe through find_ticket, with a one-second lease so that recovery is quick.
func ticketPolicy(tenant string) string {
	return fmt.Sprintf(`
tenant: %s
lease_ttl: 1s
tools:
  create_ticket:
    key: "{tenant}:{incident_id}:create_ticket"
    volatile: [trace_id]
    remote_id: ticket_id
    remote_url: url
    probe:
      tool: find_ticket
      arguments: {incident_id: "{incident_id}", title: "{title}"}
      found: found
      result: ticket
`, tenant)
}

func ticketArgs(incident, title string) map[string]any {
	return map[string]any{"incident_id": incident, "title": title, "severity": "high", "trace_id": "trace-" + title}
}

// TestGateway runs in both eras: a go-sdk agent of 2026-07-28 (stateless requests)
// and one of 2025-11-25 (initialize and a session), through the gateway's own HTTP
// handler, each against its own idemkv.
func TestGateway(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) { testGateway(t, era) })
	}
}

func testGateway(t *testing.T, era string) {
	cluster := testcluster.Start(t, 1)

	t.Run("ToolsListedUnchanged", func(t *testing.T) {
		e := newEnv(t, cluster, envOptions{era: era, policy: ticketPolicy("tools")})
		viaGateway := e.connect("agent")
		direct := mcp.NewClient(&mcp.Implementation{Name: "direct"}, nil)
		cmd := exec.Command(ticketServer(t), "--state", e.state)
		cmd.Stderr = testlog.NewWriter(t, "direct ticketserver: ")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ds, err := direct.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ds.Close()
		want, err := ds.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := viaGateway.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Tools) != 5 {
			t.Fatalf("the gateway lists %d tools, want the upstream's 5", len(got.Tools))
		}
		if !reflect.DeepEqual(jsonOf(t, got.Tools), jsonOf(t, want.Tools)) {
			t.Fatalf("tools differ:\n gateway  %s\n upstream %s", jsonOf(t, got.Tools), jsonOf(t, want.Tools))
		}
		for tool, class := range map[string]client.Class{
			"create_ticket": client.NonIdempotentMutation, "add_comment": client.NonIdempotentMutation,
			"close_ticket": client.IdempotentMutation, "find_ticket": client.ReadOnly, "list_tickets": client.ReadOnly,
		} {
			if got, _ := e.gw.Class(tool); got != class {
				t.Errorf("%s classified %s, want %s", tool, got, class)
			}
		}
	})

	t.Run("ExamplePolicy", func(t *testing.T) {
		data, err := os.ReadFile("../examples/mcp/policy.yaml")
		if err != nil {
			t.Fatal(err)
		}
		e := newEnv(t, cluster, envOptions{era: era, policy: string(data)})
		s := e.connect("agent")
		first := e.call(s, "create_ticket", ticketArgs("INC-1", "db down"), nil)
		second := e.call(s, "create_ticket", ticketArgs("INC-1", "db down again"), nil)
		ticket := sc(t, first)["ticket_id"]
		closed := e.call(s, "close_ticket", map[string]any{"ticket_id": ticket}, nil)
		comment := e.call(s, "add_comment", map[string]any{"ticket_id": ticket, "text": "hi"}, nil)
		reissued := e.call(s, "add_comment", map[string]any{"ticket_id": ticket, "text": "hi"}, nil)
		other := e.call(s, "add_comment", map[string]any{"ticket_id": ticket, "text": "bye"}, nil)
		switch {
		case meta(first, mcpgw.MetaDecision) != "execute":
			t.Fatalf("create_ticket: %s", show(first))
		case meta(second, mcpgw.MetaError) != mcpgw.CodeConflict:
			t.Fatalf("another title for the same incident: want a conflict, got %s", show(second))
		case closed.IsError || meta(closed, mcpgw.MetaIdempotencyKey) != fmt.Sprintf("demo:%v:close_ticket", ticket):
			t.Fatalf("close_ticket: %s", show(closed))
		case meta(comment, mcpgw.MetaDecision) != "execute" || meta(reissued, mcpgw.MetaDecision) != "replay" ||
			meta(other, mcpgw.MetaDecision) != "execute":
			t.Fatalf("add_comment without a key (key: derive): %s, its re-issue %s, another comment %s, want execute, replay, execute",
				show(comment), show(reissued), show(other))
		}
		if n := len(e.upstream().Comments); n != 2 {
			t.Fatalf("the ticketserver holds %d comments, want 2 (hi once, bye)", n)
		}
		if rec := e.record("demo:INC-1:create_ticket"); rec.Receipt.RemoteURL != "https://tickets.example/"+ticket.(string) {
			t.Fatalf("receipt %+v, want the ticket's URL", rec.Receipt)
		}
	})

	t.Run("DuplicateCallCreatesOneTicket", func(t *testing.T) {
		e := newEnv(t, cluster, envOptions{era: era, policy: ticketPolicy("dup")})
		s := e.connect("agent")
		first := e.call(s, "create_ticket", ticketArgs("INC-1", "db down"), nil)
		if first.IsError {
			t.Fatalf("first call failed: %s", show(first))
		}
		// The retry differs only in a volatile field.
		args := ticketArgs("INC-1", "db down")
		args["trace_id"] = "another-trace"
		second := e.call(s, "create_ticket", args, nil)

		if d := meta(first, mcpgw.MetaDecision); d != "execute" {
			t.Errorf("first decision %q, want execute", d)
		}
		if d := meta(second, mcpgw.MetaDecision); d != "replay" {
			t.Errorf("second decision %q, want replay", d)
		}
		if !reflect.DeepEqual(sc(t, first), sc(t, second)) || text(first) != text(second) {
			t.Errorf("the replay differs:\n first  %s\n second %s", show(first), show(second))
		}
		st := e.upstream()
		if len(st.Tickets) != 1 || st.CreateCalls != 1 {
			t.Fatalf("upstream has %d tickets after %d create calls, want 1 and 1", len(st.Tickets), st.CreateCalls)
		}
		rec := e.record("dup:INC-1:create_ticket")
		if rec.Status != idemkv.StatusCommitted || rec.Receipt.RemoteID != st.Tickets[0].TicketID ||
			rec.Receipt.RemoteSystem != "ticketserver" || rec.Tool != "create_ticket" || rec.Actor != "agent" {
			t.Fatalf("record %+v receipt %+v, want committed ticketserver %s by agent", rec, rec.Receipt, st.Tickets[0].TicketID)
		}
	})

	t.Run("ConcurrentSessionsCreateOneTicket", func(t *testing.T) {
		// create_ticket takes 300 ms, so the second call arrives while the first runs.
		e := newEnv(t, cluster, envOptions{era: era, policy: ticketPolicy("conc"), delay: 300 * time.Millisecond})
		sessions := []*mcp.ClientSession{e.connect("agent-a"), e.connect("agent-b")}
		results := make([]*mcp.CallToolResult, 2)
		var wg sync.WaitGroup
		for i, s := range sessions {
			wg.Go(func() {
				res, err := e.callErr(s, "create_ticket", ticketArgs("INC-7", "disk full"),
					mcp.Meta{mcpgw.MetaIdempotencyKey: "conversation_9:approval_17:create_ticket"})
				if err != nil {
					t.Errorf("session %d: %v", i, err)
					return
				}
				results[i] = res
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		decisions := map[string]int{}
		for i, res := range results {
			if res.IsError {
				t.Fatalf("session %d got an error: %s", i, show(res))
			}
			decisions[meta(res, mcpgw.MetaDecision)]++
		}
		if decisions["execute"] != 1 || decisions["replay"] != 1 {
			t.Errorf("decisions %v, want one execute and one replay", decisions)
		}
		if !reflect.DeepEqual(sc(t, results[0]), sc(t, results[1])) {
			t.Errorf("the sessions got different results:\n %s\n %s", show(results[0]), show(results[1]))
		}
		if st := e.upstream(); len(st.Tickets) != 1 || st.CreateCalls != 1 {
			t.Fatalf("upstream has %d tickets after %d create calls, want 1 and 1", len(st.Tickets), st.CreateCalls)
		}
	})

	t.Run("SameKeyDifferentArgumentsConflict", func(t *testing.T) {
		e := newEnv(t, cluster, envOptions{era: era, policy: ticketPolicy("conflict")})
		s := e.connect("agent")
		first := e.call(s, "create_ticket", ticketArgs("INC-2", "api slow"), nil)
		// Same incident, so the same key from the template, but another title.
		second := e.call(s, "create_ticket", ticketArgs("INC-2", "api very slow"), nil)
		if !second.IsError || meta(second, mcpgw.MetaError) != mcpgw.CodeConflict || meta(second, mcpgw.MetaDecision) != "conflict" {
			t.Fatalf("want a conflict tool error, got %s", show(second))
		}
		if second.StructuredContent != nil {
			t.Fatalf("the gateway's error went into structuredContent: %s", show(second))
		}
		c := details(t, second)
		ticket := sc(t, first)["ticket_id"]
		if c["status"] != "conflict" || c["reason"] != idemkv.ReasonDifferentEffect ||
			c["existing_fingerprint"] != meta(first, mcpgw.MetaFingerprint) ||
			c["received_fingerprint"] == c["existing_fingerprint"] || c["existing_remote_id"] != ticket {
			t.Fatalf("conflict %v, want the conflict shape of docs/protocol.md against %s (%v)", c, meta(first, mcpgw.MetaFingerprint), ticket)
		}
		// An explicit key reused by another tool is a conflict too.
		third := e.call(s, "close_ticket", map[string]any{"ticket_id": ticket}, mcp.Meta{mcpgw.MetaIdempotencyKey: "conflict:INC-2:create_ticket"})
		if c := details(t, third); meta(third, mcpgw.MetaError) != mcpgw.CodeConflict || c["reason"] != idemkv.ReasonDifferentTool {
			t.Fatalf("want a different-tool conflict, got %s", show(third))
		}
		if st := e.upstream(); len(st.Tickets) != 1 || st.CreateCalls != 1 {
			t.Fatalf("upstream has %d tickets after %d create calls, want 1 and 1", len(st.Tickets), st.CreateCalls)
		}
	})

	t.Run("ReadOnlyToolsAreNotRecorded", func(t *testing.T) {
		e := newEnv(t, cluster, envOptions{era: era, policy: ticketPolicy("ro")})
		s := e.connect("agent")
		before := e.call(s, "list_tickets", nil, mcp.Meta{mcpgw.MetaIdempotencyKey: "list-1"})
		e.call(s, "create_ticket", ticketArgs("INC-3", "cpu hot"), nil)
		after := e.call(s, "list_tickets", nil, mcp.Meta{mcpgw.MetaIdempotencyKey: "list-1"})
		found := e.call(s, "find_ticket", map[string]any{"incident_id": "INC-3"}, nil)
		if n := sc(t, before)["count"]; n != 0.0 {
			t.Fatalf("first list counts %v tickets, want 0", n)
		}
		if n := sc(t, after)["count"]; n != 1.0 {
			t.Fatalf("second list counts %v tickets, want 1: a read-only call must not be replayed", n)
		}
		if sc(t, found)["found"] != true {
			t.Fatalf("find_ticket: %s", show(found))
		}
		for _, res := range []*mcp.CallToolResult{before, after, found} {
			if _, ok := res.Meta[mcpgw.MetaDecision]; ok {
				t.Errorf("a read-only result carries a decision: %s", show(res))
			}
		}
		recs := e.records()
		if len(recs) != 1 || recs[0].Tool != "create_ticket" {
			t.Fatalf("idemkv holds %d records (%v), want only create_ticket's", len(recs), recs)
		}
	})

	t.Run("UpstreamKilledAfterCreateRecoversThroughProbe", func(t *testing.T) {
		e := newEnv(t, cluster, envOptions{era: era, policy: ticketPolicy("crash")})
		s := e.connect("agent")
		if err := os.WriteFile(e.crash, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		first := e.call(s, "create_ticket", ticketArgs("INC-4", "queue stuck"), nil)
		if !first.IsError || meta(first, mcpgw.MetaError) != mcpgw.CodeOutcomeUnknown {
			t.Fatalf("the call the upstream died in: want an outcome_unknown tool error, got %s", show(first))
		}
		st := e.upstream()
		if len(st.Tickets) != 1 {
			t.Fatalf("the upstream stored %d tickets before dying, want 1", len(st.Tickets))
		}
		if rec := e.record("crash:INC-4:create_ticket"); rec.Status != idemkv.StatusPending {
			t.Fatalf("after the crash the record is %s, want pending", rec.Status)
		}

		// The retry waits out the dead attempt's lease, then asks find_ticket.
		retry := e.call(s, "create_ticket", ticketArgs("INC-4", "queue stuck"), nil)
		if retry.IsError || meta(retry, mcpgw.MetaDecision) != "recover" {
			t.Fatalf("retry: want a recovered result, got %s", show(retry))
		}
		if got := sc(t, retry)["ticket_id"]; got != st.Tickets[0].TicketID {
			t.Fatalf("recovered ticket %v, want %s", got, st.Tickets[0].TicketID)
		}
		again := e.call(s, "create_ticket", ticketArgs("INC-4", "queue stuck"), nil)
		if meta(again, mcpgw.MetaDecision) != "replay" || !reflect.DeepEqual(sc(t, again), sc(t, retry)) {
			t.Fatalf("after recovery: want the recovered result replayed, got %s", show(again))
		}
		st = e.upstream()
		if len(st.Tickets) != 1 || st.CreateCalls != 1 {
			t.Fatalf("upstream has %d tickets after %d create calls, want 1 and 1", len(st.Tickets), st.CreateCalls)
		}
		if n := e.spawned(); n != 2 {
			t.Errorf("the upstream was started %d times, want 2 (once more after it died)", n)
		}
		rec := e.record("crash:INC-4:create_ticket")
		if rec.Status != idemkv.StatusCommitted || rec.Attempts != 2 || rec.Receipt.RemoteID != st.Tickets[0].TicketID {
			t.Fatalf("record %+v, want committed after 2 attempts with remote id %s", rec, st.Tickets[0].TicketID)
		}
	})

	t.Run("UpstreamKilledWithoutProbeIsInDoubt", func(t *testing.T) {
		policy := `
tenant: doubt
lease_ttl: 1s
tools:
  create_ticket:
    key: "{tenant}:{incident_id}:create_ticket"
`
		e := newEnv(t, cluster, envOptions{era: era, policy: policy})
		s := e.connect("agent")
		if err := os.WriteFile(e.crash, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		e.call(s, "create_ticket", ticketArgs("INC-5", "dns"), nil)
		retry := e.call(s, "create_ticket", ticketArgs("INC-5", "dns"), nil)
		if !retry.IsError || meta(retry, mcpgw.MetaError) != mcpgw.CodeInDoubt {
			t.Fatalf("want an in_doubt tool error, got %s", show(retry))
		}
		if st := e.upstream(); len(st.Tickets) != 1 || st.CreateCalls != 1 {
			t.Fatalf("upstream has %d tickets after %d create calls, want 1 and 1", len(st.Tickets), st.CreateCalls)
		}
		if rec := e.record("doubt:INC-5:create_ticket"); rec.Status != idemkv.StatusPending || rec.Attempts != 2 {
			t.Fatalf("record %+v, want pending after 2 attempts, for a person to resolve", rec)
		}
	})

	t.Run("UnreachableUpstreamReleasesTheKey", func(t *testing.T) {
		e := newEnv(t, cluster, envOptions{era: era, policy: ticketPolicy("unreachable"), brokenRestart: true})
		s := e.connect("agent")
		e.killUpstream()
		res := e.call(s, "create_ticket", ticketArgs("INC-11", "x"), nil)
		if !res.IsError || meta(res, mcpgw.MetaError) != mcpgw.CodeUpstreamUnavailable || !strings.Contains(text(res), "was not called") {
			t.Fatalf("want an upstream_unavailable tool error, got %s", show(res))
		}
		if _, err := e.idem.Get(context.Background(), &idemkv.GetRequest{Tenant: "unreachable", Key: "unreachable:INC-11:create_ticket"}); !errors.Is(err, idemkv.ErrNotFound) {
			t.Fatalf("nothing ran, so the key must be free again; get: %v", err)
		}
		ro := e.call(s, "list_tickets", nil, nil)
		if !ro.IsError || meta(ro, mcpgw.MetaError) != mcpgw.CodeUpstreamUnavailable {
			t.Fatalf("a read-only call to a dead upstream: %s", show(ro))
		}
	})

	t.Run("ToolErrorsAreStoredAndReplayed", func(t *testing.T) {
		e := newEnv(t, cluster, envOptions{era: era, policy: ticketPolicy("toolerr")})
		s := e.connect("agent")
		args := ticketArgs("INC-6", "bad")
		args["severity"] = "urgent"
		first := e.call(s, "create_ticket", args, nil)
		second := e.call(s, "create_ticket", args, nil)
		for i, res := range []*mcp.CallToolResult{first, second} {
			if !res.IsError || !strings.Contains(text(res), "severity must be") {
				t.Fatalf("call %d: want the upstream's own error, got %s", i+1, show(res))
			}
		}
		if meta(first, mcpgw.MetaDecision) != "execute" || meta(second, mcpgw.MetaDecision) != "replay" {
			t.Fatalf("decisions %q then %q, want execute then replay", meta(first, mcpgw.MetaDecision), meta(second, mcpgw.MetaDecision))
		}
		if st := e.upstream(); st.CreateCalls != 1 {
			t.Fatalf("create_ticket ran %d times, want 1", st.CreateCalls)
		}
		if rec := e.record("toolerr:INC-6:create_ticket"); rec.Status != idemkv.StatusFailed || rec.Error.Code != mcpgw.FailureCode {
			t.Fatalf("record %+v, want failed with %s", rec, mcpgw.FailureCode)
		}
	})

	t.Run("RetryableToolErrorsReleaseTheKey", func(t *testing.T) {
		policy := `
tenant: retryable
tools:
  create_ticket:
    key: "{tenant}:{incident_id}:create_ticket"
    retryable_errors: true
`
		e := newEnv(t, cluster, envOptions{era: era, policy: policy})
		s := e.connect("agent")
		args := ticketArgs("INC-8", "bad")
		args["severity"] = "urgent"
		for i := range 2 {
			if res := e.call(s, "create_ticket", args, nil); !res.IsError || meta(res, mcpgw.MetaDecision) != "execute" {
				t.Fatalf("call %d: want the upstream's error from a fresh execution, got %s", i+1, show(res))
			}
		}
		if st := e.upstream(); st.CreateCalls != 2 {
			t.Fatalf("create_ticket ran %d times, want 2", st.CreateCalls)
		}
		if _, err := e.idem.Get(context.Background(), &idemkv.GetRequest{Tenant: "retryable", Key: "retryable:INC-8:create_ticket"}); !errors.Is(err, idemkv.ErrNotFound) {
			t.Fatalf("the key should have been released, get: %v", err)
		}
		res := e.call(s, "create_ticket", ticketArgs("INC-8", "good"), nil)
		if res.IsError || meta(res, mcpgw.MetaDecision) != "execute" {
			t.Fatalf("after the release the key must execute afresh, got %s", show(res))
		}
	})

	t.Run("MissingKeyIsRefused", func(t *testing.T) {
		e := newEnv(t, cluster, envOptions{era: era, policy: ticketPolicy("nokey")})
		s := e.connect("agent")
		ticket := sc(t, e.call(s, "create_ticket", ticketArgs("INC-9", "x"), nil))["ticket_id"]
		refused := e.call(s, "add_comment", map[string]any{"ticket_id": ticket, "text": "hello"}, nil)
		if !refused.IsError || meta(refused, mcpgw.MetaError) != mcpgw.CodeMissingKey || !strings.Contains(text(refused), mcpgw.MetaIdempotencyKey) {
			t.Fatalf("want a missing-key tool error naming %s, got %s", mcpgw.MetaIdempotencyKey, show(refused))
		}
		// A template that cannot be filled is no key either.
		noIncident := e.call(s, "create_ticket", map[string]any{"title": "t", "severity": "low"}, nil)
		if meta(noIncident, mcpgw.MetaError) != mcpgw.CodeMissingKey || !strings.Contains(text(noIncident), "incident_id") {
			t.Fatalf("want a missing-key error explaining the template, got %s", show(noIncident))
		}
		if st := e.upstream(); len(st.Comments) != 0 || st.CreateCalls != 1 {
			t.Fatalf("refused calls reached the upstream: %d comments, %d create calls", len(st.Comments), st.CreateCalls)
		}
		withKey := e.call(s, "add_comment", map[string]any{"ticket_id": ticket, "text": "hello"}, mcp.Meta{mcpgw.MetaIdempotencyKey: "comment-1"})
		if withKey.IsError || meta(withKey, mcpgw.MetaDecision) != "execute" {
			t.Fatalf("with a key: %s", show(withKey))
		}
	})

	t.Run("MissingKeyPassThroughWhenAllowed", func(t *testing.T) {
		e := newEnv(t, cluster, envOptions{era: era, policy: "tenant: passthrough\nmissing_key: pass_through\n"})
		s := e.connect("agent")
		for range 2 {
			res := e.call(s, "add_comment", map[string]any{"ticket_id": "T-1", "text": "hi"}, nil)
			if res.IsError {
				t.Fatalf("pass-through call failed: %s", show(res))
			}
		}
		if st := e.upstream(); len(st.Comments) != 2 {
			t.Fatalf("upstream has %d comments, want 2 (unprotected calls run every time)", len(st.Comments))
		}
		if recs := e.records(); len(recs) != 0 {
			t.Fatalf("pass-through calls were recorded: %v", recs)
		}
	})

	t.Run("TraceContextFromMetaContinues", func(t *testing.T) {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		e := newEnv(t, cluster, envOptions{era: era, policy: ticketPolicy("trace"), tp: tp})
		s := e.connect("agent")
		const (
			traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
			spanID  = "00f067aa0ba902b7"
		)
		res := e.call(s, "create_ticket", ticketArgs("INC-10", "trace"),
			mcp.Meta{"traceparent": "00-" + traceID + "-" + spanID + "-01"})
		if res.IsError {
			t.Fatalf("call failed: %s", show(res))
		}
		var call, tool sdktrace.ReadOnlySpan
		inTrace := 0
		for _, sp := range rec.Ended() {
			if sp.SpanContext().TraceID().String() == traceID {
				inTrace++
			}
			switch sp.Name() {
			case "tools/call create_ticket":
				call = sp
			case "execute_tool create_ticket":
				tool = sp
			}
		}
		if call == nil || tool == nil {
			t.Fatalf("spans: gateway %v, tool %v", call, tool)
		}
		if call.SpanContext().TraceID().String() != traceID || call.Parent().SpanID().String() != spanID {
			t.Fatalf("gateway span in trace %s under %s, want %s under %s", call.SpanContext().TraceID(), call.Parent().SpanID(), traceID, spanID)
		}
		if tool.Parent().SpanID() != call.SpanContext().SpanID() {
			t.Fatalf("the tool span is not under the gateway's span")
		}
		attrs := map[string]string{}
		for _, a := range call.Attributes() {
			attrs[string(a.Key)] = a.Value.String()
		}
		if attrs["agent.idempotency.decision"] != "execute" || attrs["agent.idempotency.key"] != "trace:INC-10:create_ticket" {
			t.Fatalf("gateway span attributes %v", attrs)
		}
		if inTrace < 3 {
			t.Fatalf("%d spans joined the agent's trace, want the tool span and idemkv's reserve and commit calls", inTrace)
		}
	})
}

// record reads a record of e's tenant from idemkv.
func (e *env) record(key string) *idemkv.Record {
	e.t.Helper()
	rec, err := e.idem.Get(context.Background(), &idemkv.GetRequest{Tenant: e.tenant, Key: key})
	if err != nil {
		e.t.Fatalf("get %s: %v", key, err)
	}
	return rec
}

// records lists every record of e's tenant.
func (e *env) records() []*idemkv.Record {
	e.t.Helper()
	res, err := e.idem.List(context.Background(), &idemkv.ListRequest{Tenant: e.tenant, Limit: idemkv.MaxListLimit})
	if err != nil {
		e.t.Fatal(err)
	}
	return res.Records
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
