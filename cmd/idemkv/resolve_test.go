package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/auth"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
)

// TestLsInDoubtAndResolve: an operator lists the in-doubt records of a tenant and
// settles them by key, with no fence or fingerprint to copy (issue 14, point 3).
func TestLsInDoubtAndResolve(t *testing.T) {
	ep, cl, ctx := oneNode(t)

	// Two crashed calls of a tool without a probe, each retried once: in doubt.
	inDoubt := func(key string) {
		op := client.Op{Tenant: "acme", Key: key, Tool: "create_ticket", Effect: map[string]string{"title": key},
			LeaseTTL: time.Second}
		_, err := cl.Do(ctx, op, func(context.Context) (*client.Result, error) { return nil, errors.New("timeout") })
		if client.KindOf(err) != client.KindOutcomeUnknown {
			t.Fatalf("%v", err)
		}
		time.Sleep(op.LeaseTTL + 200*time.Millisecond)
		_, err = cl.Do(ctx, op, func(context.Context) (*client.Result, error) {
			t.Error("ran")
			return nil, nil
		})
		if client.KindOf(err) != client.KindInDoubt {
			t.Fatalf("%v", err)
		}
	}
	inDoubt("conv_1:create_ticket")
	inDoubt("conv_2:create_ticket")
	// And one settled record, which ls --in-doubt must leave out.
	if _, err := cl.Do(ctx, client.Op{Tenant: "acme", Key: "conv_3:create_ticket", Tool: "create_ticket", Effect: map[string]int{"n": 3}},
		func(context.Context) (*client.Result, error) {
			return &client.Result{RemoteSystem: "linear", RemoteID: "LIN-3"}, nil
		}); err != nil {
		t.Fatal(err)
	}

	out, err := cli(t, "ls", "--endpoint", ep, "--tenant", "acme", "--in-doubt")
	if err != nil {
		t.Fatal(err)
	}
	var page idemkv.ListResult
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(page.Records) != 2 || page.Records[0].Key != "conv_1:create_ticket" || !page.Records[1].InDoubt {
		t.Fatalf("ls --in-doubt: %s", out)
	}

	if _, err := cli(t, "resolve", "--endpoint", ep, "acme", "conv_1:create_ticket", "--committed", "--not-executed"); err == nil {
		t.Fatal("both outcomes accepted")
	}
	if _, err := cli(t, "resolve", "--endpoint", ep, "acme", "conv_1:create_ticket", "--committed"); err == nil {
		t.Fatal("--committed without a receipt accepted")
	}
	if _, err := cli(t, "resolve", "--endpoint", ep, "acme", "conv_3:create_ticket", "--not-executed"); err == nil ||
		!strings.Contains(err.Error(), "not in doubt") {
		t.Fatalf("resolving a committed record: %v", err)
	}

	out, err = cli(t, "resolve", "--endpoint", ep, "acme", "conv_1:create_ticket", "--committed",
		"--remote-system", "linear", "--remote-id", "LIN-1", "--result", `{"found":"by hand"}`)
	if err != nil || !strings.Contains(out, `"remote_id": "LIN-1"`) {
		t.Fatalf("resolve --committed: %v: %s", err, out)
	}
	out, err = cli(t, "resolve", "--endpoint", ep, "acme", "conv_2:create_ticket", "--not-executed")
	if err != nil || !strings.Contains(out, `"released": true`) {
		t.Fatalf("resolve --not-executed: %v: %s", err, out)
	}

	rec, err := cl.Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: "conv_1:create_ticket"})
	if err != nil || rec.Status != idemkv.StatusCommitted || rec.Receipt.RemoteID != "LIN-1" || rec.InDoubt {
		t.Fatalf("after resolve: %+v, %v", rec, err)
	}
	if _, err := cl.Get(ctx, &idemkv.GetRequest{Tenant: "acme", Key: "conv_2:create_ticket"}); !errors.Is(err, idemkv.ErrNotFound) {
		t.Fatalf("after release: %v", err)
	}
	if out, err := cli(t, "ls", "--endpoint", ep, "--tenant", "acme", "--in-doubt"); err != nil || !strings.Contains(out, `"records": []`) {
		t.Fatalf("ls --in-doubt after settling: %v: %s", err, out)
	}
}

// TestLsInDoubtEveryTenant: paged by idemkv_records_in_doubt, an operator with an admin
// token lists the in-doubt records of every tenant without naming one, oldest first,
// one page or all of them, and settles them with idemkv resolve; a token of some
// tenants is refused, as is a call without a token.
func TestLsInDoubtEveryTenant(t *testing.T) {
	const adminToken, acmeToken = "idk_ops-admin", "idk_acme-agents"
	f, err := auth.Parse([]byte(`{"tokens":[
		{"name":"ops","hash":"` + auth.HashToken(adminToken) + `","role":"admin"},
		{"name":"acme-agents","hash":"` + auth.HashToken(acmeToken) + `","role":"client","tenants":["acme","beta"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := testcluster.Start(t, 1, testcluster.WithAPIMiddleware(a.Middleware))
	ep := c.Endpoint(0)
	cl, err := client.New(client.Config{Endpoints: []string{ep}, Token: acmeToken})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Three attempts die in doubt, in two tenants, each a millisecond after the last.
	marks := []struct{ tenant, key, tool string }{
		{"beta", "conv_9:refund", "refund"}, {"acme", "conv_7:create_ticket", "create_ticket"}, {"beta", "conv_1:refund", "refund"}}
	var last idemkv.Timestamp
	for i, m := range marks {
		res, err := cl.Reserve(ctx, &idemkv.ReserveRequest{Tenant: m.tenant, Key: m.key, Tool: m.tool, Fingerprint: fmt.Sprintf("sha256:%02x", i)})
		if err != nil {
			t.Fatal(err)
		}
		rec, err := cl.Doubt(ctx, &idemkv.DoubtRequest{Tenant: m.tenant, Key: m.key, Fingerprint: res.Record.Fingerprint, Fence: res.Fence})
		if err != nil {
			t.Fatal(err)
		}
		if rec.InDoubtSince <= last {
			t.Fatalf("%s/%s in doubt since %s, not after %s", m.tenant, m.key, rec.InDoubtSince, last)
		}
		last = rec.InDoubtSince
		if err := testcluster.Eventually(5*time.Second, func() error {
			if time.Now().UnixMilli() <= int64(last) {
				return errors.New("same millisecond")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}

	type entry struct {
		Tenant   string `json:"tenant"`
		Key      string `json:"idempotency_key"`
		Tool     string `json:"tool"`
		Age      string `json:"age"`
		Attempts uint32 `json:"attempts"`
		Since    string `json:"in_doubt_since"`
	}
	type page struct {
		Records []entry `json:"records"`
		Next    string  `json:"next"`
	}
	ls := func(args ...string) page {
		t.Helper()
		out, err := cli(t, append([]string{"ls", "--endpoint", ep, "--in-doubt"}, args...)...)
		if err != nil {
			t.Fatalf("ls --in-doubt %v: %v", args, err)
		}
		var p page
		dec := json.NewDecoder(strings.NewReader(out))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		for _, e := range p.Records {
			if age, err := time.ParseDuration(e.Age); err != nil || age < 0 || age > time.Minute || e.Attempts != 1 || e.Since == "" {
				t.Fatalf("entry %+v", e)
			}
		}
		return p
	}
	names := func(p page) []string {
		var out []string
		for _, e := range p.Records {
			out = append(out, e.Tenant+"/"+e.Key+" "+e.Tool)
		}
		return out
	}
	want := []string{"beta/conv_9:refund refund", "acme/conv_7:create_ticket create_ticket", "beta/conv_1:refund refund"}

	first := ls("--token", adminToken, "--limit", "2")
	if got := names(first); !slices.Equal(got, want[:2]) || first.Next == "" {
		t.Fatalf("first page: %v next %q, want %v and a next", got, first.Next, want[:2])
	}
	if second := ls("--token", adminToken, "--limit", "2", "--after", first.Next); !slices.Equal(names(second), want[2:]) || second.Next != "" {
		t.Fatalf("second page: %v next %q", names(second), second.Next)
	}
	if every := ls("--token", adminToken, "--limit", "1", "--all"); !slices.Equal(names(every), want) || every.Next != "" {
		t.Fatalf("--all: %v next %q, want %v", names(every), every.Next, want)
	}

	// A token of acme and beta sees both tenants' records one tenant at a time, but
	// not every tenant's at once; no token gets nothing.
	if _, err := cli(t, "ls", "--endpoint", ep, "--in-doubt", "--token", acmeToken); !errors.Is(err, idemkv.ErrPermissionDenied) {
		t.Fatalf("ls --in-doubt with a tenant token: %v, want permission denied", err)
	}
	if _, err := cli(t, "ls", "--endpoint", ep, "--in-doubt"); !errors.Is(err, idemkv.ErrUnauthenticated) {
		t.Fatalf("ls --in-doubt without a token: %v, want unauthenticated", err)
	}
	if out, err := cli(t, "ls", "--endpoint", ep, "--in-doubt", "--tenant", "beta", "--token", acmeToken); err != nil || strings.Count(out, `"in_doubt": true`) != 2 {
		t.Fatalf("ls --tenant beta --in-doubt with a tenant token: %v: %s", err, out)
	}
	for _, args := range [][]string{{"ls"}, {"ls", "--in-doubt", "--prefix", "conv_"}, {"ls", "--in-doubt", "--status", "pending"}} {
		if _, err := cli(t, append(args, "--endpoint", ep, "--token", adminToken)...); err == nil || !strings.Contains(err.Error(), "--tenant") {
			t.Fatalf("%v: %v, want an error naming --tenant", args, err)
		}
	}

	// Settled, a record leaves the list.
	if _, err := cli(t, "resolve", "--endpoint", ep, "--token", adminToken, "acme", "conv_7:create_ticket", "--not-executed"); err != nil {
		t.Fatal(err)
	}
	if rest := ls("--token", adminToken); !slices.Equal(names(rest), []string{want[0], want[2]}) {
		t.Fatalf("after resolving acme's: %v", names(rest))
	}
}

// oneNode starts a single-node cluster for a CLI test and returns its endpoint, a client
// of it and a context that ends with the test (at most 60 s).
func oneNode(t *testing.T) (string, *client.Client, context.Context) {
	t.Helper()
	c := testcluster.Start(t, 1)
	ep := c.Endpoint(0)
	cl, err := client.New(client.Config{Endpoints: []string{ep}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ep, cl, ctx
}
