package auth_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
	"github.com/idemkv/idemkv/auth"
)

// TestApproverRole: an approver decides, lists and reads its tenants' approvals and
// writes nothing; a client, the agent that asks, may list but never approve; an
// approver token needs tenants.
func TestApproverRole(t *testing.T) {
	f, err := auth.Parse([]byte(`{"tokens":[
		{"name":"ana","hash":"` + auth.HashToken("a") + `","role":"approver","tenants":["shop"]},
		{"name":"agent","hash":"` + auth.HashToken("c") + `","role":"client","tenants":["shop"]},
		{"name":"ops","hash":"` + auth.HashToken("o") + `","role":"admin"},
		{"name":"prom","hash":"` + auth.HashToken("p") + `","role":"monitor"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	who := func(token string) *auth.Principal {
		p, err := a.Authenticate(token)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		token  string
		op     api.Operation
		tenant string
		allow  bool
	}{
		{"a", api.OpApprove, "shop", true},
		{"a", api.OpApprove, "bank", false},
		{"a", api.OpListApprovals, "shop", true},
		{"a", api.OpRead, "shop", true},
		{"a", api.OpRead, "bank", false},
		{"a", api.OpWrite, "shop", false},
		{"a", api.OpList, "shop", false},
		{"a", api.OpAdmin, "", false},
		{"c", api.OpApprove, "shop", false},
		{"c", api.OpListApprovals, "shop", true},
		{"c", api.OpListApprovals, "bank", false},
		{"o", api.OpApprove, "bank", true},
		{"o", api.OpListApprovals, "bank", true},
		{"p", api.OpApprove, "shop", false},
		{"p", api.OpListApprovals, "shop", false},
	}
	for _, tc := range tests {
		err := who(tc.token).Allow(tc.op, tc.tenant)
		if tc.allow != (err == nil) || (err != nil && !errors.Is(err, idemkv.ErrPermissionDenied)) {
			t.Errorf("token %s %s on %q: %v, want allowed=%v", tc.token, tc.op, tc.tenant, err, tc.allow)
		}
	}
	if _, err := auth.Parse([]byte(`{"tokens":[{"name":"ana","hash":"` + auth.HashToken("a") + `","role":"approver"}]}`)); !errors.Is(err, auth.ErrInvalidFile) {
		t.Errorf("an approver without tenants: %v, want an invalid file", err)
	}
}

// TestPrincipalTenants: the console offers a token's own tenants; "*" and an admin
// hold every one.
func TestPrincipalTenants(t *testing.T) {
	a, err := auth.New(&auth.File{Tokens: []auth.Token{
		{Name: "ap", Hash: auth.HashToken("t1"), Role: auth.RoleApprover, Tenants: []string{"zeta", "acme"}},
		{Name: "all", Hash: auth.HashToken("t2"), Role: auth.RoleClient, Tenants: []string{"*"}},
		{Name: "adm", Hash: auth.HashToken("t3"), Role: auth.RoleAdmin},
		{Name: "mon", Hash: auth.HashToken("t4"), Role: auth.RoleMonitor},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for token, want := range map[string]struct {
		tenants string
		every   bool
	}{"t1": {"acme,zeta", false}, "t2": {"", true}, "t3": {"", true}, "t4": {"", false}} {
		p, err := a.Authenticate(token)
		if err != nil {
			t.Fatal(err)
		}
		got, every := p.Tenants()
		if strings.Join(got, ",") != want.tenants || every != want.every {
			t.Errorf("%s: %q %v, want %q %v", p.Name, got, every, want.tenants, want.every)
		}
	}
}
