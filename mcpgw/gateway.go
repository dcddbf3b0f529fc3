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
// The gateway speaks both of MCP's eras, 2026-07-28 (stateless: no initialize, the
// protocol version in each request's _meta) and 2025-11-25 and earlier, to agents on
// one endpoint, decided per request (serve.go), and to each upstream in the newest
// era both speak.
//
// The gateway never decides on its own whether a duplicate is safe: idemkv does. It
// must never call an upstream mutating tool without a reservation, except when the
// policy explicitly allows calls without a key through. The _meta keys under
// io.idemkv/ are its alone: it never forwards them upstream, and drops what an
// upstream sends under them (hostile.go).
package mcpgw

//lint:file-ignore SA1019 MCP 2026-07-28 deprecates logging (SEP-2577) but keeps it working for at least a year; the gateway relays the upstream's log messages in both eras until it is gone.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
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
	// WaitProgress is how often a call that waits for idemkv (another attempt holds
	// its key) tells an agent that asked for progress (a progressToken) that it is
	// still waiting: clients that time calls out reset the clock on progress.
	WaitProgress time.Duration
	// Now is the clock of derived keys' windows (key: derive) and of approval
	// questions' expiry; default time.Now.
	Now func() time.Time
	// Approver decides approvals in band, as the agent's user answered them
	// (approval_in_band in the policy); nil: the Runner, when it can (a
	// *client.Client does; idemkv refuses unless its token has the approver role
	// for the tenant or is an admin's). Approvals are then decided out of band.
	Approver Decider
	// StateKey seals the request state of the 2026-07-28 approval questions the
	// gateway asks (at least 32 bytes); nil: a random key per Gateway. Give every
	// gateway behind one load balancer the same key, or a re-issued call that
	// reaches another instance is asked again.
	StateKey []byte
	// Name and Version are what the gateway tells its clients it is.
	Name    string
	Version string

	Logger         *slog.Logger
	TracerProvider trace.TracerProvider          // default: the global provider
	Propagator     propagation.TextMapPropagator // default: the global propagator
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{MaxReceiptBytes: DefaultMaxReceiptBytes, WaitProgress: time.Second, Name: "idemkv-mcp-gateway", Version: "dev"}
}

func (c *Config) withDefaults() {
	d := DefaultConfig()
	if c.MaxReceiptBytes == 0 {
		c.MaxReceiptBytes = d.MaxReceiptBytes
	}
	if c.WaitProgress == 0 {
		c.WaitProgress = d.WaitProgress
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
	if c.Now == nil {
		c.Now = time.Now
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
	case c.StateKey != nil && len(c.StateKey) < 32:
		return errors.New("mcpgw: StateKey must be at least 32 bytes")
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

	mu      sync.Mutex        // guards rules, offered and calls
	offered map[string]string // tool name -> the tool as JSON, to notice changes
	// calls are the tools/calls in flight: whom relayLog may send the upstream's log
	// messages to.
	calls map[*inFlightCall]struct{}

	storeDown atomic.Bool // an outage is logged; see noteStore

	decider  Decider  // decides approvals in band; nil: out of band only
	stateKey []byte   // seals approval questions' request state
	noDecide sync.Map // tenant -> true: idemkv refused the decider's decisions

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
		cfg:      cfg,
		up:       cfg.Upstream,
		runner:   cfg.Runner,
		rules:    map[string]*rule{},
		offered:  map[string]string{},
		calls:    map[*inFlightCall]struct{}{},
		tracer:   cfg.TracerProvider.Tracer(ScopeName),
		prop:     cfg.Propagator,
		log:      cfg.Logger,
		decider:  cfg.Approver,
		stateKey: cfg.StateKey,
	}
	if g.decider == nil {
		g.decider, _ = cfg.Runner.(Decider)
	}
	if g.stateKey == nil {
		g.stateKey = make([]byte, 32)
		if _, err := rand.Read(g.stateKey); err != nil {
			return nil, fmt.Errorf("mcpgw: a key for request state: %w", err)
		}
	}
	// Bounded as a call is: nothing else bounds ctx when the gateway starts, and an
	// upstream that never answers tools/list would hold New, and the session's
	// Close after it, for good.
	lctx, cancel := context.WithTimeout(ctx, g.listTimeout())
	tools, err := g.up.Tools(lctx)
	cancel()
	if err != nil {
		return nil, err
	}
	info := g.up.Info()
	g.remoteSystem = remoteSystem(cfg.Policy.RemoteSystem, info)
	opts := &mcp.ServerOptions{
		Logger: slog.New(atLeast{cfg.Logger.Handler(), slog.LevelWarn}),
		// Logging: the upstream's log messages are relayed (see relayLog).
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}, Logging: &mcp.LoggingCapabilities{}},
	}
	if info != nil {
		opts.Instructions = info.Instructions
	}
	g.server = mcp.NewServer(&mcp.Implementation{Name: cfg.Name, Version: cfg.Version}, opts)
	g.server.AddReceivingMiddleware(g.passRaw)
	g.server.AddSendingMiddleware(quietBeforeInitialize)
	g.up.OnLog(g.relayLog)

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
		// Bounded as a call is: an upstream that never answers must not stop the list
		// from being followed for good.
		lctx, cancel := context.WithTimeout(ctx, g.listTimeout())
		tools, err := g.up.Tools(lctx)
		cancel()
		if err == nil {
			err = g.offer(ctx, tools)
		}
		if err != nil && ctx.Err() == nil {
			g.log.LogAttrs(ctx, slog.LevelWarn, "could not refresh the upstream's tools", slog.Any(logKeyErr, err))
		}
	}
}

// listTimeout bounds one listing of the upstream's tools: the policy's timeout of
// tools that set none.
func (g *Gateway) listTimeout() time.Duration {
	if d := g.cfg.Policy.Timeout; d != 0 {
		return d
	}
	return DefaultToolTimeout
}

// Close stops following the upstream's tool list. The Upstream is the caller's to
// close.
func (g *Gateway) Close() error {
	g.stop()
	g.wg.Wait()
	return nil
}

// Server is the gateway's MCP server. Serve it with ServeIO or HTTPHandler, which also
// answer requests that come before initialize properly; serving it directly over
// another transport works, with the go-sdk's answers to those.
func (g *Gateway) Server() *mcp.Server { return g.server }

// Upstream is the MCP server behind the gateway.
func (g *Gateway) Upstream() *Upstream { return g.up }

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
		return idemkv.ClipText(info.ServerInfo.Name, idemkv.MaxRemoteLen)
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
