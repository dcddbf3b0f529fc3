package fsm

import (
	"errors"
	"testing"

	"github.com/idemkv/idemkv"
)

// The state machine owns no defaults: a reserve or heartbeat whose lease or TTL was
// not filled in by the proposer is refused and stores nothing, where it used to be
// filled from idemkv.DefaultLimits here, a second owner beside the node's limits.
func TestUnfilledCommandsAreRefused(t *testing.T) {
	h := newHarness(t)
	for name, mod := range map[string]func(*idemkv.ReserveRequest){
		"no lease": func(r *idemkv.ReserveRequest) { r.LeaseTTLMs = 0 },
		"no ttl":   func(r *idemkv.ReserveRequest) { r.TTLMs = 0 },
	} {
		res := h.apply(reserveCmd(t0, tenant, key, "a", mod))
		if !errors.Is(res[0].Err, idemkv.ErrInvalidArgument) {
			t.Fatalf("reserve with %s: %+v, want invalid_argument", name, res[0])
		}
		if _, err := h.f.Get(tenant, key, t0); !errors.Is(err, idemkv.ErrNotFound) {
			t.Fatalf("reserve with %s stored a record (get: %v)", name, err)
		}
	}
	// expires_at stands in for ttl_ms.
	at := func(r *idemkv.ReserveRequest) { r.TTLMs, r.ExpiresAt = 0, t0+ttl }
	res := h.apply(reserveCmd(t0, tenant, key, "a", at))
	mustOK(t, res...)
	hb := h.apply(&Command{Op: OpHeartbeat, Now: t0 + 1, Heartbeat: &idemkv.HeartbeatRequest{
		Tenant: tenant, Key: key, Fence: res[0].Reserve.Fence}})
	if !errors.Is(hb[0].Err, idemkv.ErrInvalidArgument) {
		t.Fatalf("heartbeat without a lease: %+v, want invalid_argument", hb[0])
	}
	rec, err := h.f.Get(tenant, key, t0+1)
	if err != nil || rec.LeaseExpiresAt != t0+lease || rec.UpdatedAt != t0 {
		t.Fatalf("after the refused heartbeat: %+v, %v; want the record as reserved", rec, err)
	}
}
