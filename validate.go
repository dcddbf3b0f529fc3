package idemkv

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Fixed limits of docs/protocol.md sections 1 and 2.
const (
	MaxTenantLen      = 128
	MaxKeyLen         = 512
	MaxFingerprintLen = 128
	MaxToolLen        = 128
	MaxActorLen       = 128
	MaxAttemptIDLen   = 128
	MaxRemoteLen      = 512 // remote_system, remote_id, remote_url
	MaxErrorCodeLen   = 128
	MaxErrorMsgLen    = 4096
	// DefaultMaxPayloadBytes is Limits.MaxPayloadBytes by default: what one record's
	// result, or its error's details and message together, may hold.
	DefaultMaxPayloadBytes = 64 << 10
	MaxRequestBytes        = 1 << 20
	DefaultListLimit       = 100
	MaxListLimit           = 1000
)

// CeilingTTL bounds every configurable TTL and lease, and the state machine caps
// expires_at and lease_expires_at at now + CeilingTTL in every decision, whatever a
// command carries: ten years keeps every timestamp far inside RFC 3339's four-digit
// years, which a record past year 9999 would break for the whole tenant's listing.
const CeilingTTL = 10 * 365 * 24 * time.Hour

// Limits are the configurable bounds a node enforces. Zero fields take the defaults.
type Limits struct {
	// MaxPayloadBytes bounds result + error details of one record (default 64 KiB).
	MaxPayloadBytes int
	DefaultLeaseTTL time.Duration // 30 s
	MinLeaseTTL     time.Duration // 1 s
	MaxLeaseTTL     time.Duration // 1 h
	DefaultTTL      time.Duration // 24 h
	MinTTL          time.Duration // 1 min
	MaxTTL          time.Duration // 30 days
}

// DefaultLimits returns the limits of docs/protocol.md section 2.
func DefaultLimits() Limits {
	return Limits{
		MaxPayloadBytes: DefaultMaxPayloadBytes,
		DefaultLeaseTTL: 30 * time.Second,
		MinLeaseTTL:     time.Second,
		MaxLeaseTTL:     time.Hour,
		DefaultTTL:      24 * time.Hour,
		MinTTL:          time.Minute,
		MaxTTL:          30 * 24 * time.Hour,
	}
}

// WithDefaults fills zero fields of l from DefaultLimits.
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits()
	if l.MaxPayloadBytes == 0 {
		l.MaxPayloadBytes = d.MaxPayloadBytes
	}
	fill := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	fill(&l.DefaultLeaseTTL, d.DefaultLeaseTTL)
	fill(&l.MinLeaseTTL, d.MinLeaseTTL)
	fill(&l.MaxLeaseTTL, d.MaxLeaseTTL)
	fill(&l.DefaultTTL, d.DefaultTTL)
	fill(&l.MinTTL, d.MinTTL)
	fill(&l.MaxTTL, d.MaxTTL)
	return l
}

// Validate reports limits that contradict each other.
func (l Limits) Validate() error {
	l = l.WithDefaults()
	switch {
	case l.MinLeaseTTL < 0 || l.MaxLeaseTTL < 0 || l.DefaultLeaseTTL < 0 || l.MinTTL < 0 || l.MaxTTL < 0 || l.DefaultTTL < 0:
		// Zero takes the default; a negative minimum let every request's non-positive
		// value through to the state machine, which answered "not filled".
		return errors.New("idemkv: lease TTLs and TTLs must not be negative (zero means the default)")
	case l.MaxPayloadBytes < 0 || l.MaxPayloadBytes > MaxRequestBytes:
		return fmt.Errorf("idemkv: max payload must be between 0 and %d bytes", MaxRequestBytes)
	case l.MinLeaseTTL > l.MaxLeaseTTL:
		return fmt.Errorf("idemkv: min lease TTL %s exceeds max %s", l.MinLeaseTTL, l.MaxLeaseTTL)
	case l.DefaultLeaseTTL < l.MinLeaseTTL || l.DefaultLeaseTTL > l.MaxLeaseTTL:
		return fmt.Errorf("idemkv: default lease TTL %s outside [%s, %s]", l.DefaultLeaseTTL, l.MinLeaseTTL, l.MaxLeaseTTL)
	case l.MinTTL > l.MaxTTL:
		return fmt.Errorf("idemkv: min TTL %s exceeds max %s", l.MinTTL, l.MaxTTL)
	case l.DefaultTTL < l.MinTTL || l.DefaultTTL > l.MaxTTL:
		return fmt.Errorf("idemkv: default TTL %s outside [%s, %s]", l.DefaultTTL, l.MinTTL, l.MaxTTL)
	case l.DefaultTTL < l.DefaultLeaseTTL:
		return fmt.Errorf("idemkv: default TTL %s is shorter than the default lease %s", l.DefaultTTL, l.DefaultLeaseTTL)
	case l.MaxTTL > CeilingTTL || l.MaxLeaseTTL > CeilingTTL:
		return fmt.Errorf("idemkv: max TTL and max lease TTL must not exceed %s", CeilingTTL)
	}
	return nil
}

// ValidTenant reports why tenant is not 1–128 bytes of [A-Za-z0-9._:-], or nil.
func ValidTenant(tenant string) error {
	if tenant == "" || len(tenant) > MaxTenantLen {
		return Invalid("tenant", "tenant must be 1-%d bytes", MaxTenantLen)
	}
	for i := 0; i < len(tenant); i++ {
		c := tenant[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == ':' || c == '-'
		if !ok {
			return Invalid("tenant", "tenant may only contain A-Z a-z 0-9 . _ : -")
		}
	}
	return nil
}

// ValidKey reports why key is not 1–512 bytes of printable UTF-8, or nil.
func ValidKey(key string) error {
	if key == "" || len(key) > MaxKeyLen {
		return Invalid("idempotency_key", "idempotency_key must be 1-%d bytes", MaxKeyLen)
	}
	if !printable(key) {
		return Invalid("idempotency_key", "idempotency_key must be printable UTF-8")
	}
	return nil
}

// ValidTool reports why tool is not 1–MaxToolLen bytes of printable UTF-8, or nil.
func ValidTool(tool string) error { return validText("tool", tool, MaxToolLen, true) }

// ClipText makes s a text field the server stores (printable UTF-8, at most max bytes)
// instead of one it refuses: an invalid byte becomes U+FFFD, any other unprintable rune
// (a newline from errors.Join, a tab, a control byte) a space, and the end is cut at a
// rune boundary. It lives beside the check it must satisfy so the two cannot drift; the
// client and the MCP gateway use it for the text they pass on from elsewhere (error
// messages, client and server names).
func ClipText(s string, max int) string {
	s = strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
	for len(s) > max {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

func validText(field, v string, max int, required bool) error {
	if v == "" {
		if required {
			return Invalid(field, "%s is required", field)
		}
		return nil
	}
	if len(v) > max {
		return Invalid(field, "%s must be at most %d bytes", field, max)
	}
	if !printable(v) {
		return Invalid(field, "%s must be printable UTF-8", field)
	}
	return nil
}

func validJSON(field string, raw json.RawMessage) error {
	if len(raw) > 0 && !json.Valid(raw) {
		return Invalid(field, "%s must be valid JSON", field)
	}
	return nil
}

func validIdentity(tenant, key, fingerprint string) error {
	if err := ValidTenant(tenant); err != nil {
		return err
	}
	if err := ValidKey(key); err != nil {
		return err
	}
	return validText("effect_fingerprint", fingerprint, MaxFingerprintLen, true)
}

func validFence(fence uint64) error {
	if fence == 0 {
		return Invalid("fence", "fence is required (the fence that reserve granted)")
	}
	return nil
}

// validLease compares in milliseconds: converting first would let a huge value
// (166020696664386 ms) overflow time.Duration into a valid-looking lease.
func validLease(ms int64, l Limits) error {
	if ms == 0 {
		return nil
	}
	if ms < l.MinLeaseTTL.Milliseconds() || ms > l.MaxLeaseTTL.Milliseconds() {
		return Invalid("lease_ttl_ms", "lease_ttl_ms must be between %d and %d", l.MinLeaseTTL.Milliseconds(), l.MaxLeaseTTL.Milliseconds())
	}
	return nil
}

// Validate checks r against the limits, given the current time; it changes nothing
// (EnsureDefaults fills what r leaves out). A fingerprint or an effect must be present
// (whoever computes the fingerprint of an effect does so before or after; both present
// must agree, which the caller checks). An effect of JSON null counts as absent.
func (r *ReserveRequest) Validate(l Limits, now Timestamp) error {
	l = l.WithDefaults()
	if err := ValidTenant(r.Tenant); err != nil {
		return err
	}
	if err := ValidKey(r.Key); err != nil {
		return err
	}
	effect := r.Effect
	if string(effect) == "null" {
		effect = nil
	}
	if r.Fingerprint == "" && len(effect) == 0 {
		return Invalid("effect_fingerprint", "effect_fingerprint or effect is required")
	}
	if err := validText("effect_fingerprint", r.Fingerprint, MaxFingerprintLen, false); err != nil {
		return err
	}
	if err := validJSON("effect", effect); err != nil {
		return err
	}
	if err := ValidTool(r.Tool); err != nil {
		return err
	}
	if err := validText("actor", r.Actor, MaxActorLen, false); err != nil {
		return err
	}
	if err := validText("attempt_id", r.AttemptID, MaxAttemptIDLen, false); err != nil {
		return err
	}
	switch r.SideEffect {
	case "", SideEffectReadOnly, SideEffectIdempotentMutation, SideEffectNonIdempotentMutation:
	default:
		return Invalid("side_effect", "side_effect must be %s, %s or %s", SideEffectReadOnly, SideEffectIdempotentMutation, SideEffectNonIdempotentMutation)
	}
	if err := r.Approval.validate(len(effect) > 0); err != nil {
		return err
	}
	if r.StoreEffect && len(effect) == 0 {
		return Invalid("effect", "a reserve with store_effect must carry the effect itself, not only its fingerprint: a conflict can only show what was stored")
	}
	if err := validLease(r.LeaseTTLMs, l); err != nil {
		return err
	}
	// The checks below compare against the lease and TTL the request will carry once
	// EnsureDefaults has filled them.
	lease := r.LeaseTTLMs
	if lease == 0 {
		lease = l.DefaultLeaseTTL.Milliseconds()
	}
	ttlField := "ttl_ms"
	var ttl int64
	switch {
	case r.TTLMs != 0 && r.ExpiresAt != 0:
		return Invalid("expires_at", "give ttl_ms or expires_at, not both")
	case r.ExpiresAt != 0:
		ttlField = "expires_at"
		ttl = int64(r.ExpiresAt - now)
	case r.TTLMs != 0:
		ttl = r.TTLMs
	default:
		ttl = l.DefaultTTL.Milliseconds()
	}
	if ttl < l.MinTTL.Milliseconds() || ttl > l.MaxTTL.Milliseconds() {
		return Invalid(ttlField, "%s must put expiry between %d and %d ms from now", ttlField, l.MinTTL.Milliseconds(), l.MaxTTL.Milliseconds())
	}
	if ttl < lease {
		return Invalid(ttlField, "%s (%d ms) is shorter than the lease (%d ms)", ttlField, ttl, lease)
	}
	return nil
}

// Validate checks r against the limits.
func (r *CommitRequest) Validate(l Limits) error {
	l = l.WithDefaults()
	if err := validIdentity(r.Tenant, r.Key, r.Fingerprint); err != nil {
		return err
	}
	if err := validFence(r.Fence); err != nil {
		return err
	}
	if err := validText("remote_system", r.RemoteSystem, MaxRemoteLen, true); err != nil {
		return err
	}
	if err := validText("remote_id", r.RemoteID, MaxRemoteLen, true); err != nil {
		return err
	}
	if err := validText("remote_url", r.RemoteURL, MaxRemoteLen, false); err != nil {
		return err
	}
	if err := validJSON("result", r.Result); err != nil {
		return err
	}
	if len(r.Result) > l.MaxPayloadBytes {
		return &Error{Code: CodePayloadTooLarge, Field: "result",
			Message: fmt.Sprintf("result is %d bytes; the limit is %d", len(r.Result), l.MaxPayloadBytes)}
	}
	return nil
}

// Validate checks r against the limits.
func (r *FailRequest) Validate(l Limits) error {
	l = l.WithDefaults()
	if err := validIdentity(r.Tenant, r.Key, r.Fingerprint); err != nil {
		return err
	}
	if err := validFence(r.Fence); err != nil {
		return err
	}
	if err := validText("error.code", r.Error.Code, MaxErrorCodeLen, true); err != nil {
		return err
	}
	if err := validText("error.message", r.Error.Message, MaxErrorMsgLen, false); err != nil {
		return err
	}
	if err := validJSON("error.details", r.Error.Details); err != nil {
		return err
	}
	if n := len(r.Error.Details) + len(r.Error.Message); n > l.MaxPayloadBytes {
		return &Error{Code: CodePayloadTooLarge, Field: "error",
			Message: fmt.Sprintf("error is %d bytes; the limit is %d", n, l.MaxPayloadBytes)}
	}
	return nil
}

// Validate checks r.
func (r *ReleaseRequest) Validate() error {
	if err := validIdentity(r.Tenant, r.Key, r.Fingerprint); err != nil {
		return err
	}
	return validFence(r.Fence)
}

// Validate checks a doubt request.
func (r *DoubtRequest) Validate() error {
	if err := validIdentity(r.Tenant, r.Key, r.Fingerprint); err != nil {
		return err
	}
	return validFence(r.Fence)
}

// Validate checks a resolve request: a committed outcome needs its receipt, a
// not_executed one must carry none.
func (r *ResolveRequest) Validate(l Limits) error {
	l = l.WithDefaults()
	if err := validIdentity(r.Tenant, r.Key, r.Fingerprint); err != nil {
		return err
	}
	switch r.Outcome {
	case ResolveCommitted:
		c := CommitRequest{Tenant: r.Tenant, Key: r.Key, Fingerprint: r.Fingerprint, Fence: 1,
			RemoteSystem: r.RemoteSystem, RemoteID: r.RemoteID, RemoteURL: r.RemoteURL, Result: r.Result}
		return c.Validate(l)
	case ResolveNotExecuted:
		if r.RemoteSystem != "" || r.RemoteID != "" || r.RemoteURL != "" || len(r.Result) > 0 {
			return Invalid("outcome", "a not_executed resolve carries no receipt")
		}
		return nil
	default:
		return Invalid("outcome", "outcome must be %q or %q", ResolveCommitted, ResolveNotExecuted)
	}
}

// Validate checks r against the limits; EnsureDefaults fills the default lease.
func (r *HeartbeatRequest) Validate(l Limits) error {
	l = l.WithDefaults()
	if err := ValidTenant(r.Tenant); err != nil {
		return err
	}
	if err := ValidKey(r.Key); err != nil {
		return err
	}
	if err := validFence(r.Fence); err != nil {
		return err
	}
	return validLease(r.LeaseTTLMs, l)
}

// MaxWait bounds the long-poll of a get.
const MaxWait = 5 * time.Minute

// Validate checks r; EnsureDefaults fills the default consistency.
func (r *GetRequest) Validate() error {
	if err := ValidTenant(r.Tenant); err != nil {
		return err
	}
	if err := ValidKey(r.Key); err != nil {
		return err
	}
	if r.Wait < 0 || r.Wait > MaxWait {
		return Invalid("wait_ms", "wait_ms must be between 0 and %d", MaxWait.Milliseconds())
	}
	return validConsistency(r.Consistency)
}

// Validate checks r; EnsureDefaults fills the default limit and consistency.
func (r *ListRequest) Validate() error {
	if err := ValidTenant(r.Tenant); err != nil {
		return err
	}
	if len(r.Prefix) > MaxKeyLen {
		return Invalid("prefix", "prefix must be at most %d bytes", MaxKeyLen)
	}
	if len(r.After) > MaxKeyLen {
		return Invalid("after", "after must be at most %d bytes", MaxKeyLen)
	}
	switch r.Status {
	case "", StatusPending, StatusCommitted, StatusFailed, StatusAwaitingApproval:
	default:
		return Invalid("status", "status must be pending, committed, failed or awaiting_approval")
	}
	if r.InDoubt && r.Status.Terminal() {
		return Invalid("in_doubt", "only pending records are in doubt")
	}
	if err := validLimit(r.Limit); err != nil {
		return err
	}
	return validConsistency(r.Consistency)
}

// Validate checks r; EnsureDefaults fills the default limit and consistency.
func (r *InDoubtRequest) Validate() error {
	if r.After != "" {
		if _, err := ParseDoubtPosition(r.After); err != nil {
			return err
		}
	}
	if err := validLimit(r.Limit); err != nil {
		return err
	}
	return validConsistency(r.Consistency)
}

// validLimit checks the page size of a listing (0: the default).
func validLimit(limit int) error {
	if limit < 0 || limit > MaxListLimit {
		return Invalid("limit", "limit must be between 1 and %d", MaxListLimit)
	}
	return nil
}

func validConsistency(c Consistency) error {
	switch c {
	case "", Linearizable, Stale:
	default:
		return Invalid("consistency", "consistency must be linearizable or stale")
	}
	return nil
}
