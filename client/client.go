// Package client is the Go client of idemkv: low-level calls for every endpoint of the
// HTTP API, and Do, the tool-call adapter that runs the whole loop of the protocol
// (reserve, replay or conflict, wait, probe, execute under a heartbeat, commit).
//
// # Running a tool call
//
// Build a Client with New(Config{Endpoints: ...}) and call Client.Do with an Op (tenant,
// key, tool, class, effect, optional probe) and a Func that runs the tool. Do returns
// an *Outcome when the operation has a committed receipt (executed now, replayed, or
// found by the probe), and otherwise an error of exactly one of six kinds:
//
//	kind               errors.Is            errors.As              what to do
//	not_executed       ErrNotExecuted       *NotExecutedError      fix the cause if any; retrying is safe
//	stored_failure     ErrStoredFailure     *StoredFailureError    final: every retry gets it back
//	outcome_unknown    ErrOutcomeUnknown    *OutcomeUnknownError   retry later: a Do after the lease recovers it
//	conflict           ErrConflict          *ConflictError         final for this key: it names another effect
//	in_doubt           ErrInDoubt           *InDoubtError          a person settles it (idemkv resolve, Client.Resolve)
//	store_unavailable  ErrStoreUnavailable  *StoreUnavailableError idemkv was unreachable for StoreWait; the tool did not run
//
// KindOf(err) returns the kind string, which the Python and TypeScript clients share.
//
// # In-doubt records
//
// A non-idempotent tool without a probe whose earlier attempt died cannot know whether
// the effect happened. The attempt that takes the key over marks the record in doubt
// (POST /v1/doubt) and returns *InDoubtError; every later Do of the key answers it at
// once, without taking the key, until someone settles it by key with no fence:
// Client.Resolve, or "idemkv resolve TENANT KEY --committed --remote-system S
// --remote-id ID" or "--not-executed". A Do whose Op has a Probe settles it itself.
// List them with Client.List(&idemkv.ListRequest{Tenant: t, InDoubt: true}) or "idemkv ls --in-doubt";
// the metrics idemkv_records_in_doubt and idemkv_in_doubt_oldest_age_seconds count
// them.
//
// # Defaults
//
// Every zero field of Config and RunConfig takes the default stated on it: Timeout
// 10 s per HTTP attempt, MaxAttempts 8 per call, backoff 20 ms to 1 s between
// attempts, StoreWait 30 s (DefaultStoreWait) and FailClosed, LeaseTTL 30 s with a
// heartbeat every third, CommitGrace 30 s, PollWait 30 s, Do's backoff 20 ms to 2 s.
//
// # Types you will meet
//
// Decision, Receipt, Record, Status, Conflict, Consistency and ResolveOutcome are
// aliases of the root package's types, with their constants (DecisionExecute,
// StatusPending, Linearizable, Stale, ResolveCommitted, ...). Requests of the
// low-level calls (idemkv.ReserveRequest, idemkv.ListRequest, ...) live in the root
// package github.com/idemkv/idemkv, as do the wire errors the typed errors wrap
// (idemkv.ErrFenced, idemkv.ErrUnavailable, idemkv.ErrOutcomeUnknown, ...).
//
// Agent runtimes embed this package, so it must stay light: it never imports Raft,
// Pebble, the server packages or the OpenTelemetry SDK (only the OpenTelemetry API). Do
// runs just as well against an in-process node, through the Store interface.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkv/idemkv"
)

// HeaderLeader is the answer header that names the leader's API address
// (idemkv.HeaderLeader, the one definition server and client share).
const HeaderLeader = idemkv.HeaderLeader

// maxAnswerBytes bounds what the client reads of one JSON answer that holds at most
// one record: a record is at most its effect and its result or error (each within the
// payload limit, at most idemkv.MaxRequestBytes), a summary and a short history, so
// 16 MiB leaves room for any escaping while a node, or anything posing as one, that
// answers without end cannot make the client read until it runs out of memory.
// Listings, which hold up to idemkv.MaxListLimit records, are not bounded by it.
const maxAnswerBytes = 16 << 20

// ScopeName is the instrumentation scope of the client's spans.
const ScopeName = "github.com/idemkv/idemkv/client"

// Config configures a Client. Zero fields take the defaults of DefaultConfig, stated
// on each field.
type Config struct {
	// Endpoints are the API addresses of some or all nodes, as host:port or as
	// http(s)://host:port. The client prefers the leader any node names and falls
	// back to these. Default: 127.0.0.1:7420, one local node.
	Endpoints []string
	// Token, when set, is sent as "Authorization: Bearer <token>". Default: none.
	Token string
	// TLSConfig, when set, makes endpoints without a scheme use https. Default: none
	// (plain http).
	TLSConfig *tls.Config
	// Timeout bounds one HTTP attempt (a long-poll gets its wait on top). Default 10 s.
	Timeout time.Duration
	// MaxAttempts bounds the attempts of one low-level call across endpoints. Only
	// failures that leave the request safe to repeat are retried: transport errors,
	// unavailable and outcome_unknown (with the same body, so the same attempt id or
	// fence). Default 8. Do retries calls on top of this, bounded by StoreWait.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the jittered exponential backoff between
	// attempts. Defaults 20 ms and 1 s.
	BackoffMin time.Duration
	BackoffMax time.Duration
	// HTTPClient replaces the client's own transport (TLSConfig is then ignored).
	// Default: a transport with a 5 s dial timeout and HTTP/2 where offered.
	HTTPClient *http.Client

	// StoreWait bounds how long Do waits in total for a store that does not answer
	// before it gives up (see RunConfig.StoreWait). Default DefaultStoreWait (30 s).
	// It is copied to Run.StoreWait when that is zero.
	StoreWait time.Duration
	// OnStoreUnavailable is what Do does then: FailClosed (the default) returns a
	// *StoreUnavailableError without running the tool; Unguarded runs an
	// IdempotentMutation tool anyway, with no record. It is copied to
	// Run.OnStoreUnavailable when that is empty.
	OnStoreUnavailable StorePolicy

	// Logger receives the client's debug logs. Default: discard.
	Logger *slog.Logger
	// TracerProvider makes the client's spans. Default: the global provider.
	TracerProvider trace.TracerProvider
	// Propagator injects trace context (W3C traceparent). Default: the global
	// propagator.
	Propagator propagation.TextMapPropagator

	// Run configures Do (LeaseTTL 30 s, CommitGrace 30 s, PollWait 30 s, backoff
	// 20 ms-2 s, StoreWait 30 s, FailClosed: see RunConfig); its Logger and
	// TracerProvider default to the ones above.
	Run RunConfig
}

// DefaultConfig returns the defaults: one node on the default address.
func DefaultConfig() Config {
	return Config{
		Endpoints:   []string{"127.0.0.1:7420"},
		Timeout:     10 * time.Second,
		MaxAttempts: 8,
		BackoffMin:  20 * time.Millisecond,
		BackoffMax:  time.Second,
	}
}

func (c *Config) withDefaults() {
	d := DefaultConfig()
	if len(c.Endpoints) == 0 {
		c.Endpoints = d.Endpoints
	}
	if c.Timeout == 0 {
		c.Timeout = d.Timeout
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = d.MaxAttempts
	}
	if c.BackoffMin == 0 {
		c.BackoffMin = d.BackoffMin
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = d.BackoffMax
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
	if c.Run.Logger == nil {
		c.Run.Logger = c.Logger
	}
	if c.Run.TracerProvider == nil {
		c.Run.TracerProvider = c.TracerProvider
	}
	if c.Run.StoreWait == 0 {
		c.Run.StoreWait = c.StoreWait
	}
	if c.Run.OnStoreUnavailable == "" {
		c.Run.OnStoreUnavailable = c.OnStoreUnavailable
	}
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	c.withDefaults()
	for _, ep := range c.Endpoints {
		if _, err := baseURL(ep, c.TLSConfig != nil); err != nil {
			return err
		}
	}
	switch {
	case c.Timeout < 0:
		return errors.New("client: Timeout must not be negative")
	case c.MaxAttempts < 1:
		return errors.New("client: MaxAttempts must be at least 1")
	case c.BackoffMin < 0 || c.BackoffMax < c.BackoffMin:
		return errors.New("client: need 0 <= BackoffMin <= BackoffMax")
	}
	return c.Run.Validate()
}

func baseURL(ep string, useTLS bool) (string, error) {
	if !strings.Contains(ep, "://") {
		scheme := "http"
		if useTLS {
			scheme = "https"
		}
		ep = scheme + "://" + ep
	}
	u, err := url.Parse(ep)
	if err != nil {
		return "", fmt.Errorf("client: endpoint %q: %w", ep, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return "", fmt.Errorf("client: endpoint %q must be host:port or http(s)://host:port", ep)
	}
	return u.Scheme + "://" + u.Host, nil
}

// Client talks to an idemkv cluster over HTTP. It is safe for concurrent use.
type Client struct {
	cfg       Config
	http      *http.Client
	scheme    string
	endpoints []string // base URLs
	// preferred is the endpoint tried first while no leader is known; it moves on
	// when that endpoint fails, so that calls do not keep hitting a dead node.
	preferred atomic.Uint32
	leaderMu  sync.Mutex
	leader    string // base URL of the leader, "" if unknown
	// failed holds leaders that failed an attempt, until when they are not followed
	// again (leaderShun).
	failed map[string]time.Time
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	log    *slog.Logger
	runner *Runner
}

var _ Store = (*Client)(nil)

// New returns a Client for cfg.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.withDefaults()
	c := &Client{
		cfg:    cfg,
		tracer: cfg.TracerProvider.Tracer(ScopeName),
		prop:   cfg.Propagator,
		log:    cfg.Logger,
	}
	for _, ep := range cfg.Endpoints {
		u, _ := baseURL(ep, cfg.TLSConfig != nil)
		c.endpoints = append(c.endpoints, u)
	}
	c.scheme, _, _ = strings.Cut(c.endpoints[0], "://")
	c.http = cfg.HTTPClient
	if c.http == nil {
		c.http = &http.Client{Transport: &http.Transport{
			Proxy: http.ProxyFromEnvironment,
			DialContext: (&net.Dialer{
				Timeout:   5 * time.Second,
				KeepAlive: 30 * time.Second,
			}).DialContext,
			TLSClientConfig:     cfg.TLSConfig,
			ForceAttemptHTTP2:   true,
			MaxIdleConns:        64,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     90 * time.Second,
			TLSHandshakeTimeout: 5 * time.Second,
		}}
	}
	var err error
	if c.runner, err = NewRunner(c, cfg.Run); err != nil {
		return nil, err
	}
	return c, nil
}

// Close releases idle connections.
func (c *Client) Close() error {
	c.http.CloseIdleConnections()
	return nil
}

// Leader returns the base URL of the leader as last reported, or "".
func (c *Client) Leader() string {
	c.leaderMu.Lock()
	defer c.leaderMu.Unlock()
	return c.leader
}

func (c *Client) setLeader(apiAddr string) {
	u, err := baseURL(apiAddr, c.scheme == "https")
	if err != nil || !strings.HasPrefix(u, c.scheme+"://") {
		// Another scheme than the endpoints' is not followed: from https to http it
		// would send the token and every request in plain text.
		return
	}
	// A node bound to a wildcard address advertises nothing a client can dial;
	// following it would cost a failed attempt on every call.
	host, _, err := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://"))
	if ip := net.ParseIP(host); err != nil || host == "" || (ip != nil && ip.IsUnspecified()) {
		return
	}
	if !strings.Contains(apiAddr, "://") {
		u = c.scheme + "://" + apiAddr
	}
	c.leaderMu.Lock()
	if until, ok := c.failed[u]; !ok || !time.Now().Before(until) {
		c.leader = u
	}
	c.leaderMu.Unlock()
}

// leaderShun is how long a leader address that failed an attempt is not followed
// again. A node names the leader's advertised address, which a client outside the
// cluster's network (behind a load balancer) may never reach: followed on every
// answer, it cost every call a failed attempt, up to the whole Timeout, and every
// heartbeat too. Meanwhile the endpoints serve, a follower forwarding to the leader.
const leaderShun = 10 * time.Second

// demote forgets base as leader and as preferred endpoint after it failed; a leader
// that did not answer at all (unreached) is not followed again for leaderShun.
func (c *Client) demote(base string, unreached bool) {
	c.leaderMu.Lock()
	if c.leader == base && unreached {
		now := time.Now()
		for u, until := range c.failed {
			if !now.Before(until) {
				delete(c.failed, u)
			}
		}
		if c.failed == nil {
			c.failed = map[string]time.Time{}
		}
		c.failed[base] = now.Add(leaderShun)
	}
	if c.leader == base {
		c.leader = ""
	}
	c.leaderMu.Unlock()
	p := c.preferred.Load()
	if c.endpoints[int(p)%len(c.endpoints)] == base {
		c.preferred.CompareAndSwap(p, p+1)
	}
}

// target is where the next attempt goes: the leader when one is known, else the
// preferred endpoint. A failed target is demoted first, so retries move on.
func (c *Client) target() string {
	if l := c.Leader(); l != "" {
		return l
	}
	return c.endpoints[int(c.preferred.Load())%len(c.endpoints)]
}

// call describes one API call.
type call struct {
	method string
	route  string // the pattern, for span names: "/v1/records/{tenant}/{key}"
	path   string // escaped
	query  url.Values
	body   any
	wait   time.Duration // a long-poll's wait, added to the attempt timeout
	attrs  []attribute.KeyValue
	// stream, when set, takes a 2xx answer's body instead of JSON decoding (Backup).
	stream *stream
	// listing: the answer is a page of records, not bounded by maxAnswerBytes.
	listing bool
}

// do sends cl, retrying on another endpoint after failures that leave the request
// safe to repeat, and decodes the answer into out. retried reports whether an earlier
// attempt may have reached the server, which lets callers read some answers (a
// release that finds nothing) as the echo of their own earlier attempt.
func (c *Client) do(ctx context.Context, cl call, out any) (retried bool, err error) {
	var body []byte
	if cl.body != nil {
		if body, err = encodeBody(cl.body); err != nil {
			return false, fmt.Errorf("client: encoding %s: %w", cl.route, err)
		}
	}
	var last, unknown error // unknown: an attempt that may have been applied
	for attempt := 0; attempt < c.cfg.MaxAttempts; attempt++ {
		if attempt > 0 {
			if err := sleep(ctx, backoff(attempt, c.cfg.BackoffMin, c.cfg.BackoffMax)); err != nil {
				if unknown != nil {
					// An earlier attempt may have been applied: not the last one's
					// unavailable.
					return retried, fmt.Errorf("client: %s %s: %w (after: %w)", cl.method, cl.route, err, unknown)
				}
				return retried, fmt.Errorf("client: %s %s: %w (after: %w)", cl.method, cl.route, err, last)
			}
		}
		base := c.target()
		err := c.attempt(ctx, base, cl, body, out)
		if err == nil {
			return retried, nil
		}
		if ctx.Err() != nil {
			if errors.Is(err, idemkv.ErrOutcomeUnknown) {
				unknown = err
			}
			if unknown != nil {
				return retried, fmt.Errorf("client: %s %s: %w (after: %w)", cl.method, cl.route, context.Cause(ctx), unknown)
			}
			return retried, fmt.Errorf("client: %s %s: %w", cl.method, cl.route, context.Cause(ctx))
		}
		// outcome_unknown is repeated too: the body is the same, so the same attempt
		// id or fence, which makes the repeat recognisable to the server.
		if !errors.Is(err, idemkv.ErrUnavailable) && !errors.Is(err, idemkv.ErrOutcomeUnknown) {
			return retried, err
		}
		retried = true
		last = err
		if errors.Is(err, idemkv.ErrOutcomeUnknown) {
			unknown = err
		}
		// An answer (idemkv's error, a proxy's page) says the address is reachable;
		// only one that gave none is not followed again for a while.
		var answer *idemkv.Error
		c.demote(base, !errors.As(err, &answer))
		c.log.LogAttrs(ctx, slog.LevelDebug, "idemkv call failed, retrying",
			slog.String("route", cl.route), slog.String("endpoint", base),
			slog.Int("attempt", attempt+1), slog.Any("err", err))
	}
	if unknown != nil && !errors.Is(last, idemkv.ErrOutcomeUnknown) {
		// The last attempt reached nobody, but an earlier one may have been applied.
		return retried, fmt.Errorf("%w (the last attempt: %v)", unknown, last)
	}
	return retried, last
}

// attempt sends one request to base, under a span of its own.
func (c *Client) attempt(ctx context.Context, base string, cl call, body []byte, out any) (err error) {
	u := base + cl.path
	if len(cl.query) > 0 {
		u += "?" + cl.query.Encode()
	}
	ctx, span := c.tracer.Start(ctx, cl.method+" "+cl.route,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(append([]attribute.KeyValue{
			attribute.String("http.request.method", cl.method),
			attribute.String("url.full", u),
			attribute.String("server.address", strings.TrimPrefix(strings.TrimPrefix(base, "http://"), "https://")),
		}, cl.attrs...)...))
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()

	timeout := c.cfg.Timeout + cl.wait
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var answered func() bool
	if cl.stream != nil {
		actx, answered = answerWithin(actx, c.cfg.Timeout)
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(actx, cl.method, u, rd)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if cl.stream != nil {
		req.Header.Set("Accept", cl.stream.contentType)
	} else {
		req.Header.Set("Accept", "application/json")
	}
	if c.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	}
	c.prop.Inject(ctx, propagation.HeaderCarrier(req.Header))
	var sent atomic.Bool
	if cl.method != http.MethodGet {
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			WroteRequest: func(w httptrace.WroteRequestInfo) { sent.Store(w.Err == nil) },
		}))
	}

	resp, err := c.http.Do(req)
	if answered != nil && !answered() {
		if err == nil {
			resp.Body.Close()
		}
		err = context.Cause(actx)
	}
	if err != nil {
		// Nothing came back. Every idemkv request is safe to repeat, so either way this
		// is "try again"; but a write the server received may have been applied, and
		// unavailable says it certainly was not (docs/protocol.md, section 2): a
		// decision on an approval that took effect was reported as not taken.
		if sent.Load() {
			return fmt.Errorf("%w: %s %s: sent, and no answer came back: it may have been applied: %w", idemkv.ErrOutcomeUnknown, cl.method, base, err)
		}
		return fmt.Errorf("%w: %s %s: %w", idemkv.ErrUnavailable, cl.method, base, err)
	}
	defer resp.Body.Close()
	span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
	if l := resp.Header.Get(HeaderLeader); l != "" {
		c.setLeader(l)
	}
	if resp.StatusCode/100 == 2 {
		if cl.stream != nil {
			return cl.stream.read(base, resp)
		}
		var body io.Reader = resp.Body
		if !cl.listing {
			body = &boundedReader{r: resp.Body, left: maxAnswerBytes}
		}
		if err := json.NewDecoder(body).Decode(out); err != nil {
			// A body cut short is a transport failure like any other, after the server
			// answered: a write it answered 2xx took effect.
			if cl.method != http.MethodGet {
				return fmt.Errorf("%w: %s %s: reading the answer: %w", idemkv.ErrOutcomeUnknown, cl.method, base, err)
			}
			return fmt.Errorf("%w: %s %s: reading the answer: %w", idemkv.ErrUnavailable, cl.method, base, err)
		}
		return nil
	}
	return decodeError(resp, cl.method != http.MethodGet)
}

// boundedReader reads at most left bytes of r, and then fails rather than end the
// answer early as if it were whole.
type boundedReader struct {
	r    io.Reader
	left int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, fmt.Errorf("the answer is larger than the %d bytes any record takes", maxAnswerBytes)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// decodeError turns an error answer back into the *idemkv.Error the server sent, so
// that errors.Is finds the same sentinel on both sides of the wire.
func decodeError(resp *http.Response, write bool) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if e := idemkv.ParseErrorBody(data); e != nil {
		return e
	}
	// Not idemkv's answer: a proxy or a load balancer in between. Gateways that
	// could not reach a node mean "try another"; anything else is not ours to read.
	// A 502 (the node's answer broke off) or a 504 (no answer in time) may come after
	// the proxy forwarded a write, which may then have been applied.
	code := idemkv.CodeInternal
	switch resp.StatusCode {
	case http.StatusBadGateway, http.StatusGatewayTimeout:
		code = idemkv.CodeUnavailable
		if write {
			code = idemkv.CodeOutcomeUnknown
		}
	case http.StatusServiceUnavailable:
		code = idemkv.CodeUnavailable
	}
	msg := strings.TrimSpace(string(data))
	if len(msg) > 200 {
		msg = msg[:200]
	}
	return &idemkv.Error{Code: code, Message: fmt.Sprintf("HTTP %d: %s", resp.StatusCode, msg)}
}

// backoff returns a full-jitter exponential delay for the n-th retry (n >= 1).
func backoff(n int, lo, hi time.Duration) time.Duration {
	ceil := hi
	if n < 30 && lo<<(n-1) < hi && lo<<(n-1) > 0 {
		ceil = lo << (n - 1)
	}
	if ceil <= lo {
		return lo
	}
	return lo + rand.N(ceil-lo)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// NewAttemptID returns a random attempt id (idemkv.NewAttemptID, the one generator the
// node uses too). Do sends one per attempt so that a reserve retried after a lost
// answer is recognised as the same attempt. Kept here so a runtime needs only client.
func NewAttemptID() string { return idemkv.NewAttemptID() }

func escapeSegment(s string) string {
	e := url.PathEscape(s)
	// A segment that is "." or ".." would be cleaned away by the server's mux.
	if strings.Trim(e, ".") == "" {
		return strings.Repeat("%2E", len(e))
	}
	return e
}

// encodeBody is v as JSON without encoding/json's HTML escaping: the server stores a
// result's or an error's details as they arrive and bounds their size so, and escaping
// turns each <, > and & of a raw result into six bytes. A result that fits the bound as
// the tool gave it must fit as sent.
func encodeBody(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
