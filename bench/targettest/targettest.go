// Package targettest checks that a loadgen.Target keeps the compare-and-set semantics
// of docs/protocol.md section 1, so that the peers in the comparison do the same job as idemkv.
// Each target's tests call Run against a real server.
package targettest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/loadgen"
)

// Open returns a fresh target for a tenant no other test uses.
type Open func(t *testing.T, tenant string) loadgen.Target

// Tenant returns a tenant name unique to this run.
func Tenant(t *testing.T) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "t-" + hex.EncodeToString(b[:])
}

const tool = "create_ticket"

func fp(s string) string { return "sha256:" + strings.Repeat(s, 64)[:64] }

// Run checks the target's semantics, each rule as a subtest.
func Run(t *testing.T, open Open) {
	t.Run("NewKeyExecutesAndRetriedReserveKeepsTheFence", func(t *testing.T) {
		tg := open(t, Tenant(t))
		ctx := t.Context()
		first := reserve(t, tg, "k", "a", "a1", 0)
		if first.Decision != idemkv.DecisionExecute || first.Fence == 0 {
			t.Fatalf("first reserve %+v, want execute with a fence", first)
		}
		again := reserve(t, tg, "k", "a", "a1", 0)
		if again.Decision != idemkv.DecisionExecute || again.Fence != first.Fence {
			t.Fatalf("same attempt again %+v, want execute with fence %d", again, first.Fence)
		}
		if other := reserve(t, tg, "k", "a", "a2", 0); other.Decision != idemkv.DecisionInProgress {
			t.Fatalf("another attempt %+v, want in_progress", other)
		}
		if other := reserve(t, tg, "k", "b", "a3", 0); other.Decision != idemkv.DecisionConflict {
			t.Fatalf("another effect %+v, want conflict", other)
		}
		if err := commit(ctx, tg, "k", "b", first); !errors.Is(err, idemkv.ErrFingerprintMismatch) {
			t.Fatalf("commit with another fingerprint: %v, want fingerprint mismatch", err)
		}
		if err := commit(ctx, tg, "k", "a", again); err != nil {
			t.Fatalf("commit: %v", err)
		}
	})

	t.Run("CommittedKeyReplaysAndConflicts", func(t *testing.T) {
		tg := open(t, Tenant(t))
		ctx := t.Context()
		res := reserve(t, tg, "k", "a", "a1", 0)
		if err := commit(ctx, tg, "k", "a", res); err != nil {
			t.Fatal(err)
		}
		if err := commit(ctx, tg, "k", "a", res); err != nil {
			t.Fatalf("retried commit: %v, want the stored outcome", err)
		}
		if got := reserve(t, tg, "k", "a", "a2", 0); got.Decision != idemkv.DecisionReplay {
			t.Errorf("same effect %+v, want replay", got)
		}
		if got := reserve(t, tg, "k", "b", "a3", 0); got.Decision != idemkv.DecisionConflict {
			t.Errorf("other effect %+v, want conflict", got)
		}
		got, err := tg.Reserve(ctx, &loadgen.Reserve{Key: "k", Tool: "other_tool", Fingerprint: fp("a"), AttemptID: "a4"})
		if err != nil || got.Decision != idemkv.DecisionConflict {
			t.Errorf("other tool %+v, %v; want conflict", got, err)
		}
		if err := commit(ctx, tg, "absent", "a", res); !errors.Is(err, idemkv.ErrNotFound) {
			t.Errorf("commit of an absent key: %v, want not found", err)
		}
	})

	t.Run("ExpiredLeaseRecoversAndFencesTheOldAttempt", func(t *testing.T) {
		tg := open(t, Tenant(t))
		ctx := t.Context()
		old := reserve(t, tg, "k", "a", "a1", 300)
		var rec loadgen.Reservation
		deadline := time.Now().Add(10 * time.Second)
		for {
			rec = reserve(t, tg, "k", "a", "a2", 60_000)
			if rec.Decision == idemkv.DecisionRecover {
				break
			}
			if rec.Decision != idemkv.DecisionInProgress || time.Now().After(deadline) {
				t.Fatalf("reserve while the lease runs out: %+v, want in_progress then recover", rec)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if rec.Fence <= old.Fence {
			t.Fatalf("recover fence %d, want above the old %d", rec.Fence, old.Fence)
		}
		if err := commit(ctx, tg, "k", "a", old); !errors.Is(err, idemkv.ErrFenced) {
			t.Fatalf("late commit of the old attempt: %v, want fenced", err)
		}
		if err := commit(ctx, tg, "k", "a", rec); err != nil {
			t.Fatalf("commit of the new owner: %v", err)
		}
		if err := commit(ctx, tg, "k", "a", old); !errors.Is(err, idemkv.ErrFenced) {
			t.Fatalf("old attempt after the commit: %v, want fenced", err)
		}
	})

	t.Run("RacingReservesGrantOnce", func(t *testing.T) {
		tg := open(t, Tenant(t))
		const racers = 16
		decisions := make([]idemkv.Decision, racers)
		var wg sync.WaitGroup
		for i := range racers {
			wg.Go(func() {
				res, err := tg.Reserve(t.Context(), &loadgen.Reserve{Key: "hot", Tool: tool, Fingerprint: fp("a"),
					AttemptID: "a" + strconv.Itoa(i)})
				if err != nil {
					t.Error(err)
					return
				}
				decisions[i] = res.Decision
			})
		}
		wg.Wait()
		counts := map[idemkv.Decision]int{}
		for _, d := range decisions {
			counts[d]++
		}
		if counts[idemkv.DecisionExecute] != 1 || counts[idemkv.DecisionInProgress] != racers-1 {
			t.Fatalf("decisions %v, want one execute and %d in_progress", counts, racers-1)
		}
	})

	t.Run("Workload", func(t *testing.T) {
		tg := open(t, Tenant(t))
		rep, err := loadgen.Run(t.Context(), loadgen.Config{Target: tg, Name: "peer", Concurrency: 8, Ops: 400,
			Duration: time.Minute, Warmup: -1, Keys: 40, HotKeys: 2, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Ops != 400 || rep.Errors != 0 {
			t.Fatalf("ops %d errors %d: %+v", rep.Ops, rep.Errors, rep.Kinds)
		}
	})
}

func reserve(t *testing.T, tg loadgen.Target, key, effect, attempt string, leaseMs int64) loadgen.Reservation {
	t.Helper()
	res, err := tg.Reserve(t.Context(), &loadgen.Reserve{Key: key, Tool: tool, Fingerprint: fp(effect),
		AttemptID: attempt, LeaseTTLMs: leaseMs})
	if err != nil {
		t.Fatalf("reserve %s/%s: %v", key, attempt, err)
	}
	return res
}

func commit(ctx context.Context, tg loadgen.Target, key, effect string, res loadgen.Reservation) error {
	return tg.Commit(ctx, &loadgen.Commit{Key: key, Fingerprint: fp(effect), Reservation: res,
		RemoteSystem: "linear", RemoteID: "LIN-" + strconv.FormatUint(res.Fence, 10)})
}
