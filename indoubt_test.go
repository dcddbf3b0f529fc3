package idemkv_test

import (
	"errors"
	"testing"

	"github.com/idemkv/idemkv"
)

// TestDoubtPositionCursor: a position survives its cursor, keys with "/" included; the
// cursor orders by in_doubt_since, then tenant, then key; anything String cannot have
// written is an invalid "after".
func TestDoubtPositionCursor(t *testing.T) {
	for _, p := range []idemkv.DoubtPosition{
		{Since: 1_700_000_000_123, Tenant: "acme", Key: "conv_1:create_ticket"},
		{Since: 5, Tenant: "a.b_c:d-E", Key: "a/b//c/ é"},
		{Since: 0, Tenant: "t", Key: "1/2"},
	} {
		got, err := idemkv.ParseDoubtPosition(p.String())
		if err != nil || got != p {
			t.Errorf("%q read back as %+v, %v; want %+v", p.String(), got, err, p)
		}
	}
	order := []idemkv.DoubtPosition{
		{Since: 1, Tenant: "zeta", Key: "z"},
		{Since: 2, Tenant: "acme", Key: "b"},
		{Since: 2, Tenant: "beta", Key: "a"},
		{Since: 2, Tenant: "beta", Key: "b"},
		{Since: 10, Tenant: "a", Key: "a"},
	}
	for i := range order {
		for j := range order {
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got := order[i].Compare(order[j]); got != want {
				t.Errorf("%v vs %v: %d, want %d", order[i], order[j], got, want)
			}
		}
	}
	for _, bad := range []string{"", "acme/k", "12/acme", "x/acme/k", "-1/acme/k", "+1/acme/k", "01/acme/k",
		"1//k", "1/ac me/k", "1/acme/", "1/acme/k\n", "99999999999999999999/acme/k"} {
		_, err := idemkv.ParseDoubtPosition(bad)
		var e *idemkv.Error
		if !errors.As(err, &e) || e.Code != idemkv.CodeInvalidArgument || e.Field != "after" {
			t.Errorf("%q: %v, want invalid after", bad, err)
		}
	}
}

// TestInDoubtRequestValidate: the listing of every tenant takes a list's limits and
// consistencies, and a cursor of its own; Validate only checks, EnsureDefaults fills.
func TestInDoubtRequestValidate(t *testing.T) {
	r := idemkv.InDoubtRequest{}
	if err := r.Validate(); err != nil || r.Limit != 0 || r.Consistency != "" {
		t.Fatalf("Validate: %v, %+v", err, r)
	}
	r.EnsureDefaults()
	if r.Limit != idemkv.DefaultListLimit || r.Consistency != idemkv.Linearizable {
		t.Fatalf("defaults: %+v", r)
	}
	ok := idemkv.InDoubtRequest{Limit: idemkv.MaxListLimit, After: "17/acme/k", Consistency: idemkv.Stale}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for field, bad := range map[string]idemkv.InDoubtRequest{
		"limit":       {Limit: idemkv.MaxListLimit + 1},
		"consistency": {Consistency: "eventual"},
		"after":       {After: "acme/k"},
	} {
		err := bad.Validate()
		var e *idemkv.Error
		if !errors.As(err, &e) || e.Field != field {
			t.Errorf("%+v: %v, want invalid %s", bad, err, field)
		}
		// The same rule as a list's, from the same place.
		if field == "limit" || field == "consistency" {
			l := idemkv.ListRequest{Tenant: "acme", Limit: bad.Limit, Consistency: bad.Consistency}
			if lerr := l.Validate(); lerr == nil || lerr.Error() != err.Error() {
				t.Errorf("list %s: %v, in-doubt: %v", field, lerr, err)
			}
		}
	}
	negative := idemkv.InDoubtRequest{Limit: -1}
	if err := negative.Validate(); err == nil {
		t.Error("a negative limit")
	}
}
