package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/auth"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
)

// TestGetHistoryNamesTheResolver: on a node with tokens, an attempt dies in doubt and
// an admin resolves it with idemkv resolve; idemkv get --history shows the execute, the
// doubt and the resolve by that token (name and role), and idemkv get alone no history.
func TestGetHistoryNamesTheResolver(t *testing.T) {
	const adminToken, agentToken = "idk_ops-admin", "idk_acme-agents"
	f, err := auth.Parse([]byte(`{"tokens":[
		{"name":"oncall-ana","hash":"` + auth.HashToken(adminToken) + `","role":"admin"},
		{"name":"acme-agents","hash":"` + auth.HashToken(agentToken) + `","role":"client","tenants":["acme"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := testcluster.Start(t, 1, testcluster.WithAPIMiddleware(a.Middleware))
	ep := c.Endpoint(0)
	cl, err := client.New(client.Config{Endpoints: []string{ep}, Token: agentToken})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := cl.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "acme", Key: "conv_5:refund", Tool: "refund", Actor: "agent-3", Fingerprint: "sha256:05"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Doubt(ctx, &idemkv.DoubtRequest{Tenant: "acme", Key: "conv_5:refund", Fingerprint: "sha256:05", Fence: res.Fence}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli(t, "resolve", "--endpoint", ep, "--token", adminToken, "acme", "conv_5:refund", "--committed",
		"--remote-system", "psp", "--remote-id", "rf_5"); err != nil {
		t.Fatal(err)
	}
	get := func(args ...string) *idemkv.Record {
		t.Helper()
		out, err := cli(t, append([]string{"get", "--endpoint", ep, "--token", adminToken, "--tenant", "acme", "--key", "conv_5:refund"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		var rec idemkv.Record
		if err := json.Unmarshal([]byte(out), &rec); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return &rec
	}
	if rec := get(); rec.History != nil {
		t.Fatalf("get without --history: %+v", rec.History)
	}
	h := get("--history").History
	if len(h) != 3 || h[0].Event != idemkv.EventExecute || h[0].Actor != "agent-3" || h[0].Fence != res.Fence ||
		h[1].Event != idemkv.EventDoubt || h[2].Event != idemkv.EventResolve || h[2].Actor != "oncall-ana (admin)" ||
		h[2].Detail != "committed: psp rf_5" {
		t.Fatalf("history %+v", h)
	}
}
