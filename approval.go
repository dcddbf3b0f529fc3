package idemkv

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Approvals bound to the effect (docs/protocol.md "Approvals"). An approval belongs to
// (tenant, idempotency_key, tool, effect_fingerprint) and is used once: the record that
// asks for it is the approval, so no retry, resume or second worker can stretch it to
// another call.

// StatusAwaitingApproval is a record that asked for an approval and has not run: no
// fence, no lease. Its Approval says whether it is still waiting or was approved; a
// denial makes the record failed, and the approved reserve that consumes the approval
// makes it pending.
const StatusAwaitingApproval Status = "awaiting_approval"

// DecisionNeedsApproval answers a reserve whose effect may not run until a person (or
// a policy) approves it; the answer carries the approval to show them.
const DecisionNeedsApproval Decision = "needs_approval"

// ApprovalState is where an approval stands.
type ApprovalState string

const (
	ApprovalWaiting  ApprovalState = "waiting"
	ApprovalApproved ApprovalState = "approved"
	ApprovalDenied   ApprovalState = "denied"
)

// ApprovalVerdict is what an approver says.
type ApprovalVerdict string

const (
	VerdictApprove ApprovalVerdict = "approve"
	VerdictDeny    ApprovalVerdict = "deny"
)

// CodeApprovalDenied is the error code of the failed receipt a denied record replays.
// It is a stored outcome, not a wire error: the reserve that replays it is a 200.
const CodeApprovalDenied = "approval_denied"

// Bounds of approvals (docs/protocol.md "Approvals").
const (
	DefaultApprovalTTL = 24 * time.Hour
	MinApprovalTTL     = time.Minute
	MaxApprovalTTL     = 30 * 24 * time.Hour
	MaxSummaryLen      = 1 << 10
	MaxApproverLen     = 128
	MaxReasonLen       = 1 << 10
)

// ApprovalAsk is a reserve's request for approval ("approval" in POST /v1/reserve).
// Required false asks for nothing (a server-side rule may still require one).
type ApprovalAsk struct {
	Required bool `json:"required"`
	// TTLMs bounds the wait for a decision (DefaultApprovalTTL when zero); once it
	// passes unanswered the request expires and the next reserve asks anew.
	TTLMs int64 `json:"ttl_ms,omitempty"`
	// Summary is what the approver reads, beside the effect itself.
	Summary string `json:"summary,omitempty"`
	// ByRule is set by the state machine when a server-side rule required the
	// approval; it never travels on the wire.
	ByRule bool `json:"-"`
}

// Approval is the approval a record asked for, and its decision once there is one.
type Approval struct {
	ID          string        `json:"id"`
	State       ApprovalState `json:"state"`
	Summary     string        `json:"summary,omitempty"`
	RequestedAt Timestamp     `json:"requested_at"`
	// ExpiresAt is when a waiting approval expires unanswered.
	ExpiresAt Timestamp `json:"expires_at"`
	// ByRule marks an approval required by a server-side rule rather than the request.
	ByRule    bool      `json:"by_rule,omitempty"`
	Approver  string    `json:"approver,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	DecidedAt Timestamp `json:"decided_at,omitempty"`
}

// Waiting reports whether a is a request nobody answered that has not expired at now.
func (a *Approval) Waiting(now Timestamp) bool {
	return a != nil && a.State == ApprovalWaiting && a.ExpiresAt > now
}

// Lapsed reports whether a is a request nobody answered before it expired.
func (a *Approval) Lapsed(now Timestamp) bool {
	return a != nil && a.State == ApprovalWaiting && a.ExpiresAt <= now
}

// DecideApprovalRequest approves or denies the approval a record waits for (POST
// /v1/approvals/{tenant}/{key}). ApprovalID and Fingerprint are what the approver saw:
// a decision binds to that request and that effect, never to whatever the key holds
// by the time it arrives. The answer is the record.
type DecideApprovalRequest struct {
	Tenant      string          `json:"-"`
	Key         string          `json:"-"`
	ApprovalID  string          `json:"approval_id"`
	Fingerprint string          `json:"effect_fingerprint"`
	Decision    ApprovalVerdict `json:"decision"`
	Approver    string          `json:"approver"`
	Reason      string          `json:"reason,omitempty"`
}

// ApprovalsRequest pages through a tenant's waiting approvals, oldest requested_at
// first (GET /v1/approvals?tenant=). Its answer is an ApprovalsResult.
type ApprovalsRequest struct {
	Tenant string
	Limit  int    // 0: DefaultListLimit
	After  string // exclusive cursor: the Next of an earlier page (ApprovalPosition)
	// Consistency is linearizable (default) or stale.
	Consistency Consistency
}

// ApprovalsResult is one page of waiting approvals: the records, each with its
// approval (summary, requested_at, expires_at), tool and effect.
type ApprovalsResult struct {
	Approvals []*Record `json:"approvals"`
	Next      string    `json:"next,omitempty"`
}

// ApprovalPosition is where a page of waiting approvals resumes: after the record
// requested at RequestedAt under Key. It travels as "<unix ms>:<key>".
type ApprovalPosition struct {
	RequestedAt Timestamp
	Key         string
}

func (p ApprovalPosition) String() string {
	return strconv.FormatInt(int64(p.RequestedAt), 10) + ":" + p.Key
}

// ParseApprovalPosition reads an ApprovalPosition cursor.
func ParseApprovalPosition(s string) (ApprovalPosition, error) {
	ms, key, ok := strings.Cut(s, ":")
	at, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil || at < 0 || ValidKey(key) != nil {
		return ApprovalPosition{}, Invalid("after", "after must be the next of an earlier page of approvals")
	}
	return ApprovalPosition{RequestedAt: Timestamp(at), Key: key}, nil
}

// ApprovalRule makes every reserve of Tool in Tenant require an approval, whatever the
// request says: an admin sets it, and no client can switch it off. It is replicated
// state, like the records.
type ApprovalRule struct {
	Tenant string `json:"tenant"`
	Tool   string `json:"tool"`
	// TTLMs is the wait for a decision when the request names none (DefaultApprovalTTL
	// when zero).
	TTLMs int64 `json:"ttl_ms,omitempty"`
	// RequireApproval false makes a rule that only keeps effects (StoreEffect) or masks
	// them; absent, the rule requires approval, as every rule set before it existed.
	RequireApproval *bool `json:"require_approval,omitempty"`
	// StoreEffect keeps the effect of every reserve of the tool in its record, as
	// store_effect on the reserve does, so that conflicts carry a diff.
	StoreEffect bool `json:"store_effect,omitempty"`
	// Mask names the values a stored effect of the tool never keeps: JSON Pointers
	// (RFC 6901) whose segment "*" stands for any member or element. The record keeps
	// "***" in their place, and a diff shows them as "***" on both sides.
	Mask []string `json:"mask,omitempty"`
}

// RequiresApproval reports whether the rule requires an approval.
func (r ApprovalRule) RequiresApproval() bool { return r.RequireApproval == nil || *r.RequireApproval }

// SetApprovalRuleRequest sets a rule, or with Remove deletes it (POST
// /v1/approval-rules). The answer is the tenant's rules.
type SetApprovalRuleRequest struct {
	ApprovalRule
	Remove bool `json:"remove,omitempty"`
}

// ApprovalRules is the answer of GET /v1/approval-rules?tenant= and of setting one.
type ApprovalRules struct {
	Rules []ApprovalRule `json:"rules"`
}

// validApprovalTTL checks a wait for a decision in milliseconds (0: the default).
func validApprovalTTL(field string, ms int64) error {
	if ms != 0 && (ms < MinApprovalTTL.Milliseconds() || ms > MaxApprovalTTL.Milliseconds()) {
		return Invalid(field, "%s must be between %d and %d", field, MinApprovalTTL.Milliseconds(), MaxApprovalTTL.Milliseconds())
	}
	return nil
}

// validSummary allows line breaks and tabs: a summary is a short text for people.
func validSummary(field, s string, max int) error {
	return validText(field, strings.NewReplacer("\n", " ", "\r", " ", "\t", " ").Replace(s), max, false)
}

// validate checks an approval ask of a reserve whose effect is present or not.
func (a *ApprovalAsk) validate(hasEffect bool) error {
	if a == nil {
		return nil
	}
	if err := validApprovalTTL("approval.ttl_ms", a.TTLMs); err != nil {
		return err
	}
	if err := validSummary("approval.summary", a.Summary, MaxSummaryLen); err != nil {
		return err
	}
	if a.Required && !hasEffect {
		return Invalid("effect", "a reserve that requires approval must carry the effect itself, not only its fingerprint: the approver approves what they can read")
	}
	return nil
}

// Validate checks a decision.
func (r *DecideApprovalRequest) Validate() error {
	if err := ValidTenant(r.Tenant); err != nil {
		return err
	}
	if err := ValidKey(r.Key); err != nil {
		return err
	}
	if err := validText("approval_id", r.ApprovalID, MaxAttemptIDLen, true); err != nil {
		return err
	}
	if err := validText("effect_fingerprint", r.Fingerprint, MaxFingerprintLen, true); err != nil {
		return err
	}
	switch r.Decision {
	case VerdictApprove, VerdictDeny:
	default:
		return Invalid("decision", "decision must be %q or %q", VerdictApprove, VerdictDeny)
	}
	if err := validText("approver", r.Approver, MaxApproverLen, true); err != nil {
		return err
	}
	return validSummary("reason", r.Reason, MaxReasonLen)
}

// Validate checks r; EnsureDefaults fills the default limit and consistency.
func (r *ApprovalsRequest) Validate() error {
	if err := ValidTenant(r.Tenant); err != nil {
		return err
	}
	if r.After != "" {
		if _, err := ParseApprovalPosition(r.After); err != nil {
			return err
		}
	}
	if err := validLimit(r.Limit); err != nil {
		return err
	}
	return validConsistency(r.Consistency)
}

// Validate checks a rule change.
func (r *SetApprovalRuleRequest) Validate() error {
	if err := ValidTenant(r.Tenant); err != nil {
		return err
	}
	if err := ValidTool(r.Tool); err != nil {
		return err
	}
	if r.Remove {
		for _, f := range []struct {
			name string
			set  bool
		}{{"ttl_ms", r.TTLMs != 0}, {"require_approval", r.RequireApproval != nil}, {"store_effect", r.StoreEffect}, {"mask", len(r.Mask) > 0}} {
			if f.set {
				return Invalid(f.name, "a rule being removed takes only its tenant and tool, not %s", f.name)
			}
		}
	}
	if !r.Remove && !r.RequiresApproval() && !r.StoreEffect && len(r.Mask) == 0 {
		return Invalid("require_approval", "a rule that requires no approval must store effects or mask them")
	}
	if !r.RequiresApproval() && r.TTLMs != 0 {
		return Invalid("ttl_ms", "ttl_ms is the wait for an approval; this rule requires none")
	}
	if err := ValidMasks("mask", r.Mask); err != nil {
		return err
	}
	return validApprovalTTL("ttl_ms", r.TTLMs)
}

// ValidMasks checks masked paths: JSON Pointers (RFC 6901, "" is the whole effect and
// is refused: mask its members instead), at most MaxEffectMasks of at most MaxMaskLen
// bytes, each "~" followed by 0 or 1.
func ValidMasks(field string, masks []string) error {
	if len(masks) > MaxEffectMasks {
		return Invalid(field, "%s holds at most %d paths", field, MaxEffectMasks)
	}
	for _, m := range masks {
		if err := validText(field, m, MaxMaskLen, true); err != nil {
			return err
		}
		if m[0] != '/' {
			return Invalid(field, "%s: %q is not a JSON Pointer (it must start with \"/\")", field, m)
		}
		for i := 0; i < len(m); i++ {
			if m[i] == '~' && (i+1 == len(m) || (m[i+1] != '0' && m[i+1] != '1')) {
				return Invalid(field, "%s: %q has a \"~\" that is not ~0 or ~1", field, m)
			}
		}
	}
	return nil
}

// DeniedError is the stored failure of a denied approval.
func DeniedError(approver, reason string) *ErrorInfo {
	msg := fmt.Sprintf("denied by %s", approver)
	if reason != "" {
		msg += ": " + reason
	}
	details, _ := json.Marshal(map[string]string{"approver": approver, "reason": reason})
	return &ErrorInfo{Code: CodeApprovalDenied, Message: ClipText(msg, MaxErrorMsgLen), Details: details}
}

// ValidSummary checks s as an approval's summary: at most MaxSummaryLen bytes of
// printable text, line breaks and tabs allowed.
func ValidSummary(s string) error { return validSummary("approval.summary", s, MaxSummaryLen) }

// RecordedApprover is the approver a decision records: the person the body names, who
// may be anyone the token's holder says (one approver token may serve a chat bot that
// decides for many people), and the token that decided, which no body can set:
// "alice via approvals-bot (approver)". A token's identity names the token first (auth:
// "name (role)"), so a body naming the token's own holder is recorded as the identity
// alone. Without authentication (token "") there is no token to name.
func RecordedApprover(named, token string) string {
	switch {
	case token == "":
		return named
	case named == token || strings.HasPrefix(token, named+" ("):
		return token
	}
	room := MaxApproverLen - len(approverVia) - len(token)
	if room <= 0 {
		return ClipText(token, MaxApproverLen)
	}
	return ClipText(named, room) + approverVia + token
}

const approverVia = " via "

// ApproverNamed reports whether recorded, an approver a decision recorded, is what
// RecordedApprover makes of a body naming named, under some token: how a client that
// sent a decision, lost the answer and met not_pending on its retry knows the decision
// on record is its own. The client does not know its token's name, so any token
// matches; the approval id, verdict and reason it compares besides are what make the
// decision its own.
func ApproverNamed(recorded, named string) bool {
	if recorded == named || strings.HasPrefix(recorded, named+" (") {
		return true
	}
	for i := 0; ; {
		j := strings.Index(recorded[i:], approverVia)
		if j < 0 {
			return false
		}
		// The name before " via " may have been clipped to make room for the token, and
		// then the whole is within a rune of the limit.
		left := recorded[:i+j]
		if left == named || (left != "" && len(recorded) > MaxApproverLen-utf8.UTFMax && strings.HasPrefix(named, left)) {
			return true
		}
		i += j + len(approverVia)
	}
}
