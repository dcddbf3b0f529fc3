package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
)

// TestLsInDoubtAndResolve: an operator lists the in-doubt records of a tenant and
// settles them by key, with no fence or fingerprint to copy (issue 14, point 3).
func TestLsInDoubtAndResolve(t *testing.T) {
	c := testcluster.Start(t, 1)
	ep := c.Endpoint(0)
	cl, err := client.New(client.Config{Endpoints: []string{ep}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

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
