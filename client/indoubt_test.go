package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/internal/testcluster"
)

// inDoubtGauges reads idemkv_records_in_doubt and idemkv_in_doubt_oldest_age_seconds
// from node i's registry.
func inDoubtGauges(t *testing.T, c *testcluster.Cluster, i int) (count, age float64) {
	t.Helper()
	families, err := c.Metrics(i).Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, f := range families {
		switch f.GetName() {
		case "idemkv_records_in_doubt":
			count, found = f.GetMetric()[0].GetGauge().GetValue(), found+1
		case "idemkv_in_doubt_oldest_age_seconds":
			age, found = f.GetMetric()[0].GetGauge().GetValue(), found+1
		}
	}
	if found != 2 {
		t.Fatalf("the in-doubt gauges are not exported (%d of 2 found)", found)
	}
	return count, age
}

// crashWithoutProbe leaves key pending as a worker that died mid-call does (the tool
// created the ticket, then its call timed out), and waits out the lease.
func (e *env) crashWithoutProbe(t *testing.T, op client.Op) {
	t.Helper()
	_, err := e.client.Do(timeout(t, 20*time.Second), op, func(context.Context) (*client.Result, error) {
		e.api.create(op.Key)
		return nil, errDownstreamTimeout
	})
	if client.KindOf(err) != client.KindOutcomeUnknown {
		t.Fatalf("the crashed call: %v (kind %q)", err, client.KindOf(err))
	}
	time.Sleep(op.LeaseTTL + 200*time.Millisecond)
}

// TestInDoubtEndToEnd drives the in-doubt state through a real three-node cluster
// over HTTP (issue 14, point 3): a recover without a probe marks the record in doubt
// once; retries answer in doubt at once without taking a new fence or lease; the
// record is listed, counted and aged; Resolve settles it without a fence; a caller
// with a probe settles it itself.
func TestInDoubtEndToEnd(t *testing.T) {
	e := startEnv(t, 3)
	for i := range e.cluster.Len() {
		if err := e.cluster.Node(i).RegisterMetrics(e.cluster.Metrics(i)); err != nil {
			t.Fatal(err)
		}
	}
	ctx := timeout(t, 60*time.Second)

	key := "conv_31:approval_4:create_ticket"
	op := createTicket(key, "Outage D")
	op.LeaseTTL = time.Second
	e.crashWithoutProbe(t, op)

	// The first retry takes the key over, cannot probe, and marks it in doubt.
	_, err := e.client.Do(ctx, op, mustNotRun(t))
	var ide *client.InDoubtError
	if !errors.As(err, &ide) || client.KindOf(err) != client.KindInDoubt || ide.Cause != nil {
		t.Fatalf("first retry: %v (kind %q)", err, client.KindOf(err))
	}
	rec := ide.Record
	if rec == nil || !rec.InDoubt || rec.InDoubtSince == 0 || rec.Status != idemkv.StatusPending || rec.LeaseExpiresAt != 0 {
		t.Fatalf("the in-doubt error names %+v", rec)
	}
	// The message names the record and how to settle it; it names no fence (a fence
	// is no use to an operator) and says nothing twice.
	msg := err.Error()
	t.Logf("in-doubt message: %s", msg)
	if strings.Contains(msg, "fence") || strings.Count(msg, "idemkv:") != 1 || !strings.Contains(msg, key) ||
		!strings.Contains(msg, "resolve") {
		t.Fatalf("message %q", msg)
	}

	// Retries answer in doubt at once and never re-lease: same fence, same attempts,
	// no lease, for every worker.
	for i := range 3 {
		start := time.Now()
		_, err := e.client.Do(ctx, op, mustNotRun(t))
		if !errors.As(err, &ide) || time.Since(start) > 2*time.Second {
			t.Fatalf("retry %d: %v after %s", i, err, time.Since(start))
		}
		t.Logf("retry %d answered in doubt after %s", i, time.Since(start))
		if ide.Record.Fence != rec.Fence || ide.Record.Attempts != rec.Attempts || ide.Record.LeaseExpiresAt != 0 ||
			ide.Record.InDoubtSince != rec.InDoubtSince {
			t.Fatalf("retry %d re-leased the key: %+v, was %+v", i, ide.Record, rec)
		}
	}

	// A pending record that is not in doubt (its attempt is alive).
	other := createTicket("conv_31:approval_5:create_ticket", "Outage E")
	fp := fingerprintOf(t, other)
	if _, err := e.client.Reserve(ctx, &idemkv.ReserveRequest{Tenant: other.Tenant, Key: other.Key, Tool: other.Tool,
		Fingerprint: fp, LeaseTTLMs: 60_000}); err != nil {
		t.Fatal(err)
	}

	// Listed (alone), counted and aged.
	page, err := e.client.List(ctx, &idemkv.ListRequest{Tenant: op.Tenant, InDoubt: true})
	if err != nil || len(page.Records) != 1 || page.Records[0].Key != key || !page.Records[0].InDoubt {
		t.Fatalf("list in_doubt: %+v, %v", page, err)
	}
	all, err := e.client.List(ctx, &idemkv.ListRequest{Tenant: op.Tenant, Status: idemkv.StatusPending})
	if err != nil || len(all.Records) != 2 {
		t.Fatalf("list: %+v, %v", all, err)
	}
	if err := testcluster.Eventually(10*time.Second, func() error {
		for i := range e.cluster.Len() {
			if n, age := inDoubtGauges(t, e.cluster, i); n != 1 || age <= 0 {
				return errors.New("gauges not there yet")
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// A resolve of a pending record that is not in doubt is refused: its attempt may
	// still be running.
	_, err = e.client.Resolve(ctx, &idemkv.ResolveRequest{Tenant: other.Tenant, Key: other.Key, Fingerprint: fp,
		Outcome: idemkv.ResolveNotExecuted})
	if !errors.Is(err, idemkv.ErrNotPending) {
		t.Fatalf("resolve of a live pending record: %v", err)
	}

	// The operator found the ticket and resolves by key, without a fence.
	res, err := e.client.Resolve(ctx, &idemkv.ResolveRequest{Tenant: op.Tenant, Key: key, Fingerprint: rec.Fingerprint,
		Outcome: idemkv.ResolveCommitted, RemoteSystem: "linear", RemoteID: e.api.id(key)})
	if err != nil || res.Receipt == nil || res.Receipt.RemoteID != e.api.id(key) {
		t.Fatalf("resolve: %+v, %v", res, err)
	}
	out, err := e.client.Do(ctx, op, mustNotRun(t))
	if err != nil || !out.Replayed || out.Receipt.RemoteID != e.api.id(key) || e.api.count(key) != 1 {
		t.Fatalf("after resolve: %+v, %v, %d tickets", out, err, e.api.count(key))
	}
	// Settled: a second resolve is refused, and the gauges drop to zero.
	if _, err := e.client.Resolve(ctx, &idemkv.ResolveRequest{Tenant: op.Tenant, Key: key, Fingerprint: rec.Fingerprint,
		Outcome: idemkv.ResolveNotExecuted}); !errors.Is(err, idemkv.ErrNotPending) {
		t.Fatalf("second resolve: %v", err)
	}
	if err := testcluster.Eventually(10*time.Second, func() error {
		for i := range e.cluster.Len() {
			if n, age := inDoubtGauges(t, e.cluster, i); n != 0 || age != 0 {
				return errors.New("gauges not back to zero")
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	t.Run("a caller with a probe that finds nothing releases and executes", func(t *testing.T) {
		key := "conv_32:create_ticket"
		op := createTicket(key, "Outage F")
		op.LeaseTTL = time.Second
		_, _ = e.client.Do(ctx, op, func(context.Context) (*client.Result, error) { return nil, errDownstreamTimeout })
		time.Sleep(op.LeaseTTL + 200*time.Millisecond)
		if _, err := e.client.Do(ctx, op, mustNotRun(t)); client.KindOf(err) != client.KindInDoubt {
			t.Fatalf("%v", err)
		}
		op.Probe = e.api.probe(key) // finds nothing: the crashed call never created it
		out, err := e.client.Do(ctx, op, e.create(key))
		if err != nil || out.Decision != idemkv.DecisionExecute || e.api.count(key) != 1 {
			t.Fatalf("%+v, %v, %d tickets", out, err, e.api.count(key))
		}
	})

	t.Run("a caller with a probe that finds the effect commits it", func(t *testing.T) {
		key := "conv_33:create_ticket"
		op := createTicket(key, "Outage G")
		op.LeaseTTL = time.Second
		e.crashWithoutProbe(t, op)
		if _, err := e.client.Do(ctx, op, mustNotRun(t)); client.KindOf(err) != client.KindInDoubt {
			t.Fatalf("%v", err)
		}
		op.Probe = e.api.probe(key)
		out, err := e.client.Do(ctx, op, mustNotRun(t))
		if err != nil || !out.Probed || out.Receipt.RemoteID != e.api.id(key) || e.api.count(key) != 1 {
			t.Fatalf("%+v, %v, %d tickets", out, err, e.api.count(key))
		}
	})
}

func fingerprintOf(t *testing.T, op client.Op) string {
	t.Helper()
	fp, err := fingerprint.OfValue(op.Effect, op.Drop...)
	if err != nil {
		t.Fatal(err)
	}
	return fp
}
