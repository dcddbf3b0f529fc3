package idemkv_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
)

// Validate only checks: the request it accepts is byte for byte the one it was given,
// and EnsureDefaults is the one step that fills it.
func TestValidateChecksEnsureDefaultsFills(t *testing.T) {
	r := idemkv.ReserveRequest{Tenant: "acme", Key: "k", Tool: "t", Fingerprint: "sha256:x", Effect: json.RawMessage("null")}
	before := r
	if err := r.Validate(idemkv.Limits{}, 1_000_000); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r, before) {
		t.Fatalf("Validate changed the reserve: %+v, was %+v", r, before)
	}
	r.EnsureDefaults(idemkv.Limits{})
	if r.LeaseTTLMs != 30_000 || r.TTLMs != 86_400_000 || r.Effect != nil {
		t.Fatalf("defaults: lease %d ttl %d effect %q", r.LeaseTTLMs, r.TTLMs, r.Effect)
	}
	// Defaults come from the limits given: the node's, not a copy.
	own := idemkv.ReserveRequest{Tenant: "acme", Key: "k", Tool: "t", Fingerprint: "sha256:x", ExpiresAt: 9_000_000}
	own.EnsureDefaults(idemkv.Limits{DefaultLeaseTTL: 45 * time.Second})
	if own.LeaseTTLMs != 45_000 || own.TTLMs != 0 {
		t.Fatalf("own defaults: lease %d ttl %d, want 45000 and no ttl beside expires_at", own.LeaseTTLMs, own.TTLMs)
	}

	hb := idemkv.HeartbeatRequest{Tenant: "acme", Key: "k", Fence: 3}
	if err := hb.Validate(idemkv.Limits{}); err != nil || hb.LeaseTTLMs != 0 {
		t.Fatalf("heartbeat Validate: %v, lease %d", err, hb.LeaseTTLMs)
	}
	hb.EnsureDefaults(idemkv.Limits{})
	if hb.LeaseTTLMs != 30_000 {
		t.Fatalf("heartbeat default lease %d", hb.LeaseTTLMs)
	}

	g := idemkv.GetRequest{Tenant: "acme", Key: "k"}
	if err := g.Validate(); err != nil || g.Consistency != "" {
		t.Fatalf("get Validate: %v, consistency %q", err, g.Consistency)
	}
	g.EnsureDefaults()
	if g.Consistency != idemkv.Linearizable {
		t.Fatalf("get default consistency %q", g.Consistency)
	}

	l := idemkv.ListRequest{Tenant: "acme"}
	if err := l.Validate(); err != nil || l.Limit != 0 || l.Consistency != "" {
		t.Fatalf("list Validate: %v, limit %d consistency %q", err, l.Limit, l.Consistency)
	}
	l.EnsureDefaults()
	if l.Limit != idemkv.DefaultListLimit || l.Consistency != idemkv.Linearizable {
		t.Fatalf("list defaults: limit %d consistency %q", l.Limit, l.Consistency)
	}
}

func TestReserveValidateNamesTheField(t *testing.T) {
	now := idemkv.Timestamp(1_000_000_000)
	ok := func() idemkv.ReserveRequest {
		return idemkv.ReserveRequest{Tenant: "acme", Key: "k", Tool: "t", Fingerprint: "sha256:x"}
	}
	cases := []struct {
		field string
		edit  func(*idemkv.ReserveRequest)
	}{
		{"tenant", func(r *idemkv.ReserveRequest) { r.Tenant = "" }},
		{"tenant", func(r *idemkv.ReserveRequest) { r.Tenant = "a/b" }},
		{"tenant", func(r *idemkv.ReserveRequest) { r.Tenant = strings.Repeat("a", 129) }},
		{"idempotency_key", func(r *idemkv.ReserveRequest) { r.Key = "" }},
		{"idempotency_key", func(r *idemkv.ReserveRequest) { r.Key = strings.Repeat("k", 513) }},
		{"idempotency_key", func(r *idemkv.ReserveRequest) { r.Key = "a\x00b" }},
		{"idempotency_key", func(r *idemkv.ReserveRequest) { r.Key = "bad\xffutf8" }},
		{"effect_fingerprint", func(r *idemkv.ReserveRequest) { r.Fingerprint = "" }},
		{"effect_fingerprint", func(r *idemkv.ReserveRequest) { r.Fingerprint = ""; r.Effect = json.RawMessage("null") }},
		{"effect_fingerprint", func(r *idemkv.ReserveRequest) { r.Fingerprint = strings.Repeat("f", 129) }},
		{"effect", func(r *idemkv.ReserveRequest) { r.Effect = json.RawMessage("{") }},
		{"tool", func(r *idemkv.ReserveRequest) { r.Tool = "" }},
		{"actor", func(r *idemkv.ReserveRequest) { r.Actor = strings.Repeat("a", 129) }},
		{"lease_ttl_ms", func(r *idemkv.ReserveRequest) { r.LeaseTTLMs = 999 }},
		{"lease_ttl_ms", func(r *idemkv.ReserveRequest) { r.LeaseTTLMs = 3_600_001 }},
		{"ttl_ms", func(r *idemkv.ReserveRequest) { r.TTLMs = 59_999 }},
		{"ttl_ms", func(r *idemkv.ReserveRequest) { r.TTLMs = 30*24*3_600_000 + 1 }},
		{"ttl_ms", func(r *idemkv.ReserveRequest) { r.TTLMs = 120_000; r.LeaseTTLMs = 600_000 }},
		{"expires_at", func(r *idemkv.ReserveRequest) { r.ExpiresAt = now + 1000 }},
		{"expires_at", func(r *idemkv.ReserveRequest) { r.ExpiresAt = now + 3_600_000; r.TTLMs = 3_600_000 }},
	}
	for _, c := range cases {
		r := ok()
		c.edit(&r)
		err := r.Validate(idemkv.Limits{}, now)
		var e *idemkv.Error
		if !errors.As(err, &e) || e.Field != c.field || !errors.Is(err, idemkv.ErrInvalidArgument) {
			t.Errorf("want invalid %s, got %v", c.field, err)
		}
	}
}

func TestCommitPayloadLimit(t *testing.T) {
	r := idemkv.CommitRequest{Tenant: "a", Key: "k", Fingerprint: "f", Fence: 1, RemoteSystem: "s", RemoteID: "i",
		Result: json.RawMessage(`"` + strings.Repeat("x", 64<<10) + `"`)}
	if err := r.Validate(idemkv.Limits{}); !errors.Is(err, idemkv.ErrPayloadTooLarge) {
		t.Fatalf("64 KiB result: %v, want payload too large", err)
	}
	if err := r.Validate(idemkv.Limits{MaxPayloadBytes: 128 << 10}); err != nil {
		t.Fatalf("raised limit: %v", err)
	}
}

func TestLimitsValidate(t *testing.T) {
	if err := idemkv.DefaultLimits().Validate(); err != nil {
		t.Fatal(err)
	}
	bad := []idemkv.Limits{
		{MinLeaseTTL: time.Hour, MaxLeaseTTL: time.Minute},
		{DefaultLeaseTTL: 2 * time.Hour},
		{DefaultTTL: 31 * 24 * time.Hour},
		{DefaultTTL: 2 * time.Minute, DefaultLeaseTTL: 10 * time.Minute},
		{MaxPayloadBytes: 2 << 20},
		{MinLeaseTTL: -time.Second},
		{MinTTL: -time.Minute},
		{DefaultLeaseTTL: -time.Second, MinLeaseTTL: -time.Hour},
	}
	for _, l := range bad {
		if err := l.Validate(); err == nil {
			t.Errorf("%+v: no error", l)
		}
	}
}

func TestErrorMapping(t *testing.T) {
	for code, status := range map[string]int{
		idemkv.CodeInvalidArgument: 400, idemkv.CodeUnauthenticated: 401, idemkv.CodePermissionDenied: 403,
		idemkv.CodeNotFound: 404, idemkv.CodeFenced: 409, idemkv.CodeFingerprintMismatch: 409,
		idemkv.CodeNotPending: 409, idemkv.CodePayloadTooLarge: 413, idemkv.CodeUnavailable: 503,
		idemkv.CodeInternal: 500,
	} {
		if got := idemkv.HTTPStatus(code); got != status {
			t.Errorf("%s: %d, want %d", code, got, status)
		}
		err := idemkv.Errorf(idemkv.SentinelOf(code), "x")
		if idemkv.CodeOf(err) != code || !errors.Is(err, idemkv.SentinelOf(code)) {
			t.Errorf("%s does not round-trip: %v", code, err)
		}
	}
	if idemkv.CodeOf(idemkv.ErrNotLeader) != idemkv.CodeUnavailable {
		t.Errorf("ErrNotLeader maps to %s", idemkv.CodeOf(idemkv.ErrNotLeader))
	}
	if e := idemkv.AsError(errors.New("disk on fire")); e.Code != idemkv.CodeInternal || strings.Contains(e.Message, "fire") {
		t.Errorf("internal errors leak: %+v", e)
	}
}

// A lease of 166020696664386 ms overflows time.Duration into about 2.4 minutes; it was
// accepted and stored expiry dates past year 9999 (issue 13, defect 3).
func TestLeaseMillisecondsCheckedBeforeConverting(t *testing.T) {
	for _, ms := range []int64{166020696664386, 1 << 62, -166020696664386} {
		hb := idemkv.HeartbeatRequest{Tenant: "acme", Key: "k", Fence: 1, LeaseTTLMs: ms}
		if err := hb.Validate(idemkv.Limits{}); idemkv.AsError(err).Field != "lease_ttl_ms" {
			t.Errorf("heartbeat lease_ttl_ms %d: %v", ms, err)
		}
		r := idemkv.ReserveRequest{Tenant: "acme", Key: "k", Tool: "t", Fingerprint: "sha256:x", LeaseTTLMs: ms}
		if err := r.Validate(idemkv.Limits{}, 1_000_000); idemkv.AsError(err).Field != "lease_ttl_ms" {
			t.Errorf("reserve lease_ttl_ms %d: %v", ms, err)
		}
	}
	l := idemkv.DefaultLimits()
	l.MaxTTL = idemkv.CeilingTTL + time.Millisecond
	if err := l.Validate(); err == nil {
		t.Error("a max TTL beyond the ceiling was accepted")
	}
}

// What ClipText gives back, the validator accepts: the client and the gateway rely on it
// to pass on text they did not write (multi-line errors, odd client names).
func TestClipTextSatisfiesTheValidator(t *testing.T) {
	inputs := []string{
		"plain",
		"line one\nline two\ttabbed\r\x00\x7f",
		"bad utf-8: \xff\xfe end",
		strings.Repeat("é", idemkv.MaxKeyLen), // 2 bytes a rune: the cut must fall between runes
		strings.Repeat("x", idemkv.MaxKeyLen-1) + "€",
		"\u2028separator\u200bzero-width",
	}
	for _, in := range inputs {
		got := idemkv.ClipText(in, idemkv.MaxKeyLen)
		if err := idemkv.ValidKey(got); err != nil {
			t.Errorf("ClipText(%q) = %q, refused: %v", in, got, err)
		}
		if idemkv.ValidKey(in) == nil && got != in {
			t.Errorf("ClipText(%q) = %q, changed text that was fine", in, got)
		}
	}
	if got := idemkv.ClipText("a\nb", 10); got != "a b" {
		t.Errorf(`ClipText("a\nb") = %q, want "a b"`, got)
	}
}
