//lint:file-ignore SA1019 MCP 2026-07-28 deprecates logging (SEP-2577) but keeps it working for at least a year; the gateway relays the upstream's log messages in both eras until it is gone.

package mcpgw

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ErrUpstream is wrapped by errors about reaching the upstream MCP server.
var ErrUpstream = errors.New("mcpgw: upstream")

// Upstream is a connection to the MCP server behind the gateway that comes back after
// the server dies: a stdio server is started again, an HTTP one reconnected, on the
// next call. The tickets an upstream created before it died are what the probe looks
// for.
type Upstream struct {
	transport func() mcp.Transport
	client    *mcp.Client
	log       *slog.Logger

	// changed gets a value when the upstream's tools may have changed: it said so,
	// or it was restarted.
	changed chan struct{}

	tap *tap
	seq atomic.Uint64

	logMu sync.Mutex
	onLog func(context.Context, *mcp.LoggingMessageParams)

	// connecting is held (a value in it) while a session is being made: a lock that a
	// caller waits for only as long as its context lets it, so that an upstream that
	// never answers initialize holds up nobody past their own deadline.
	connecting chan struct{}

	mu        sync.Mutex
	sess      *mcp.ClientSession
	ended     chan struct{} // closed when sess has ended
	connected bool          // a session was made before
	closed    bool
	wg        sync.WaitGroup // session watchers and closers
}

// NewUpstream returns an Upstream that connects through a fresh transport from
// transport every time it (re)connects: a new mcp.CommandTransport for a stdio
// server (an exec.Cmd runs once), or a mcp.StreamableClientTransport.
func NewUpstream(transport func() mcp.Transport, impl *mcp.Implementation, logger *slog.Logger) *Upstream {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	u := &Upstream{transport: transport, log: logger, changed: make(chan struct{}, 1), tap: newTap(),
		connecting: make(chan struct{}, 1)}
	u.client = mcp.NewClient(impl, &mcp.ClientOptions{
		Logger: slog.New(atLeast{logger.Handler(), slog.LevelWarn}),
		// An upstream's input_required goes to the agent (relayInput), whose user
		// answers it: the gateway has no user of its own. The go-sdk's default
		// would answer it here, and fail for want of an elicitation handler.
		MultiRoundTrip:         &mcp.MultiRoundTripOptions{Disabled: true},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { u.toolsChanged() },
		LoggingMessageHandler: func(ctx context.Context, req *mcp.LoggingMessageRequest) {
			u.logMu.Lock()
			f := u.onLog
			u.logMu.Unlock()
			if f != nil {
				f(ctx, req.Params)
			}
		},
	})
	return u
}

// OnLog sets what becomes of the upstream's log messages (notifications/message).
func (u *Upstream) OnLog(f func(context.Context, *mcp.LoggingMessageParams)) {
	u.logMu.Lock()
	u.onLog = f
	u.logMu.Unlock()
}

func (u *Upstream) toolsChanged() {
	select {
	case u.changed <- struct{}{}:
	default: // one pending signal covers any number of changes
	}
}

// ToolsChanged receives a value when the upstream's tools may have changed since they
// were last listed.
func (u *Upstream) ToolsChanged() <-chan struct{} { return u.changed }

// ConnectTimeout bounds the making of one upstream session (starting a stdio server,
// initialize): a caller whose own deadline is sooner gives up sooner.
const ConnectTimeout = 30 * time.Second

// live returns the current session if it has not ended.
func (u *Upstream) live() (*mcp.ClientSession, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil, fmt.Errorf("%w: closed", ErrUpstream)
	}
	if u.sess != nil {
		select {
		case <-u.ended:
			u.sess = nil
		default:
			return u.sess, nil
		}
	}
	return nil, nil
}

// Session returns the live session, connecting first when there is none. Only one
// caller connects at a time; the others wait for it as long as ctx lets them.
func (u *Upstream) Session(ctx context.Context) (*mcp.ClientSession, error) {
	if sess, err := u.live(); sess != nil || err != nil {
		return sess, err
	}
	select {
	case u.connecting <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: waiting for the connection to the upstream: %w", ErrUpstream, ctx.Err())
	}
	defer func() { <-u.connecting }()
	if sess, err := u.live(); sess != nil || err != nil {
		return sess, err // another caller connected while this one waited
	}
	u.mu.Lock()
	reconnect := u.connected
	u.mu.Unlock()
	if reconnect {
		u.log.LogAttrs(ctx, slog.LevelWarn, "upstream session ended, reconnecting")
	}
	// The session is made under a context of its own, which ends when ctx does but
	// carries none of its values: ctx is often an agent's request, in which the
	// go-sdk keeps the agent's protocol version, and would send it to the upstream
	// as the gateway's (an HTTP upstream of 2025-11-25 then refused the initialize of
	// every reconnection made for a 2026-07-28 agent: 400, protocol version not
	// supported), and the session outlives the request.
	cctx, cancel := context.WithTimeout(context.Background(), ConnectTimeout)
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	sess, err := u.client.Connect(cctx, u.tap.wrap(u.transport()), nil)
	if err != nil {
		return nil, fmt.Errorf("%w: connecting: %w", ErrUpstream, err)
	}
	if r := sess.InitializeResult(); r != nil && r.Capabilities != nil && r.Capabilities.Logging != nil {
		// Servers send no log messages until asked (the go-sdk's do not); the
		// gateway's own sessions filter by the level each agent set.
		if err := sess.SetLoggingLevel(cctx, &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
			u.log.LogAttrs(ctx, slog.LevelDebug, "the upstream refused logging/setLevel", slog.Any("err", err))
		}
	}
	if r := sess.InitializeResult(); r != nil {
		u.log.LogAttrs(ctx, slog.LevelInfo, "connected to the upstream", slog.String("protocol", r.ProtocolVersion))
	}
	ended := make(chan struct{})
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		_ = sess.Close()
		return nil, fmt.Errorf("%w: closed", ErrUpstream)
	}
	u.sess, u.ended, u.connected = sess, ended, true
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		_ = sess.Wait()
		close(ended)
	}()
	if reconnect {
		// A restarted server may be a new version with other tools.
		u.toolsChanged()
	}
	return sess, nil
}

// Close ends the session (a stdio server gets its stdin closed, then signals) and
// waits for it.
func (u *Upstream) Close() error {
	u.mu.Lock()
	u.closed = true
	u.mu.Unlock()
	// A connect in flight ends within ConnectTimeout and, finding the upstream
	// closed, closes what it made: wait for it, so that no stdio server starts after
	// Close returns.
	u.connecting <- struct{}{}
	<-u.connecting
	u.mu.Lock()
	sess := u.sess
	u.sess = nil
	u.mu.Unlock()
	var err error
	if sess != nil {
		err = sess.Close()
	}
	u.wg.Wait()
	return err
}

// inputNeeded: a 2026-07-28 upstream answered resultType "input_required": it asks
// for input (elicitation, sampling, roots) before it completes the call, and the
// re-issued call must carry the answers and its request state.
type inputNeeded struct {
	requests mcp.InputRequestMap
	state    string
}

func (e *inputNeeded) Error() string {
	return "the upstream asks for input (resultType input_required: elicitation, sampling or roots), which this agent's client cannot be asked for"
}

// callError says what a failed tools/call means for the effect.
type callError struct {
	err error
	// sent: the request may have reached the upstream, so the effect may have
	// happened. Unsent requests and requests the upstream refused as malformed
	// certainly did not take effect.
	sent bool
	// timeout, when not zero, is the tool's timeout that cut the call.
	timeout time.Duration
	// gone: the upstream answered the call's HTTP request with 404, holding no such
	// session; it did not read the call (sent is false).
	gone bool
}

func (e *callError) Error() string { return e.err.Error() }
func (e *callError) Unwrap() error { return e.err }

// rejected reports whether err is the upstream refusing the request itself (no such
// tool, arguments that fail the schema), which happens before any tool code runs.
func rejected(err error) (*jsonrpc.Error, bool) {
	var we *jsonrpc.Error
	if !errors.As(err, &we) {
		return nil, false
	}
	switch we.Code {
	case jsonrpc.CodeParseError, jsonrpc.CodeInvalidRequest, jsonrpc.CodeMethodNotFound, jsonrpc.CodeInvalidParams:
		return we, true
	}
	return we, false
}

// CallTool calls a tool upstream. Its errors are *callError values that say whether
// the call may have taken effect.
func (u *Upstream) CallTool(ctx context.Context, params *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	res, _, err := u.call(ctx, params, nil)
	return res, err
}

// call calls a tool upstream under a progress token of the gateway's own, which
// routes the upstream's progress notifications to progress (when not nil) and lets the
// tap find the answer: raw is the result as the upstream sent it (nil when the
// transport could not be tapped).
func (u *Upstream) call(ctx context.Context, params *mcp.CallToolParams, progress func(*mcp.ProgressNotificationParams)) (res *mcp.CallToolResult, raw json.RawMessage, err error) {
	res, raw, err = u.callOnce(ctx, params, progress)
	var ce *callError
	if errors.As(err, &ce) && ce.gone && ctx.Err() == nil {
		// The upstream holds no session of the gateway's any more (it restarted):
		// nothing ran, and a new session takes the call.
		u.log.LogAttrs(ctx, slog.LevelWarn, "the upstream no longer knows the gateway's session; calling again on a new one",
			slog.String(logKeyTool, params.Name))
		res, raw, err = u.callOnce(ctx, params, progress)
	}
	return res, raw, err
}

// callOnce is one attempt of call, on the session there is or a new one.
func (u *Upstream) callOnce(ctx context.Context, params *mcp.CallToolParams, progress func(*mcp.ProgressNotificationParams)) (res *mcp.CallToolResult, raw json.RawMessage, err error) {
	sess, err := u.Session(ctx)
	if err != nil {
		return nil, nil, &callError{err: err}
	}
	token := progressTokenPrefix + strconv.FormatUint(u.seq.Add(1), 10)
	p := *params
	p.Meta = make(mcp.Meta, len(params.Meta)+1)
	for k, v := range params.Meta {
		p.Meta[k] = v
	}
	p.Meta["progressToken"] = token
	if modern(sess.InitializeResult()) {
		// 2026-07-28 has no logging/setLevel: a request asks for the log messages
		// sent while it runs. The gateway's own sessions filter by each agent's level.
		p.Meta[mcp.MetaKeyLogLevel] = "debug"
	}
	u.tap.expect(token, progress)
	res, err = sess.CallTool(ctx, &p)
	raw, gone := u.tap.take(token)
	if err != nil {
		we, refused := rejected(err)
		if (we == nil || gone) && ctx.Err() == nil {
			// Not an answer but a broken connection, or a session the upstream
			// no longer holds: the next call must not find it still looking alive.
			u.drop(sess)
		}
		return nil, nil, &callError{err: fmt.Errorf("%w: calling %s: %w", ErrUpstream, params.Name, err), sent: !refused && !gone, gone: gone}
	}
	if res, raw, err = scrubResult(res, raw); err != nil {
		// The tool ran and answered something the gateway cannot use.
		return nil, nil, &callError{err: fmt.Errorf("%w: calling %s: %w", ErrUpstream, params.Name, err), sent: true}
	}
	if res.NeedsInput() {
		// A 2026-07-28 upstream asks for input before it completes the call: the
		// request did not complete (sent false: nothing took effect).
		return nil, nil, &callError{err: fmt.Errorf("%w: calling %s: %w", ErrUpstream, params.Name,
			&inputNeeded{requests: res.InputRequests, state: res.RequestState})}
	}
	return res, raw, nil
}

// ModernProtocol is the first MCP revision without initialize (SEP-2575): a request
// carries its protocol version, client info and capabilities in _meta.
const ModernProtocol = "2026-07-28"

// modern reports whether a session negotiated ModernProtocol or later.
func modern(r *mcp.InitializeResult) bool {
	return r != nil && r.ProtocolVersion >= ModernProtocol
}

// Protocol is the MCP revision the upstream session speaks, "" before it connected.
func (u *Upstream) Protocol() string {
	if r := u.Info(); r != nil {
		return r.ProtocolVersion
	}
	return ""
}

// drop forgets sess, if it is still the current session, and closes it in the
// background (a stdio server that is still alive gets time to exit).
func (u *Upstream) drop(sess *mcp.ClientSession) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.sess != sess {
		return
	}
	u.sess = nil
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		_ = sess.Close()
	}()
}

// Tools lists every tool the upstream offers, page by page. A cursor the upstream
// hands back a second time is an error: the go-sdk's iterator would follow it
// forever, holding up New (which nothing else bounds) and piling up every page's
// tools.
func (u *Upstream) Tools(ctx context.Context) ([]*mcp.Tool, error) {
	sess, err := u.Session(ctx)
	if err != nil {
		return nil, err
	}
	var tools []*mcp.Tool
	seen := map[string]bool{}
	params := &mcp.ListToolsParams{}
	for {
		page, err := sess.ListTools(ctx, params)
		if err != nil {
			return nil, fmt.Errorf("%w: listing tools: %w", ErrUpstream, err)
		}
		for _, t := range page.Tools {
			t.Meta = withoutOwnMeta(t.Meta) // hostile.go
			tools = append(tools, t)
		}
		if page.NextCursor == "" {
			return tools, nil
		}
		if seen[page.NextCursor] {
			return nil, fmt.Errorf("%w: listing tools: the upstream hands back cursor %q again after %d pages", ErrUpstream, page.NextCursor, len(seen)+1)
		}
		seen[page.NextCursor] = true
		params = &mcp.ListToolsParams{Cursor: page.NextCursor}
	}
}

// Info returns the upstream's initialize answer, or nil before the first connection.
func (u *Upstream) Info() *mcp.InitializeResult {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.sess == nil {
		return nil
	}
	return u.sess.InitializeResult()
}
