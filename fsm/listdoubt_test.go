package fsm

import (
	"reflect"
	"testing"

	"github.com/idemkv/idemkv"
)

// TestListInDoubt: the in-doubt records of every tenant, oldest first; one past its
// expires_at is left out as List leaves it out, and the page that held it comes back
// short with a next that resumes after it.
func TestListInDoubt(t *testing.T) {
	h := newHarness(t)
	short := func(r *idemkv.ReserveRequest) { r.TTLMs = 60_000 }
	rs := h.apply(reserveCmd(t0, "zeta", "x", "a", short), reserveCmd(t0, "acme", "y", "b"),
		reserveCmd(t0, "beta", "z", "c"), reserveCmd(t0, "acme", "settled", "d"))
	mustOK(t, rs...)
	doubt := func(now idemkv.Timestamp, r *Result) *Command {
		rec := r.Reserve.Record
		return &Command{Op: OpDoubt, Now: now, Doubt: &idemkv.DoubtRequest{Tenant: rec.Tenant, Key: rec.Key,
			Fingerprint: rec.Fingerprint, Fence: r.Reserve.Fence}}
	}
	mustOK(t, h.apply(doubt(t0+1, rs[0]), doubt(t0+2, rs[1]), doubt(t0+3, rs[2]))...)

	page := func(req idemkv.InDoubtRequest, now idemkv.Timestamp) ([]string, string) {
		t.Helper()
		if err := req.Validate(); err != nil {
			t.Fatal(err)
		}
		res, err := h.f.ListInDoubt(&req, now)
		if err != nil {
			t.Fatal(err)
		}
		return keysOf(res.Records), res.Next
	}
	if keys, next := page(idemkv.InDoubtRequest{}, t0+10); !reflect.DeepEqual(keys, []string{"zeta/x", "acme/y", "beta/z"}) || next != "" {
		t.Fatalf("before expiry: %v next %q", keys, next)
	}
	keys, next := page(idemkv.InDoubtRequest{Limit: 2}, t0+10)
	if want := (idemkv.DoubtPosition{Since: t0 + 2, Tenant: "acme", Key: "y"}).String(); !reflect.DeepEqual(keys, []string{"zeta/x", "acme/y"}) || next != want {
		t.Fatalf("first page of 2: %v next %q, want next %q", keys, next, want)
	}
	if keys, next := page(idemkv.InDoubtRequest{Limit: 2, After: next}, t0+10); !reflect.DeepEqual(keys, []string{"beta/z"}) || next != "" {
		t.Fatalf("second page: %v next %q", keys, next)
	}

	expired := t0 + 60_000
	keys, next = page(idemkv.InDoubtRequest{Limit: 2}, expired)
	if want := (idemkv.DoubtPosition{Since: t0 + 2, Tenant: "acme", Key: "y"}).String(); !reflect.DeepEqual(keys, []string{"acme/y"}) || next != want {
		t.Fatalf("at zeta/x's expiry: %v next %q, want [acme/y] next %q", keys, next, want)
	}
	if keys, next := page(idemkv.InDoubtRequest{Limit: 2, After: next}, expired); !reflect.DeepEqual(keys, []string{"beta/z"}) || next != "" {
		t.Fatalf("after it: %v next %q", keys, next)
	}
	// The state machine clock alone hides it too.
	if keys, _ := page(idemkv.InDoubtRequest{}, 0); len(keys) != 3 {
		t.Fatalf("with a stale now before the clock passed expiry: %v", keys)
	}
	mustOK(t, h.apply(reserveCmd(expired, "acme", "bump", "e"))...)
	if keys, _ := page(idemkv.InDoubtRequest{}, 0); !reflect.DeepEqual(keys, []string{"acme/y", "beta/z"}) {
		t.Fatalf("with a stale now after the clock passed expiry: %v", keys)
	}
}
