package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/auth"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
)

// loseDecisions delivers every decision and loses the answer of the first lose of
// them, as a connection reset after the server applied it.
type loseDecisions struct {
	base    http.RoundTripper
	lose    int32
	dropped atomic.Int32
}

func (t *loseDecisions) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if err == nil && r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/approvals/") && t.dropped.Add(1) <= t.lose {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil, errors.New("connection reset by peer (the answer was lost)")
	}
	return resp, err
}

// A decision whose answer is lost is sent again; the retry meets not_pending, and the
// client looks at the decision on record to see whether it is its own. Under tokens the
// record names the token besides the person ("ana (approver)", "cfo-alice via ana
// (approver)"), and the client compared it with the bare name: its own decision was
// reported as someone else's. A decision that took effect and whose every answer was
// lost was reported unavailable, which says it certainly did not.
func TestDecisionAnswersLostUnderTokens(t *testing.T) {
	const approverToken, agentToken = "idk_ana", "idk_agent"
	f, err := auth.Parse([]byte(`{"tokens":[
		{"name":"ana","hash":"` + auth.HashToken(approverToken) + `","role":"approver","tenants":["shop"]},
		{"name":"agent","hash":"` + auth.HashToken(agentToken) + `","role":"client","tenants":["shop"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := testcluster.Start(t, 1, testcluster.WithAPIMiddleware(a.Middleware))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	agent, err := client.New(client.Config{Endpoints: []string{c.Endpoint(0)}, Token: agentToken})
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	ask := func(key string) *idemkv.ReserveResult {
		t.Helper()
		res, err := agent.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "shop", Key: key, Tool: "refund", Actor: "agent-1",
			Effect: json.RawMessage(`{"order":17,"eur":40}`), Approval: &idemkv.ApprovalAsk{Required: true, Summary: "Refund 40 EUR"}})
		if err != nil || res.Decision != idemkv.DecisionNeedsApproval {
			t.Fatalf("reserve %s: %v %+v", key, err, res)
		}
		return res
	}
	decider := func(lose int32) *client.Client {
		cl, err := client.New(client.Config{Endpoints: []string{c.Endpoint(0)}, Token: approverToken, MaxAttempts: 3,
			HTTPClient: &http.Client{Transport: &loseDecisions{base: http.DefaultTransport, lose: lose}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	for i, named := range []string{"ana", "cfo-alice", strings.Repeat("é", 64)} {
		key := fmt.Sprintf("order-17:%d", i)
		res := ask(key)
		rec, err := decider(1).DecideApproval(ctx, &idemkv.DecideApprovalRequest{Tenant: "shop", Key: key,
			ApprovalID: res.Approval.ID, Fingerprint: res.Record.Fingerprint, Decision: idemkv.VerdictApprove, Approver: named, Reason: "ok"})
		if err != nil || rec.Approval.State != idemkv.ApprovalApproved {
			t.Errorf("approver %q: the decision took effect and its retry said: %v", named, err)
		}
	}
	// Someone else's decision is still not this one.
	res := ask("order-17:other")
	if _, err := decider(0).DecideApproval(ctx, &idemkv.DecideApprovalRequest{Tenant: "shop", Key: "order-17:other",
		ApprovalID: res.Approval.ID, Fingerprint: res.Record.Fingerprint, Decision: idemkv.VerdictApprove, Approver: "bob"}); err != nil {
		t.Fatal(err)
	}
	if _, err := decider(1).DecideApproval(ctx, &idemkv.DecideApprovalRequest{Tenant: "shop", Key: "order-17:other",
		ApprovalID: res.Approval.ID, Fingerprint: res.Record.Fingerprint, Decision: idemkv.VerdictApprove, Approver: "ana"}); !errors.Is(err, idemkv.ErrNotPending) {
		t.Errorf("approving what bob approved: %v, want not_pending", err)
	}

	res = ask("order-17:lost")
	_, err = decider(100).DecideApproval(ctx, &idemkv.DecideApprovalRequest{Tenant: "shop", Key: "order-17:lost",
		ApprovalID: res.Approval.ID, Fingerprint: res.Record.Fingerprint, Decision: idemkv.VerdictDeny, Approver: "ana"})
	got, gerr := agent.Get(ctx, &idemkv.GetRequest{Tenant: "shop", Key: "order-17:lost"})
	if gerr != nil || got.Approval.State != idemkv.ApprovalDenied {
		t.Fatalf("the denial whose answers were lost: %+v, %v", got, gerr)
	}
	if errors.Is(err, idemkv.ErrUnavailable) || !errors.Is(err, idemkv.ErrOutcomeUnknown) {
		t.Errorf("a denial that took effect, every answer lost: %v, want outcome_unknown and not unavailable", err)
	}
}

// A call whose caller gives up after an attempt that may have been applied says so,
// whatever the attempts after it met: the first node took the decision and lost the
// answer, the second said unavailable, and the caller's context ended in the backoff;
// the error was the second's unavailable, certainly not applied.
func TestGivingUpKeepsAnUnknownAttempt(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close() // received, perhaps applied, never answered
	}))
	defer a.Close()
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"code":"unavailable","message":"no leader"}`))
		time.AfterFunc(50*time.Millisecond, cancel)
	}))
	defer b.Close()
	c, err := client.New(client.Config{Endpoints: []string{a.URL, b.URL}, MaxAttempts: 3,
		BackoffMin: 300 * time.Millisecond, BackoffMax: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.DecideApproval(ctx, &idemkv.DecideApprovalRequest{Tenant: "t", Key: "k", ApprovalID: "apr_1",
		Fingerprint: "sha256:" + strings.Repeat("0", 64), Decision: idemkv.VerdictDeny, Approver: "ana"})
	if errors.Is(err, idemkv.ErrUnavailable) || !errors.Is(err, idemkv.ErrOutcomeUnknown) || !errors.Is(err, context.Canceled) {
		t.Fatalf("an attempt may have been applied, then the caller gave up: %v (code %s)", err, idemkv.CodeOf(err))
	}
}
