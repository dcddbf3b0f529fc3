package mcpgw

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MCP has two eras, and the gateway serves both on one endpoint, deciding per request
// as the spec allows. A request of 2026-07-28 (ModernProtocol) carries its protocol
// version in _meta["io.modelcontextprotocol/protocolVersion"] (and, over HTTP, the
// MCP-Protocol-Version header): there is no initialize and no session, so over HTTP
// it goes to the go-sdk's stateless handler, where any gateway instance can answer
// it. Any other request is of 2025-11-25 or earlier and goes to the sessions of the
// stateful handler (stdio: the one session), which starts with initialize.
//
// The go-sdk answers a legacy request that comes before initialize with an error
// that has no JSON-RPC code, and logs it at ERROR ("method invalid during
// initialization"). So the gateway answers those requests itself, before the go-sdk
// sees them: -32601 (method not found) for a method MCP 2025-11-25 does not have
// (server/discover without a 2026-07-28 version among them: a probe of a client that
// falls back to initialize), -32600 (invalid request) for one it has but not before
// initialize. ServeIO and HTTPHandler do that; serving Server() directly does not.
//
// Nor does the gateway send a legacy session anything but answers before its client
// sent initialize, on any transport (quietBeforeInitialize): such a client has not
// learned what the server offers, and one that reads an answer per request, as a
// server/discover probe over stdio does, takes whatever comes first for its answer.

// modernVersion reports whether a protocol version is of the 2026-07-28 era.
func modernVersion(v string) bool { return v >= ModernProtocol }

// modernMessage reports whether a JSON-RPC message is a request of the 2026-07-28
// era: its _meta names such a protocol version.
func modernMessage(msg jsonrpc.Message) bool {
	req, ok := msg.(*jsonrpc.Request)
	if !ok {
		return false
	}
	var p struct {
		Meta map[string]any `json:"_meta"`
	}
	if len(req.Params) == 0 || json.Unmarshal(req.Params, &p) != nil {
		return false
	}
	v, _ := p.Meta[mcp.MetaKeyProtocolVersion].(string)
	return modernVersion(v)
}

// clientMethods are the requests a client may send under MCP 2025-11-25.
var clientMethods = map[string]bool{
	"initialize": true, "ping": true,
	"tools/list": true, "tools/call": true,
	"resources/list": true, "resources/templates/list": true, "resources/read": true,
	"resources/subscribe": true, "resources/unsubscribe": true,
	"prompts/list": true, "prompts/get": true,
	"completion/complete": true, "logging/setLevel": true,
	"tasks/get": true, "tasks/result": true, "tasks/list": true, "tasks/cancel": true,
}

// preInitAnswer returns the answer to msg when msg is a request that may not come
// before initialize, and initialize reports whether msg is the initialize request.
func preInitAnswer(msg []byte) (answer []byte, initialize bool) {
	m, err := jsonrpc.DecodeMessage(bytes.TrimSpace(msg))
	if err != nil {
		return nil, false // a batch, or not JSON-RPC: the go-sdk answers it
	}
	req, ok := m.(*jsonrpc.Request)
	if !ok || !req.IsCall() || modernMessage(m) {
		// A 2026-07-28 request needs no initialize: the go-sdk serves it.
		return nil, false
	}
	switch req.Method {
	case "initialize":
		return nil, true
	case "ping":
		return nil, false
	}
	e := &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound,
		Message: fmt.Sprintf("method %q not found before initialize: send initialize (MCP 2025-11-25 and earlier), or name protocol version %s or later in _meta[%q]",
			req.Method, ModernProtocol, mcp.MetaKeyProtocolVersion)}
	if clientMethods[req.Method] {
		e = &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: fmt.Sprintf("%q before initialize: send initialize first", req.Method)}
	}
	b, err := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: req.ID, Error: e})
	if err != nil {
		return nil, false
	}
	return b, false
}

// quietBeforeInitialize is sending middleware that drops the notifications a
// session would get before its client sent initialize. The go-sdk tells every
// session when the tool list changed (10 ms after New offers the upstream's tools,
// and after every change upstream), one that has not initialized too; its client
// lists the tools after it initializes anyway.
func quietBeforeInitialize(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if ss, ok := req.GetSession().(*mcp.ServerSession); ok && ss.InitializeParams() == nil &&
			strings.HasPrefix(method, "notifications/") {
			return nil, nil
		}
		return next(ctx, method, req)
	}
}

// ServeIO serves the gateway over newline-delimited JSON-RPC on r and w (stdio: the
// process's stdin and stdout) until the client goes away or ctx ends.
func (g *Gateway) ServeIO(ctx context.Context, r io.Reader, w io.Writer) error {
	out := &lockedWriter{w: w}
	in := &preInitReader{src: bufio.NewReaderSize(r, 64<<10), out: out}
	if c, ok := r.(io.Closer); ok {
		in.closer = c
	}
	return g.server.Run(ctx, &mcp.IOTransport{Reader: in, Writer: out})
}

// lockedWriter keeps the gateway's own answers from interleaving with the go-sdk's
// messages: each is one Write.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) Close() error { return nil }

// preInitReader passes lines through to the go-sdk, except requests before
// initialize, which it answers on out itself, and with a SEP-3182 key lifted into
// _meta (liftSEP3182Key).
type preInitReader struct {
	src     *bufio.Reader
	out     io.Writer
	closer  io.Closer
	pending []byte
	through bool
}

func (p *preInitReader) Read(b []byte) (int, error) {
	for len(p.pending) == 0 {
		line, err := p.src.ReadBytes('\n')
		if answer := uncleanAnswer(line); answer != nil {
			if _, werr := p.out.Write(append(answer, '\n')); werr != nil {
				return 0, werr
			}
			line = nil
		}
		if len(line) > 0 && p.through {
			p.pending = liftSEP3182Key(line)
		} else if len(line) > 0 {
			answer, initialize := preInitAnswer(line)
			switch {
			case answer != nil:
				if _, werr := p.out.Write(append(answer, '\n')); werr != nil {
					return 0, werr
				}
			default:
				p.through = initialize
				p.pending = liftSEP3182Key(line)
			}
		}
		if err != nil && len(p.pending) == 0 {
			return 0, err
		}
	}
	n := copy(b, p.pending)
	p.pending = p.pending[n:]
	return n, nil
}

func (p *preInitReader) Close() error {
	if p.closer != nil {
		return p.closer.Close()
	}
	return nil
}

// HTTPHandler serves the gateway over streamable HTTP (mount it at /mcp), both eras
// on one endpoint: a request of 2026-07-28 goes to the go-sdk's stateless handler, any
// other to its sessions (opts.Stateless: everything to the stateless handler). It
// reads each body whole, within DefaultMaxBodyBytes; Handler takes the bounds, the
// timeouts and the token of an HTTPConfig.
func (g *Gateway) HTTPHandler(opts *mcp.StreamableHTTPOptions) http.Handler {
	return g.httpHandler(DefaultHTTPConfig(), opts)
}

func (g *Gateway) eras(opts *mcp.StreamableHTTPOptions) http.Handler {
	var o mcp.StreamableHTTPOptions
	if opts != nil {
		o = *opts
	}
	serve := func(*http.Request) *mcp.Server { return g.server }
	sessions := mcp.NewStreamableHTTPHandler(serve, &o)
	o.Stateless = true
	stateless := mcp.NewStreamableHTTPHandler(serve, &o)
	if opts != nil && opts.Stateless {
		return stateless
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil || r.Body == http.NoBody {
			if modernVersion(r.Header.Get("Mcp-Protocol-Version")) {
				stateless.ServeHTTP(w, r)
				return
			}
			sessions.ServeHTTP(w, r)
			return
		}
		// The body was read whole by handler, within its bound.
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "reading the request: "+err.Error(), http.StatusBadRequest)
			return
		}
		if answer := uncleanAnswer(body); answer != nil {
			// A JSON-RPC error, as the go-sdk answers a call it refuses: the transport
			// did its part, so a client shows the error rather than retrying.
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(answer)
			return
		}
		body = liftSEP3182Key(body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		msg, derr := jsonrpc.DecodeMessage(bytes.TrimSpace(body))
		switch {
		case modernVersion(r.Header.Get("Mcp-Protocol-Version")) || (derr == nil && modernMessage(msg)):
			stateless.ServeHTTP(w, r)
			return
		case r.Header.Get("Mcp-Session-Id") == "":
			if answer, _ := preInitAnswer(body); answer != nil {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write(answer)
				return
			}
		}
		sessions.ServeHTTP(w, r)
	})
}
