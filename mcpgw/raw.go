package mcpgw

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The go-sdk decodes what an upstream answers into Go types, and that loses things the
// gateway must pass on exactly: structuredContent and _meta are decoded into float64
// (an integer beyond 2^53 such as 9007199254740993 becomes ...992; still so in
// v1.8.0), and a tool's annotations are re-encoded: before v1.7.0 every false hint was
// dropped (readOnlyHint and idempotentHint were plain bools with omitempty); since,
// a hint the upstream left out is written as false, and the tool's members come in
// the go-sdk's order. The tap below keeps the upstream's own bytes of every
// tools/call and tools/list answer, read off the transport before the go-sdk decodes
// them, and the gateway answers its agents with those bytes.

// progressTokenPrefix starts the progress token the gateway puts on every tools/call it
// sends upstream: it tells the tap which answer belongs to which call, and routes the
// upstream's progress notifications back to the agent that asked.
const progressTokenPrefix = "io.idemkv/gw-"

// tap holds raw upstream answers until the call that waits for them takes them.
type tap struct {
	mu      sync.Mutex
	results map[string]json.RawMessage // progress token -> the answer's result
	waiting map[string]bool            // progress tokens whose call still waits
	// gone are the progress tokens of calls whose HTTP request the upstream answered
	// with 404 Not Found: it holds no such session (or endpoint), and ran nothing.
	gone  map[string]bool
	relay map[string]func(*mcp.ProgressNotificationParams)
	tools map[string]json.RawMessage // tool name -> the tool as last listed
}

func newTap() *tap {
	return &tap{results: map[string]json.RawMessage{}, waiting: map[string]bool{}, gone: map[string]bool{}, tools: map[string]json.RawMessage{},
		relay: map[string]func(*mcp.ProgressNotificationParams){}}
}

// tapIDs are the request ids of one connection to the upstream whose answers the tap
// keeps (guarded by tap.mu). Ids are the connection's own: a new session numbers its
// requests from 1 again, while the session it replaced may still be answering its own
// (the go-sdk lets calls in flight finish when a session is closed), and an answer
// matched by id alone across the two would become another call's receipt.
type tapIDs struct {
	calls map[jsonrpc.ID]string // tools/call request id -> its progress token
	lists map[jsonrpc.ID]bool   // tools/list request ids
}

func newTapIDs() *tapIDs {
	return &tapIDs{calls: map[jsonrpc.ID]string{}, lists: map[jsonrpc.ID]bool{}}
}

// expect registers a call by its progress token before it is sent; progress (when
// not nil) gets the upstream's progress notifications for it. They are relayed from
// the transport's read, in the order the upstream sent them, so that all that came
// before the answer are relayed before the answer is.
func (t *tap) expect(token string, progress func(*mcp.ProgressNotificationParams)) {
	t.mu.Lock()
	t.waiting[token] = true
	if progress != nil {
		t.relay[token] = progress
	}
	t.mu.Unlock()
}

// take returns the raw result of the call with token, if it came, and whether the
// upstream refused its HTTP request as one for a session it does not hold (gone), and
// forgets it.
func (t *tap) take(token string) (raw json.RawMessage, gone bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	raw, gone = t.results[token], t.gone[token]
	delete(t.results, token)
	delete(t.waiting, token)
	delete(t.relay, token)
	delete(t.gone, token)
	return raw, gone
}

// callToken is the progress token of a tools/call request, "" for any other message.
func callToken(msg jsonrpc.Message) string {
	req, ok := msg.(*jsonrpc.Request)
	if !ok || !req.IsCall() || req.Method != "tools/call" {
		return ""
	}
	var p struct {
		Meta struct {
			ProgressToken any `json:"progressToken"`
		} `json:"_meta"`
	}
	if json.Unmarshal(req.Params, &p) != nil {
		return ""
	}
	token, _ := p.Meta.ProgressToken.(string)
	return token
}

func (t *tap) progress(params json.RawMessage) {
	var p mcp.ProgressNotificationParams
	if json.Unmarshal(params, &p) != nil {
		return
	}
	token, _ := p.ProgressToken.(string)
	p.Meta = withoutOwnMeta(p.Meta)
	t.mu.Lock()
	f := t.relay[token]
	t.mu.Unlock()
	if f != nil {
		f(&p)
	}
}

// tool returns the upstream's own JSON of a tool, as last listed.
func (t *tap) tool(name string) json.RawMessage {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tools[name]
}

// sent notes the requests of one connection whose answers the tap keeps.
func (t *tap) sent(ids *tapIDs, msg jsonrpc.Message) {
	req, ok := msg.(*jsonrpc.Request)
	if !ok || !req.IsCall() {
		return
	}
	t.mu.Lock()
	delete(ids.calls, req.ID)
	delete(ids.lists, req.ID)
	t.mu.Unlock()
	switch req.Method {
	case "tools/list":
		t.mu.Lock()
		ids.lists[req.ID] = true
		t.mu.Unlock()
	case "tools/call":
		token := callToken(msg)
		t.mu.Lock()
		if t.waiting[token] {
			ids.calls[req.ID] = token
		}
		t.mu.Unlock()
	}
}

// received keeps the raw result of an answer to a request sent on the same connection
// (ids), and relays progress.
func (t *tap) received(ids *tapIDs, msg jsonrpc.Message) {
	if req, ok := msg.(*jsonrpc.Request); ok {
		if req.Method == "notifications/progress" {
			t.progress(req.Params)
		}
		return
	}
	resp, ok := msg.(*jsonrpc.Response)
	if !ok {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if token, ok := ids.calls[resp.ID]; ok {
		delete(ids.calls, resp.ID)
		if t.waiting[token] && resp.Error == nil && len(resp.Result) > 0 {
			t.results[token] = bytes.Clone(resp.Result)
		}
		return
	}
	if ids.lists[resp.ID] {
		delete(ids.lists, resp.ID)
		var page struct {
			Tools []json.RawMessage `json:"tools"`
		}
		if resp.Error != nil || json.Unmarshal(resp.Result, &page) != nil {
			return
		}
		for _, raw := range page.Tools {
			var named struct {
				Name string `json:"name"`
			}
			if json.Unmarshal(raw, &named) != nil || named.Name == "" {
				continue
			}
			if clean := scrubTool(raw); clean != nil {
				t.tools[named.Name] = bytes.Clone(clean)
			} else {
				delete(t.tools, named.Name)
			}
		}
	}
}

// wrap makes transport report to the tap. A streamable HTTP transport is tapped at its
// HTTP client, so that the go-sdk keeps its own connection (which learns the session's
// state and opens the stream that carries list_changed notifications); any other
// transport (stdio, in-memory) is tapped at its connection. Each call wraps one
// session's transport, with request ids of its own.
func (t *tap) wrap(transport mcp.Transport) mcp.Transport {
	ids := newTapIDs()
	if st, ok := transport.(*mcp.StreamableClientTransport); ok {
		hc := st.HTTPClient
		if hc == nil {
			hc = http.DefaultClient
		}
		c := *hc
		rt := c.Transport
		if rt == nil {
			rt = http.DefaultTransport
		}
		c.Transport = &tapRoundTripper{next: rt, tap: t, ids: ids}
		st.HTTPClient = &c
		return st
	}
	return &tapTransport{next: transport, tap: t, ids: ids}
}

type tapTransport struct {
	next mcp.Transport
	tap  *tap
	ids  *tapIDs
}

func (tt *tapTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	conn, err := tt.next.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &tapConn{Connection: conn, tap: tt.tap, ids: tt.ids}, nil
}

type tapConn struct {
	mcp.Connection
	tap *tap
	ids *tapIDs
}

func (c *tapConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if err == nil {
		c.tap.received(c.ids, msg)
	}
	return msg, err
}

func (c *tapConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	c.tap.sent(c.ids, msg)
	return c.Connection.Write(ctx, msg)
}

// tapRoundTripper reads the JSON-RPC messages of streamable HTTP: the request body
// going out, and the JSON or server-sent-event body coming back, as the go-sdk reads
// it, so that each answer reaches the tap before the go-sdk has decoded it.
// sessionIDHeader names the session a streamable HTTP request belongs to (MCP
// 2025-11-25 and earlier).
const sessionIDHeader = "Mcp-Session-Id"

type tapRoundTripper struct {
	next http.RoundTripper
	tap  *tap
	ids  *tapIDs
}

func (rt *tapRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	token := ""
	if req.Method == http.MethodPost && req.Body != nil {
		body, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		if msg, err := jsonrpc.DecodeMessage(body); err == nil {
			rt.tap.sent(rt.ids, msg)
			token = callToken(msg)
		}
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		req.ContentLength = int64(len(body))
	}
	resp, err := rt.next.RoundTrip(req)
	if err != nil || resp.Body == nil {
		return resp, err
	}
	if token != "" && resp.StatusCode == http.StatusNotFound && req.Header.Get(sessionIDHeader) != "" {
		// The streamable HTTP transport answers 404 to a request for a session
		// the server no longer holds (it restarted, or timed the session out),
		// before it reads the request: the tool did not run. Only a request that
		// names a session can meet a session the server forgot: 2026-07-28 has no
		// sessions, and answers a JSON-RPC -32601 with 404, which a tool's handler
		// may send after it did its work (that error says on its own what it says;
		// called again on a new session, the tool ran twice).
		rt.tap.mu.Lock()
		if rt.tap.waiting[token] {
			rt.tap.gone[token] = true
		}
		rt.tap.mu.Unlock()
	}
	ct := resp.Header.Get("Content-Type")
	switch {
	case strings.HasPrefix(ct, "application/json"):
		resp.Body = &jsonBody{ReadCloser: resp.Body, tap: rt.tap, ids: rt.ids}
	case strings.HasPrefix(ct, "text/event-stream"):
		resp.Body = &sseBody{ReadCloser: resp.Body, tap: rt.tap, ids: rt.ids}
	}
	return resp, nil
}

// jsonBody hands the whole body to the tap when it has been read.
type jsonBody struct {
	io.ReadCloser
	tap  *tap
	ids  *tapIDs
	buf  bytes.Buffer
	done bool
}

func (b *jsonBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.buf.Write(p[:n])
	if errors.Is(err, io.EOF) && !b.done {
		b.done = true
		if msg, derr := jsonrpc.DecodeMessage(b.buf.Bytes()); derr == nil {
			b.tap.received(b.ids, msg)
		}
	}
	return n, err
}

// sseBody hands each event's data to the tap as soon as the event is complete,
// before the bytes that complete it are returned to the go-sdk.
type sseBody struct {
	io.ReadCloser
	tap  *tap
	ids  *tapIDs
	line []byte // the unfinished line
	data bytes.Buffer
}

func (b *sseBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	chunk := p[:n]
	for len(chunk) > 0 {
		i := bytes.IndexByte(chunk, '\n')
		if i < 0 {
			b.line = append(b.line, chunk...)
			break
		}
		b.line = append(b.line, chunk[:i]...)
		chunk = chunk[i+1:]
		b.event(bytes.TrimSuffix(b.line, []byte("\r")))
		b.line = b.line[:0]
	}
	return n, err
}

func (b *sseBody) event(line []byte) {
	switch {
	case len(line) == 0:
		if b.data.Len() > 0 {
			if msg, err := jsonrpc.DecodeMessage(b.data.Bytes()); err == nil {
				b.tap.received(b.ids, msg)
			}
			b.data.Reset()
		}
	case bytes.HasPrefix(line, []byte("data:")):
		if b.data.Len() > 0 {
			b.data.WriteByte('\n')
		}
		b.data.Write(bytes.TrimPrefix(bytes.TrimPrefix(line, []byte("data:")), []byte(" ")))
	}
}

// member is one member of a JSON object, its value as the bytes it was written with.
type member struct {
	name  string
	value json.RawMessage
}

// members reads the members of a JSON object in order, each value untouched.
func members(raw json.RawMessage) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object")
	}
	var out []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, member{name, v})
	}
	return out, nil
}

func writeObject(ms []member) json.RawMessage {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		name, _ := json.Marshal(m.name)
		b.Write(name)
		b.WriteByte(':')
		b.Write(m.value)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// withMeta returns the result raw with its _meta's keys under MetaPrefix replaced by
// own (none: removed), every other byte of every value as it was. own's values are
// encoded with encoding/json.
func withMeta(raw json.RawMessage, own mcp.Meta) (json.RawMessage, error) {
	ms, err := members(raw)
	if err != nil {
		return nil, err
	}
	// A stored receipt may predate the gateway's normalising of duplicate members
	// (hostile.go): the last of each is the one that was decided on.
	ms, deduped := lastOfEach(ms)
	var meta []member
	at := -1
	for i, m := range ms {
		if m.name != "_meta" {
			continue
		}
		at = i
		if meta, err = members(m.value); err != nil {
			return nil, fmt.Errorf("_meta: %w", err)
		}
		var d bool
		meta, d = lastOfEach(meta)
		deduped = deduped || d
	}
	kept := meta[:0]
	for _, m := range meta {
		if !strings.HasPrefix(m.name, MetaPrefix) {
			kept = append(kept, m)
		}
	}
	changed := deduped || len(kept) != len(meta) || len(own) > 0
	if !changed {
		return raw, nil
	}
	names := make([]string, 0, len(own))
	for k := range own {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		v, err := json.Marshal(own[k])
		if err != nil {
			return nil, err
		}
		kept = append(kept, member{k, v})
	}
	switch {
	case len(kept) == 0 && at >= 0:
		ms = append(ms[:at], ms[at+1:]...)
	case at >= 0:
		ms[at].value = writeObject(kept)
	case len(kept) > 0:
		ms = append(ms, member{"_meta", writeObject(kept)})
	}
	return writeObject(ms), nil
}

// ownMeta is the part of m under MetaPrefix.
func ownMeta(m mcp.Meta) mcp.Meta {
	out := mcp.Meta{}
	for k, v := range m {
		if strings.HasPrefix(k, MetaPrefix) {
			out[k] = v
		}
	}
	return out
}

// rawCallResult and rawListResult go to the agent as the given bytes instead of as
// the go-sdk would encode them; embedding the go-sdk's result makes them mcp.Results.
type rawCallResult struct {
	*mcp.CallToolResult
	raw    json.RawMessage
	modern bool
}

func (r *rawCallResult) MarshalJSON() ([]byte, error) {
	return withProtocol(r.raw, r.CallToolResult.Meta, r.modern)
}

type rawListResult struct {
	*mcp.ListToolsResult
	raw    json.RawMessage
	modern bool
}

func (r *rawListResult) MarshalJSON() ([]byte, error) {
	return withProtocol(r.raw, r.ListToolsResult.Meta, r.modern)
}

// withProtocol adds to the bytes of an answer to a 2026-07-28 request what that era
// puts on every result and the go-sdk set after the gateway built it: resultType
// "complete" (an input_required answer, relayed or the gateway's own, is never
// sent from upstream bytes) and the _meta keys under
// io.modelcontextprotocol/ (the gateway's serverInfo, in place of an upstream's).
// An answer in the earlier era goes as it is.
func withProtocol(raw json.RawMessage, meta mcp.Meta, modern bool) ([]byte, error) {
	if !modern {
		return raw, nil
	}
	ms, err := members(raw)
	if err != nil {
		return nil, err
	}
	ms, _ = lastOfEach(ms)
	own := mcp.Meta{}
	for k, v := range meta {
		if strings.HasPrefix(k, protocolMetaPrefix) {
			own[k] = v
		}
	}
	hasType := false
	for i, m := range ms {
		switch m.name {
		case "resultType":
			hasType = true
			ms[i].value = json.RawMessage(`"complete"`)
		case "_meta":
			inner, err := members(m.value)
			if err != nil {
				return nil, err
			}
			// The gateway is the server of this conversation: its keys under
			// io.modelcontextprotocol/ (serverInfo) replace the upstream's.
			inner = slices.DeleteFunc(inner, func(im member) bool { _, ok := own[im.name]; return ok })
			for _, k := range sortedKeys(own) {
				v, err := json.Marshal(own[k])
				if err != nil {
					return nil, err
				}
				inner = append(inner, member{k, v})
			}
			ms[i].value = writeObject(inner)
			own = nil
		}
	}
	if len(own) > 0 {
		var inner []member
		for _, k := range sortedKeys(own) {
			v, err := json.Marshal(own[k])
			if err != nil {
				return nil, err
			}
			inner = append(inner, member{k, v})
		}
		ms = append(ms, member{"_meta", writeObject(inner)})
	}
	if !hasType {
		ms = append(ms, member{"resultType", json.RawMessage(`"complete"`)})
	}
	return writeObject(ms), nil
}

func sortedKeys(m mcp.Meta) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// modernRequest reports whether req is of the 2026-07-28 era.
func modernRequest(req mcp.Request) bool {
	var meta mcp.Meta
	switch r := req.(type) {
	case *mcp.CallToolRequest:
		if r.Params != nil {
			meta = r.Params.Meta
		}
	case *mcp.ListToolsRequest:
		if r.Params != nil {
			meta = r.Params.Meta
		}
	}
	v, _ := meta[mcp.MetaKeyProtocolVersion].(string)
	return modernVersion(v)
}

// rawSlot carries the bytes of a tools/call answer from the tool handler to the
// middleware that hands them to the go-sdk.
type rawSlot struct{ raw json.RawMessage }

type rawSlotKey struct{}

// passRaw is the server middleware that answers tools/call with the bytes the handler
// left in its slot, and tools/list with the upstream's own JSON of each tool.
func (g *Gateway) passRaw(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "tools/call":
			slot := &rawSlot{}
			res, err := next(context.WithValue(ctx, rawSlotKey{}, slot), method, req)
			if cr, ok := res.(*mcp.CallToolResult); ok && err == nil && slot.raw != nil {
				return &rawCallResult{CallToolResult: cr, raw: slot.raw, modern: modernRequest(req)}, nil
			}
			return res, err
		case "tools/list":
			res, err := next(ctx, method, req)
			lr, ok := res.(*mcp.ListToolsResult)
			if !ok || err != nil {
				return res, err
			}
			if raw, ok := g.rawTools(lr); ok {
				return &rawListResult{ListToolsResult: lr, raw: raw, modern: modernRequest(req)}, nil
			}
			return res, err
		}
		return next(ctx, method, req)
	}
}

// rawTools encodes a page of tools with each tool as the upstream listed it.
func (g *Gateway) rawTools(lr *mcp.ListToolsResult) (json.RawMessage, bool) {
	tools := make([]json.RawMessage, 0, len(lr.Tools))
	for _, t := range lr.Tools {
		raw := g.up.tap.tool(t.Name)
		if raw == nil {
			return nil, false
		}
		tools = append(tools, raw)
	}
	out := struct {
		Meta       mcp.Meta          `json:"_meta,omitempty"`
		Tools      []json.RawMessage `json:"tools"`
		NextCursor string            `json:"nextCursor,omitempty"`
	}{lr.Meta, tools, lr.NextCursor}
	b, err := json.Marshal(out)
	return b, err == nil
}

// setRaw leaves the bytes of the answer in ctx's slot: raw with the gateway's _meta
// keys of res.
func setRaw(ctx context.Context, res *mcp.CallToolResult, raw json.RawMessage) {
	slot, _ := ctx.Value(rawSlotKey{}).(*rawSlot)
	if slot == nil || raw == nil || res == nil {
		return
	}
	if b, err := withMeta(raw, ownMeta(res.Meta)); err == nil {
		slot.raw = b
	}
}
