package mcpgw

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The go-sdk answers any request that comes before initialize with an error that has
// no JSON-RPC code, and logs it at ERROR ("method invalid during initialization"). A
// client of a newer protocol revision starts with such a request on purpose: mcp-go
// v1.2 probes with server/discover (SEP-2575) and falls back to initialize when the
// server does not know the method. So the gateway answers those requests itself,
// before the go-sdk sees them: -32601 (method not found) for a method MCP 2025-11-25
// does not have, -32600 (invalid request) for one it has but not before initialize.
// ServeIO and HTTPHandler do that; serving Server() directly does not.
//
// Nor does the gateway send a session anything but answers before its client sent
// initialize, on any transport (quietBeforeInitialize): such a client has not learned
// what the server offers, and one that reads an answer per request, as a
// server/discover probe over stdio does, takes whatever comes first for its answer.

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
	if !ok || !req.IsCall() {
		return nil, false
	}
	switch req.Method {
	case "initialize":
		return nil, true
	case "ping":
		return nil, false
	}
	e := &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound,
		Message: fmt.Sprintf("method %q not found: this server speaks MCP 2025-11-25 and earlier; start with initialize", req.Method)}
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
// initialize, which it answers on out itself; from initialize on it only passes bytes.
type preInitReader struct {
	src     *bufio.Reader
	out     io.Writer
	closer  io.Closer
	pending []byte
	through bool
}

func (p *preInitReader) Read(b []byte) (int, error) {
	for len(p.pending) == 0 {
		if p.through {
			return p.src.Read(b)
		}
		line, err := p.src.ReadBytes('\n')
		if len(line) > 0 {
			answer, initialize := preInitAnswer(line)
			switch {
			case answer != nil:
				if _, werr := p.out.Write(append(answer, '\n')); werr != nil {
					return 0, werr
				}
			default:
				p.through = initialize
				p.pending = line
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

// maxPeek bounds the body HTTPHandler reads to look for a request before initialize;
// such requests are small, and a larger body goes to the go-sdk untouched.
const maxPeek = 64 << 10

// HTTPHandler serves the gateway over streamable HTTP (mount it at /mcp). In
// stateless mode (opts.Stateless) every request comes without a session and the
// go-sdk treats sessions as initialized, so nothing is answered before it.
func (g *Gateway) HTTPHandler(opts *mcp.StreamableHTTPOptions) http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.server }, opts)
	if opts != nil && opts.Stateless {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Mcp-Session-Id") != "" || r.Body == nil {
			h.ServeHTTP(w, r)
			return
		}
		peek, err := io.ReadAll(io.LimitReader(r.Body, maxPeek+1))
		if err != nil {
			http.Error(w, "reading the request: "+err.Error(), http.StatusBadRequest)
			return
		}
		if len(peek) <= maxPeek {
			if answer, _ := preInitAnswer(peek); answer != nil {
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write(answer)
				return
			}
		}
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(peek), r.Body), r.Body}
		h.ServeHTTP(w, r)
	})
}
