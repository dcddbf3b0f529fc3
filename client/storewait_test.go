package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/internal/testcluster"
	"github.com/idemkv/idemkv/internal/testlog"
)

// TestDoStoreWaitWithQuorumLost: two of three nodes are down, so no write can commit.
// Do, under context.Background(), must come back within StoreWait with a
// store_unavailable error and without running the tool (issue 14, point 1: it used to
// retry until the caller's context ended, which with Background is never).
func TestDoStoreWaitWithQuorumLost(t *testing.T) {
	c := testcluster.Start(t, 3)
	const storeWait = 3 * time.Second
	cl, err := client.New(client.Config{
		Endpoints:  c.Endpoints(),
		Timeout:    2 * time.Second,
		Logger:     testlog.New(t),
		StoreWait:  storeWait,
		BackoffMax: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	unguarded, err := client.New(client.Config{
		Endpoints:          c.Endpoints(),
		Timeout:            2 * time.Second,
		Logger:             testlog.New(t),
		StoreWait:          storeWait,
		OnStoreUnavailable: client.Unguarded,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unguarded.Close() })

	// Kill the leader and one follower: the survivor can never elect itself.
	leader := c.WaitLeader()
	c.Stop(leader)
	c.Stop((leader + 1) % 3)

	// do runs Do with context.Background() under a watchdog: the old Do never returned.
	do := func(t *testing.T, cl *client.Client, op client.Op, fn client.Func) (*client.Outcome, time.Duration, error) {
		t.Helper()
		type answer struct {
			out *client.Outcome
			err error
		}
		done := make(chan answer, 1)
		start := time.Now()
		go func() {
			out, err := cl.Do(context.Background(), op, fn)
			done <- answer{out, err}
		}()
		select {
		case a := <-done:
			return a.out, time.Since(start), a.err
		case <-time.After(storeWait + 20*time.Second):
			t.Fatalf("Do has not returned %s after it started; StoreWait is %s", time.Since(start), storeWait)
			return nil, 0, nil
		}
	}

	t.Run("fail closed by default", func(t *testing.T) {
		for _, class := range []client.Class{client.NonIdempotentMutation, client.IdempotentMutation} {
			op := createTicket("conv_1:create_ticket:"+string(class), "Outage Q")
			op.Class = class
			ran := false
			_, took, err := do(t, cl, op, func(context.Context) (*client.Result, error) {
				ran = true
				return &client.Result{RemoteSystem: "linear", RemoteID: "LIN-1"}, nil
			})
			t.Logf("%s: returned after %s: %v", class, took, err)
			if !errors.Is(err, client.ErrStoreUnavailable) || client.KindOf(err) != client.KindStoreUnavailable {
				t.Fatalf("%s: error %v (kind %q), want store_unavailable", class, err, client.KindOf(err))
			}
			var se *client.StoreUnavailableError
			if !errors.As(err, &se) || se.Waited < storeWait/2 {
				t.Fatalf("%s: %#v", class, se)
			}
			if ran {
				t.Fatalf("%s: the tool ran although idemkv was unreachable", class)
			}
			// The bound: StoreWait, plus the slack of one backoff and a loaded machine.
			if took < storeWait-500*time.Millisecond || took > storeWait+3*time.Second {
				t.Fatalf("%s: Do returned after %s, want about %s", class, took, storeWait)
			}
		}
	})

	t.Run("unguarded runs an idempotent tool without a record", func(t *testing.T) {
		op := createTicket("conv_2:put_label", "Outage Q")
		op.Class = client.IdempotentMutation
		runs := 0
		out, took, err := do(t, unguarded, op, func(context.Context) (*client.Result, error) {
			runs++
			return &client.Result{RemoteSystem: "linear", RemoteID: "LIN-7"}, nil
		})
		if err != nil || !out.Unguarded || runs != 1 || out.Receipt.RemoteID != "LIN-7" {
			t.Fatalf("outcome %+v, err %v, %d runs", out, err, runs)
		}
		if took > storeWait+3*time.Second {
			t.Fatalf("took %s", took)
		}
	})

	t.Run("unguarded never applies to a non-idempotent tool", func(t *testing.T) {
		_, _, err := do(t, unguarded, createTicket("conv_3:create_ticket", "Outage Q"), mustNotRun(t))
		if client.KindOf(err) != client.KindStoreUnavailable {
			t.Fatalf("error %v (kind %q)", err, client.KindOf(err))
		}
	})
}
