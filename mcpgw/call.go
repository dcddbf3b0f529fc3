//lint:file-ignore SA1019 MCP 2026-07-28 deprecates logging (SEP-2577) but keeps it working for at least a year; the gateway relays the upstream's log messages in both eras until it is gone.

package mcpgw

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/telemetry/semconv"
)

// handler serves tools/call for one tool, under a server span that continues the
// agent's trace.
func (g *Gateway) handler(r *rule) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (res *mcp.CallToolResult, err error) {
		ctx = g.extract(ctx, req.Params.Meta)
		ctx, span := g.tracer.Start(ctx, "tools/call "+r.tool.Name, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(
				semconv.ToolName.String(r.tool.Name),
				semconv.ToolSideEffect.Bool(r.class != client.ReadOnly),
				semconv.ToolClass.String(string(r.class)),
			))
		defer func() {
			switch {
			case err != nil:
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			case res != nil:
				annotateSpan(span, res)
			}
			span.End()
		}()
		ctx = withCaller(ctx, req)
		progress := g.progressFor(ctx, req)
		// The progress that came before the answer goes before it (the go-sdk
		// sends the answer once the handler returned).
		defer progress.close()
		if r.class == client.ReadOnly {
			res, err = g.passThrough(ctx, r, req, progress)
		} else {
			res, err = g.mutate(ctx, r, req, progress)
		}
		if modernRequest(req) {
			res = withoutProtocolMeta(res)
		}
		return sendRaw(ctx, res), err
	}
}

// withoutProtocolMeta is res without the _meta keys MCP 2026-07-28 puts on every
// result (io.modelcontextprotocol/serverInfo): an upstream's, or a stored one's, name
// the upstream, and the go-sdk adds the gateway's own, the agent's server, only where
// a result names none (withProtocol then writes them over the upstream's bytes).
func withoutProtocolMeta(res *mcp.CallToolResult) *mcp.CallToolResult {
	if res == nil {
		return nil
	}
	var out *mcp.CallToolResult
	for k := range res.Meta {
		if !strings.HasPrefix(k, protocolMetaPrefix) {
			continue
		}
		if out == nil {
			c := *res
			c.Meta = maps.Clone(res.Meta)
			out = &c
		}
		delete(out.Meta, k)
	}
	if out == nil {
		return res
	}
	return out
}

// annotateSpan puts what the gateway decided on its span.
func annotateSpan(span trace.Span, res *mcp.CallToolResult) {
	for key, attr := range map[string]attribute.Key{
		MetaIdempotencyKey: semconv.IdempotencyKey,
		MetaTenant:         semconv.Tenant,
		MetaDecision:       semconv.Decision,
		MetaFingerprint:    semconv.Fingerprint,
	} {
		if v, ok := res.Meta[key].(string); ok {
			span.SetAttributes(attr.String(v))
		}
	}
	if code, ok := res.Meta[MetaError].(string); ok {
		span.SetStatus(codes.Error, code)
	}
}

// extract continues the trace the agent sent in _meta (traceparent, tracestate,
// baggage), so that the gateway's and idemkv's spans join it.
func (g *Gateway) extract(ctx context.Context, meta mcp.Meta) context.Context {
	carrier := propagation.MapCarrier{}
	for _, k := range g.prop.Fields() {
		if v, ok := meta[k].(string); ok {
			carrier[k] = v
		}
	}
	if len(carrier) == 0 {
		return ctx
	}
	return g.prop.Extract(ctx, carrier)
}

// protocolMetaPrefix starts the _meta keys MCP itself defines per request (SEP-2575).
const protocolMetaPrefix = "io.modelcontextprotocol/"

// forward builds the upstream call: the same name and arguments, the agent's _meta
// without the gateway's keys, and the trace context of ctx. The agent's progressToken
// is replaced by one of the gateway's own (Upstream.call), which relay maps back.
func (g *Gateway) forward(ctx context.Context, name string, args json.RawMessage, meta mcp.Meta) *mcp.CallToolParams {
	out := withoutOwnMeta(meta)
	delete(out, "progressToken")
	for k := range out {
		if strings.HasPrefix(k, protocolMetaPrefix) {
			// The agent's protocol version, client info, capabilities and log
			// level describe its hop, not the gateway's: the go-sdk fills in the
			// gateway's own for an upstream of 2026-07-28.
			delete(out, k)
		}
	}
	carrier := propagation.MapCarrier{}
	g.prop.Inject(ctx, carrier)
	if len(carrier) > 0 && out == nil {
		out = mcp.Meta{}
	}
	for k, v := range carrier {
		out[k] = v
	}
	p := &mcp.CallToolParams{Name: name, Meta: out}
	if len(bytes.TrimSpace(args)) > 0 {
		p.Arguments = args
	}
	return p
}

// errToolTimeout is the cause of a call's context cut at its tool's timeout.
var errToolTimeout = errors.New("mcpgw: the tool's timeout passed")

// upCall calls a tool upstream within r's timeout. When the timeout cuts a call that
// was sent, the go-sdk cancels it upstream (notifications/cancelled) and the
// callError says so: the upstream may still have done the effect.
func (g *Gateway) upCall(ctx context.Context, r *rule, p *mcp.CallToolParams, progress func(*mcp.ProgressNotificationParams)) (*mcp.CallToolResult, json.RawMessage, error) {
	tctx, cancel := context.WithTimeoutCause(ctx, r.timeout, errToolTimeout)
	defer cancel()
	defer g.inFlight(ctx)()
	res, raw, err := g.up.call(tctx, p, progress)
	var ce *callError
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(tctx), errToolTimeout) && errors.As(err, &ce) {
		ce.timeout = r.timeout
	}
	return res, raw, err
}

// timeoutDetails are the details of an answer to a call its timeout cut.
func timeoutDetails(r *rule, d time.Duration) map[string]any {
	return map[string]any{"reason": "upstream_timeout", "tool": r.tool.Name, "timeout": d.String()}
}

func (g *Gateway) passThrough(ctx context.Context, r *rule, req *mcp.CallToolRequest, progress *progressTo) (*mcp.CallToolResult, error) {
	res, raw, err := g.upCall(ctx, r, withInput(g.forward(ctx, req.Params.Name, req.Params.Arguments, req.Params.Meta), req), progress.relay())
	if err == nil {
		return withRaw(res, raw), nil
	}
	var (
		we *jsonrpc.Error
		ce *callError
		in *inputNeeded
	)
	if errors.As(err, &in) {
		if res := relayInput(req, in); res != nil {
			return res, nil
		}
	}
	switch {
	case errors.As(err, &we):
		// The upstream's own protocol error, passed on as it came.
		return nil, we
	case ctx.Err() != nil:
		return nil, context.Cause(ctx)
	case errors.As(err, &ce) && ce.timeout != 0:
		return errorResult(CodeUpstreamUnavailable, fmt.Sprintf(
			"idemkv gateway: %s did not answer within its timeout of %s; the call was cancelled upstream.", r.tool.Name, ce.timeout),
			timeoutDetails(r, ce.timeout)), nil
	}
	return errorResult(CodeUpstreamUnavailable, "idemkv gateway: the upstream MCP server failed: "+err.Error(), nil), nil
}

// call is one mutating tools/call as idemkv sees it.
type call struct {
	tenant string
	key    string
	actor  string // as the record keeps it: at most idemkv.MaxActorLen bytes
	// caller is the actor whole, which a derived key is a digest of: two actors
	// alike in their first MaxActorLen bytes are still two callers.
	caller string
	raw    json.RawMessage // the arguments as sent
	args   any             // the arguments, decoded with json.Number
	// derived: the key was derived (key: derive), not sent or templated; no
	// approval may be asked under it (heldUnasked).
	derived bool
}

func (g *Gateway) mutate(ctx context.Context, r *rule, req *mcp.CallToolRequest, progress *progressTo) (*mcp.CallToolResult, error) {
	c, refusal := g.prepare(r, req)
	if refusal != nil {
		return refusal, nil
	}
	if c.key == "" {
		return g.passThrough(ctx, r, req, progress)
	}
	op := client.Op{
		Tenant: c.tenant, Key: c.key, Tool: r.tool.Name, Actor: c.actor, Class: r.class,
		TTL: r.ttl, LeaseTTL: r.leaseTTL,
	}
	effect, err := effectOf(r, c)
	if err != nil {
		return errorResult(CodeInvalidArgument, "idemkv gateway: "+err.Error(), nil), nil
	}
	op.Effect, op.Drop = effect, r.policy.Volatile
	noAsk := unasked(r, c)
	if !noAsk {
		op.Approval = g.approvalAsk(r, c)
	}
	// The reserve of a derived key, or of a tool whose policy names an effect
	// subset, carries the fingerprint alone: an admin's rule that asks approval of
	// the tool then refuses it before anything is stored (heldUnasked).
	var w *waiter // of the Do in progress
	if r.class == client.NonIdempotentMutation && r.policy.Probe != nil {
		probe := g.probe(r, c, req.Params.Meta)
		op.Probe = func(ctx context.Context) (*client.Result, error) {
			w.granted()
			return probe(ctx)
		}
	}

	// upstream is the upstream's answer when the tool ran during this call: whatever
	// idemkv then says, the agent gets what the tool did.
	var upstream *mcp.CallToolResult
	fn := func(ctx context.Context) (*client.Result, error) {
		w.granted()
		res, raw, err := g.upCall(ctx, r, withInput(g.forward(ctx, req.Params.Name, c.raw, req.Params.Meta), req), progress.relay())
		if err != nil {
			var ce *callError
			if errors.As(err, &ce) && !ce.sent {
				return nil, client.NotExecuted(err)
			}
			return nil, err
		}
		upstream = withRaw(res, raw)
		if res.IsError {
			te := &toolError{res: res}
			if r.policy.RetryableErrors || (r.notExec == Release && validationError(res)) {
				return nil, client.NotExecuted(te)
			}
			// The server bounds the details and the message together: the details
			// get what the message leaves of MaxReceiptBytes (else a payload_too_large
			// would leave the call pending though the tool ran and said no).
			perm := &client.PermanentError{Code: FailureCode, Err: te}
			budget := g.cfg.MaxReceiptBytes - len(perm.Info().Message)
			details, _, derr := encodeResult(res, raw, budget)
			if derr != nil || len(details) > budget {
				details = nil
			}
			perm.Details = details
			return nil, perm
		}
		return g.receipt(r, c.key, res, raw)
	}
	do := func() (*client.Outcome, error) {
		w = g.waiting(progress, c.key)
		out, err := g.runner.Do(ctx, op, fn)
		w.stop()
		g.noteStore(ctx, err)
		return out, err
	}
	// A re-issued 2026-07-28 call may carry its user's answer to the gateway's
	// question (approval.go): it is recorded before the reserve that acts on it.
	var ans *inBandAnswer
	if !noAsk {
		ans = g.answerOf(ctx, r, c, req)
	}
	out, err := do()
	if noAsk && upstream == nil {
		if res := g.heldUnasked(ctx, r, c, err); res != nil {
			return res, nil
		}
	}
	var pending *client.ApprovalPendingError
	if errors.As(err, &pending) && askAgain(ans, pending) && g.mayAskInBand(r, c, req) {
		switch why := unshowable(pending); {
		case why != "":
			// The user would approve an effect they could not read whole.
			ans = &inBandAnswer{approvalID: pending.ApprovalID, note: why}
			g.log.LogAttrs(ctx, slog.LevelInfo, "an approval was not asked in band: a question could not show its effect whole",
				slog.String(logKeyTool, r.tool.Name), slog.String(logKeyKey, c.key), slog.String("approval_id", pending.ApprovalID))
		case modernRequest(req):
			return g.inputRequired(r, c, pending), nil
		default:
			if ans = g.elicit(ctx, r, c, req, pending); ans.decided {
				out, err = do()
			}
		}
	}
	if errors.As(err, &pending) {
		return approvalPending(r, c, pending, ans), nil
	}
	var (
		in    *inputNeeded
		probe *probeError
	)
	if errors.As(err, &in) && !errors.As(err, &probe) {
		// The tool asks for input; the key was released (input.go). (A probe that
		// asks is a probe that cannot tell.)
		if res := relayInput(req, in); res != nil {
			return res, nil
		}
	}
	meta := []string{MetaIdempotencyKey, c.key, MetaTenant, c.tenant}
	if out != nil {
		meta = append(meta, MetaFingerprint, out.Fingerprint, MetaDecision, string(out.Decision))
		if upstream != nil {
			return annotate(upstream, meta...), nil
		}
		return annotate(decodeResult(out.Receipt, r.tool.OutputSchema != nil), meta...), nil
	}
	return g.failure(ctx, r, c, err, upstream, meta)
}

func conflictSubject(c idemkv.Conflict) string {
	if c.Reason == idemkv.ReasonDifferentTool {
		return "tool (" + c.ExistingTool + ")"
	}
	return "effect (other arguments)"
}

// prepare reads tenant, key, actor and arguments from the call. A non-nil result is
// the refusal to answer instead.
func (g *Gateway) prepare(r *rule, req *mcp.CallToolRequest) (*call, *mcp.CallToolResult) {
	meta := req.Params.Meta
	c := &call{tenant: g.cfg.Policy.tenant(), raw: req.Params.Arguments}
	if len(bytes.TrimSpace(c.raw)) == 0 || bytes.Equal(bytes.TrimSpace(c.raw), []byte("null")) {
		c.raw = json.RawMessage("{}")
	}
	if err := fingerprint.Check(c.raw); err != nil {
		// clean.go: encoding/json would read other arguments than were sent.
		return nil, errorResult(CodeInvalidArgument, "idemkv gateway: the arguments are not JSON that every reader reads alike "+
			"(text must be valid UTF-8, and each member named once): "+err.Error(), nil)
	}
	dec := json.NewDecoder(bytes.NewReader(c.raw))
	dec.UseNumber()
	if err := dec.Decode(&c.args); err != nil {
		return nil, errorResult(CodeInvalidArgument, "idemkv gateway: the arguments are not JSON: "+err.Error(), nil)
	}
	if _, ok := c.args.(map[string]any); !ok {
		return nil, errorResult(CodeInvalidArgument, "idemkv gateway: the arguments must be a JSON object", nil)
	}
	if v, ok := meta[MetaTenant]; ok {
		s, isStr := v.(string)
		if !isStr {
			return nil, errorResult(CodeInvalidArgument, "idemkv gateway: _meta."+MetaTenant+" must be a string", nil)
		}
		if !g.cfg.Policy.mayPick(s) {
			return nil, errorResult(CodeTenantNotAllowed, fmt.Sprintf(
				"idemkv gateway: this gateway records calls under tenant %q; the policy does not let a call pick tenant %q "+
					"(its tenants list), so %s was not run.", g.cfg.Policy.tenant(), s, r.tool.Name),
				map[string]any{"tenant": s, "tool": r.tool.Name})
		}
		c.tenant = s
	}
	if err := idemkv.ValidTenant(c.tenant); err != nil {
		return nil, errorResult(CodeInvalidArgument, "idemkv gateway: "+err.Error(), nil)
	}
	if v, ok := meta[MetaActor]; ok {
		if s, isStr := v.(string); !isStr || s == "" {
			// Read as no actor, it would be the client's name, shared by every end
			// user the agent names this way: their derived keys would be one.
			return nil, errorResult(CodeInvalidArgument, "idemkv gateway: _meta."+MetaActor+" must be a non-empty string", nil)
		}
	}
	c.caller = actorOf(req)
	c.actor = idemkv.ClipText(c.caller, idemkv.MaxActorLen)

	// Where the key comes from: keys.go.
	var why string
	for _, name := range []string{MetaIdempotencyKey, MetaSEP3182Key} {
		v, ok := meta[name]
		if !ok {
			continue
		}
		s, isStr := v.(string)
		if !isStr || s == "" {
			return nil, errorResult(CodeInvalidArgument, "idemkv gateway: the idempotency key "+name+" must be a non-empty string", nil)
		}
		c.key = s
		break
	}
	switch {
	case c.key != "":
	case r.policy.key != nil:
		key, err := r.policy.key.expand(scope{tenant: c.tenant, tool: r.tool.Name, args: c.args})
		if err == nil {
			c.key = key
		} else {
			why = fmt.Sprintf(" The policy's key template %s cannot be filled: %v.", r.policy.key, err)
		}
	case r.policy.derive != 0:
		effect, err := effectOf(r, c)
		if err == nil {
			c.key, err = deriveKey(c.tenant, c.caller, r.tool.Name, effect, r.policy.Volatile, r.policy.derive, g.cfg.Now())
			c.derived = err == nil
		}
		if err != nil {
			return nil, errorResult(CodeInvalidArgument, "idemkv gateway: deriving the idempotency key: "+err.Error(), nil)
		}
	}
	if c.key == "" && r.missingKey != PassThrough {
		return nil, errorResult(CodeMissingKey, fmt.Sprintf(
			"idemkv gateway: %s changes things (%s) and the call has no idempotency key, so it was not run.%s "+
				"Send one in _meta[%q] (or SEP-3182's idempotencyKey) naming the business operation, so that a retry of it cannot run twice.",
			r.tool.Name, r.class, why, MetaIdempotencyKey), map[string]any{"tool": r.tool.Name, "class": r.class})
	}
	return c, nil
}

// actorOf names who runs the attempt: _meta's actor, or the MCP client's name: the
// request's own clientInfo in 2026-07-28, which has no session (over stdio the go-sdk
// keeps the first request's as the session's, whoever sends the next), else the
// session's from initialize.
func actorOf(req *mcp.CallToolRequest) string {
	if s, ok := req.Params.Meta[MetaActor].(string); ok {
		return s
	}
	if info := req.ClientInfo(); info != nil {
		return info.Name
	}
	return ""
}

// effectOf is the object idemkv fingerprints: the policy's effect fields, or every
// argument (the volatile ones are dropped by the fingerprint itself). A tool asked
// approval of has no effect fields: compileApproval refuses them with approval:
// required, and a rule's approval is never asked of a tool that has them
// (heldUnasked), so what an approver sees is every argument the call runs with,
// but the volatile ones.
func effectOf(r *rule, c *call) (json.RawMessage, error) {
	if len(r.policy.Effect) == 0 {
		return c.raw, nil
	}
	obj := make(map[string]any, len(r.policy.Effect))
	for _, p := range r.policy.Effect {
		if v, ok := lookupPath(c.args, p); ok {
			obj[p] = v
		}
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encoding the effect: %w", err)
	}
	return b, nil
}

// receipt is what idemkv stores for a successful result: the upstream's own bytes
// when they fit (raw), else as encodeResult shrinks it.
func (g *Gateway) receipt(r *rule, key string, res *mcp.CallToolResult, raw json.RawMessage) (*client.Result, error) {
	stored, _, err := encodeResult(res, raw, g.cfg.MaxReceiptBytes)
	if err != nil {
		return nil, err
	}
	out := &client.Result{RemoteSystem: g.remoteSystem, RemoteID: key, Result: stored}
	sc := structured(res, raw)
	if p := r.policy.RemoteID; p != "" {
		if v, ok := lookupPath(sc, p); ok {
			if s, err := scalarString(v); err == nil && s != "" && len(s) <= idemkv.MaxRemoteLen && idemkv.ClipText(s, idemkv.MaxRemoteLen) == s {
				out.RemoteID = s
			}
		}
	}
	if p := r.policy.RemoteURL; p != "" {
		if v, ok := lookupPath(sc, p); ok {
			if s, err := scalarString(v); err == nil && len(s) <= idemkv.MaxRemoteLen && idemkv.ClipText(s, idemkv.MaxRemoteLen) == s {
				out.RemoteURL = s
			}
		}
	}
	return out, nil
}

// validationPrefixes open the isError answers with which MCP SDKs refuse arguments
// before the tool's own code runs (SEP-1303 made input validation a tool error so
// the model can correct itself): mcp-go's schema validation ("input schema
// validation failed: ", "invalid arguments: ") and typed handlers ("failed to bind
// arguments: "), the go-sdk's typed handlers ("validating \"arguments\": "), the
// TypeScript and Python SDKs ("Input validation error: ", or the TypeScript SDK's
// wrapped "MCP error -32602: "). Nothing ran, so the key must not be consumed by a
// stored failure.
var validationPrefixes = []string{
	"input schema validation failed:",
	"invalid arguments:",
	"failed to bind arguments:",
	`validating "arguments":`,
	"input validation error:",
	"mcp error -32602:",
}

// validationError reports whether an isError answer is the upstream refusing the
// arguments rather than the tool failing: its first text says so.
func validationError(res *mcp.CallToolResult) bool {
	for _, c := range res.Content {
		t, ok := c.(*mcp.TextContent)
		if !ok {
			continue
		}
		text := strings.ToLower(strings.TrimSpace(t.Text))
		for _, p := range validationPrefixes {
			if strings.HasPrefix(text, p) {
				return true
			}
		}
		return false
	}
	return false
}

// toolError is an upstream answer with isError set.
type toolError struct{ res *mcp.CallToolResult }

func (e *toolError) Error() string {
	for _, c := range e.res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			return "the tool reported an error: " + t.Text
		}
	}
	return "the tool reported an error"
}
