package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// TestGetHistoryOfAReleasedKey: idemkv get --history of a key whose record was
// released prints the history it left (the execute and the release) and fails with
// not_found; idemkv get alone fails the same way and prints nothing.
func TestGetHistoryOfAReleasedKey(t *testing.T) {
	ep, cl, ctx := oneNode(t)
	res, err := cl.Reserve(ctx, &idemkv.ReserveRequest{Tenant: "acme", Key: "conv_6:email", Tool: "send_email", Actor: "agent-4", Fingerprint: "sha256:06"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli(t, "release", "--endpoint", ep, "--tenant", "acme", "--key", "conv_6:email", "--fingerprint", "sha256:06",
		"--fence", fmt.Sprint(res.Fence)); err != nil {
		t.Fatal(err)
	}
	get := []string{"get", "--endpoint", ep, "--tenant", "acme", "--key", "conv_6:email"}
	out, err := cli(t, get...)
	if !errors.Is(err, idemkv.ErrNotFound) || out != "" {
		t.Fatalf("get: %v, printed %q", err, out)
	}
	out, err = cli(t, append(get, "--history")...)
	if !errors.Is(err, idemkv.ErrNotFound) {
		t.Fatalf("get --history: %v", err)
	}
	var printed idemkv.ErrorDetails
	if err := json.Unmarshal([]byte(out), &printed); err != nil || printed.Released == nil {
		t.Fatalf("%v: %s", err, out)
	}
	h := printed.Released.History
	if len(h) != 2 || h[0].Event != idemkv.EventExecute || h[0].Actor != "agent-4" || h[1].Event != idemkv.EventRelease ||
		h[1].Fence != res.Fence || printed.Released.Tool != "send_email" {
		t.Fatalf("released %+v", printed.Released)
	}
}
