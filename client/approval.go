package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/telemetry/semconv"
)

// Approvals bound to the effect (docs/protocol.md "Approvals"), as Do and the HTTP
// client see them.

type (
	// Approval is the approval a record asked for, and its decision once there is one.
	Approval = idemkv.Approval
	// ApprovalRule makes a tenant's tool require approval whatever the request says.
	ApprovalRule = idemkv.ApprovalRule
)

// DecisionNeedsApproval answers a reserve whose effect waits for an approval.
const DecisionNeedsApproval = idemkv.DecisionNeedsApproval

// ApprovalRequirement is what an Op asks of approvals. A non-nil one also makes Do send
// the effect itself, which a record that waits for approval keeps for the approver:
// give one (Required may be false) for a tool an admin's rule may hold.
type ApprovalRequirement struct {
	// Required asks for a person's approval before the effect runs.
	Required bool
	// TTL is how long the request waits for a decision before it lapses; zero: the
	// server's default (24 h).
	TTL time.Duration
	// Summary is what the approver reads beside the effect (at most 1 KiB).
	Summary string
	// Wait bounds how long Do waits for the decision (long-polls that wake on it).
	// Zero: Do returns an *ApprovalPendingError at once, for runtimes that suspend
	// and call Do again (with the same key and effect) once they are resumed.
	Wait time.Duration
}

// KindApprovalPending is the kind of *ApprovalPendingError.
const KindApprovalPending = "approval_pending"

// ErrApprovalPending: the effect waits for an approval; nothing ran. Call Do again
// with the same key and effect once it is decided: the same request is seen, never a
// second one (*ApprovalPendingError). A denial comes back from that Do as a
// *StoredFailureError whose receipt's error code is idemkv.CodeApprovalDenied.
var ErrApprovalPending = errors.New("idemkv: waiting for approval")

// ApprovalPendingError says the effect waits for an approval: ApprovalID names the
// request to decide (idemkv approvals approve TENANT KEY --id ...), Approval and
// Record what the store holds.
type ApprovalPendingError struct {
	Tenant     string
	Key        string
	ApprovalID string
	Approval   *idemkv.Approval
	Record     *idemkv.Record
	// Cause is set when the wait for the decision ended for another reason than its
	// bound (the caller's context).
	Cause error
}

func (e *ApprovalPendingError) Error() string {
	msg := fmt.Sprintf("idemkv: %q (tenant %q) waits for approval %s", e.Key, e.Tenant, e.ApprovalID)
	if e.Approval != nil {
		msg += " (requested " + e.Approval.RequestedAt.String() + ", lapses " + e.Approval.ExpiresAt.String() + ")"
	}
	return msg + suffix(e.Cause)
}

func (e *ApprovalPendingError) Unwrap() []error { return unwrapKind(ErrApprovalPending, e.Cause) }

// IsApprovalDenied reports whether err from Do is the replayed denial of an approval.
func IsApprovalDenied(err error) bool {
	var sf *StoredFailureError
	return errors.As(err, &sf) && sf.Receipt != nil && sf.Receipt.Error != nil && sf.Receipt.Error.Code == idemkv.CodeApprovalDenied
}

// reserveRequest is the reserve Do sends for its op: with the approval ask and the
// effect's canonical JSON when the op has an ApprovalRequirement.
func (x *run) reserveRequest() (*idemkv.ReserveRequest, error) {
	op := &x.op
	req := &idemkv.ReserveRequest{
		Tenant:      op.Tenant,
		Key:         op.Key,
		Tool:        op.Tool,
		Actor:       op.Actor,
		Fingerprint: x.fp,
		AttemptID:   op.AttemptID,
		LeaseTTLMs:  op.LeaseTTL.Milliseconds(),
		TTLMs:       op.TTL.Milliseconds(),
		SideEffect:  string(op.Class),
	}
	a := op.Approval
	if a == nil {
		return req, nil
	}
	if a.Required || a.TTL != 0 || a.Summary != "" {
		req.Approval = &idemkv.ApprovalAsk{Required: a.Required, TTLMs: a.TTL.Milliseconds(), Summary: a.Summary}
	}
	if op.Effect == nil {
		if a.Required {
			return nil, idemkv.Invalid("effect", "an op that requires approval needs its Effect, not only a fingerprint: the approver approves what they can read")
		}
		return req, nil
	}
	canonical, err := x.canonicalEffect()
	if err != nil {
		return nil, err
	}
	req.Effect = canonical
	return req, nil
}

// canonicalEffect is the RFC 8785 form of the op's effect, Drop paths removed: the
// bytes the fingerprint was computed from.
func (x *run) canonicalEffect() ([]byte, error) {
	var data []byte
	switch e := x.op.Effect.(type) {
	case json.RawMessage:
		data = e
	case []byte:
		data = e
	default:
		b, err := json.Marshal(e)
		if err != nil {
			return nil, idemkv.Invalid("effect", "effect: %v", err)
		}
		data = b
	}
	c, err := fingerprint.CanonicalizeWithout(data, x.op.Drop...)
	if err != nil {
		return nil, idemkv.Invalid("effect", "effect: %v", err)
	}
	if fingerprint.Sum(c) != x.fp {
		return nil, idemkv.Errorf(idemkv.ErrInternal, "the canonical effect does not match its fingerprint %s", x.fp)
	}
	return c, nil
}

// awaitApproval waits for the decision on res's approval, up to the op's Wait: the
// caller then reserves again and gets execute (approved), a replay of the denial, or
// a new request (lapsed). Without a Wait, or once it is spent, the answer is an
// *ApprovalPendingError.
func (x *run) awaitApproval(ctx context.Context, res *idemkv.ReserveResult, deadline *time.Time) error {
	pending := &ApprovalPendingError{Tenant: x.op.Tenant, Key: x.op.Key, Approval: res.Approval, Record: res.Record}
	if res.Approval != nil {
		pending.ApprovalID = res.Approval.ID
	}
	x.span.AddEvent("approval_pending", trace.WithAttributes(attribute.String("idemkv.approval.id", pending.ApprovalID)))
	if x.op.Approval == nil || x.op.Approval.Wait <= 0 {
		return pending
	}
	if deadline.IsZero() {
		*deadline = time.Now().Add(x.op.Approval.Wait)
	}
	wait := min(time.Until(*deadline), idemkv.MaxWait)
	if wait <= 0 {
		return pending
	}
	left := x.cfg.StoreWait - x.waited
	if left <= 0 {
		return &storeWaitError{what: "get", waited: x.waited, last: idemkv.Errorf(idemkv.ErrUnavailable, "no answer yet")}
	}
	// The long-poll may take its whole wait; only the time past it is the store's
	// (a store that hangs would otherwise hold each of the client's attempts for the
	// whole wait again).
	gctx, cancel := context.WithTimeoutCause(ctx, wait+left, errStoreWait)
	defer cancel()
	start := time.Now()
	rec, err := x.store.Get(gctx, &idemkv.GetRequest{Tenant: x.op.Tenant, Key: x.op.Key, Wait: wait})
	pause := func(d time.Duration) error {
		if sleep(ctx, d) != nil {
			pending.Cause = context.Cause(ctx)
			return pending
		}
		return nil
	}
	switch {
	case ctx.Err() != nil:
		pending.Cause = context.Cause(ctx)
		return pending
	case err == nil && rec.Status == idemkv.StatusAwaitingApproval && rec.Approval.Waiting(idemkv.TimestampOf(time.Now())) && time.Since(start) < wait/2:
		// Still waiting, and the long-poll ended early: do not spin.
		return pause(x.cfg.BackoffMax)
	case err == nil, errors.Is(err, idemkv.ErrNotFound):
		return nil
	case retryable(err) || gctx.Err() != nil:
		// A store that does not answer (or sheds long-polls: resource_exhausted) is
		// waited for as the in_progress wait waits for it: backing off, within
		// StoreWait, not reserving again at once.
		x.waited += max(time.Since(start)-wait, 0)
		d := min(x.cfg.BackoffMax, max(x.cfg.StoreWait-x.waited, 0))
		if err := pause(d); err != nil {
			return err
		}
		x.waited += d
		if x.waited >= x.cfg.StoreWait {
			return &storeWaitError{what: "get", waited: x.waited, last: err}
		}
		return nil
	default:
		return err
	}
}

// DecideApproval approves or denies the approval a record waits for; the answer is
// the record. It takes an approver (or admin) token. When an earlier attempt of this
// call may have reached the server, not_pending for a decision that is exactly this
// one is reported as success.
func (c *Client) DecideApproval(ctx context.Context, req *idemkv.DecideApprovalRequest) (*idemkv.Record, error) {
	var out idemkv.Record
	cl := call{
		method: http.MethodPost,
		route:  "/v1/approvals/{tenant}/{key}",
		path:   "/v1/approvals/" + escapeSegment(req.Tenant) + "/" + escapeSegment(req.Key),
		body:   req,
		attrs:  keyAttrs(req.Tenant, req.Key),
	}
	retried, err := c.do(ctx, cl, &out)
	if err != nil && retried && errors.Is(err, idemkv.ErrNotPending) {
		rec, gerr := c.Get(ctx, &idemkv.GetRequest{Tenant: req.Tenant, Key: req.Key})
		if gerr == nil && rec.Approval != nil && rec.Approval.ID == req.ApprovalID && idemkv.ApproverNamed(rec.Approval.Approver, req.Approver) &&
			rec.Approval.Reason == req.Reason && rec.Approval.State == verdictState(req.Decision) {
			return rec, nil
		}
	}
	if err != nil {
		return nil, err
	}
	return &out, nil
}

func verdictState(v idemkv.ApprovalVerdict) idemkv.ApprovalState {
	if v == idemkv.VerdictDeny {
		return idemkv.ApprovalDenied
	}
	return idemkv.ApprovalApproved
}

// Approvals pages through a tenant's waiting approvals, oldest first.
func (c *Client) Approvals(ctx context.Context, req *idemkv.ApprovalsRequest) (*idemkv.ApprovalsResult, error) {
	q := url.Values{"tenant": {req.Tenant}}
	pageQuery(q, req.Limit, req.After, req.Consistency)
	var out idemkv.ApprovalsResult
	cl := call{method: http.MethodGet, route: "/v1/approvals", path: "/v1/approvals", query: q,
		attrs: []attribute.KeyValue{semconv.Tenant.String(req.Tenant)}, listing: true}
	if _, err := c.do(ctx, cl, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetApprovalRule sets (or, with Remove, deletes) a rule; it takes an admin token. The
// answer is the tenant's rules.
func (c *Client) SetApprovalRule(ctx context.Context, req *idemkv.SetApprovalRuleRequest) (*idemkv.ApprovalRules, error) {
	var out idemkv.ApprovalRules
	if _, err := c.do(ctx, call{method: http.MethodPost, route: "/v1/approval-rules", path: "/v1/approval-rules", body: req}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ApprovalRules lists a tenant's rules.
func (c *Client) ApprovalRules(ctx context.Context, tenant string) (*idemkv.ApprovalRules, error) {
	var out idemkv.ApprovalRules
	cl := call{method: http.MethodGet, route: "/v1/approval-rules", path: "/v1/approval-rules", query: url.Values{"tenant": {tenant}}}
	if _, err := c.do(ctx, cl, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
