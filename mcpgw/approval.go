package mcpgw

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/fingerprint"
)

// Approvals bound to the effect (docs/protocol.md "Approvals"), as the gateway asks
// for them. A tool whose policy says approval: required reserves with the ask; a tool
// an admin's rule holds on the server is answered needs_approval all the same, so
// every mutating reserve carries the effect and a summary, but for a key the gateway
// derives (key: derive) or a tool whose policy names an effect subset: no approval
// is ever asked of those (heldUnasked). What an approver is shown, and an approval
// binds, is every argument the call runs with but the policy's volatile ones, which
// the in-band question names as not shown and not bound.
//
// A waiting approval is decided out of band (idemkv approvals approve, the API), or,
// when the policy lets it (approval_in_band) and the gateway holds a Decider, in
// band: the agent's MCP client asks its user, with elicitation in 2025-11-25 and
// the multi round-trip input_required result in 2026-07-28. Both are answered by
// the client's user interface, never by the model: the model writes a call's
// arguments, not its inputResponses. In-band is off by default all the same: the
// gateway cannot tell a person's click from a client that answers elicitations by
// itself, and the person who drives an agent approving its effects is no second
// pair of eyes. See docs/mcp-gateway.md "Approvals".

// ApprovalMode says whether a tool's calls need a person's approval.
type ApprovalMode string

const (
	// ApprovalNone: the policy asks for no approval (the default).
	ApprovalNone ApprovalMode = "none"
	// ApprovalRequired: every call's effect waits for an approval before it runs.
	ApprovalRequired ApprovalMode = "required"
)

// CodeApprovalPending (MetaError): the call's effect waits for an approval; nothing
// ran. The details name the approval and how to decide it.
const CodeApprovalPending = client.KindApprovalPending

// CodeApprovalDenied (MetaError): the approval was denied; nothing ran, and every
// retry of the call gets the same answer.
const CodeApprovalDenied = idemkv.CodeApprovalDenied

// Decider decides approvals: a *client.Client whose token has the approver role for
// the tenant (or is an admin's) does.
type Decider interface {
	DecideApproval(ctx context.Context, req *idemkv.DecideApprovalRequest) (*idemkv.Record, error)
}

// approvalInput names the gateway's input request in an input_required result.
const approvalInput = MetaPrefix + "approval"

// The bounds of what a summary shows of one argument, in bytes: a summary is at
// most idemkv.MaxSummaryLen, and a long argument is clipped rather than the
// summary refused (the call would fail) or cut at its end (hiding what follows).
const (
	maxSummaryArg = 256
	minSummaryArg = 8
	// maxMessageEffect bounds the effect an in-band question shows: one that does
	// not fit is not asked in band (unshowable).
	maxMessageEffect = 4 << 10
)

func compileApproval(c *compiled) error {
	tp := c.ToolPolicy
	switch tp.Approval {
	case "", ApprovalNone, ApprovalRequired:
	default:
		return fmt.Errorf("approval %q is neither %s nor %s", tp.Approval, ApprovalNone, ApprovalRequired)
	}
	if tp.Approval == ApprovalRequired && tp.Class == client.ReadOnly {
		return fmt.Errorf("approval: %s cannot be class %s: a read-only call is not reserved, so nobody would approve it", ApprovalRequired, client.ReadOnly)
	}
	if tp.Approval == ApprovalRequired && tp.MissingKey == PassThrough {
		return fmt.Errorf("approval: %s cannot take missing_key: %s: a call without a key would run unapproved", ApprovalRequired, PassThrough)
	}
	if tp.Approval == ApprovalRequired && tp.Key == KeyDerive {
		// A derived key changes with its window: a retry after the window that held
		// the request for approval is a new operation, whose new request a person may
		// approve too, and the tool then runs twice.
		return fmt.Errorf("approval: %s cannot take key: %s: a retry in a later derive window would ask for, and could be granted, a second approval of the same effect; give the tool a key template", ApprovalRequired, KeyDerive)
	}
	if tp.Approval == ApprovalRequired && len(tp.Effect) > 0 {
		// The approver is shown, and the approval binds, the effect: with a subset,
		// a call whose other arguments (an amount, an account) they never saw would
		// run under it, and a retry could change those after the approval.
		return fmt.Errorf("approval: %s cannot take effect: %s: the approver would see, and the approval bind, those arguments alone, "+
			"while the call runs with all of them (any other argument, such as an amount or an account, unseen and free to change after the approval); "+
			"remove effect, so that the effect is every argument, and list the arguments that may differ between retries of one operation "+
			"(trace ids, timestamps) under volatile", ApprovalRequired, flowList(tp.Effect))
	}
	if d := tp.ApprovalTTL; d != 0 && (d < idemkv.MinApprovalTTL || d > idemkv.MaxApprovalTTL) {
		return fmt.Errorf("approval_ttl %s outside [%s, %s]", d, idemkv.MinApprovalTTL, idemkv.MaxApprovalTTL)
	}
	if tp.ApprovalSummary == "" {
		return nil
	}
	t, err := ParseTemplate(tp.ApprovalSummary)
	if err != nil {
		return fmt.Errorf("approval_summary: %w", err)
	}
	n := 0
	for _, p := range t.parts {
		n += len(p.lit)
		if err := idemkv.ValidSummary(p.lit); err != nil {
			return fmt.Errorf("approval_summary: its text: %w", err)
		}
	}
	if n > idemkv.MaxSummaryLen/2 {
		return fmt.Errorf("approval_summary: its text is %d bytes; at most %d, leaving room for the arguments", n, idemkv.MaxSummaryLen/2)
	}
	for _, p := range t.parts {
		if p.name == "" || p.name == "tenant" || p.name == "tool" {
			continue
		}
		for _, v := range tp.Volatile {
			if overlaps(strings.TrimPrefix(p.name, "arguments."), v) {
				// The approver would read a value the approval does not bind.
				return fmt.Errorf("approval_summary: {%s} shows what volatile drops (%s): the approver would read a value the approval "+
					"does not bind, which may differ when the call runs; name only arguments the effect keeps", p.name, v)
			}
		}
	}
	c.summary = t
	return nil
}

// overlaps reports whether the argument at path shows anything under the volatile
// path v or is itself under it: one is a prefix of the other, segment by segment, a
// "*" of v matching any segment.
func overlaps(path, v string) bool {
	a, b := strings.Split(path, "."), strings.Split(v, ".")
	for i := range min(len(a), len(b)) {
		if b[i] != "*" && a[i] != b[i] {
			return false
		}
	}
	return true
}

// flowList writes paths as a YAML flow sequence, as a policy would.
func flowList(paths []string) string {
	return "[" + strings.Join(paths, ", ") + "]"
}

// unasked reports whether the call's reserve must carry the effect's fingerprint
// alone, so that no approval can be asked of it (heldUnasked): its key is derived,
// or its policy fingerprints only some of its arguments (tools.X.effect).
func unasked(r *rule, c *call) bool {
	return c.derived || len(r.policy.Effect) > 0
}

// heldUnasked answers a call that idemkv would hold for a person's approval but
// that the gateway lets no approval be asked of (unasked), or nil when err is not
// that.
//
// A derived key changes with its window, so an approval asked under it would be
// asked again by the same call retried in a later window, and a person could grant
// both: the effect would run twice (compileApproval refuses approval: required with
// key: derive for this reason). A policy's effect subset (tools.X.effect) is what
// the approver would be shown and the approval would bind, while the call runs with
// every argument: an amount or an account the approver never saw, which a retry
// could change after the approval (compileApproval refuses approval: required with
// an effect for this reason). An admin's rule on the server asks approval of such a
// tool all the same, and idemkv has no way to withdraw a request once asked: a
// waiting approval stays listed until it is decided or lapses, and once approved,
// the next reserve of its key runs the tool. So the gateway never lets one be
// asked. The reserve of such a call carries the effect's fingerprint alone, which a
// rule that requires approval refuses, on the node and again in the state machine,
// with 400 naming the effect (docs/protocol.md section 7) before it stores
// anything: no record, no request, nothing to withdraw. Nothing else names the
// effect in a refusal of that reserve (the gateway checked it could canonicalize
// the arguments, and sent no effect). needs_approval itself can only come from a
// Runner that sent the effect anyway, or from a request an earlier gateway opened;
// the request is named, to be denied.
func (g *Gateway) heldUnasked(ctx context.Context, r *rule, c *call, err error) *mcp.CallToolResult {
	var (
		pending *client.ApprovalPendingError
		refused *idemkv.Error
	)
	isPending := errors.As(err, &pending)
	if !isPending && !(errors.As(err, &refused) && refused.Code == idemkv.CodeInvalidArgument && refused.Field == "effect") {
		return nil
	}
	d := map[string]any{"reason": "approval_rule", "tool": r.tool.Name, "tenant": c.tenant, "idempotency_key": c.key}
	var code, msg, logMsg string
	if c.derived {
		code = CodeApprovalDerivedKey
		d["key"], d["derive_window"] = KeyDerive, r.policy.derive.String()
		msg = fmt.Sprintf("idemkv gateway: %[1]s was not called: idemkv requires a person's approval of it (an admin's approval rule of tenant %[2]q), "+
			"and the gateway derives its idempotency keys (key: %[3]s), which change with each derive_window: a retry in a later window would "+
			"ask for, and could be granted, a second approval of the same effect, and %[1]s would run twice. So no approval is asked under a "+
			"derived key, and every retry of this call gets this answer. Give %[1]s a key template naming the operation in the gateway's policy "+
			"(tools.%[1]s.key, over the arguments that identify it), or call it with an idempotency key of your own in _meta[%[4]q].",
			r.tool.Name, c.tenant, KeyDerive, MetaIdempotencyKey)
		logMsg = "idemkv requires approval of a tool whose keys the gateway derives: the call was refused (give the tool a key template in the policy)"
	} else {
		code = CodeApprovalEffectSubset
		msg = fmt.Sprintf("idemkv gateway: %[1]s was not called: idemkv requires a person's approval of it (an admin's approval rule of tenant %[2]q), "+
			"and the gateway's policy fingerprints only some of its arguments (tools.%[1]s.effect: %[3]s): the approver would be shown, and "+
			"would approve, those alone, while %[1]s runs with every argument, any other one unseen and free to change after the approval. "+
			"So no approval is asked of it, and every retry of this call gets this answer.",
			r.tool.Name, c.tenant, flowList(r.policy.Effect))
		logMsg = "idemkv requires approval of a tool whose policy limits its effect to some arguments: the call was refused " +
			"(remove the tool's effect from the policy, listing the arguments that may vary under volatile)"
	}
	if len(r.policy.Effect) > 0 {
		d["effect"] = r.policy.Effect
		msg += fmt.Sprintf(" Remove tools.%[1]s.effect from the gateway's policy, so that the effect is every argument, and list the arguments "+
			"that may differ between retries of one operation (trace ids, timestamps) under tools.%[1]s.volatile.", r.tool.Name)
	}
	meta := []string{MetaIdempotencyKey, c.key, MetaTenant, c.tenant}
	attrs := []slog.Attr{slog.String(logKeyTool, r.tool.Name), slog.String("tenant", c.tenant), slog.String(logKeyKey, c.key)}
	if isPending {
		d["approval_id"] = pending.ApprovalID
		attrs = append(attrs, slog.String("approval_id", pending.ApprovalID))
		fp := ""
		if pending.Record != nil {
			fp = pending.Record.Fingerprint
		}
		msg += fmt.Sprintf(" idemkv opened approval %s for this call all the same: deny it, do not approve it "+
			"(idemkv approvals deny --tenant %s --key %s --id %s --fingerprint %s --approver NAME).",
			pending.ApprovalID, shellQuote(c.tenant), shellQuote(c.key), shellQuote(pending.ApprovalID), shellQuote(fp))
		meta = append(meta, MetaDecision, string(idemkv.DecisionNeedsApproval))
	}
	g.log.LogAttrs(ctx, slog.LevelWarn, logMsg, attrs...)
	return annotate(errorResult(code, msg, d), meta...)
}

// approvalAsk is what the call's reserve asks of approvals: always the effect and a
// summary (an admin's rule may hold any tool), and the policy's requirement.
func (g *Gateway) approvalAsk(r *rule, c *call) *client.ApprovalRequirement {
	return &client.ApprovalRequirement{
		Required: r.policy.Approval == ApprovalRequired,
		TTL:      r.policy.ApprovalTTL,
		Summary:  summarize(r, c),
	}
}

// summarize renders the approver's summary of the call within idemkv.MaxSummaryLen.
// An argument is shown quoted, with every character that is not printable escaped
// (line breaks, bidirectional overrides, zero-width marks), so that no argument can
// pass for the summary's own text or hide what follows it; a long one is clipped,
// saying how much was left out.
func summarize(r *rule, c *call) string {
	for limit := maxSummaryArg; ; limit /= 2 {
		s := renderSummary(r, c, limit)
		if len(s) <= idemkv.MaxSummaryLen || limit <= minSummaryArg {
			if s = clipBytes(s, idemkv.MaxSummaryLen); idemkv.ValidSummary(s) != nil {
				// Not reached: every argument is escaped and the template's
				// text was checked. A summary must never fail the call.
				s = idemkv.ClipText(s, idemkv.MaxSummaryLen)
			}
			return s
		}
	}
}

func renderSummary(r *rule, c *call, limit int) string {
	if r.policy.summary == nil {
		return "Call " + quote(r.tool.Name, limit) + " with " + showValue(boundArgs(r, c), limit)
	}
	s := scope{tenant: c.tenant, tool: r.tool.Name, args: c.args}
	var b strings.Builder
	for _, p := range r.policy.summary.parts {
		if p.name == "" {
			b.WriteString(p.lit)
			continue
		}
		v, err := s.lookup(p.name)
		if err != nil {
			b.WriteString("(no " + p.name + ")")
			continue
		}
		b.WriteString(showValue(v, limit))
	}
	return b.String()
}

// boundArgs are the call's arguments as its effect keeps them: every one but what
// the policy's volatile paths drop, exactly as the fingerprint drops them. A tool
// asked approval of has no effect subset (unasked), so this is what the approver
// approves. Should the arguments not canonicalize (the reserve then fails
// anyway), they are shown whole.
func boundArgs(r *rule, c *call) any {
	if len(r.policy.Volatile) == 0 {
		return c.args
	}
	b, err := fingerprint.CanonicalizeWithout(c.raw, r.policy.Volatile...)
	if err != nil {
		return c.args
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return c.args
	}
	return v
}

// unbound names the policy's volatile paths that drop something from the call's
// arguments: what the approver is not shown and the approval does not bind. Should
// the arguments not canonicalize, every volatile path is named.
func unbound(r *rule, c *call) []string {
	if len(r.policy.Volatile) == 0 {
		return nil
	}
	whole, err := fingerprint.Canonicalize(c.raw)
	if err != nil {
		return r.policy.Volatile
	}
	var out []string
	for _, p := range r.policy.Volatile {
		// Dropping a member always shortens the canonical form.
		if kept, err := fingerprint.CanonicalizeWithout(c.raw, p); err != nil || len(kept) != len(whole) {
			out = append(out, p)
		}
	}
	return out
}

// showValue shows an argument to a person: strings quoted and escaped, numbers and
// booleans as written, objects and arrays as JSON, each within limit bytes.
func showValue(v any, limit int) string {
	switch v := v.(type) {
	case string:
		return quote(v, limit)
	case json.Number:
		return clipNote(escapeUnprintable(v.String()), limit)
	case bool, nil:
		b, _ := json.Marshal(v)
		return string(b)
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, quote(k, limit)+": "+showValue(v[k], limit))
		}
		return clipNote("{"+strings.Join(parts, ", ")+"}", 4*limit)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "(unprintable)"
	}
	return clipNote(escapeUnprintable(string(b)), 4*limit)
}

// quote is s in double quotes, its quotes and backslashes escaped, every character
// that is not printable written as \uXXXX, clipped to limit bytes of s.
func quote(s string, limit int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	rest := 0
	if len(s) > limit {
		cut := limit
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		rest = len(s) - cut
		s = s[:cut]
	}
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case unicode.IsPrint(r):
			b.WriteRune(r)
		default:
			b.WriteString(escapeRune(r))
		}
	}
	b.WriteByte('"')
	if rest > 0 {
		fmt.Fprintf(&b, "…(%d more bytes)", rest)
	}
	return b.String()
}

func escapeRune(r rune) string {
	if r > 0xFFFF {
		return fmt.Sprintf(`\U%08X`, r)
	}
	return fmt.Sprintf(`\u%04X`, r)
}

// escapeUnprintable writes every character of s that is not printable as \uXXXX.
func escapeUnprintable(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	var b strings.Builder
	for _, r := range s {
		if unicode.IsPrint(r) {
			b.WriteRune(r)
		} else {
			b.WriteString(escapeRune(r))
		}
	}
	return b.String()
}

// clipNote clips s to limit bytes, saying how many were left out.
func clipNote(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	c := clipBytes(s, limit)
	return c + fmt.Sprintf("…(%d more bytes)", len(s)-len(c))
}

// clipBytes cuts s to at most max bytes at a character boundary.
func clipBytes(s string, max int) string {
	for len(s) > max {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
}

// approvalState is what an input_required result asks the client to echo: the
// approval the user was shown. It is sealed (sealState): only a question the gateway
// asked can be answered, and only for the approval and effect it showed.
type approvalState struct {
	Tenant      string `json:"t"`
	Key         string `json:"k"`
	ApprovalID  string `json:"a"`
	Fingerprint string `json:"f"`
	Expires     int64  `json:"e"` // unix ms: the approval's expires_at
}

func (g *Gateway) sealState(st approvalState) string {
	body, _ := json.Marshal(st)
	mac := hmac.New(sha256.New, g.stateKey)
	mac.Write(body)
	enc := base64.RawURLEncoding
	return sealedPrefix + enc.EncodeToString(body) + "." + enc.EncodeToString(mac.Sum(nil))
}

// openState checks a sealed state and its expiry.
func (g *Gateway) openState(s string, now time.Time) (*approvalState, error) {
	enc := base64.RawURLEncoding
	rest, sealed := strings.CutPrefix(s, sealedPrefix)
	b64, sig, ok := strings.Cut(rest, ".")
	ok = ok && sealed
	body, err1 := enc.DecodeString(b64)
	got, err2 := enc.DecodeString(sig)
	if !ok || err1 != nil || err2 != nil {
		return nil, errors.New("the request state is not one of the gateway's")
	}
	mac := hmac.New(sha256.New, g.stateKey)
	mac.Write(body)
	if !hmac.Equal(got, mac.Sum(nil)) {
		return nil, errors.New("the request state was not sealed by this gateway (another instance's key, or altered)")
	}
	var st approvalState
	if err := json.Unmarshal(body, &st); err != nil {
		return nil, fmt.Errorf("the request state: %w", err)
	}
	if now.UnixMilli() >= st.Expires {
		return nil, errors.New("the approval the request state names has expired")
	}
	return &st, nil
}

// inBandAnswer is what became of the user's answer a re-issued call carried.
type inBandAnswer struct {
	approvalID string // of the approval the user was shown; "" if the state was not usable
	decided    bool   // the decision was recorded
	cancelled  bool   // the user dismissed the question without deciding
	refused    bool   // idemkv refused the gateway's decision: ask this tenant no more
	note       string // why it was not recorded, for the out-of-band answer
}

// mayAskInBand reports whether the agent's client may be asked to decide the call's
// approval: the policy allows it, the gateway can decide approvals of the tenant, and
// the client declared form elicitation.
func (g *Gateway) mayAskInBand(r *rule, c *call, req *mcp.CallToolRequest) bool {
	if !r.inBand || g.decider == nil {
		return false
	}
	if _, refused := g.noDecide.Load(c.tenant); refused {
		return false
	}
	caps := req.ClientCapabilities()
	if caps == nil || caps.Elicitation == nil {
		return false
	}
	e := caps.Elicitation
	return e.Form != nil || e.URL == nil // neither: form, for backward compatibility
}

// unshowable says why the user cannot be asked in band to decide p, or "": the
// question must show the effect whole, since an approval binds all of it, and a
// clipped one would have the user approve what they did not read. Such an approval
// is left to be decided out of band, where the effect is shown whole.
func unshowable(p *client.ApprovalPendingError) string {
	where := fmt.Sprintf("decide it out of band, where the effect is shown whole: the record page of idemkv's console (/ui/record?tenant=%s&key=%s), "+
		"or idemkv approvals ls --tenant %s", url.QueryEscape(p.Tenant), url.QueryEscape(p.Key), shellQuote(p.Tenant))
	if p.Record == nil || len(p.Record.Effect) == 0 {
		return "the user was not asked: idemkv answered without the effect to approve, so a question could not show it; " + where
	}
	if n := len(escapeUnprintable(string(p.Record.Effect))); n > maxMessageEffect {
		return fmt.Sprintf("the user was not asked: the effect to approve is %d bytes as shown, more than an in-band question shows (%d), "+
			"and an approval covers all of it; %s", n, maxMessageEffect, where)
	}
	return ""
}

// question is the elicitation that asks the agent's user to decide: the summary, the
// tool and the effect whole (unshowable), and the arguments the call carries that
// the policy's volatile paths drop (unbound), named as not shown and not bound.
func question(r *rule, p *client.ApprovalPendingError, dropped []string) *mcp.ElicitParams {
	var b strings.Builder
	b.WriteString("Approve this call? It runs only once you approve it, and only with the effect shown below")
	if len(dropped) > 0 {
		b.WriteString(": every argument but those named as not shown")
	}
	b.WriteString(".\n")
	if len(dropped) > 0 {
		quoted := make([]string, len(dropped))
		for i, d := range dropped {
			quoted[i] = escapeUnprintable(d)
		}
		b.WriteString("Not shown, not bound: " + strings.Join(quoted, ", ") +
			" (the gateway's policy declares them volatile: meaningless to what the call does, and free to differ when it runs).\n")
	}
	if p.Record != nil && len(p.Record.EffectMask) > 0 {
		b.WriteString("Masked by the tenant's approval rule (bound, but shown as \"***\"): " + escapeUnprintable(strings.Join(p.Record.EffectMask, ", ")) + ".\n")
	}
	b.WriteString("\n")
	if p.Approval != nil && p.Approval.Summary != "" {
		b.WriteString(p.Approval.Summary + "\n\n")
	}
	b.WriteString("Tool: " + escapeUnprintable(r.tool.Name) + "\n")
	if p.Record != nil && len(p.Record.Effect) > 0 {
		// Whole: a question is not asked of an effect that does not fit (unshowable).
		b.WriteString("Effect: " + escapeUnprintable(string(p.Record.Effect)) + "\n")
	}
	fmt.Fprintf(&b, "Approval %s, tenant %s, key %s", p.ApprovalID, p.Tenant, quote(p.Key, idemkv.MaxKeyLen))
	if p.Approval != nil {
		b.WriteString(", expires " + p.Approval.ExpiresAt.String())
	}
	return &mcp.ElicitParams{
		Mode:    "form",
		Message: b.String(),
		RequestedSchema: map[string]any{
			"type": "object",
			"properties": map[string]any{
				"approve": map[string]any{"type": "boolean", "title": "Approve",
					"description": "true runs the call once; false denies it for good (every retry gets the denial)"},
				"reason": map[string]any{"type": "string", "title": "Reason", "maxLength": idemkv.MaxReasonLen},
			},
			"required": []string{"approve"},
		},
	}
}

// verdictOf reads the user's answer: accept with approve true approves, accept with
// approve false or decline denies, anything else (cancel) decides nothing.
func verdictOf(er *mcp.ElicitResult) (idemkv.ApprovalVerdict, string, bool) {
	reason, _ := er.Content["reason"].(string)
	switch er.Action {
	case "accept":
		approve, ok := er.Content["approve"].(bool)
		if !ok {
			return "", "", false
		}
		if approve {
			return idemkv.VerdictApprove, reason, true
		}
		return idemkv.VerdictDeny, reason, true
	case "decline":
		return idemkv.VerdictDeny, reason, true
	}
	return "", "", false
}

// approverName is who decided in band, as the record keeps it: the agent's user,
// known to the gateway by the call's actor (its _meta or the MCP client's name).
func approverName(c *call) string {
	who := c.actor
	if who == "" {
		who = "unnamed MCP client"
	}
	return idemkv.ClipText("user of "+who+" (in band, through the idemkv MCP gateway)", idemkv.MaxApproverLen)
}

// decideInBand records the user's answer to the question: the approval and effect
// the sealed state names, decided as the user said.
func (g *Gateway) decideInBand(ctx context.Context, r *rule, c *call, st *approvalState, er *mcp.ElicitResult) *inBandAnswer {
	ans := &inBandAnswer{approvalID: st.ApprovalID}
	verdict, reason, ok := verdictOf(er)
	if !ok {
		ans.cancelled = true
		ans.note = "the question was dismissed without a decision (" + er.Action + ")"
		return ans
	}
	if g.decider == nil || !r.inBand {
		ans.note = "this gateway does not record in-band decisions"
		return ans
	}
	if reason == "" {
		reason = string(verdict) + "d in band by the MCP client's user"
	}
	_, err := g.decider.DecideApproval(ctx, &idemkv.DecideApprovalRequest{
		Tenant: c.tenant, Key: c.key, ApprovalID: st.ApprovalID, Fingerprint: st.Fingerprint,
		Decision: verdict, Approver: approverName(c), Reason: idemkv.ClipText(reason, idemkv.MaxReasonLen),
	})
	attrs := []slog.Attr{slog.String(logKeyTool, r.tool.Name), slog.String(logKeyKey, c.key),
		slog.String("tenant", c.tenant), slog.String("approval_id", st.ApprovalID), slog.String("decision", string(verdict))}
	switch {
	case err == nil:
		ans.decided = true
		g.log.LogAttrs(ctx, slog.LevelInfo, "approval decided in band", attrs...)
	case errors.Is(err, idemkv.ErrPermissionDenied):
		g.noDecide.Store(c.tenant, true)
		ans.refused = true
		ans.note = fmt.Sprintf("the gateway's idemkv token may not decide approvals of tenant %q, so the answer was not recorded", c.tenant)
		g.log.LogAttrs(ctx, slog.LevelWarn, "the idemkv token may not decide approvals of the tenant: its approvals are decided out of band from now on "+
			"(give the gateway an approver token of the tenant)", append(attrs, slog.Any(logKeyErr, err))...)
	case errors.Is(err, idemkv.ErrNotPending), errors.Is(err, idemkv.ErrFingerprintMismatch):
		// Decided or replaced meanwhile (out of band, or by another re-issue): the
		// reserve that follows answers what the record now says.
		ans.note = "the approval was no longer the one shown: " + err.Error()
		g.log.LogAttrs(ctx, slog.LevelInfo, "an in-band answer came for an approval decided or replaced meanwhile", append(attrs, slog.Any(logKeyErr, err))...)
	case errors.Is(err, idemkv.ErrOutcomeUnknown):
		// Sent, and no answer came back: it may have been recorded. The reserve that
		// follows answers what the record says.
		ans.note = "the answer was sent and may have been recorded (no reply came): " + err.Error()
		g.log.LogAttrs(ctx, slog.LevelWarn, "an in-band approval decision may or may not have been recorded", append(attrs, slog.Any(logKeyErr, err))...)
	default:
		ans.note = "the answer could not be recorded: " + err.Error()
		g.log.LogAttrs(ctx, slog.LevelWarn, "could not record an in-band approval decision", append(attrs, slog.Any(logKeyErr, err))...)
	}
	return ans
}

// answerOf reads the answer a re-issued 2026-07-28 call carries to the gateway's
// question, and records it. nil: the call carries none.
func (g *Gateway) answerOf(ctx context.Context, r *rule, c *call, req *mcp.CallToolRequest) *inBandAnswer {
	resp, ok := req.Params.InputResponses[approvalInput]
	if !ok {
		return nil
	}
	st, err := g.openState(req.Params.RequestState, g.cfg.Now())
	if err == nil && (st.Tenant != c.tenant || st.Key != c.key) {
		err = errors.New("the request state names another call")
	}
	if err != nil {
		g.log.LogAttrs(ctx, slog.LevelDebug, "ignoring an answer to an approval question", slog.String(logKeyTool, r.tool.Name), slog.Any(logKeyErr, err))
		return &inBandAnswer{note: err.Error()}
	}
	er, ok := resp.(*mcp.ElicitResult)
	if !ok {
		return &inBandAnswer{approvalID: st.ApprovalID, note: fmt.Sprintf("the answer is a %T, not an elicitation result", resp)}
	}
	return g.decideInBand(ctx, r, c, st, er)
}

// askAgain reports whether the question is still to be asked after ans: nothing was
// asked yet, or the answer was for an approval no longer waiting.
func askAgain(ans *inBandAnswer, p *client.ApprovalPendingError) bool {
	return ans == nil || (!ans.cancelled && !ans.decided && !ans.refused && ans.approvalID != p.ApprovalID)
}

// inputRequired is the 2026-07-28 answer that asks the agent's client for its user's
// decision, carrying the sealed state the re-issued call must echo.
func (g *Gateway) inputRequired(r *rule, c *call, p *client.ApprovalPendingError) *mcp.CallToolResult {
	st := approvalState{Tenant: p.Tenant, Key: p.Key, ApprovalID: p.ApprovalID}
	if p.Record != nil {
		st.Fingerprint = p.Record.Fingerprint
	}
	if p.Approval != nil {
		st.Expires = p.Approval.ExpiresAt.Time().UnixMilli()
	}
	return annotate(&mcp.CallToolResult{
		InputRequests: mcp.InputRequestMap{approvalInput: question(r, p, unbound(r, c))},
		RequestState:  g.sealState(st),
	}, MetaIdempotencyKey, p.Key, MetaTenant, p.Tenant, MetaFingerprint, st.Fingerprint, MetaDecision, string(idemkv.DecisionNeedsApproval))
}

// elicit asks a 2025-11-25 client's user on its session (elicitation/create), and
// records the answer.
func (g *Gateway) elicit(ctx context.Context, r *rule, c *call, req *mcp.CallToolRequest, p *client.ApprovalPendingError) *inBandAnswer {
	er, err := req.Session.Elicit(ctx, question(r, p, unbound(r, c)))
	if err != nil {
		g.log.LogAttrs(ctx, slog.LevelInfo, "the client did not answer the approval question", slog.String(logKeyTool, r.tool.Name), slog.Any(logKeyErr, err))
		return &inBandAnswer{approvalID: p.ApprovalID, cancelled: true, note: "the client did not answer the question: " + err.Error()}
	}
	st := &approvalState{Tenant: c.tenant, Key: c.key, ApprovalID: p.ApprovalID}
	if p.Record != nil {
		st.Fingerprint = p.Record.Fingerprint
	}
	return g.decideInBand(ctx, r, c, st, er)
}

// approvalPending is the tool error that names a waiting approval, for it to be
// decided out of band; a retry of the same call gets the same approval.
func approvalPending(r *rule, c *call, p *client.ApprovalPendingError, ans *inBandAnswer) *mcp.CallToolResult {
	d := map[string]any{
		"status": string(idemkv.StatusAwaitingApproval), "approval_id": p.ApprovalID,
		"tenant": p.Tenant, "idempotency_key": p.Key, "tool": r.tool.Name,
	}
	fp := ""
	if p.Record != nil {
		fp = p.Record.Fingerprint
		d["effect_fingerprint"] = fp
	}
	if a := p.Approval; a != nil {
		d["summary"], d["requested_at"], d["expires_at"] = a.Summary, a.RequestedAt.String(), a.ExpiresAt.String()
		if a.ByRule {
			d["by_rule"] = true
		}
	}
	cli := fmt.Sprintf("idemkv approvals approve --tenant %s --key %s --id %s --fingerprint %s --approver NAME",
		shellQuote(p.Tenant), shellQuote(p.Key), shellQuote(p.ApprovalID), shellQuote(fp))
	d["decide"] = map[string]any{
		"cli": cli,
		"api": fmt.Sprintf("POST /v1/approvals/%s/%s {\"approval_id\":%q,\"effect_fingerprint\":%q,\"decision\":\"approve\"|\"deny\",\"approver\":\"NAME\"} (an approver token of the tenant, or an admin's)",
			p.Tenant, p.Key, p.ApprovalID, fp),
	}
	msg := fmt.Sprintf("idemkv: %s waits for a person's approval (%s) and was not run. "+
		"Once it is approved, retry this same call: it runs once; if it is denied, the retry answers the denial. "+
		"Retrying before then answers this again, with the same approval; it never asks twice.", r.tool.Name, p.ApprovalID)
	if ans != nil && ans.note != "" {
		msg += " (In band: " + ans.note + ".)"
		d["in_band"] = ans.note
	}
	return annotate(errorResult(CodeApprovalPending, msg, d), MetaIdempotencyKey, c.key, MetaTenant, c.tenant,
		MetaFingerprint, fp, MetaDecision, string(idemkv.DecisionNeedsApproval))
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '-' || r == '_' || r == '.' || r == ':' || r == '/' || unicode.IsLetter(r) || unicode.IsDigit(r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// denied answers a call whose approval was denied: nothing ran, and every retry of it
// gets this answer.
func denied(r *rule, c *call, receipt *idemkv.Receipt) *mcp.CallToolResult {
	d := map[string]any{"status": string(idemkv.StatusFailed), "tenant": c.tenant, "idempotency_key": c.key, "tool": r.tool.Name}
	msg := "denied"
	if e := receipt.Error; e != nil {
		msg = e.Message
		var who struct{ Approver, Reason string }
		if json.Unmarshal(e.Details, &who) == nil {
			d["approver"], d["reason"] = who.Approver, who.Reason
		}
	}
	return errorResult(CodeApprovalDenied, fmt.Sprintf(
		"idemkv: the approval of this %s call was %s; it was not run, and every retry of it gets this answer. "+
			"Doing it anyway takes a new call with another idempotency key, and a new approval.", r.tool.Name, msg), d)
}
