package mcpgw

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/fingerprint"
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
	// CodeStoreUnavailable: idemkv could not be reached within the client's store-wait
	// bound (client.Config.StoreWait, --store-wait); nothing ran. The same word as
	// the client's error kind.
	CodeStoreUnavailable = "store_unavailable"
	// CodeInvalidArgument: the call cannot be recorded as it is (a key that is not
	// printable, arguments that are not an object); nothing ran.
	CodeInvalidArgument = "invalid_argument"
	// CodeTenantNotAllowed: the call names a tenant the policy does not let calls
	// pick (Policy.Tenants); nothing ran.
	CodeTenantNotAllowed = "tenant_not_allowed"
	// CodeApprovalDerivedKey: idemkv asks approval of a call whose key the gateway
	// derives (key: derive, an admin's approval rule of the tenant and tool); a retry
	// in a later derive window would ask, and could be granted, a second approval of
	// the same effect, so none is asked and nothing ran (approval.go).
	CodeApprovalDerivedKey = "approval_with_derived_key"
	// CodeApprovalEffectSubset: idemkv asks approval of a call whose effect the
	// gateway's policy limits to some of its arguments (tools.X.effect, an admin's
	// approval rule of the tenant and tool); the approver would see those alone and
	// the call would run with every argument, so none is asked and nothing ran
	// (approval.go).
	CodeApprovalEffectSubset = "approval_with_effect_subset"
	// CodeInternal: anything else.
	CodeInternal = "internal"
)

// FailureCode is the code a stored upstream tool error (isError) carries in idemkv.
const FailureCode = "mcp_tool_error"

// DefaultMaxReceiptBytes is how large a stored result may be by default: idemkv's
// default limit for a record's result and error details.
const DefaultMaxReceiptBytes = idemkv.DefaultMaxPayloadBytes

// encodeResult turns a CallToolResult into what idemkv stores, within max bytes. A
// result too large loses its unstructured content first (the structured content says
// the same thing to a program), then everything but a note; truncated reports that.
//
// upstream, when not nil, is the result as the upstream sent it: it is stored as it
// came (without any _meta key of the gateway's), so that a replay answers with the
// same bytes, integers beyond 2^53 included; unless it is not JSON every reader reads
// alike (fingerprint.Check: a JS tool that cut a string inside an emoji sends a lone
// surrogate), which idemkv refuses to store: the call would stay pending though the
// tool ran. Such a result is stored as res, as the MCP library read it (U+FFFD for
// what was not text).
func encodeResult(res *mcp.CallToolResult, upstream json.RawMessage, max int) (raw json.RawMessage, truncated bool, err error) {
	if upstream != nil && fingerprint.Check(upstream) == nil {
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
	if res := storedResult(receipt.Result); res != nil {
		return res
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
	if info.Code == FailureCode {
		if res := storedResult(info.Details); res != nil && res.IsError {
			return res
		}
	}
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: info.Code + ": " + info.Message}},
		Meta: mcp.Meta{MetaDetails: map[string]any{"code": info.Code, "message": info.Message}}}
}

// storedResult reads a CallToolResult the gateway stored, nil when raw is none. Its
// bytes pass through the scrub an upstream's answer passes through (hostile.go):
// whatever wrote the receipt (a client token of the tenant committing to the key,
// `idemkv resolve`, a gateway from before the scrub) may have put the gateway's own
// keys in it, and a replay must not carry a forged io.idemkv/error or decision.
func storedResult(raw json.RawMessage) *mcp.CallToolResult {
	if !isCallToolResult(raw) {
		return nil
	}
	clean, _, err := scrubbed(raw, true)
	if err != nil {
		return nil
	}
	var res mcp.CallToolResult
	if err := json.Unmarshal(clean, &res); err != nil {
		return nil
	}
	return withRaw(&res, clean)
}

// isCallToolResult reports whether raw is a CallToolResult as the gateway stores
// one: an object with a content array. (The go-sdk decodes any object into a
// CallToolResult without complaint.)
func isCallToolResult(raw json.RawMessage) bool {
	ms, err := members(raw)
	if err != nil {
		return false
	}
	for _, m := range ms {
		if m.name == "content" {
			return bytes.HasPrefix(bytes.TrimSpace(m.value), []byte("["))
		}
	}
	return false
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

// failure answers a call whose Do ended in an error. It reads what happened from the
// outcome Do reports (client.KindOf, and the decision the error carries), and the
// gateway's own knowledge of the upstream (its answer when the tool ran in this call,
// its transport errors); it never re-derives idemkv's decision from error types.
func (g *Gateway) failure(ctx context.Context, r *rule, c *call, err error, upstream *mcp.CallToolResult, meta []string) (*mcp.CallToolResult, error) {
	kind := client.KindOf(err)
	decided := func(d idemkv.Decision) []string {
		if d == "" {
			return meta
		}
		return append(meta, MetaDecision, string(d))
	}
	var ce *callError
	switch kind {
	case client.KindConflict:
		var conflict *client.ConflictError
		errors.As(err, &conflict)
		return annotate(errorResult(CodeConflict, fmt.Sprintf(
			"idemkv: the idempotency key %q was already used for a different %s; %s was not called.",
			c.key, conflictSubject(conflict.Conflict), r.tool.Name), conflict.Conflict),
			decided(idemkv.DecisionConflict)...), nil

	case client.KindStoredFailure:
		var failed *client.StoredFailureError
		errors.As(err, &failed)
		switch {
		case failed.Replayed && client.IsApprovalDenied(err):
			return annotate(denied(r, c, failed.Receipt), decided(idemkv.DecisionReplay)...), nil
		case failed.Replayed:
			return annotate(decodeFailure(failed.Receipt), decided(idemkv.DecisionReplay)...), nil
		case upstream != nil:
			return annotate(upstream, decided(idemkv.DecisionExecute)...), nil
		}
		return annotate(decodeFailure(failed.Receipt), decided(idemkv.DecisionExecute)...), nil

	case client.KindInDoubt:
		var inDoubt *client.InDoubtError
		errors.As(err, &inDoubt)
		details := map[string]any{"status": "in_doubt", "tenant": c.tenant, "idempotency_key": c.key}
		if rec := inDoubt.Record; rec != nil {
			details["attempts"] = rec.Attempts
			if rec.InDoubtSince != 0 {
				details["in_doubt_since"] = rec.InDoubtSince.String()
			}
		}
		return annotate(errorResult(CodeInDoubt, fmt.Sprintf(
			"idemkv: an earlier %s call with key %q died before it answered, and the policy names no probe to find out "+
				"whether it took effect; it was not called again. An operator must settle it: "+
				"`idemkv resolve %s %s --committed --remote-system S --remote-id ID` or `--not-executed`.",
			r.tool.Name, c.key, c.tenant, c.key), details), decided(idemkv.DecisionRecover)...), nil

	case client.KindStoreUnavailable:
		var su *client.StoreUnavailableError
		waited := ""
		if errors.As(err, &su) {
			waited = " for " + su.Waited.Round(time.Millisecond).String()
		}
		return annotate(errorResult(CodeStoreUnavailable, fmt.Sprintf(
			"idemkv gateway: idemkv could not be reached%s; %s was not called. Retry the same call later.", waited, r.tool.Name), nil),
			meta...), nil

	case client.KindNotExecuted:
		d := decisionOf(err)
		switch {
		case upstream != nil:
			// The upstream refused the call in its input validation, or the policy
			// counts its errors as retryable: the key was released.
			return annotate(upstream, decided(d)...), nil
		case errors.As(err, &ce):
			if we, ok := rejected(ce.err); ok {
				// The upstream refused the request (unknown tool, bad arguments):
				// its own protocol error, as it came; the key was released.
				return nil, we
			}
			return annotate(errorResult(CodeUpstreamUnavailable, fmt.Sprintf(
				"idemkv gateway: could not reach the upstream MCP server (%v); %s was not called. Retry the same call.", ce.err, r.tool.Name), nil),
				decided(d)...), nil
		case ctx.Err() != nil:
			return nil, context.Cause(ctx)
		case errors.Is(err, idemkv.ErrInvalidArgument):
			return annotate(errorResult(CodeInvalidArgument, "idemkv gateway: "+err.Error()+"; "+r.tool.Name+" was not called.", nil), meta...), nil
		}

	case client.KindOutcomeUnknown:
		d := decisionOf(err)
		var probe *probeError
		switch {
		case upstream != nil:
			// The tool ran: the agent gets its answer; idemkv could not record it,
			// and the next attempt will recover it.
			g.log.LogAttrs(ctx, slog.LevelWarn, "the tool ran but its outcome was not stored",
				slog.String(logKeyTool, r.tool.Name), slog.String(logKeyKey, c.key), slog.Any(logKeyErr, err))
			return annotate(upstream, append(decided(d), MetaWarning, "the tool ran but idemkv could not store its outcome: "+err.Error())...), nil
		case errors.As(err, &probe):
			return annotate(errorResult(CodeOutcomeUnknown, fmt.Sprintf(
				"idemkv: an earlier %s call with key %q died before it answered, and the probe %s could not tell whether it took effect (%v); "+
					"nothing was called again. Retry the same call later.", r.tool.Name, c.key, r.policy.Probe.Tool, probe.err), nil),
				decided(d)...), nil
		case errors.As(err, &ce) && ce.timeout != 0:
			g.log.LogAttrs(ctx, slog.LevelWarn, "the tool did not answer within its timeout; cancelled upstream, outcome unknown",
				slog.String(logKeyTool, r.tool.Name), slog.String(logKeyKey, c.key), slog.Duration("timeout", ce.timeout))
			return annotate(errorResult(CodeOutcomeUnknown, fmt.Sprintf(
				"idemkv gateway: %s did not answer within its timeout of %s; the call was cancelled upstream, and whether it took "+
					"effect is unknown. Retry the same call with the same key: idemkv will recover it without running it twice.",
				r.tool.Name, ce.timeout), timeoutDetails(r, ce.timeout)), decided(d)...), nil
		case errors.As(err, &ce):
			return annotate(errorResult(CodeOutcomeUnknown, fmt.Sprintf(
				"idemkv gateway: the upstream failed while %s was running (%v); whether it took effect is unknown. "+
					"Retry the same call with the same key: idemkv will recover it without running it twice.", r.tool.Name, ce.err), nil),
				decided(d)...), nil
		case ctx.Err() != nil:
			return nil, context.Cause(ctx)
		}
		return annotate(errorResult(CodeOutcomeUnknown, fmt.Sprintf(
			"idemkv gateway: whether %s took effect is unknown (%v). Retry the same call with the same key: "+
				"idemkv will recover it without running it twice.", r.tool.Name, err), nil), decided(d)...), nil
	}
	g.log.LogAttrs(ctx, slog.LevelError, "tool call failed", slog.String(logKeyTool, r.tool.Name),
		slog.String(logKeyKey, c.key), slog.String("kind", kind), slog.Any(logKeyErr, err))
	return annotate(errorResult(CodeInternal, "idemkv gateway: "+err.Error(), nil), meta...), nil
}

// decisionOf is the reserve decision an error from Do says the call acted on.
func decisionOf(err error) idemkv.Decision {
	var (
		ne *client.NotExecutedError
		ou *client.OutcomeUnknownError
	)
	switch {
	case errors.As(err, &ne):
		return ne.Decision
	case errors.As(err, &ou):
		return ou.Decision
	}
	return ""
}

// noteStore logs idemkv outages once each: the first call that finds idemkv
// unreachable logs a warning, the calls after it nothing, until one gets an answer
// from idemkv again.
func (g *Gateway) noteStore(ctx context.Context, err error) {
	switch client.KindOf(err) {
	case client.KindStoreUnavailable:
		if g.storeDown.CompareAndSwap(false, true) {
			g.log.LogAttrs(ctx, slog.LevelWarn, "idemkv is unreachable: mutating tool calls fail with "+CodeStoreUnavailable+
				" until it answers (logged once per outage)", slog.Any(logKeyErr, err))
		}
	case "", client.KindConflict, client.KindStoredFailure, client.KindInDoubt:
		// idemkv answered this call.
		if g.storeDown.CompareAndSwap(true, false) {
			g.log.LogAttrs(ctx, slog.LevelInfo, "idemkv answers again")
		}
	}
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
