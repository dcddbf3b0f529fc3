package pgtarget

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/bench/targettest"
	"github.com/idemkv/idemkv/loadgen"
)

// dsn returns the PostgreSQL server to test against, from IDEMKV_BENCH_PG.
func dsn(t *testing.T) string {
	t.Helper()
	env := os.Getenv("IDEMKV_BENCH_PG")
	if env == "" {
		t.Skip("IDEMKV_BENCH_PG is not set: no PostgreSQL to test against (bench/run.sh test starts one and sets it)")
	}
	return env
}

const testTable = "idem_records_test"

func open(t *testing.T, tenant string) *Target {
	t.Helper()
	tg, err := New(t.Context(), Config{DSN: dsn(t), Tenant: tenant, Conns: 16, Table: testTable})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tg.Close() })
	return tg
}

func TestSemantics(t *testing.T) {
	dsn(t)
	targettest.Run(t, func(t *testing.T, tenant string) loadgen.Target { return open(t, tenant) })
}

func TestFencesComeFromOneSequence(t *testing.T) {
	tg := open(t, targettest.Tenant(t))
	ctx := t.Context()
	var last uint64
	for _, key := range []string{"a", "b", "c"} {
		res, err := tg.Reserve(ctx, &loadgen.Reserve{Key: key, Tool: "t", Fingerprint: "f", AttemptID: "x"})
		if err != nil || res.Decision != idemkv.DecisionExecute {
			t.Fatalf("reserve %s: %+v, %v", key, res, err)
		}
		if res.Fence <= last {
			t.Fatalf("fence %d after %d: fences must grow", res.Fence, last)
		}
		last = res.Fence
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	ctx := context.Background()
	if _, err := New(ctx, Config{DSN: "postgres://127.0.0.1:1/x", Tenant: "ok", Table: "drop table;"}); !errors.Is(err, idemkv.ErrInvalidArgument) {
		t.Errorf("bad table name: %v", err)
	}
	if _, err := New(ctx, Config{DSN: "postgres://127.0.0.1:1/x", Tenant: "bad tenant"}); !errors.Is(err, idemkv.ErrInvalidArgument) {
		t.Errorf("bad tenant: %v", err)
	}
	if _, err := New(ctx, Config{DSN: "postgres://127.0.0.1:1/x", Tenant: "ok"}); !errors.Is(err, idemkv.ErrUnavailable) {
		t.Errorf("nothing listening: %v", err)
	}
}
