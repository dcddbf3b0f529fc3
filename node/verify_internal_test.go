package node

import (
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	walmetrics "github.com/hashicorp/raft-wal/metrics"
	"github.com/hashicorp/raft-wal/verifier"
)

// verifierNode is a log store behind raft-wal's verifier, as a node has it, with the
// reports it makes.
type verifierNode struct {
	store   *verifier.LogStore
	inner   raft.LogStore
	cuts    *tailCuts
	reports chan verifier.VerificationReport
}

func newVerifierNode(t *testing.T) *verifierNode {
	v := &verifierNode{cuts: &tailCuts{}, reports: make(chan verifier.VerificationReport, 16)}
	isCheckpoint := func(l *raft.Log) (bool, error) { return string(l.Data) == "checkpoint", nil }
	v.inner = tailCutLog{raft.NewInmemStore(), v.cuts}
	v.store = verifier.NewLogStore(v.inner, isCheckpoint,
		func(r verifier.VerificationReport) { v.reports <- r }, &walmetrics.NoOpCollector{})
	t.Cleanup(func() { v.store.Close() })
	return v
}

func (v *verifierNode) store1(t *testing.T, logs ...*raft.Log) {
	t.Helper()
	if err := v.store.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
}

func (v *verifierNode) report(t *testing.T) verifier.VerificationReport {
	t.Helper()
	select {
	case r := <-v.reports:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no verification report")
	}
	return verifier.VerificationReport{}
}

func entry(index, term uint64, data string) *raft.Log {
	return &raft.Log{Index: index, Term: term, Type: raft.LogCommand, Data: []byte(data)}
}

// replicate is the leader's entries as a follower gets them: copies, the checkpoint's
// extensions (the leader's range and checksum) included.
func replicate(logs ...*raft.Log) []*raft.Log {
	out := make([]*raft.Log, len(logs))
	for i, l := range logs {
		c := *l
		out[i] = &c
	}
	return out
}

// A follower held two entries of a leader that lost its term; the new leader cut
// them and sent its own. raft-wal's verifier reports the range as in-flight
// corruption (its checksum of what the node wrote still counts the cut entries),
// though the follower's log is exactly the leader's: the node counts it unchecked.
// Corruption without a cut, or a read-back that differs, stays a mismatch.
func TestVerifierRangeRewrittenByANewLeaderIsNoMismatch(t *testing.T) {
	leader, follower := newVerifierNode(t), newVerifierNode(t)
	first := []*raft.Log{entry(1, 1, "a"), entry(2, 1, "b"), entry(3, 1, "checkpoint")}
	leader.store1(t, first...)
	follower.store1(t, replicate(first...)...)
	leader.report(t)
	if r := follower.report(t); r.Err != nil && !errors.Is(r.Err, verifier.ErrRangeMismatch) {
		t.Fatalf("the first range: %v", r.Err)
	}

	follower.store1(t, entry(4, 1, "lost-1"), entry(5, 1, "lost-2")) // the old leader's
	if err := follower.store.DeleteRange(4, 5); err != nil {         // the new leader's conflict
		t.Fatal(err)
	}
	second := []*raft.Log{entry(4, 2, "c"), entry(5, 2, "d"), entry(6, 2, "checkpoint")}
	leader.store1(t, second...)
	follower.store1(t, replicate(second...)...)
	lr := leader.report(t)
	if lr.Err != nil {
		t.Fatalf("the leader's own range: %v", lr.Err)
	}
	if sum, err := walRangeSum(leader.inner, lr.Range.Start, lr.Range.End); err != nil || sum != lr.ExpectedSum || sum != lr.ReadSum {
		t.Fatalf("walRangeSum = %x, %v; the verifier's sums: expected %x, read %x", sum, err, lr.ExpectedSum, lr.ReadSum)
	}
	r := follower.report(t)
	var mismatch verifier.ErrChecksumMismatch
	if !errors.As(r.Err, &mismatch) {
		t.Fatalf("raft-wal's verifier no longer reports the rewritten range as a mismatch (%v): drop tailCuts", r.Err)
	}
	if !follower.cuts.rewritten(r, follower.inner) {
		t.Fatalf("a range rewritten by a new leader counts as a mismatch: %v", r.Err)
	}
	// The same once a snapshot compacted the range's head: nothing left to compare,
	// as the verifier says of a range it cannot read back.
	compacted := &verifierNode{inner: tailCutLog{raft.NewInmemStore(), follower.cuts}}
	for i := uint64(4); i <= 6; i++ {
		var l raft.Log
		if err := follower.inner.GetLog(i, &l); err != nil {
			t.Fatal(err)
		}
		if err := compacted.inner.StoreLog(&l); err != nil {
			t.Fatal(err)
		}
	}
	if !follower.cuts.rewritten(r, compacted.inner) {
		t.Fatalf("a rewritten range whose head is compacted counts as a mismatch: %v", r.Err)
	}

	// Other entries than the leader's after a cut too: a mismatch.
	follower.store1(t, entry(7, 1, "lost-3"))
	if err := follower.store.DeleteRange(7, 7); err != nil {
		t.Fatal(err)
	}
	leader.store1(t, entry(7, 2, "e"), entry(8, 2, "checkpoint"))
	third := replicate(leader.lastTwo(t)...)
	third[0].Data = []byte("E")
	follower.store1(t, third...)
	leader.report(t)
	if r := follower.report(t); !errors.As(r.Err, &mismatch) || follower.cuts.rewritten(r, follower.inner) {
		t.Fatalf("other entries than the leader's after a cut: %v, rewritten %v; want a mismatch", r.Err, follower.cuts.rewritten(r, follower.inner))
	}
}

func (v *verifierNode) lastTwo(t *testing.T) []*raft.Log {
	t.Helper()
	last, err := v.store.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	var out []*raft.Log
	for i := last - 1; i <= last; i++ {
		var l raft.Log
		if err := v.store.GetLog(i, &l); err != nil {
			t.Fatal(err)
		}
		out = append(out, &l)
	}
	return out
}

func TestTailCutsWithin(t *testing.T) {
	var c tailCuts
	if c.within(0, 100) {
		t.Fatal("no cut yet")
	}
	for i := range uint64(10) {
		c.add(100 + i)
	}
	if !c.within(109, 110) || c.within(100, 102) || c.within(0, 100) {
		t.Fatal("tailCuts keeps the last 8 cuts")
	}
}
