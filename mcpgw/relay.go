//lint:file-ignore SA1019 MCP 2026-07-28 deprecates logging (SEP-2577) but keeps it working for at least a year; the gateway relays the upstream's log messages in both eras until it is gone.

package mcpgw

// How the upstream's progress and log messages reach the agents: each call relays
// through writers of its own, so that no agent that reads slowly holds up the
// upstream connection, or its queue, that every agent's calls share.

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// progressTo sends the progress notifications of one call to the agent that asked for
// them (a progressToken), the gateway's own while the call waits for idemkv and the
// upstream's while the tool runs, keeping the values increasing as MCP requires: one
// that would not is dropped.
//
// The upstream's progress is handed over on the read of the connection that carries
// every agent's answers (a stdio upstream's, tap.progress), so send never waits for
// the agent: it queues the notification for a goroutine of the call's own, which
// writes to the agent in order, and drops it when progressQueue notifications already
// wait. (Written from the read, to an agent that stopped reading its answer, one
// call's progress stopped the gateway from reading any other agent's answer until
// each call's tool timeout.) close, before the call answers, sends what waits.
type progressTo struct {
	g     *Gateway
	ctx   context.Context
	sess  *mcp.ServerSession
	token any

	mu     sync.Mutex
	sent   bool
	last   float64
	closed bool
	queue  chan mcp.ProgressNotificationParams
	done   chan struct{} // closed when the writer has sent what was queued
}

// progressQueue is how many progress notifications of one call wait for its agent
// before more are dropped: enough for a burst, while an agent that reads nothing holds
// at most this many of them.
const progressQueue = 32

// progressFor returns where the call's progress goes, with its writer started; nil
// when the agent asked for none. The caller closes it before the call answers.
func (g *Gateway) progressFor(ctx context.Context, req *mcp.CallToolRequest) *progressTo {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return nil
	}
	p := &progressTo{g: g, ctx: ctx, sess: req.Session, token: token,
		queue: make(chan mcp.ProgressNotificationParams, progressQueue), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for q := range p.queue {
			if err := p.sess.NotifyProgress(p.ctx, &q); err != nil {
				p.g.log.LogAttrs(p.ctx, slog.LevelDebug, "could not send progress", slog.Any(logKeyErr, err))
			}
		}
	}()
	return p
}

// send queues q for the agent, without waiting.
func (p *progressTo) send(q mcp.ProgressNotificationParams) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || (p.sent && q.Progress <= p.last) {
		return
	}
	q.ProgressToken = p.token
	select {
	case p.queue <- q:
		p.sent, p.last = true, q.Progress
	default:
		p.g.log.LogAttrs(p.ctx, slog.LevelDebug, "dropped a progress notification: the agent does not read them as fast as they come",
			slog.Int("waiting", progressQueue))
	}
}

// close sends what is queued and stops the writer; later progress is dropped, as MCP
// requires of progress after the answer. It waits for the agent to take what was
// queued, which holds up no one but this call's agent, whose answer follows.
func (p *progressTo) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.queue)
	}
	p.mu.Unlock()
	<-p.done
}

// relay is what Upstream.call hands the upstream's progress for the call to.
func (p *progressTo) relay() func(*mcp.ProgressNotificationParams) {
	if p == nil {
		return nil
	}
	return func(q *mcp.ProgressNotificationParams) { p.send(*q) }
}

// waiter tells an agent that asked for progress that its call is still waiting for
// idemkv, until idemkv grants the call its key (the tool or its probe runs) or the
// call ends.
type waiter struct {
	once    sync.Once
	started chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup
}

func (g *Gateway) waiting(p *progressTo, key string) *waiter {
	w := &waiter{started: make(chan struct{}), done: make(chan struct{})}
	if p == nil {
		return w
	}
	w.wg.Go(func() {
		tick := time.NewTicker(g.cfg.WaitProgress)
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-w.started:
				return
			case <-w.done:
				return
			case <-tick.C:
			}
			// n/(n+1) grows and stays below 1, below where most tools' own
			// progress starts, so less of theirs is dropped.
			p.send(mcp.ProgressNotificationParams{Progress: float64(n) / float64(n+1),
				Message: fmt.Sprintf("waiting for idemkv to grant key %q: another attempt holds it, or idemkv is not answering", key)})
		}
	})
	return w
}

// granted: the tool or its probe runs; the upstream's own progress follows.
func (w *waiter) granted() { w.once.Do(func() { close(w.started) }) }

// stop ends the notifications before the call answers.
func (w *waiter) stop() {
	w.granted()
	close(w.done)
	w.wg.Wait()
}

// relayLog sends an upstream log message to the agent whose calls to the upstream are
// the only ones in flight (or ended less than logGrace ago) when it arrives, if that
// agent's logging level admits it, through its call still in flight if it has one.
// The upstream has one session for all agents, so a message says nothing of whose
// call it is about: sent to every agent, one agent's order ids or customer data in an
// upstream's log reached every other agent of the gateway, of other tenants too. A
// message that arrives while no call is in flight, or while calls of two agents are,
// goes to the gateway's own log at debug level only.
//
// A 2026-07-28 agent has no session: it names a level in each request's _meta, and
// gets log messages on that request's stream, which its context carries; once a
// request is answered its stream is gone, so a message the grace keeps for such a
// request alone is not delivered.
//
// relayLog runs on the upstream client's queue of requests and notifications, which
// also carries the upstream's pings and its requests for input: it hands the message
// to the call's own writer (inFlight) and never waits for the agent. (Written from
// here, one agent that stopped reading held up that queue: the upstream's pings went
// unanswered, and other agents' calls that waited on them failed.) A message that
// finds logQueue of the call's messages still waiting for its agent is dropped.
func (g *Gateway) relayLog(ctx context.Context, p *mcp.LoggingMessageParams) {
	clean := *p
	clean.Meta = withoutOwnMeta(p.Meta) // hostile.go
	p = &clean
	g.mu.Lock()
	defer g.mu.Unlock()
	to := owner(g.calls)
	if to == nil || to.ss == nil {
		g.log.LogAttrs(ctx, slog.LevelDebug, "an upstream log message no single agent's call can own was not relayed",
			slog.String("level", string(p.Level)), slog.String("logger", p.Logger))
		return
	}
	select {
	case to.logs <- p:
	default:
		g.log.LogAttrs(ctx, slog.LevelDebug, "dropped an upstream log message: its agent does not read them as fast as they come",
			slog.Int("waiting", logQueue))
	}
}

// logQueue is how many log messages one call holds for its agent before more are
// dropped.
const logQueue = 32

// writeLogs sends c's log messages to its agent, in order, until c is forgotten.
func (g *Gateway) writeLogs(c *inFlightCall) {
	lctx := c.ctx
	if !c.modern {
		// A session's messages go to its standalone stream, which outlives the call:
		// a context that names no request of the agent's.
		lctx = context.Background()
	}
	for p := range c.logs {
		if err := c.ss.Log(lctx, p); err != nil {
			g.log.LogAttrs(lctx, slog.LevelDebug, "could not relay a log message", slog.Any(logKeyErr, err))
		}
	}
}

// owner is the call through which relayLog sends a message while calls are in flight:
// nil unless they are all one agent's, and then one still in flight if there is one.
func owner(calls map[*inFlightCall]struct{}) *inFlightCall {
	var to *inFlightCall
	for c := range calls {
		if to != nil && to.ss != c.ss {
			return nil
		}
		if to == nil || to.ended {
			to = c
		}
	}
	return to
}

// inFlightCall is a call to the upstream in flight for an agent: the agent's session
// and the call's context (a 2026-07-28 request's carries its log level).
type inFlightCall struct {
	ss     *mcp.ServerSession
	ctx    context.Context
	modern bool
	ended  bool // answered less than logGrace ago (guarded by Gateway.mu)
	// logs go to the agent through writeLogs; sent to and closed under Gateway.mu.
	logs chan *mcp.LoggingMessageParams
}

// logGrace is how long a call to the upstream still owns the upstream's log messages
// after its answer came: the upstream's client hands notifications over on a
// goroutine of their own, so a message sent just before the answer may come after it,
// and must not go to the agent whose call is the only one in flight by then.
const logGrace = time.Second

type callerKey struct{}

// withCaller notes in ctx the agent whose tools/call ctx serves, for the calls to the
// upstream made on its behalf (the tool, its probe).
func withCaller(ctx context.Context, req *mcp.CallToolRequest) context.Context {
	return context.WithValue(ctx, callerKey{}, req)
}

// inFlight notes a call to the upstream made on behalf of ctx's agent for relayLog,
// until logGrace after done: only then, not while the agent waits for idemkv or for an
// approval, is the upstream doing something of that agent's.
func (g *Gateway) inFlight(ctx context.Context) (done func()) {
	req, ok := ctx.Value(callerKey{}).(*mcp.CallToolRequest)
	if !ok {
		return func() {}
	}
	c := &inFlightCall{ss: req.Session, ctx: ctx, modern: modernRequest(req), logs: make(chan *mcp.LoggingMessageParams, logQueue)}
	if c.ss != nil {
		go g.writeLogs(c)
	}
	g.mu.Lock()
	g.calls[c] = struct{}{}
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		c.ended = true
		g.mu.Unlock()
		time.AfterFunc(logGrace, func() {
			g.mu.Lock()
			delete(g.calls, c)
			close(c.logs) // writeLogs sends what waits, then ends
			g.mu.Unlock()
		})
	}
}
