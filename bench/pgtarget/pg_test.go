package pgtarget

import (
	"context"
	"errors"
	"os"
	"slices"
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

// replicatedDSN returns the primary with quorum-synchronous standbys to test against,
// from IDEMKV_BENCH_PG_REPLICATED.
func replicatedDSN(t *testing.T) string {
	t.Helper()
	env := os.Getenv("IDEMKV_BENCH_PG_REPLICATED")
	if env == "" {
		t.Skip("IDEMKV_BENCH_PG_REPLICATED is not set: no replicated PostgreSQL to test against (bench/run.sh test starts one and sets it)")
	}
	return env
}

const testTable = "idem_records_test"

func open(t *testing.T, tenant string) *Target {
	t.Helper()
	return openAt(t, dsn(t), tenant)
}

func openAt(t *testing.T, dsn, tenant string) *Target {
	t.Helper()
	tg, err := New(t.Context(), Config{DSN: dsn, Tenant: tenant, Conns: 16, Table: testTable})
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

// The primary of run.sh's replicated PostgreSQL keeps the semantics: a reserve is a
// statement on the primary, whatever waits for the standbys.
func TestSemanticsOnAReplicatedPrimary(t *testing.T) {
	primary := replicatedDSN(t)
	targettest.Run(t, func(t *testing.T, tenant string) loadgen.Target { return openAt(t, primary, tenant) })
}

func TestReplicationSeesTheStandbys(t *testing.T) {
	names, standbys, err := openAt(t, replicatedDSN(t), targettest.Tenant(t)).Replication(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []Standby{{"s1", "streaming", "quorum"}, {"s2", "streaming", "quorum"}}
	if names != "ANY 1 (s1, s2)" || !slices.Equal(standbys, want) {
		t.Errorf("synchronous_standby_names %q, standbys %+v; want ANY 1 (s1, s2) and %+v", names, standbys, want)
	}
	names, standbys, err = open(t, targettest.Tenant(t)).Replication(t.Context())
	if err != nil || names != "" || len(standbys) != 0 {
		t.Errorf("the single server: %q, %+v, %v; want no standbys", names, standbys, err)
	}
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
