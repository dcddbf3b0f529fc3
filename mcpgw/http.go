package mcpgw

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv/internal/connlimit"
)

// The defaults of HTTPConfig. A tools/call body is a tool's arguments: a few KiB
// usually, and MCP has no streaming upload, so 4 MiB leaves room for large inline
// arguments while DefaultMaxConns of them cost at most 512 MiB. Before the bound one
// 400 MB POST raised the gateway from 33 MB to 911 MB before its 400.
const (
	DefaultMaxBodyBytes      = 4 << 20
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadBodyTimeout   = 30 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultSessionIdle       = time.Hour
	DefaultMaxConns          = 128
	DefaultMaxConnsPerSource = 32
	DefaultShutdownGrace     = 5 * time.Second
	DefaultWriteStall        = 30 * time.Second
)

// HTTPConfig configures the gateway's streamable HTTP server (Gateway.Serve,
// Gateway.Handler). Zero fields take the defaults of DefaultHTTPConfig.
type HTTPConfig struct {
	// Token, when set, is the bearer token every request to /mcp must carry
	// (Authorization: Bearer TOKEN); others get 401. The gateway holds an idemkv
	// token that may act for many tenants: without its own, anyone who reaches
	// the port acts with it.
	Token string
	// MaxBodyBytes bounds a request body; a larger one gets 413 and is not read
	// further.
	MaxBodyBytes int64
	// ReadHeaderTimeout bounds reading a request's headers, ReadBodyTimeout its
	// body; IdleTimeout closes a kept-alive connection that sends nothing. Nothing
	// bounds how long an answer streams: a tool call may take its tool's timeout.
	ReadHeaderTimeout time.Duration
	ReadBodyTimeout   time.Duration
	IdleTimeout       time.Duration
	// SessionIdle closes a session of MCP 2025-11-25 (or earlier) that has had no
	// request for this long, a GET stream open or not (the go-sdk times a session by
	// its requests); its client gets 404 for the old session and initializes anew, as
	// the protocol says it must. Every initialize makes a session, kept until then.
	SessionIdle time.Duration
	// MaxConns bounds the connections served at once. MaxConnsPerSource is one
	// source's share (an IPv4 address, an IPv6 /64): past it a source's new
	// connection takes the place of its own oldest idle one (no request in flight),
	// and is held as any other when all of its are busy. Past MaxConns a new
	// connection takes the place of an idle one of the source holding the most, or
	// waits while every connection is busy.
	MaxConns          int
	MaxConnsPerSource int
	// ShutdownGrace is how long Serve waits for calls in flight once its context
	// ends; past it connections are cut.
	ShutdownGrace time.Duration
	// WriteStallTimeout bounds how long one write of an answer (a result, a
	// progress notification, a log message) waits for its client to read, after
	// which the write fails and the connection is closed. A connection with a
	// request in flight is never closed to make room, so without it clients that
	// read none of their answers would hold MaxConns for good.
	WriteStallTimeout time.Duration
	// Logger gets the server's own errors; default: the gateway's logger.
	Logger *slog.Logger
}

// DefaultHTTPConfig returns the defaults.
func DefaultHTTPConfig() HTTPConfig {
	return HTTPConfig{MaxBodyBytes: DefaultMaxBodyBytes, ReadHeaderTimeout: DefaultReadHeaderTimeout,
		ReadBodyTimeout: DefaultReadBodyTimeout, IdleTimeout: DefaultIdleTimeout, MaxConns: DefaultMaxConns,
		MaxConnsPerSource: DefaultMaxConnsPerSource, SessionIdle: DefaultSessionIdle,
		ShutdownGrace: DefaultShutdownGrace, WriteStallTimeout: DefaultWriteStall}
}

// EnsureDefaults fills the zero fields.
func (c *HTTPConfig) EnsureDefaults() {
	d := DefaultHTTPConfig()
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = d.MaxBodyBytes
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = d.ReadHeaderTimeout
	}
	if c.ReadBodyTimeout == 0 {
		c.ReadBodyTimeout = d.ReadBodyTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = d.IdleTimeout
	}
	if c.SessionIdle == 0 {
		c.SessionIdle = d.SessionIdle
	}
	if c.MaxConns == 0 {
		c.MaxConns = d.MaxConns
	}
	if c.MaxConnsPerSource == 0 {
		c.MaxConnsPerSource = min(d.MaxConnsPerSource, c.MaxConns)
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = d.ShutdownGrace
	}
	if c.WriteStallTimeout == 0 {
		c.WriteStallTimeout = d.WriteStallTimeout
	}
}

// Validate reports a configuration that cannot work; it fills nothing.
func (c HTTPConfig) Validate() error {
	switch {
	case c.MaxBodyBytes < 0 || (c.MaxBodyBytes > 0 && c.MaxBodyBytes < 4<<10):
		return errors.New("mcpgw: MaxBodyBytes must be at least 4 KiB")
	case c.ReadHeaderTimeout < 0 || c.ReadBodyTimeout < 0 || c.IdleTimeout < 0 || c.ShutdownGrace < 0 || c.SessionIdle < 0 ||
		c.WriteStallTimeout < 0:
		return errors.New("mcpgw: HTTP timeouts must not be negative")
	case c.MaxConns < 0 || c.MaxConnsPerSource < 0:
		return errors.New("mcpgw: MaxConns and MaxConnsPerSource must not be negative")
	case strings.ContainsAny(c.Token, " \t\r\n"):
		return errors.New("mcpgw: the listen token must not contain white space")
	}
	return nil
}

// Handler is HTTPHandler behind the checks of cfg: the bearer token, and a body read
// whole, within MaxBodyBytes and ReadBodyTimeout, before anything decodes it.
func (g *Gateway) Handler(cfg HTTPConfig) http.Handler {
	cfg.EnsureDefaults()
	return g.httpHandler(cfg, &mcp.StreamableHTTPOptions{Logger: g.log, SessionTimeout: cfg.SessionIdle})
}

func (g *Gateway) httpHandler(cfg HTTPConfig, opts *mcp.StreamableHTTPOptions) http.Handler {
	cfg.EnsureDefaults()
	inner := g.eras(opts)
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w := &stallBound{ResponseWriter: rw, rc: http.NewResponseController(rw), stall: cfg.WriteStallTimeout}
		// What the server writes after the handler returned (the rest of its
		// buffer) gets the same bound.
		defer w.bound()
		if cfg.Token != "" && !bearerIs(r, cfg.Token) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="idemkv-mcp-gateway"`)
			httpError(w, http.StatusUnauthorized, "this gateway requires its bearer token (Authorization: Bearer …)")
			return
		}
		if r.Body != nil && r.Body != http.NoBody {
			body, status, err := readBody(w, r, cfg)
			if err != nil {
				httpError(w, status, err.Error())
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
		}
		inner.ServeHTTP(w, r)
	})
}

// stallBound gives the client WriteStallTimeout to take each stallChunk of an answer:
// an answer may stream for as long as its call runs, and a slow client may read a
// large one slowly, but a client that takes nothing for that long is cut off.
type stallBound struct {
	http.ResponseWriter
	rc    *http.ResponseController
	stall time.Duration
}

// stallChunk is how much of a write must be taken within the stall bound.
const stallChunk = 64 << 10

func (w *stallBound) bound() { _ = w.rc.SetWriteDeadline(time.Now().Add(w.stall)) }

func (w *stallBound) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		chunk := b[:min(len(b), stallChunk)]
		w.bound()
		m, err := w.ResponseWriter.Write(chunk)
		n += m
		if err != nil {
			return n, err
		}
		b = b[m:]
	}
	return n, nil
}

// Flush and FlushError are what the go-sdk and http.ResponseController call to push
// server-sent events out.
func (w *stallBound) Flush() { _ = w.FlushError() }

func (w *stallBound) FlushError() error {
	w.bound()
	return w.rc.Flush()
}

// Unwrap lets http.ResponseController reach the server's own writer (read
// deadlines, hijacking).
func (w *stallBound) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// readBody reads r's body whole within cfg's bounds, then lifts the read deadline: an
// answer that streams for a long call must not be cut by it.
func readBody(w http.ResponseWriter, r *http.Request, cfg HTTPConfig) ([]byte, int, error) {
	if r.ContentLength > cfg.MaxBodyBytes {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("the request body (%d bytes) is larger than the gateway's limit of %d bytes", r.ContentLength, cfg.MaxBodyBytes)
	}
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(time.Now().Add(cfg.ReadBodyTimeout)) == nil
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, cfg.MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("the request body is larger than the gateway's limit of %d bytes", cfg.MaxBodyBytes)
	case isTimeout(err):
		return nil, http.StatusRequestTimeout, fmt.Errorf("the request body did not arrive within %s", cfg.ReadBodyTimeout)
	case err != nil:
		return nil, http.StatusBadRequest, fmt.Errorf("reading the request body: %w", err)
	}
	if deadline {
		_ = rc.SetReadDeadline(time.Time{})
	}
	return body, 0, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func bearerIs(r *http.Request, token string) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(token)) == 1
}

// httpError answers with a JSON-RPC error without an id, which MCP clients show as
// it is, and closes the connection when the body was not read to its end.
func httpError(w http.ResponseWriter, status int, msg string) {
	b, err := jsonrpc.EncodeMessage(&jsonrpc.Response{Error: &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: msg}})
	if err != nil {
		http.Error(w, msg, status)
		return
	}
	// A body not read to its end, or a caller without the token: the connection is
	// not kept for another request (an unauthenticated one would sit idle in the
	// gateway's connection bound).
	if status == http.StatusRequestEntityTooLarge || status == http.StatusRequestTimeout || status == http.StatusUnauthorized {
		w.Header().Set("Connection", "close")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// Serve serves the gateway over streamable HTTP on ln, at /mcp (and GET /healthz,
// which needs no token), until ctx ends; then it waits up to cfg.ShutdownGrace for
// calls in flight.
func (g *Gateway) Serve(ctx context.Context, ln net.Listener, cfg HTTPConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg.EnsureDefaults()
	logger := cfg.Logger
	if logger == nil {
		logger = g.log
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", g.Handler(cfg))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	limited := connlimit.New(ln, cfg.MaxConns, cfg.MaxConnsPerSource)
	srv := &http.Server{
		ConnState:         limited.ConnState,
		Handler:           mux,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(atLeast{logger.Handler(), slog.LevelWarn}, slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(limited) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Sessions hold SSE streams open; past the grace they are cut.
		_ = srv.Close()
	}
	<-served
	return nil
}
