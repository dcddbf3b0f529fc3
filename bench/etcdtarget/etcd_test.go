package etcdtarget

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench/targettest"
	"github.com/idemkv/idemkv/loadgen"
)

// endpoints returns the etcd cluster to test against, from IDEMKV_BENCH_ETCD.
func endpoints(t *testing.T) []string {
	t.Helper()
	env := os.Getenv("IDEMKV_BENCH_ETCD")
	if env == "" {
		t.Skip("IDEMKV_BENCH_ETCD is not set: no etcd to test against (bench/run.sh test starts one and sets it)")
	}
	return strings.Split(env, ",")
}

func open(t *testing.T, tenant string) *Target {
	t.Helper()
	tg, err := New(t.Context(), Config{Endpoints: endpoints(t), Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The test context is gone by now.
		_ = tg.Delete(context.Background())
		_ = tg.Close()
	})
	return tg
}

func TestSemantics(t *testing.T) {
	endpoints(t)
	targettest.Run(t, func(t *testing.T, tenant string) loadgen.Target { return open(t, tenant) })
}

func TestReplayAnswersFromTheStoredRecord(t *testing.T) {
	tg := open(t, targettest.Tenant(t))
	ctx := t.Context()
	res, err := tg.Reserve(ctx, &loadgen.Reserve{Key: "k", Tool: "t", Fingerprint: "f", AttemptID: "a"})
	if err != nil || res.Decision != idemkv.DecisionExecute {
		t.Fatalf("reserve %+v, %v", res, err)
	}
	if err := tg.Commit(ctx, &loadgen.Commit{Key: "k", Fingerprint: "f", Reservation: res, RemoteSystem: "s", RemoteID: "1"}); err != nil {
		t.Fatal(err)
	}
	before, err := tg.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tg.Reserve(ctx, &loadgen.Reserve{Key: "k", Tool: "t", Fingerprint: "f", AttemptID: "b"}); err != nil || got.Decision != idemkv.DecisionReplay {
		t.Fatalf("replay %+v, %v", got, err)
	}
	after, err := tg.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The transaction's put branch did not run: a replay changes nothing in etcd,
	// though it still goes through its log as a write transaction.
	if after != before {
		t.Errorf("revision moved from %d to %d on a replay", before, after)
	}
}

func TestNewNeedsEndpointsAndATenant(t *testing.T) {
	if _, err := New(t.Context(), Config{Tenant: "x"}); !errors.Is(err, idemkv.ErrInvalidArgument) {
		t.Errorf("no endpoints: %v", err)
	}
	if _, err := New(t.Context(), Config{Endpoints: []string{"127.0.0.1:1"}, Tenant: "bad tenant"}); !errors.Is(err, idemkv.ErrInvalidArgument) {
		t.Errorf("bad tenant: %v", err)
	}
}
