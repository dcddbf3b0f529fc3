// Package mcpgw is idemkv's MCP gateway: an MCP server that sits in front of any other
// MCP server, lists its tools unchanged, and runs every mutating tools/call through
// idemkv (client.Do), so that a retried call replays the stored CallToolResult instead
// of running the side effect again.
//
// Read-only tools pass straight through. Whether a tool mutates comes from its MCP
// annotations (readOnlyHint, idempotentHint), which a policy file can override; the
// policy also says how to build idempotency keys from arguments, which arguments
// define the effect, and which upstream tool can probe for an effect whose attempt
// died.
//
// The gateway never decides on its own whether a duplicate is safe: idemkv does. It
// must never call an upstream mutating tool without a reservation, except when the
// policy explicitly allows calls without a key through.
package mcpgw

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/telemetry/semconv"
)

// ScopeName is the instrumentation scope of the gateway's own spans.
const ScopeName = "github.com/idemkv/idemkv/mcpgw"

// Runner runs a tool call through idemkv: *client.Client and *client.Runner both do.
type Runner interface {
	Do(ctx context.Context, op client.Op, fn client.Func) (*client.Outcome, error)
}

// Config configures a Gateway. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// Upstream is the MCP server behind the gateway (required).
	Upstream *Upstream
	// Runner records the calls (required).
	Runner Runner
	// Policy overrides classification and says how to build keys; nil: an empty
	// policy (annotations decide, keys come from _meta only).
	Policy *Policy
	// MaxReceiptBytes bounds a stored result; keep it at or below the node's
	// --max-payload-bytes.
	MaxReceiptBytes int
	// Name and Version are what the gateway tells its clients it is.
	Name    string
	Version string

	Logger         *slog.Logger
	TracerProvider trace.TracerProvider          // default: the global provider
	Propagator     propagation.TextMapPropagator // default: the global propagator
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{MaxReceiptBytes: DefaultMaxReceiptBytes, Name: "idemkv-mcp-gateway", Version: "dev"}
}

func (c *Config) withDefaults() {
	d := DefaultConfig()
	if c.MaxReceiptBytes == 0 {
		c.MaxReceiptBytes = d.MaxReceiptBytes
	}
	if c.Name == "" {
		c.Name = d.Name
	}
	if c.Version == "" {
		c.Version = d.Version
	}
	if c.Policy == nil {
		c.Policy = &Policy{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = otel.GetTextMapPropagator()
	}
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	c.withDefaults()
	switch {
	case c.Upstream == nil:
		return errors.New("mcpgw: Upstream is required")
	case c.Runner == nil:
		return errors.New("mcpgw: Runner is required")
	case c.MaxReceiptBytes < 256 || c.MaxReceiptBytes > idemkv.MaxRequestBytes:
		return fmt.Errorf("mcpgw: MaxReceiptBytes must be between 256 and %d", idemkv.MaxRequestBytes)
	}
	return c.Policy.Validate()
}

// Log keys.
const (
	logKeyTool  = "tool"
	logKeyRule  = "rule"
	logKeyKey   = "key"
	logKeyErr   = "err"
	logKeyClass = "class"
)

// Gateway is the MCP server in front of the upstream. Serve Server() over any MCP
// transport; one Gateway serves any number of sessions.
type Gateway struct {
	cfg          Config
	up           *Upstream
	runner       Runner
	server       *mcp.Server
	rules        map[string]*rule
	remoteSystem string
	tracer       trace.Tracer
	prop         propagation.TextMapPropagator
	log          *slog.Logger

	mu      sync.Mutex        // guards rules and offered
	offered map[string]string // tool name -> the tool as JSON, to notice changes

	stop context.CancelFunc
	wg   sync.WaitGroup
}

// New connects to the upstream, reads its tools and builds the gateway's server.
// The policy must not name a probe tool the upstream lacks.
func New(ctx context.Context, cfg Config) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.withDefaults()
	g := &Gateway{
		cfg:     cfg,
		up:      cfg.Upstream,
		runner:  cfg.Runner,
		rules:   map[string]*rule{},
		offered: map[string]string{},
		tracer:  cfg.TracerProvider.Tracer(ScopeName),
		prop:    cfg.Propagator,
		log:     cfg.Logger,
	}
	tools, err := g.up.Tools(ctx)
	if err != nil {
		return nil, err
	}
	info := g.up.Info()
	g.remoteSystem = remoteSystem(cfg.Policy.RemoteSystem, info)
	opts := &mcp.ServerOptions{
		Logger:       slog.New(atLeast{cfg.Logger.Handler(), slog.LevelWarn}),
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}},
	}
	if info != nil {
		opts.Instructions = info.Instructions
	}
	g.server = mcp.NewServer(&mcp.Implementation{Name: cfg.Name, Version: cfg.Version}, opts)

	offered := map[string]bool{}
	for _, t := range tools {
		offered[t.Name] = true
	}
	for name, tp := range cfg.Policy.Tools {
		if !offered[name] {
			g.log.LogAttrs(ctx, slog.LevelWarn, "the policy names a tool the upstream does not offer", slog.String(logKeyTool, name))
		}
		if tp != nil && tp.Probe != nil && !offered[tp.Probe.Tool] {
			return nil, fmt.Errorf("%w: tools.%s: the probe tool %q is not offered by the upstream", ErrPolicy, name, tp.Probe.Tool)
		}
	}
	if err := g.offer(ctx, tools); err != nil {
		return nil, err
	}
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	g.stop = stop
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.watch(wctx)
	}()
	return g, nil
}

// offer makes the server offer exactly tools, each under its rule. The go-sdk tells
// connected clients when the list changed.
func (g *Gateway) offer(ctx context.Context, tools []*mcp.Tool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	seen := map[string]bool{}
	for _, t := range tools {
		seen[t.Name] = true
		if err := schemaIsObject(t); err != nil {
			// The go-sdk would panic, and MCP requires object schemas anyway.
			g.log.LogAttrs(ctx, slog.LevelWarn, "not offering an upstream tool with an invalid schema",
				slog.String(logKeyTool, t.Name), slog.Any(logKeyErr, err))
			continue
		}
		b, _ := json.Marshal(t)
		if g.offered[t.Name] == string(b) {
			continue
		}
		r, err := g.cfg.Policy.rule(t)
		if err != nil {
			return fmt.Errorf("%w: tools.%s: %w", ErrPolicy, t.Name, err)
		}
		g.rules[t.Name], g.offered[t.Name] = r, string(b)
		g.log.LogAttrs(ctx, slog.LevelInfo, "offering tool", slog.String(logKeyTool, t.Name),
			slog.String(logKeyClass, string(r.class)), slog.String(logKeyRule, r.String()))
		g.server.AddTool(t, g.handler(r))
	}
	var gone []string
	for name := range g.offered {
		if !seen[name] {
			gone = append(gone, name)
			delete(g.offered, name)
			delete(g.rules, name)
		}
	}
	if len(gone) > 0 {
		g.log.LogAttrs(ctx, slog.LevelInfo, "upstream tools gone", slog.Any(logKeyTool, gone))
		g.server.RemoveTools(gone...)
	}
	return nil
}

// watch lists the upstream's tools again whenever they may have changed.
func (g *Gateway) watch(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.up.ToolsChanged():
		}
		tools, err := g.up.Tools(ctx)
		if err == nil {
			err = g.offer(ctx, tools)
		}
		if err != nil && ctx.Err() == nil {
			g.log.LogAttrs(ctx, slog.LevelWarn, "could not refresh the upstream's tools", slog.Any(logKeyErr, err))
		}
	}
}

// Close stops following the upstream's tool list. The Upstream is the caller's to
// close.
func (g *Gateway) Close() error {
	g.stop()
	g.wg.Wait()
	return nil
}

// Server is the MCP server to serve (mcp.StdioTransport, mcp.StreamableHTTPHandler...).
func (g *Gateway) Server() *mcp.Server { return g.server }

// Class returns the class the gateway gave a tool, and whether it offers the tool.
func (g *Gateway) Class(tool string) (client.Class, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.rules[tool]
	if !ok {
		return "", false
	}
	return r.class, true
}

func remoteSystem(fromPolicy string, info *mcp.InitializeResult) string {
	if fromPolicy != "" {
		return fromPolicy
	}
	if info != nil && info.ServerInfo != nil && info.ServerInfo.Name != "" {
		return clip(info.ServerInfo.Name, idemkv.MaxRemoteLen)
	}
	return "mcp"
}

func schemaIsObject(t *mcp.Tool) error {
	for _, s := range []struct {
		name   string
		schema any
		must   bool
	}{{"input", t.InputSchema, true}, {"output", t.OutputSchema, false}} {
		if s.schema == nil {
			if s.must {
				return fmt.Errorf("no %s schema", s.name)
			}
			continue
		}
		b, err := json.Marshal(s.schema)
		if err != nil {
			return fmt.Errorf("%s schema: %w", s.name, err)
		}
		var m map[string]any
		if json.Unmarshal(b, &m) != nil || m["type"] != "object" {
			return fmt.Errorf("%s schema is not of type object", s.name)
		}
	}
	return nil
}

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
		if r.class == client.ReadOnly {
			return g.passThrough(ctx, req)
		}
		return g.mutate(ctx, r, req)
	}
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

// forward builds the upstream call: the same name and arguments, the agent's _meta
// without the gateway's keys, and the trace context of ctx. progressToken is dropped:
// the gateway does not relay progress notifications.
func (g *Gateway) forward(ctx context.Context, name string, args json.RawMessage, meta mcp.Meta) *mcp.CallToolParams {
	out := withoutOwnMeta(meta)
	delete(out, "progressToken")
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

func (g *Gateway) passThrough(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	res, err := g.up.CallTool(ctx, g.forward(ctx, req.Params.Name, req.Params.Arguments, req.Params.Meta))
	if err == nil {
		return res, nil
	}
	var we *jsonrpc.Error
	if errors.As(err, &we) {
		// The upstream's own protocol error, passed on as it came.
		return nil, we
	}
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	return errorResult(CodeUpstreamUnavailable, "idemkv gateway: the upstream MCP server failed: "+err.Error(), nil), nil
}

// call is one mutating tools/call as idemkv sees it.
type call struct {
	tenant string
	key    string
	actor  string
	raw    json.RawMessage // the arguments as sent
	args   any             // the arguments, decoded with json.Number
}

func (g *Gateway) mutate(ctx context.Context, r *rule, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	c, refusal := g.prepare(r, req)
	if refusal != nil {
		return refusal, nil
	}
	if c.key == "" {
		return g.passThrough(ctx, req)
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
	if r.class == client.NonIdempotentMutation && r.policy.Probe != nil {
		op.Probe = g.probe(r, c, req.Params.Meta)
	}

	// upstream is the upstream's answer when the tool ran during this call: whatever
	// idemkv then says, the agent gets what the tool did.
	var upstream *mcp.CallToolResult
	fn := func(ctx context.Context) (*client.Result, error) {
		res, err := g.up.CallTool(ctx, g.forward(ctx, req.Params.Name, c.raw, req.Params.Meta))
		if err != nil {
			var ce *callError
			if errors.As(err, &ce) && !ce.sent {
				return nil, client.NotExecuted(err)
			}
			return nil, err
		}
		upstream = res
		if res.IsError {
			te := &toolError{res: res}
			if r.policy.RetryableErrors {
				return nil, client.NotExecuted(te)
			}
			details, _, derr := encodeResult(res, g.cfg.MaxReceiptBytes)
			if derr != nil {
				details = nil
			}
			return nil, &client.PermanentError{Code: FailureCode, Details: details, Err: te}
		}
		return g.receipt(r, c.key, res)
	}
	out, err := g.runner.Do(ctx, op, fn)
	meta := []string{MetaIdempotencyKey, c.key, MetaTenant, c.tenant}
	if out != nil {
		meta = append(meta, MetaFingerprint, out.Fingerprint, MetaDecision, string(out.Decision))
		if upstream != nil {
			return annotate(upstream, meta...), nil
		}
		return annotate(decodeResult(out.Receipt), meta...), nil
	}
	return g.failure(ctx, r, c, err, upstream, meta)
}

// failure answers a call whose Do ended in an error.
func (g *Gateway) failure(ctx context.Context, r *rule, c *call, err error, upstream *mcp.CallToolResult, meta []string) (*mcp.CallToolResult, error) {
	var (
		conflict *client.ConflictError
		failed   *client.FailedError
		inDoubt  *client.InDoubtError
		probe    *probeError
		ce       *callError
	)
	isFailed := errors.As(err, &failed)
	switch {
	case errors.As(err, &conflict):
		return annotate(errorResult(CodeConflict, fmt.Sprintf(
			"idemkv: the idempotency key %q was already used for a different %s; %s was not called.",
			c.key, conflictSubject(conflict.Conflict), r.tool.Name), conflict.Conflict),
			append(meta, MetaDecision, string(idemkv.DecisionConflict))...), nil
	case isFailed && failed.Replayed:
		return annotate(decodeFailure(failed.Receipt), append(meta, MetaDecision, string(idemkv.DecisionReplay))...), nil
	case upstream != nil:
		// The tool ran: the agent gets its answer. A stored or released failure is
		// the expected path; anything else means idemkv could not record the
		// outcome, and the next attempt will recover it.
		meta = append(meta, MetaDecision, string(idemkv.DecisionExecute))
		if !isFailed && !upstream.IsError {
			g.log.LogAttrs(ctx, slog.LevelWarn, "the tool ran but its outcome was not stored",
				slog.String(logKeyTool, r.tool.Name), slog.String(logKeyKey, c.key), slog.Any(logKeyErr, err))
			meta = append(meta, MetaWarning, "the tool ran but idemkv could not store its outcome: "+err.Error())
		}
		return annotate(upstream, meta...), nil
	case isFailed:
		return annotate(decodeFailure(failed.Receipt), append(meta, MetaDecision, string(idemkv.DecisionExecute))...), nil
	case errors.As(err, &inDoubt):
		details := map[string]any{"status": "in_doubt", "tenant": c.tenant, "idempotency_key": c.key}
		if inDoubt.Record != nil {
			details["fence"] = inDoubt.Record.Fence
			details["attempts"] = inDoubt.Record.Attempts
		}
		return annotate(errorResult(CodeInDoubt, fmt.Sprintf(
			"idemkv: an earlier %s call with key %q died before it answered, and the policy names no probe to find out "+
				"whether it took effect; it was not called again. An operator must resolve it with `idemkv commit` or `idemkv release`.",
			r.tool.Name, c.key), details), append(meta, MetaDecision, string(idemkv.DecisionRecover))...), nil
	case errors.As(err, &probe):
		return annotate(errorResult(CodeOutcomeUnknown, fmt.Sprintf(
			"idemkv: an earlier %s call with key %q died before it answered, and the probe %s could not tell whether it took effect (%v); "+
				"nothing was called again. Retry the same call later.", r.tool.Name, c.key, r.policy.Probe.Tool, probe.err), nil),
			append(meta, MetaDecision, string(idemkv.DecisionRecover))...), nil
	case errors.As(err, &ce):
		if we, ok := rejected(ce.err); ok {
			// The upstream refused the request (unknown tool, bad arguments): its
			// own protocol error, as it came; the key was released.
			return nil, we
		}
		if !ce.sent {
			return annotate(errorResult(CodeUpstreamUnavailable, fmt.Sprintf(
				"idemkv gateway: could not reach the upstream MCP server (%v); %s was not called. Retry the same call.", ce.err, r.tool.Name), nil),
				meta...), nil
		}
		return annotate(errorResult(CodeOutcomeUnknown, fmt.Sprintf(
			"idemkv gateway: the upstream failed while %s was running (%v); whether it took effect is unknown. "+
				"Retry the same call with the same key: idemkv will recover it without running it twice.", r.tool.Name, ce.err), nil),
			append(meta, MetaDecision, string(idemkv.DecisionExecute))...), nil
	case ctx.Err() != nil:
		return nil, context.Cause(ctx)
	case errors.Is(err, idemkv.ErrInvalidArgument):
		return annotate(errorResult(CodeInvalidArgument, "idemkv gateway: "+err.Error()+"; "+r.tool.Name+" was not called.", nil), meta...), nil
	case errors.Is(err, idemkv.ErrUnavailable):
		return annotate(errorResult(CodeStoreUnavailable, "idemkv gateway: idemkv is unavailable ("+err.Error()+"); "+r.tool.Name+" was not called. Retry the same call.", nil), meta...), nil
	}
	g.log.LogAttrs(ctx, slog.LevelError, "tool call failed", slog.String(logKeyTool, r.tool.Name),
		slog.String(logKeyKey, c.key), slog.Any(logKeyErr, err))
	return annotate(errorResult(CodeInternal, "idemkv gateway: "+err.Error(), nil), meta...), nil
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
		c.tenant = s
	}
	if err := idemkv.ValidTenant(c.tenant); err != nil {
		return nil, errorResult(CodeInvalidArgument, "idemkv gateway: "+err.Error(), nil)
	}
	c.actor = actorOf(req)

	var why string
	if v, ok := meta[MetaIdempotencyKey]; ok {
		s, isStr := v.(string)
		if !isStr || s == "" {
			return nil, errorResult(CodeInvalidArgument, "idemkv gateway: _meta."+MetaIdempotencyKey+" must be a non-empty string", nil)
		}
		c.key = s
	} else if r.policy.key != nil {
		key, err := r.policy.key.expand(scope{tenant: c.tenant, tool: r.tool.Name, args: c.args})
		if err == nil {
			c.key = key
		} else {
			why = fmt.Sprintf(" The policy's key template %s cannot be filled: %v.", r.policy.key, err)
		}
	}
	if c.key == "" && r.missingKey != PassThrough {
		return nil, errorResult(CodeMissingKey, fmt.Sprintf(
			"idemkv gateway: %s changes things (%s) and the call has no idempotency key, so it was not run.%s "+
				"Send one in _meta[%q] naming the business operation, so that a retry of it cannot run twice.",
			r.tool.Name, r.class, why, MetaIdempotencyKey), map[string]any{"tool": r.tool.Name, "class": r.class})
	}
	return c, nil
}

// actorOf names who runs the attempt: _meta's actor, or the MCP client's name.
func actorOf(req *mcp.CallToolRequest) string {
	if s, ok := req.Params.Meta[MetaActor].(string); ok {
		return clip(s, idemkv.MaxActorLen)
	}
	if req.Session == nil {
		return ""
	}
	if p := req.Session.InitializeParams(); p != nil && p.ClientInfo != nil {
		return clip(p.ClientInfo.Name, idemkv.MaxActorLen)
	}
	return ""
}

// clip makes s printable and at most max bytes, as idemkv stores text fields.
func clip(s string, max int) string {
	s = strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
	for len(s) > max {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
}

// effectOf is the object idemkv fingerprints: the policy's effect fields, or every
// argument (the volatile ones are dropped by the fingerprint itself).
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

// receipt is what idemkv stores for a successful result.
func (g *Gateway) receipt(r *rule, key string, res *mcp.CallToolResult) (*client.Result, error) {
	raw, _, err := encodeResult(res, g.cfg.MaxReceiptBytes)
	if err != nil {
		return nil, err
	}
	out := &client.Result{RemoteSystem: g.remoteSystem, RemoteID: key, Result: raw}
	sc := structured(res)
	if p := r.policy.RemoteID; p != "" {
		if v, ok := lookupPath(sc, p); ok {
			if s, err := scalarString(v); err == nil && s != "" && len(s) <= idemkv.MaxRemoteLen && clip(s, idemkv.MaxRemoteLen) == s {
				out.RemoteID = s
			}
		}
	}
	if p := r.policy.RemoteURL; p != "" {
		if v, ok := lookupPath(sc, p); ok {
			if s, err := scalarString(v); err == nil && len(s) <= idemkv.MaxRemoteLen && clip(s, idemkv.MaxRemoteLen) == s {
				out.RemoteURL = s
			}
		}
	}
	return out, nil
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

// probeError is a probe that could not tell whether the effect happened.
type probeError struct{ err error }

func (e *probeError) Error() string { return "probe: " + e.err.Error() }
func (e *probeError) Unwrap() error { return e.err }

// probe calls the policy's probe tool for c, and reads its answer: found means the
// effect happened, and its result becomes the receipt.
func (g *Gateway) probe(r *rule, c *call, meta mcp.Meta) client.ProbeFunc {
	pp := r.policy.Probe
	return func(ctx context.Context) (*client.Result, error) {
		args := c.raw
		if len(r.policy.probeArgs) > 0 {
			s := scope{tenant: c.tenant, tool: r.tool.Name, args: c.args}
			obj := make(map[string]any, len(r.policy.probeArgs))
			for name, t := range r.policy.probeArgs {
				v, err := t.value(s)
				if err != nil {
					return nil, &probeError{err}
				}
				obj[name] = v
			}
			b, err := json.Marshal(obj)
			if err != nil {
				return nil, &probeError{err}
			}
			args = b
		}
		res, err := g.up.CallTool(ctx, g.forward(ctx, pp.Tool, args, meta))
		if err != nil {
			return nil, &probeError{err}
		}
		if res.IsError {
			return nil, &probeError{&toolError{res: res}}
		}
		sc := structured(res)
		if pp.Found != "" {
			v, _ := lookupPath(sc, pp.Found)
			if !truthy(v) {
				return nil, nil
			}
		} else if !truthy(sc) {
			return nil, nil
		}
		found, ok := lookupPath(sc, pp.Result)
		if !ok || found == nil {
			// Found, but not where the policy says the result is: running the tool
			// again would be the duplicate this exists to prevent.
			return nil, &probeError{fmt.Errorf("%s found the effect but its answer has no %q", pp.Tool, pp.Result)}
		}
		trace.SpanFromContext(ctx).AddEvent("probe_found", trace.WithAttributes(attribute.String("probe.tool", pp.Tool)))
		return g.receipt(r, c.key, structuredResult(found, false))
	}
}

// atLeast drops records below min: the go-sdk logs every session at info, which
// drowns the gateway's own lines.
type atLeast struct {
	slog.Handler
	min slog.Level
}

func (h atLeast) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h atLeast) WithAttrs(attrs []slog.Attr) slog.Handler {
	return atLeast{h.Handler.WithAttrs(attrs), h.min}
}

func (h atLeast) WithGroup(name string) slog.Handler {
	return atLeast{h.Handler.WithGroup(name), h.min}
}
