package node

import (
	"errors"
	"fmt"
	"testing"

	"github.com/hashicorp/raft"
)

// TestRaftLogSurvivesTruncationsAcrossReopen: what Raft does to its log store besides
// appending, each followed by a close and reopen as a restart would: drop a suffix (a
// follower's entries that conflict with a new leader's), drop a prefix (compaction
// after a snapshot), set the term. raft-wal v0.4.0 marked the tail segment sealed on a
// suffix drop without writing its index, so the next open failed to read the log
// ("sealed segment has no index block", hashicorp/raft-wal#31, fixed in v0.4.1).
// With small segments every step crosses segment boundaries.
func TestRaftLogSurvivesTruncationsAcrossReopen(t *testing.T) {
	for _, tc := range []struct {
		name, backend string
		segment       int
	}{
		{RaftLogBolt, RaftLogBolt, 0},
		{RaftLogWAL, RaftLogWAL, DefaultRaftWALSegmentBytes},
		{"wal-4KiB-segments", RaftLogWAL, 4 << 10},
	} {
		backend := tc.backend
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			open := func() raftLogStore { return mustOpenRaftLog(t, dir, backend, tc.segment) }
			closeStore := func(s raftLogStore) { t.Helper(); mustClose(t, s) }
			entry := func(i, term uint64) *raft.Log {
				return &raft.Log{Index: i, Term: term, Type: raft.LogCommand, Data: fmt.Appendf(nil, "e%d-t%d-%064d", i, term, i)}
			}
			store := func(s raftLogStore, from, to, term uint64) {
				t.Helper()
				// In batches of up to 7, as Raft groups its appends.
				for lo := from; lo <= to; lo += 7 {
					var es []*raft.Log
					for i := lo; i <= min(lo+6, to); i++ {
						es = append(es, entry(i, term))
					}
					if err := s.StoreLogs(es); err != nil {
						t.Fatalf("store %d-%d: %v", lo, min(lo+6, to), err)
					}
				}
			}
			check := func(s raftLogStore, first, last uint64, termOf func(uint64) uint64) {
				t.Helper()
				if f, err := s.FirstIndex(); err != nil || f != first {
					t.Fatalf("first index %d (%v), want %d", f, err, first)
				}
				if l, err := s.LastIndex(); err != nil || l != last {
					t.Fatalf("last index %d (%v), want %d", l, err, last)
				}
				for i := first; i <= last; i++ {
					var got raft.Log
					if err := s.GetLog(i, &got); err != nil {
						t.Fatalf("entry %d: %v", i, err)
					}
					if want := entry(i, termOf(i)); got.Term != want.Term || string(got.Data) != string(want.Data) {
						t.Fatalf("entry %d: term %d %q, want %d %q", i, got.Term, got.Data, want.Term, want.Data)
					}
				}
				var got raft.Log
				if err := s.GetLog(last+1, &got); !errors.Is(err, raft.ErrLogNotFound) {
					t.Fatalf("entry %d past the end: %v, want ErrLogNotFound", last+1, err)
				}
			}
			term1 := func(uint64) uint64 { return 1 }
			term2After := func(i uint64) uint64 {
				if i >= 251 {
					return 2
				}
				return 1
			}

			s := open()
			store(s, 1, 300, 1)
			if err := s.SetUint64([]byte("CurrentTerm"), 1); err != nil {
				t.Fatal(err)
			}
			if err := s.DeleteRange(251, 300); err != nil {
				t.Fatal(err)
			}
			closeStore(s)

			s = open()
			check(s, 1, 250, term1)
			store(s, 251, 320, 2)
			if err := s.SetUint64([]byte("CurrentTerm"), 2); err != nil {
				t.Fatal(err)
			}
			closeStore(s)

			s = open()
			check(s, 1, 320, term2After)
			if err := s.DeleteRange(1, 200); err != nil {
				t.Fatal(err)
			}
			closeStore(s)

			s = open()
			check(s, 201, 320, term2After)
			if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 2 {
				t.Fatalf("current term %d (%v), want 2", v, err)
			}
			closeStore(s)
		})
	}
}
