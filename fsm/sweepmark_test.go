package fsm_test

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
	"github.com/idemkv/idemkv/metrics"
	"github.com/idemkv/idemkv/storage"
)

// A sweep entry marks what it swept, so that later scans of the expiry index start
// after it instead of stepping over the tombstones of every entry swept before. The
// mark shows in what a scan can no longer see: an index entry written before it, which
// only a bug could write, is left out of the backlog and reported by the index check.
func TestSweepMarksWhatItSwept(t *testing.T) {
	st, err := storage.Open(t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f, err := fsm.New(st, metrics.New(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	const t0 idemkv.Timestamp = 1_800_000_000_000
	var index uint64
	apply := func(cmds ...*fsm.Command) []*fsm.Result {
		t.Helper()
		logs := make([]*raft.Log, len(cmds))
		for i, c := range cmds {
			data, err := c.AppendBinary(nil)
			if err != nil {
				t.Fatal(err)
			}
			index++
			logs[i] = &raft.Log{Index: index, Term: 1, Type: raft.LogCommand, Data: data}
		}
		var out []*fsm.Result
		for _, r := range f.ApplyBatch(logs) {
			res := r.(*fsm.Result)
			if res.Err != nil {
				t.Fatal(res.Err)
			}
			out = append(out, res)
		}
		return out
	}
	var reserves []*fsm.Command
	for i := range 10 {
		reserves = append(reserves, &fsm.Command{Op: fsm.OpReserve, Now: t0, Reserve: &idemkv.ReserveRequest{
			Tenant: "acme", Key: fmt.Sprintf("k%02d", i), Tool: "t", Fingerprint: "sha256:x", AttemptID: "a",
			LeaseTTLMs: 30_000, TTLMs: 60_000}})
	}
	apply(reserves...)
	now := t0 + 61_000
	if res := apply(&fsm.Command{Op: fsm.OpSweep, Now: now, Sweep: &fsm.SweepArgs{Limit: 4}}); res[0].Swept != 4 || !res[0].More {
		t.Fatalf("sweep: %+v", res[0])
	}

	b := st.NewBatch()
	if err := b.PutRecord(&idemkv.Record{Tenant: "acme", Key: "stray", Fingerprint: "f", Tool: "t",
		Status: idemkv.StatusCommitted, Fence: 1, Attempts: 1, CreatedAt: t0, UpdatedAt: t0, ExpiresAt: t0 + 1}); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if count, oldest := f.Backlog(now); count != 6 || oldest != t0+60_000 {
		t.Errorf("backlog %d from %s, want the 6 left after the sweep from %s", count, oldest, t0+60_000)
	}
	if err := f.CheckExpiryIndex(); !errors.Is(err, storage.ErrCorrupt) {
		t.Errorf("index check with an entry before the swept mark: %v, want ErrCorrupt", err)
	}
}
