package nemesis

import (
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
)

// The first clock jump of a run goes to the leader (n1 in the fake), the only node that
// stamps: seeds 7 and 8 are ones for which the draw of two in three went to a follower.
func TestFirstClockJumpMovesTheLeader(t *testing.T) {
	for _, seed := range []uint64{7, 8} {
		fake := &fakeNodes{offsets: map[string][]int64{}}
		c := startFakeCluster(t, fake)
		n := New(Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() int64 { return 1 },
			Hold: 400 * time.Millisecond, Seed: seed}, c)
		n.inject(t.Context(), FamilyClockJump)
		f := n.Faults()[0]
		if f.Err != "" {
			t.Fatalf("seed %d: %s", seed, f.Err)
		}
		fake.mu.Lock()
		for id, offs := range fake.offsets {
			if id != "n1" && slices.ContainsFunc(offs, func(o int64) bool { return o != 0 }) {
				t.Errorf("seed %d: the first jump moved %s's clock (%v), not the leader's: %s", seed, id, fake.offsets, f.Detail)
			}
		}
		fake.mu.Unlock()
		if !strings.Contains(f.Detail, "n1 (the leader)") || !strings.Contains(f.Detail, "it led") {
			t.Errorf("seed %d: detail %q", seed, f.Detail)
		}
	}
}

// A node that does not report the offset it was set to has not jumped: the fault is a
// harness error, as for clock-skew.
func TestClockJumpReadsTheOffsetBack(t *testing.T) {
	c := startFakeCluster(t, &fakeNodes{offsets: map[string][]int64{}, ignoreOffsets: true})
	n := New(Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() int64 { return 1 },
		Hold: 400 * time.Millisecond, Seed: 1}, c)
	n.inject(t.Context(), FamilyClockJump)
	if f := n.Faults()[0]; !strings.Contains(f.Err, "reports clock offset 0 ms") {
		t.Fatalf("a jump that did not read back: error %q, detail %q", f.Err, f.Detail)
	}
}
