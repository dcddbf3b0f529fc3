package client

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/telemetry/semconv"
)

// The low-level calls have exactly the signatures of the node's methods, so that Do
// runs against either through Store. Their errors wrap the sentinels of the root
// package. A failure to reach any node wraps idemkv.ErrUnavailable (certainly not
// applied); a write that was sent and whose answer never came back wraps
// idemkv.ErrOutcomeUnknown (it may have been applied; repeating it is safe).

func keyAttrs(tenant, key string) []attribute.KeyValue {
	return []attribute.KeyValue{semconv.Tenant.String(tenant), semconv.IdempotencyKey.String(key)}
}

// Reserve asks for the right to run an effect. A request without an AttemptID gets a
// fresh one, so that the retries of this call are one attempt to the server.
func (c *Client) Reserve(ctx context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
	r := *req
	if r.AttemptID == "" {
		r.AttemptID = NewAttemptID()
	}
	var out idemkv.ReserveResult
	attrs := append(keyAttrs(r.Tenant, r.Key), semconv.ToolName.String(r.Tool), semconv.AttemptID.String(r.AttemptID))
	if _, err := c.do(ctx, call{method: http.MethodPost, route: "/v1/reserve", path: "/v1/reserve", body: &r, attrs: attrs}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Commit stores the receipt of the attempt holding req.Fence. A retried commit that
// had landed gets the stored outcome back.
func (c *Client) Commit(ctx context.Context, req *idemkv.CommitRequest) (*idemkv.Receipt, error) {
	var out idemkv.Receipt
	attrs := append(keyAttrs(req.Tenant, req.Key), semconv.FenceValue(req.Fence))
	if _, err := c.do(ctx, call{method: http.MethodPost, route: "/v1/commit", path: "/v1/commit", body: req, attrs: attrs}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Fail stores a permanent failure for the attempt holding req.Fence.
func (c *Client) Fail(ctx context.Context, req *idemkv.FailRequest) (*idemkv.Record, error) {
	var out idemkv.Record
	attrs := append(keyAttrs(req.Tenant, req.Key), semconv.FenceValue(req.Fence))
	if _, err := c.do(ctx, call{method: http.MethodPost, route: "/v1/fail", path: "/v1/fail", body: req, attrs: attrs}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Release gives the key back. When an earlier attempt of this call may have reached
// the server, not_found means that attempt released the key, and is reported as
// released.
func (c *Client) Release(ctx context.Context, req *idemkv.ReleaseRequest) (*idemkv.ReleaseResult, error) {
	var out idemkv.ReleaseResult
	attrs := append(keyAttrs(req.Tenant, req.Key), semconv.FenceValue(req.Fence))
	retried, err := c.do(ctx, call{method: http.MethodPost, route: "/v1/release", path: "/v1/release", body: req, attrs: attrs}, &out)
	if err != nil {
		if retried && errors.Is(err, idemkv.ErrNotFound) {
			return &idemkv.ReleaseResult{Released: true}, nil
		}
		return nil, err
	}
	return &out, nil
}

// Heartbeat extends the lease of the attempt holding req.Fence.
func (c *Client) Heartbeat(ctx context.Context, req *idemkv.HeartbeatRequest) (*idemkv.Record, error) {
	var out idemkv.Record
	attrs := append(keyAttrs(req.Tenant, req.Key), semconv.FenceValue(req.Fence))
	if _, err := c.do(ctx, call{method: http.MethodPost, route: "/v1/heartbeat", path: "/v1/heartbeat", body: req, attrs: attrs}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Doubt marks the pending record held by req.Fence in doubt: this attempt was granted
// recover and cannot learn whether the earlier attempt's effect happened. The answer is
// the record (InDoubt set). From then on every reserve of the key answers recover
// without a fence, and only Resolve settles it.
func (c *Client) Doubt(ctx context.Context, req *idemkv.DoubtRequest) (*idemkv.Record, error) {
	var out idemkv.Record
	attrs := append(keyAttrs(req.Tenant, req.Key), semconv.FenceValue(req.Fence))
	if _, err := c.do(ctx, call{method: http.MethodPost, route: "/v1/doubt", path: "/v1/doubt", body: req, attrs: attrs}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Resolve settles an in-doubt record by key, without a fence: Outcome committed
// stores the receipt in the request (answer: Receipt), not_executed releases the key
// (answer: Released). Any record that is not pending and in doubt is refused with
// idemkv.ErrNotPending. When an earlier attempt of this call may have reached the
// server, an answer that is the echo of that attempt (the key already released, or
// already committed with this remote id) is reported as success.
func (c *Client) Resolve(ctx context.Context, req *idemkv.ResolveRequest) (*idemkv.ResolveResult, error) {
	var out idemkv.ResolveResult
	attrs := keyAttrs(req.Tenant, req.Key)
	retried, err := c.do(ctx, call{method: http.MethodPost, route: "/v1/resolve", path: "/v1/resolve", body: req, attrs: attrs}, &out)
	switch {
	case err == nil:
		return &out, nil
	case retried && req.Outcome == idemkv.ResolveNotExecuted && errors.Is(err, idemkv.ErrNotFound):
		return &idemkv.ResolveResult{Released: true}, nil
	case retried && req.Outcome == idemkv.ResolveCommitted && errors.Is(err, idemkv.ErrNotPending):
		rec, gerr := c.Get(ctx, &idemkv.GetRequest{Tenant: req.Tenant, Key: req.Key})
		if gerr == nil && rec.Status == idemkv.StatusCommitted && rec.Receipt != nil &&
			rec.Receipt.RemoteID == req.RemoteID && rec.Fingerprint == req.Fingerprint {
			return &idemkv.ResolveResult{Receipt: rec.Outcome()}, nil
		}
	}
	return nil, err
}

// Get reads a record; with Wait it long-polls until the record is not pending.
// An absent record is an error wrapping idemkv.ErrNotFound.
func (c *Client) Get(ctx context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) {
	q := url.Values{}
	if req.Wait > 0 {
		q.Set("wait_ms", strconv.FormatInt(req.Wait.Milliseconds(), 10))
	}
	if req.Consistency != "" {
		q.Set("consistency", string(req.Consistency))
	}
	if req.History {
		q.Set("history", "true")
	}
	var out idemkv.Record
	cl := call{
		method: http.MethodGet,
		route:  "/v1/records/{tenant}/{key}",
		path:   "/v1/records/" + escapeSegment(req.Tenant) + "/" + escapeSegment(req.Key),
		query:  q,
		wait:   req.Wait,
		attrs:  keyAttrs(req.Tenant, req.Key),
	}
	if _, err := c.do(ctx, cl, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// List pages through a tenant's records in key order.
func (c *Client) List(ctx context.Context, req *idemkv.ListRequest) (*idemkv.ListResult, error) {
	q := url.Values{}
	if req.Prefix != "" {
		q.Set("prefix", req.Prefix)
	}
	if req.Status != "" {
		q.Set("status", string(req.Status))
	}
	if req.InDoubt {
		q.Set("in_doubt", "true")
	}
	pageQuery(q, req.Limit, req.After, req.Consistency)
	var out idemkv.ListResult
	cl := call{
		method:  http.MethodGet,
		route:   "/v1/records/{tenant}",
		path:    "/v1/records/" + escapeSegment(req.Tenant),
		query:   q,
		attrs:   []attribute.KeyValue{semconv.Tenant.String(req.Tenant)},
		listing: true,
	}
	if _, err := c.do(ctx, cl, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListInDoubt pages through the in-doubt records of every tenant, oldest first. It
// takes a token that may list every tenant (an admin's).
func (c *Client) ListInDoubt(ctx context.Context, req *idemkv.InDoubtRequest) (*idemkv.ListResult, error) {
	q := url.Values{}
	pageQuery(q, req.Limit, req.After, req.Consistency)
	var out idemkv.ListResult
	if _, err := c.do(ctx, call{method: http.MethodGet, route: "/v1/in-doubt", path: "/v1/in-doubt", query: q, listing: true}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// pageQuery sets the paging and consistency parameters of a listing.
func pageQuery(q url.Values, limit int, after string, c idemkv.Consistency) {
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if after != "" {
		q.Set("after", after)
	}
	if c != "" {
		q.Set("consistency", string(c))
	}
}

// Cluster describes the cluster as the answering node sees it.
func (c *Client) Cluster(ctx context.Context) (*idemkv.ClusterInfo, error) {
	var out idemkv.ClusterInfo
	if _, err := c.do(ctx, call{method: http.MethodGet, route: "/v1/cluster", path: "/v1/cluster"}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Join adds a node to the cluster.
//
// A leader of an older release refuses the fields it does not know (format,
// holds_state, stage); the join is then sent again without them, as that release's
// own nodes send it (olderJoin), unless it names a stage: a promotion, or a learner an
// operator asked for, is refused as that release refuses it, never turned into
// another join.
func (c *Client) Join(ctx context.Context, req *idemkv.JoinRequest) (*idemkv.ClusterInfo, error) {
	var out idemkv.ClusterInfo
	_, err := c.do(ctx, call{method: http.MethodPost, route: "/v1/cluster/join", path: "/v1/cluster/join", body: req}, &out)
	// An operator's stage is kept: an older release refuses it rather than add a
	// voter where a learner was asked for.
	for old, ok := olderJoin(req, err, false); ok; old, ok = olderJoin(old, err, false) {
		_, err = c.do(ctx, call{method: http.MethodPost, route: "/v1/cluster/join", path: "/v1/cluster/join", body: old}, &out)
	}
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// olderJoin is req as a release before its fields would take it, when err is such a
// release's refusal of a field it does not know: without holds_state (a release
// before it), without format (a release before data formats, which knows none of
// them), and, with dropLearner, without a learner's stage (that release adds every
// node as a voter, as a node joining by itself did before stages). A promotion is
// never dropped: that release would answer a member's join as a no-op, and the node
// would stay a learner believing itself promoted.
func olderJoin(req *idemkv.JoinRequest, err error, dropLearner bool) (*idemkv.JoinRequest, bool) {
	var e *idemkv.Error
	if !errors.As(err, &e) || e.Code != idemkv.CodeInvalidArgument || !strings.Contains(e.Message, "unknown field") {
		return nil, false
	}
	old := *req
	switch {
	case e.Field == "stage" && req.Stage == idemkv.JoinLearner && dropLearner:
		old.Stage = ""
	case e.Field == "holds_state" && req.HoldsState != nil:
		old.HoldsState = nil
	case e.Field == "format" && req.Format != 0 && (req.Stage == "" || req.Stage == idemkv.JoinLearner && dropLearner):
		old.Format, old.HoldsState, old.Stage = 0, nil, ""
	default:
		return nil, false
	}
	return &old, true
}

// Remove removes a node from the cluster.
func (c *Client) Remove(ctx context.Context, req *idemkv.RemoveRequest) (*idemkv.ClusterInfo, error) {
	var out idemkv.ClusterInfo
	if _, err := c.do(ctx, call{method: http.MethodPost, route: "/v1/cluster/remove", path: "/v1/cluster/remove", body: req}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Do runs a tool call through the whole loop of docs/protocol.md section 4; see Runner.Do.
func (c *Client) Do(ctx context.Context, op Op, fn Func) (*Outcome, error) {
	return c.runner.Do(ctx, op, fn)
}
