package mcpgw

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
)

// The _meta keys the gateway reads from calls and writes on results. Keys under
// MetaPrefix are the gateway's own: it never forwards them upstream.
const (
	MetaPrefix = "io.idemkv/"
	// MetaIdempotencyKey (call): the key of the business operation.
	MetaIdempotencyKey = MetaPrefix + "idempotency_key"
	// MetaTenant (call): the tenant, overriding the policy's.
	MetaTenant = MetaPrefix + "tenant"
	// MetaActor (call): who runs the attempt; default: the MCP client's name.
	MetaActor = MetaPrefix + "actor"
	// MetaDecision (result): execute, replay, recover or conflict.
	MetaDecision = MetaPrefix + "decision"
	// MetaError (result): why the gateway answered with a tool error of its own; one
	// of the Code* values.
	MetaError = MetaPrefix + "error"
	// MetaFingerprint (result): the effect fingerprint of the call.
	MetaFingerprint = MetaPrefix + "effect_fingerprint"
	// MetaDetails (result): on the gateway's own tool errors, what the error is about
	// as JSON (the conflict of docs/protocol.md, the in-doubt record). It lives in
	// _meta and in the text, never in structuredContent: that belongs to the tool's
	// declared outputSchema, and clients that validate it would reject the answer.
	MetaDetails = MetaPrefix + "details"
	// MetaWarning (result): the upstream answered but idemkv could not store the
	// outcome; a retry will recover it.
	MetaWarning = MetaPrefix + "warning"
)

// The codes of MetaError.
const (
	// CodeConflict: the key names a different effect or tool; nothing ran.
	CodeConflict = "conflict"
	// CodeMissingKey: a mutating call without a key was refused; nothing ran.
	CodeMissingKey = "missing_idempotency_key"
	// CodeInDoubt: an earlier attempt died and the tool has no probe; nothing ran.
	CodeInDoubt = "in_doubt"
	// CodeOutcomeUnknown: the upstream failed while the call was in flight; the
	// record stays pending and a retry with the same key recovers it.
	CodeOutcomeUnknown = "outcome_unknown"
	// CodeUpstreamUnavailable: the upstream could not be reached; nothing ran.
	CodeUpstreamUnavailable = "upstream_unavailable"
	// CodeStoreUnavailable: idemkv could not be reached; nothing ran.
	CodeStoreUnavailable = "idemkv_unavailable"
	// CodeInvalidArgument: the call cannot be recorded as it is (a key that is not
	// printable, arguments that are not an object); nothing ran.
	CodeInvalidArgument = "invalid_argument"
	// CodeInternal: anything else.
	CodeInternal = "internal"
)

// FailureCode is the code a stored upstream tool error (isError) carries in idemkv.
const FailureCode = "mcp_tool_error"

// DefaultMaxReceiptBytes is how large a stored result may be by default: idemkv's
// default limit for a record's result and error details.
const DefaultMaxReceiptBytes = 64 << 10

// encodeResult turns a CallToolResult into what idemkv stores, within max bytes. A
// result too large loses its unstructured content first (the structured content says
// the same thing to a program), then everything but a note; truncated reports that.
//
// upstream, when not nil, is the result as the upstream sent it: it is stored as it
// came (without any _meta key of the gateway's), so that a replay answers with the
// same bytes, integers beyond 2^53 included.
func encodeResult(res *mcp.CallToolResult, upstream json.RawMessage, max int) (raw json.RawMessage, truncated bool, err error) {
	if upstream != nil {
		if raw, err = withMeta(upstream, nil); err == nil && len(raw) <= max {
			return raw, false, nil
		}
	}
	clean := *res
	clean.Meta = withoutOwnMeta(res.Meta)
	if raw, err = json.Marshal(&clean); err != nil {
		return nil, false, fmt.Errorf("mcpgw: encoding the tool result: %w", err)
	}
	if len(raw) <= max {
		return raw, false, nil
	}
	size := len(raw)
	if clean.StructuredContent != nil {
		slim := clean
		slim.Content = []mcp.Content{&mcp.TextContent{Text: "(the unstructured content was too large to store; see the structured content)"}}
		if raw, err = json.Marshal(&slim); err == nil && len(raw) <= max {
			return raw, true, nil
		}
	}
	note := &mcp.CallToolResult{
		IsError: res.IsError,
		Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(
			"idemkv: the tool's result (%d bytes) was larger than the %d bytes that can be stored; the call did take effect", size, max)}},
	}
	if raw, err = json.Marshal(note); err != nil {
		return nil, false, fmt.Errorf("mcpgw: encoding the tool result: %w", err)
	}
	return raw, true, nil
}

// decodeResult reads a stored result back. A receipt committed by other means (a
// person resolving an in-doubt record with `idemkv resolve`) may hold any JSON or
// none: the answer then describes the receipt itself, in the text and in _meta. For
// a tool that declares an outputSchema only the receipt's own result, when it is an
// object, may become structuredContent (the operator recorded what the tool would
// have returned); the gateway's description never does.
func decodeResult(receipt *idemkv.Receipt, declared bool) *mcp.CallToolResult {
	if len(receipt.Result) > 0 && isObject(receipt.Result) {
		var res mcp.CallToolResult
		if err := json.Unmarshal(receipt.Result, &res); err == nil && res.Content != nil {
			return withRaw(&res, receipt.Result)
		}
	}
	desc := map[string]any{
		"status":        receipt.Status,
		"remote_system": receipt.RemoteSystem,
		"remote_id":     receipt.RemoteID,
	}
	if receipt.RemoteURL != "" {
		desc["remote_url"] = receipt.RemoteURL
	}
	if len(receipt.Result) > 0 {
		desc["result"] = receipt.Result
	}
	if !declared {
		return structuredResult(desc, false)
	}
	text, _ := json.Marshal(desc)
	res := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(text)}}, Meta: mcp.Meta{MetaDetails: desc}}
	if isObject(receipt.Result) {
		res.StructuredContent = receipt.Result
	}
	return res
}

// decodeFailure reads a stored failure back: the upstream's own isError answer when
// the gateway stored it, else one made of the stored code and message.
func decodeFailure(receipt *idemkv.Receipt) *mcp.CallToolResult {
	info := receipt.Error
	if info == nil {
		info = &idemkv.ErrorInfo{Code: client.DefaultFailureCode, Message: "the operation failed"}
	}
	if info.Code == FailureCode && isObject(info.Details) {
		var res mcp.CallToolResult
		if err := json.Unmarshal(info.Details, &res); err == nil && res.Content != nil && res.IsError {
			return withRaw(&res, info.Details)
		}
	}
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: info.Code + ": " + info.Message}},
		Meta: mcp.Meta{MetaDetails: map[string]any{"code": info.Code, "message": info.Message}}}
}

func isObject(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{'
}

// structuredResult is a result whose structured content is v and whose text is v as
// JSON, which is how the go-sdk fills in results of typed tools.
func structuredResult(v any, isError bool) *mcp.CallToolResult {
	text, err := json.Marshal(v)
	if err != nil {
		text = []byte(fmt.Sprintf("%v", v))
	}
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: string(text)}},
		StructuredContent: v,
		IsError:           isError,
	}
}

// errorResult is a tool error the gateway answers itself: a sentence for the model
// followed by the details as JSON, and the code and details in _meta. Never
// structuredContent: see MetaDetails.
func errorResult(code, msg string, details any) *mcp.CallToolResult {
	res := &mcp.CallToolResult{IsError: true, Meta: mcp.Meta{MetaError: code}}
	text := msg
	if details != nil {
		if b, err := json.Marshal(details); err == nil {
			text += "\n" + string(b)
		}
		res.Meta[MetaDetails] = details
	}
	res.Content = []mcp.Content{&mcp.TextContent{Text: text}}
	return res
}

// withoutOwnMeta copies m without the gateway's keys.
func withoutOwnMeta(m mcp.Meta) mcp.Meta {
	if len(m) == 0 {
		return nil
	}
	out := make(mcp.Meta, len(m))
	for k, v := range m {
		if !strings.HasPrefix(k, MetaPrefix) {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// annotate sets the gateway's _meta keys on a copy of res.
func annotate(res *mcp.CallToolResult, kv ...string) *mcp.CallToolResult {
	out := *res
	meta := make(mcp.Meta, len(res.Meta)+len(kv)/2)
	for k, v := range res.Meta {
		meta[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			meta[kv[i]] = kv[i+1]
		}
	}
	out.Meta = meta
	return &out
}

// structured returns a result's structured content, or the JSON object its first text
// content holds (servers written before structured content often answer that way).
func structured(res *mcp.CallToolResult, raw json.RawMessage) any {
	if raw != nil {
		if ms, err := members(raw); err == nil {
			for _, m := range ms {
				if m.name != "structuredContent" {
					continue
				}
				var v any
				dec := json.NewDecoder(bytes.NewReader(m.value))
				dec.UseNumber()
				if dec.Decode(&v) == nil && v != nil {
					return v
				}
			}
		}
	}
	if res.StructuredContent != nil {
		return normalize(res.StructuredContent)
	}
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			var v any
			dec := json.NewDecoder(strings.NewReader(t.Text))
			dec.UseNumber()
			if dec.Decode(&v) == nil {
				if _, ok := v.(map[string]any); ok {
					return v
				}
			}
			return nil
		}
	}
	return nil
}

// normalize re-decodes v with json.Number, so that paths and templates see the same
// values however v was built.
func normalize(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out any
	if dec.Decode(&out) != nil {
		return v
	}
	return out
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

// metaRaw carries, inside a result's _meta on its way through the gateway, the bytes
// the result came with (from the upstream, or stored in idemkv). sendRaw takes it out
// before anything is sent; it never reaches an agent or idemkv.
const metaRaw = MetaPrefix + "raw"

// withRaw returns res carrying raw, the bytes it was decoded from.
func withRaw(res *mcp.CallToolResult, raw json.RawMessage) *mcp.CallToolResult {
	if res == nil || raw == nil {
		return res
	}
	out := *res
	out.Meta = make(mcp.Meta, len(res.Meta)+1)
	for k, v := range res.Meta {
		out.Meta[k] = v
	}
	out.Meta[metaRaw] = raw
	return &out
}

// sendRaw takes the bytes withRaw attached off res, and arranges for the agent to
// get them, with the gateway's _meta keys of res, instead of the go-sdk's encoding.
func sendRaw(ctx context.Context, res *mcp.CallToolResult) *mcp.CallToolResult {
	if res == nil {
		return nil
	}
	raw, ok := res.Meta[metaRaw].(json.RawMessage)
	if !ok {
		return res
	}
	out := *res
	out.Meta = make(mcp.Meta, len(res.Meta))
	for k, v := range res.Meta {
		if k != metaRaw {
			out.Meta[k] = v
		}
	}
	setRaw(ctx, &out, raw)
	return &out
}
