// Package workload holds the workloads of jepsen-lite: the register workload, whose
// history porcupine checks, and the agent workload, whose simulated workers run the
// reserve → execute → commit loop against a simulated downstream service. Both speak
// the HTTP API of docs/protocol.md section 2 to real nodes.
package workload

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

// Tenant is the tenant every workload writes under.
const Tenant = "jepsen"

// API talks to the nodes over HTTP. Every answer, to this API's requests and to the
// agent workload's Go client alike, passes a checking transport that notes the ones
// no correct node gives.
type API struct {
	http    *http.Client
	addrs   []string
	timeout time.Duration
	check   *checkTransport
	gate    *writeGate
}

// BadAnswers lists every answer that broke the contract so far.
func (a *API) BadAnswers() []BadAnswer { return a.check.list() }

// HTTPClient is the HTTP client (with the checking transport) for other clients of
// the nodes, such as the Go client the agent workload runs.
func (a *API) HTTPClient() *http.Client { return a.http }

// NewAPI returns a client for the nodes at addrs; every request is bounded by timeout.
func NewAPI(addrs []string, timeout time.Duration) *API {
	gate := &writeGate{base: &http.Transport{
		Proxy:               nil,
		MaxIdleConnsPerHost: 64,
		DialContext:         (&net.Dialer{Timeout: time.Second}).DialContext,
	}}
	check := &checkTransport{base: gate}
	return &API{addrs: addrs, timeout: timeout, check: check, gate: gate, http: &http.Client{Transport: check}}
}

// Addrs lists the node addresses.
func (a *API) Addrs() []string { return a.addrs }

// Close drops idle connections.
func (a *API) Close() { a.http.CloseIdleConnections() }

// result classifies an answer: its history type, the wire code of an error answer,
// a message, and the anomaly kind when the answer itself breaks the contract.
type result struct {
	typ  history.Type
	code string
	msg  string
	// anomaly is AnomalyServerError or AnomalyUndecodable for an answer no correct
	// node gives; typ is then Info (the write may have happened).
	anomaly string
}

// Anomaly kinds of answers that break docs/protocol.md section 2 whatever the history.
const (
	// AnomalyServerError: a 500 (internal), or an error code the endpoint never answers.
	AnomalyServerError = "server-error"
	// AnomalyUndecodable: an answer whose body does not parse.
	AnomalyUndecodable = "undecodable-answer"
)

// modelCodes are error answers that are part of the state machine's behaviour: the
// model must explain them.
var modelCodes = map[string]bool{
	idemkv.CodeNotFound:            true,
	idemkv.CodeFenced:              true,
	idemkv.CodeFingerprintMismatch: true,
	idemkv.CodeNotPending:          true,
}

// Codes that say the request certainly had no effect: refused by validation or by a
// cap, or unavailable (protocol: "certainly not applied"; a write that may have
// happened is answered outcome_unknown). A node that answers unavailable for a write
// that then takes effect breaks linearizability, and the model shows it.
var notAppliedCodes = map[string]bool{
	idemkv.CodeInvalidArgument:   true,
	idemkv.CodePayloadTooLarge:   true,
	idemkv.CodeResourceExhausted: true,
	idemkv.CodeUnavailable:       true,
}

// unknownCodes leave the outcome unknown: only the documented indeterminate code.
var unknownCodes = map[string]bool{
	idemkv.CodeOutcomeUnknown: true,
}

// do sends one request to node and decodes a 200 answer into out.
func (a *API) do(ctx context.Context, node int, method, path string, body, out any) result {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return result{typ: history.Fail, msg: err.Error()}
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+a.addrs[node]+path, rd)
	if err != nil {
		return result{typ: history.Fail, msg: err.Error()}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.http.Do(req)
	if err != nil {
		if notSent(err) {
			return result{typ: history.Fail, msg: err.Error()}
		}
		return result{typ: history.Info, msg: err.Error()}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		// The connection broke mid-answer: a transport failure, not a bad answer.
		return result{typ: history.Info, msg: "reading the answer: " + err.Error()}
	}
	r := classify(resp.StatusCode, resp.Status, b, out)
	if r.anomaly == AnomalyUndecodable && resp.StatusCode == http.StatusOK && json.Valid(b) {
		// Valid JSON of the wrong shape: the transport, which judges syntax only,
		// did not count it.
		a.check.note(BadAnswer{Kind: r.anomaly, Node: a.addrs[node], Method: method, Path: path, Detail: r.msg})
	}
	return r
}

// classify turns a complete answer into a result, decoding a 200 body into out.
func classify(status int, statusText string, b []byte, out any) result {
	if status == http.StatusOK {
		if out != nil {
			if err := json.Unmarshal(b, out); err != nil {
				return result{typ: history.Info, anomaly: AnomalyUndecodable,
					msg: fmt.Sprintf("decoding the answer: %v: %.200s", err, b)}
			}
		}
		return result{typ: history.OK}
	}
	e := idemkv.ParseErrorBody(b)
	if e == nil {
		return result{typ: history.Info, anomaly: AnomalyUndecodable, msg: fmt.Sprintf("%s: %.200s", statusText, b)}
	}
	code := e.Code
	switch {
	case modelCodes[code]:
		return result{typ: history.OK, code: code, msg: e.Message}
	case notAppliedCodes[code]:
		return result{typ: history.Fail, code: code, msg: e.Message}
	case unknownCodes[code]:
		return result{typ: history.Info, code: code, msg: e.Message}
	default:
		// internal, or a code this endpoint never answers: the node broke, and what it
		// did to the record is unknown.
		return result{typ: history.Info, code: code, anomaly: AnomalyServerError,
			msg: fmt.Sprintf("%s: %s: %s", statusText, code, e.Message)}
	}
}

// notSent reports whether a transport error happened before the request could reach
// a node: then it certainly had no effect.
func notSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

func recordPath(key string) string {
	return "/v1/records/" + url.PathEscape(Tenant) + "/" + url.PathEscape(key)
}

// toRecord keeps the fields the checkers compare; a receipt's result as its digest.
func toRecord(r *idemkv.Record) *history.Record {
	if r == nil {
		return nil
	}
	out := &history.Record{Status: string(r.Status), Fingerprint: r.Fingerprint, Tool: r.Tool,
		AttemptID: r.AttemptID, Fence: r.Fence, Attempts: r.Attempts, CreatedAt: int64(r.CreatedAt), UpdatedAt: int64(r.UpdatedAt),
		LeaseExpiresAt: int64(r.LeaseExpiresAt), ExpiresAt: int64(r.ExpiresAt)}
	if r.Receipt != nil {
		out.RemoteID, out.RemoteURL = r.Receipt.RemoteID, r.Receipt.RemoteURL
		out.ResultDigest, out.CommittedAt = history.Digest(r.Receipt.Result), int64(r.Receipt.CommittedAt)
	}
	if r.Error != nil {
		out.ErrorCode = r.Error.Code
	}
	if r.Approval != nil {
		out.ApprovalID, out.ApprovalState = r.Approval.ID, string(r.Approval.State)
	}
	return out
}

// toReceipt keeps every field of r but the key, the remote system and the error's
// message; the result as its digest.
func toReceipt(r *idemkv.Receipt) *history.Receipt {
	if r == nil {
		return nil
	}
	out := &history.Receipt{Status: string(r.Status), Fingerprint: r.Fingerprint, RemoteID: r.RemoteID,
		RemoteURL: r.RemoteURL, ResultDigest: history.Digest(r.Result), CommittedAt: int64(r.CommittedAt)}
	if r.Error != nil {
		out.ErrorCode = r.Error.Code
	}
	return out
}

// Reserve sends a reserve and converts the answer.
func (a *API) Reserve(ctx context.Context, node int, req *idemkv.ReserveRequest) (*history.Output, *idemkv.ReserveResult, result) {
	var res idemkv.ReserveResult
	r := a.do(ctx, node, http.MethodPost, "/v1/reserve", req, &res)
	if r.typ != history.OK {
		return nil, nil, r
	}
	if r.code != "" {
		return &history.Output{Err: r.code}, nil, r
	}
	out := &history.Output{Decision: string(res.Decision), Grant: res.Fence, Record: toRecord(res.Record), Receipt: toReceipt(res.Receipt)}
	if res.Conflict != nil {
		out.ConflictRemoteID = res.Conflict.ExistingRemoteID
		out.ConflictFP = res.Conflict.ExistingFingerprint
	}
	return out, &res, r
}

// Commit sends a commit.
func (a *API) Commit(ctx context.Context, node int, req *idemkv.CommitRequest) (*history.Output, result) {
	var rc idemkv.Receipt
	r := a.do(ctx, node, http.MethodPost, "/v1/commit", req, &rc)
	return output(r, func(o *history.Output) { o.Receipt = toReceipt(&rc) }), r
}

// Fail sends a fail.
func (a *API) Fail(ctx context.Context, node int, req *idemkv.FailRequest) (*history.Output, result) {
	var rec idemkv.Record
	r := a.do(ctx, node, http.MethodPost, "/v1/fail", req, &rec)
	return output(r, func(o *history.Output) { o.Record = toRecord(&rec) }), r
}

// Release sends a release.
func (a *API) Release(ctx context.Context, node int, req *idemkv.ReleaseRequest) (*history.Output, result) {
	var rel idemkv.ReleaseResult
	r := a.do(ctx, node, http.MethodPost, "/v1/release", req, &rel)
	return output(r, func(o *history.Output) { o.Released = rel.Released }), r
}

// Heartbeat sends a heartbeat.
func (a *API) Heartbeat(ctx context.Context, node int, req *idemkv.HeartbeatRequest) (*history.Output, result) {
	var rec idemkv.Record
	r := a.do(ctx, node, http.MethodPost, "/v1/heartbeat", req, &rec)
	return output(r, func(o *history.Output) { o.Record = toRecord(&rec) }), r
}

// DecideApproval approves or denies an approval.
func (a *API) DecideApproval(ctx context.Context, node int, req *idemkv.DecideApprovalRequest) (*history.Output, result) {
	var rec idemkv.Record
	path := "/v1/approvals/" + url.PathEscape(req.Tenant) + "/" + url.PathEscape(req.Key)
	r := a.do(ctx, node, http.MethodPost, path, req, &rec)
	return output(r, func(o *history.Output) { o.Record = toRecord(&rec) }), r
}

// Get reads a record linearizably; wait > 0 long-polls while it is pending.
func (a *API) Get(ctx context.Context, node int, key string, wait time.Duration) (*history.Output, *idemkv.Record, result) {
	var rec idemkv.Record
	path := recordPath(key)
	if wait > 0 {
		path += fmt.Sprintf("?wait_ms=%d", wait.Milliseconds())
	}
	r := a.do(ctx, node, http.MethodGet, path, nil, &rec)
	out := output(r, func(o *history.Output) { o.Record = toRecord(&rec) })
	if out != nil && out.Err == "" {
		return out, &rec, r
	}
	return out, nil, r
}

func output(r result, fill func(*history.Output)) *history.Output {
	if r.typ != history.OK {
		return nil
	}
	if r.code != "" {
		return &history.Output{Err: r.code}
	}
	o := &history.Output{}
	fill(o)
	return o
}
