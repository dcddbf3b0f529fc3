package model

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

const fpA, fpB = "sha256:aaaa", "sha256:bbbb"

// h builds histories by hand: each call adds one operation on key k.
type h struct{ ops []history.Op }

func (b *h) add(client int, f string, call, ret int64, in history.Input, out *history.Output) {
	t := history.OK
	if out == nil {
		t = history.Info
	}
	if in.Tool == "" && f == history.FReserve {
		in.Tool = "t"
	}
	b.ops = append(b.ops, history.Op{ID: int64(len(b.ops) + 1), Client: client, Process: client, F: f, Key: "k",
		In: in, Type: t, Out: out, Call: call, Return: ret})
}

func rec(status string, fp, attempt string, fence uint64, remote string, updated int64) *history.Record {
	return &history.Record{Status: status, Fingerprint: fp, Tool: "t", AttemptID: attempt, Fence: fence, Attempts: 1, RemoteID: remote, UpdatedAt: updated}
}

func execute(fp, attempt string, fence uint64) *history.Output {
	return &history.Output{Decision: "execute", Grant: fence, Record: rec("pending", fp, attempt, fence, "", 1)}
}

func check(t *testing.T, ops []history.Op) porcupine.CheckResult {
	t.Helper()
	res := Check(ops, 5*time.Second)
	if res.Result == porcupine.Unknown {
		t.Fatal("the check timed out on a tiny history")
	}
	return res.Result
}

// The happy path with contention, conflict, a stale fence and a replay.
func legal() *h {
	b := &h{}
	b.add(0, history.FReserve, 0, 10, history.Input{Fingerprint: fpA, AttemptID: "a1"}, execute(fpA, "a1", 5))
	b.add(1, history.FReserve, 5, 15, history.Input{Fingerprint: fpA, AttemptID: "a2"},
		&history.Output{Decision: "in_progress", Record: rec("pending", fpA, "a1", 5, "", 1)})
	b.add(2, history.FReserve, 12, 20, history.Input{Fingerprint: fpB, AttemptID: "b1"},
		&history.Output{Decision: "conflict", Record: rec("pending", fpA, "a1", 5, "", 1)})
	b.add(1, history.FCommit, 16, 18, history.Input{Fingerprint: fpA, Fence: 3, RemoteID: "r-old"}, &history.Output{Err: "fenced"})
	b.add(0, history.FCommit, 21, 30, history.Input{Fingerprint: fpA, Fence: 5, RemoteID: "r1"},
		&history.Output{Receipt: &history.Receipt{Status: "committed", Fingerprint: fpA, RemoteID: "r1"}})
	// A retried commit of the same attempt gets the stored receipt.
	b.add(0, history.FCommit, 31, 32, history.Input{Fingerprint: fpA, Fence: 5, RemoteID: "r1-retry"},
		&history.Output{Receipt: &history.Receipt{Status: "committed", Fingerprint: fpA, RemoteID: "r1"}})
	b.add(1, history.FGet, 33, 34, history.Input{}, &history.Output{Record: rec("committed", fpA, "a1", 5, "r1", 2)})
	b.add(2, history.FReserve, 35, 36, history.Input{Fingerprint: fpA, AttemptID: "a3"},
		&history.Output{Decision: "replay", Receipt: &history.Receipt{Status: "committed", Fingerprint: fpA, RemoteID: "r1"}, Record: rec("committed", fpA, "a1", 5, "r1", 2)})
	b.add(2, history.FRelease, 37, 38, history.Input{Fingerprint: fpA, Fence: 5}, &history.Output{Err: "not_pending"})
	b.add(1, history.FReserve, 39, 40, history.Input{Fingerprint: fpB, AttemptID: "b2"},
		&history.Output{Decision: "conflict", ConflictRemoteID: "r1", Record: rec("committed", fpA, "a1", 5, "r1", 2)})
	return b
}

func TestLegalHistoryPasses(t *testing.T) {
	if got := check(t, legal().ops); got != porcupine.Ok {
		t.Fatalf("a linearizable history was judged %s", got)
	}
}

func TestConcurrentOperationsMayReorder(t *testing.T) {
	b := &h{}
	// The read overlaps the commit and sees its result: it linearizes after it.
	b.add(0, history.FReserve, 0, 10, history.Input{Fingerprint: fpA, AttemptID: "a1"}, execute(fpA, "a1", 5))
	b.add(0, history.FCommit, 20, 40, history.Input{Fingerprint: fpA, Fence: 5, RemoteID: "r1"},
		&history.Output{Receipt: &history.Receipt{Status: "committed", Fingerprint: fpA, RemoteID: "r1"}})
	b.add(1, history.FGet, 15, 25, history.Input{}, &history.Output{Record: rec("committed", fpA, "a1", 5, "r1", 2)})
	b.add(2, history.FGet, 16, 26, history.Input{}, &history.Output{Record: rec("pending", fpA, "a1", 5, "", 1)})
	if got := check(t, b.ops); got != porcupine.Ok {
		t.Fatalf("overlapping reads on both sides of a commit were judged %s", got)
	}
}

// Each case breaks one guarantee that a sabotage mode or a real bug would break.
func TestIllegalHistoriesFail(t *testing.T) {
	commitOK := func(remote string) *history.Output {
		return &history.Output{Receipt: &history.Receipt{Status: "committed", Fingerprint: fpA, RemoteID: remote}}
	}
	cases := map[string]func(b *h){
		"two executes without a release": func(b *h) {
			b.add(1, history.FReserve, 20, 30, history.Input{Fingerprint: fpA, AttemptID: "a2"}, execute(fpA, "a2", 9))
		},
		"stale read after a commit": func(b *h) {
			b.add(0, history.FCommit, 20, 30, history.Input{Fingerprint: fpA, Fence: 5, RemoteID: "r1"}, commitOK("r1"))
			b.add(1, history.FGet, 31, 32, history.Input{}, &history.Output{Record: rec("pending", fpA, "a1", 5, "", 1)})
		},
		"commit with a stale fence accepted": func(b *h) {
			b.add(0, history.FRelease, 20, 30, history.Input{Fingerprint: fpA, Fence: 5}, &history.Output{Released: true})
			b.add(1, history.FReserve, 31, 40, history.Input{Fingerprint: fpA, AttemptID: "a2"}, execute(fpA, "a2", 9))
			b.add(0, history.FCommit, 41, 50, history.Input{Fingerprint: fpA, Fence: 5, RemoteID: "zombie"}, commitOK("zombie"))
		},
		"acknowledged commit lost": func(b *h) {
			b.add(0, history.FCommit, 20, 30, history.Input{Fingerprint: fpA, Fence: 5, RemoteID: "r1"}, commitOK("r1"))
			b.add(1, history.FGet, 40, 41, history.Input{}, &history.Output{Err: "not_found"})
		},
		"second receipt stored": func(b *h) {
			b.add(0, history.FCommit, 20, 30, history.Input{Fingerprint: fpA, Fence: 5, RemoteID: "r1"}, commitOK("r1"))
			b.add(0, history.FCommit, 31, 32, history.Input{Fingerprint: fpA, Fence: 5, RemoteID: "r2"}, commitOK("r2"))
		},
		"fence did not grow after a release": func(b *h) {
			b.add(0, history.FRelease, 20, 30, history.Input{Fingerprint: fpA, Fence: 5}, &history.Output{Released: true})
			b.add(1, history.FReserve, 31, 40, history.Input{Fingerprint: fpA, AttemptID: "a2"}, execute(fpA, "a2", 4))
		},
		"recover while the lease is live": func(b *h) {
			b.add(1, history.FReserve, 20, 30, history.Input{Fingerprint: fpA, AttemptID: "a2"},
				&history.Output{Decision: "recover", Grant: 9, Record: rec("pending", fpA, "a2", 9, "", 2)})
		},
		"conflict missed": func(b *h) {
			b.add(1, history.FReserve, 20, 30, history.Input{Fingerprint: fpB, AttemptID: "b1"},
				&history.Output{Decision: "in_progress", Record: rec("pending", fpA, "a1", 5, "", 1)})
		},
	}
	for name, addBad := range cases {
		t.Run(name, func(t *testing.T) {
			b := &h{}
			b.add(0, history.FReserve, 0, 10, history.Input{Fingerprint: fpA, AttemptID: "a1"}, execute(fpA, "a1", 5))
			addBad(b)
			if got := check(t, b.ops); got != porcupine.Illegal {
				t.Fatalf("judged %s", got)
			}
		})
	}
}

// A reserve whose answer was lost may or may not have happened; later answers decide.
func TestUnknownOutcomes(t *testing.T) {
	base := func() *h {
		b := &h{}
		b.add(0, history.FReserve, 0, 0, history.Input{Fingerprint: fpA, AttemptID: "lost"}, nil)
		return b
	}
	t.Run("it happened, and its fence shows later", func(t *testing.T) {
		b := base()
		b.add(1, history.FReserve, 20, 30, history.Input{Fingerprint: fpA, AttemptID: "a2"},
			&history.Output{Decision: "in_progress", Record: rec("pending", fpA, "lost", 7, "", 1)})
		b.add(0, history.FReserve, 31, 40, history.Input{Fingerprint: fpA, AttemptID: "lost"}, execute(fpA, "lost", 7))
		if got := check(t, b.ops); got != porcupine.Ok {
			t.Fatalf("judged %s", got)
		}
	})
	t.Run("it never happened", func(t *testing.T) {
		b := base()
		b.add(1, history.FReserve, 20, 30, history.Input{Fingerprint: fpA, AttemptID: "a2"}, execute(fpA, "a2", 8))
		if got := check(t, b.ops); got != porcupine.Ok {
			t.Fatalf("judged %s", got)
		}
	})
	t.Run("its fence cannot change", func(t *testing.T) {
		b := base()
		b.add(1, history.FGet, 20, 30, history.Input{}, &history.Output{Record: rec("pending", fpA, "lost", 7, "", 1)})
		b.add(1, history.FGet, 31, 40, history.Input{}, &history.Output{Record: rec("pending", fpA, "lost", 8, "", 1)})
		if got := check(t, b.ops); got != porcupine.Illegal {
			t.Fatalf("judged %s", got)
		}
	})
	t.Run("a lost commit may land later", func(t *testing.T) {
		b := &h{}
		b.add(0, history.FReserve, 0, 10, history.Input{Fingerprint: fpA, AttemptID: "a1"}, execute(fpA, "a1", 5))
		b.add(0, history.FCommit, 11, 0, history.Input{Fingerprint: fpA, Fence: 5, RemoteID: "r1"}, nil)
		b.add(1, history.FGet, 20, 21, history.Input{}, &history.Output{Record: rec("pending", fpA, "a1", 5, "", 1)})
		b.add(1, history.FGet, 30, 31, history.Input{}, &history.Output{Record: rec("committed", fpA, "a1", 5, "r1", 2)})
		if got := check(t, b.ops); got != porcupine.Ok {
			t.Fatalf("judged %s", got)
		}
		b.add(1, history.FGet, 40, 41, history.Input{}, &history.Output{Record: rec("pending", fpA, "a1", 5, "", 1)})
		if got := check(t, b.ops); got != porcupine.Illegal {
			t.Fatalf("a commit that landed was undone, judged %s", got)
		}
	})
}

func TestFailAndHeartbeat(t *testing.T) {
	b := &h{}
	b.add(0, history.FReserve, 0, 10, history.Input{Fingerprint: fpA, AttemptID: "a1"}, execute(fpA, "a1", 5))
	b.add(0, history.FHeartbeat, 11, 12, history.Input{Fence: 5}, &history.Output{Record: rec("pending", fpA, "a1", 5, "", 1)})
	failed := rec("failed", fpA, "a1", 5, "", 2)
	failed.ErrorCode = "boom"
	b.add(0, history.FFail, 13, 14, history.Input{Fingerprint: fpA, Fence: 5, ErrorCode: "boom"}, &history.Output{Record: failed})
	b.add(0, history.FCommit, 15, 16, history.Input{Fingerprint: fpA, Fence: 5, RemoteID: "late"},
		&history.Output{Receipt: &history.Receipt{Status: "failed", Fingerprint: fpA, ErrorCode: "boom", CommittedAt: 2}})
	b.add(0, history.FHeartbeat, 17, 18, history.Input{Fence: 5}, &history.Output{Err: "not_pending"})
	b.add(0, history.FCommit, 19, 20, history.Input{Fingerprint: fpB, Fence: 5, RemoteID: "x"}, &history.Output{Err: "fingerprint_mismatch"})
	if got := check(t, b.ops); got != porcupine.Ok {
		t.Fatalf("judged %s", got)
	}
	b.add(0, history.FCommit, 21, 22, history.Input{Fingerprint: fpA, Fence: 5, RemoteID: "late"},
		&history.Output{Receipt: &history.Receipt{Status: "committed", Fingerprint: fpA, RemoteID: "late"}})
	if got := check(t, b.ops); got != porcupine.Illegal {
		t.Fatalf("a commit overwrote a stored failure, judged %s", got)
	}
}

// A stored receipt is given back exactly: the result byte for byte, the remote URL and
// committed_at as the first answer showed them, by every replay, retried commit and read.
func TestReceiptsReplayExactly(t *testing.T) {
	result := json.RawMessage(`{"zid":"r1","ticket":{"n":1.50,"title":"Zürich"},"é":"\u00e9"}`)
	receipt := func(raw []byte, url string, at int64) *history.Receipt {
		return &history.Receipt{Status: "committed", Fingerprint: fpA, RemoteID: "r1", RemoteURL: url, ResultDigest: history.Digest(raw), CommittedAt: at}
	}
	stored := func(raw []byte, url string, at int64) *history.Record {
		r := rec("committed", fpA, "a1", 5, "r1", at)
		r.RemoteURL, r.ResultDigest, r.CommittedAt = url, history.Digest(raw), at
		return r
	}
	base := func() *h {
		b := &h{}
		b.add(0, history.FReserve, 0, 10, history.Input{Fingerprint: fpA, AttemptID: "a1"}, execute(fpA, "a1", 5))
		b.add(0, history.FCommit, 11, 20, history.Input{Fingerprint: fpA, Fence: 5, RemoteID: "r1", RemoteURL: "https://x/r1", Result: result},
			&history.Output{Receipt: receipt(result, "https://x/r1", 1000)})
		return b
	}
	replay := func(rc *history.Receipt, r *history.Record) *history.Output {
		return &history.Output{Decision: "replay", Receipt: rc, Record: r}
	}
	t.Run("exact replays, retried commit and read", func(t *testing.T) {
		b := base()
		b.add(1, history.FReserve, 21, 22, history.Input{Fingerprint: fpA, AttemptID: "a2"},
			replay(receipt(result, "https://x/r1", 1000), stored(result, "https://x/r1", 1000)))
		b.add(0, history.FCommit, 23, 24, history.Input{Fingerprint: fpA, Fence: 5, RemoteID: "r1", Result: json.RawMessage(`{}`)},
			&history.Output{Receipt: receipt(result, "https://x/r1", 1000)})
		b.add(1, history.FGet, 25, 26, history.Input{}, &history.Output{Record: stored(result, "https://x/r1", 1000)})
		if got := check(t, b.ops); got != porcupine.Ok {
			t.Fatalf("judged %s", got)
		}
	})
	// What a bug on one path does to the receipt.
	canonical := json.RawMessage(`{"zid":"r1","ticket":{"n":1.5,"title":"Zürich"},"é":"é"}`)
	cases := map[string]func(b *h){
		"a replay without the result": func(b *h) {
			b.add(1, history.FReserve, 21, 22, history.Input{Fingerprint: fpA, AttemptID: "a2"},
				replay(receipt(nil, "https://x/r1", 1000), stored(nil, "https://x/r1", 1000)))
		},
		"a replay with the result re-encoded": func(b *h) {
			b.add(1, history.FReserve, 21, 22, history.Input{Fingerprint: fpA, AttemptID: "a2"},
				replay(receipt(canonical, "https://x/r1", 1000), stored(canonical, "https://x/r1", 1000)))
		},
		"a replay re-stamped": func(b *h) {
			b.add(1, history.FReserve, 21, 22, history.Input{Fingerprint: fpA, AttemptID: "a2"},
				replay(receipt(result, "https://x/r1", 1500), stored(result, "https://x/r1", 1500)))
		},
		"a retried commit without the remote URL": func(b *h) {
			b.add(0, history.FCommit, 23, 24, history.Input{Fingerprint: fpA, Fence: 5, RemoteID: "r1"},
				&history.Output{Receipt: receipt(result, "", 1000)})
		},
		"a read of another result": func(b *h) {
			b.add(1, history.FGet, 25, 26, history.Input{}, &history.Output{Record: stored(canonical, "https://x/r1", 1000)})
		},
		"the first answer is not what was committed": func(b *h) {
			b.ops[1].Out = &history.Output{Receipt: receipt(canonical, "https://x/r1", 1000)}
		},
	}
	for name, addBad := range cases {
		t.Run(name, func(t *testing.T) {
			b := base()
			addBad(b)
			if got := check(t, b.ops); got != porcupine.Illegal {
				t.Fatalf("judged %s", got)
			}
		})
	}
}

func TestCheckClock(t *testing.T) {
	b := &h{}
	b.add(0, history.FGet, 0, 10, history.Input{}, &history.Output{Record: rec("pending", fpA, "a1", 5, "", 100)})
	b.add(1, history.FGet, 5, 15, history.Input{}, &history.Output{Record: rec("pending", fpA, "a1", 5, "", 90)}) // overlaps: no order
	b.add(1, history.FGet, 20, 25, history.Input{}, &history.Output{Record: rec("pending", fpA, "a1", 5, "", 100)})
	if a := CheckClock(b.ops); len(a) != 0 {
		t.Fatalf("anomalies in a monotonic history: %v", a)
	}
	b.add(2, history.FGet, 30, 35, history.Input{}, &history.Output{Record: rec("pending", fpA, "a1", 5, "", 99)})
	a := CheckClock(b.ops)
	if len(a) != 1 || a[0].Later != 4 || a[0].Seen != 99 || a[0].Previous != 100 {
		t.Fatalf("clock regression not found: %v", a)
	}
}

func TestCheckDurable(t *testing.T) {
	b := &h{}
	b.add(0, history.FReserve, 0, 10, history.Input{Fingerprint: fpA, AttemptID: "a1"}, execute(fpA, "a1", 5))
	b.add(0, history.FCommit, 11, 20, history.Input{Fingerprint: fpA, Fence: 5, RemoteID: "r1"},
		&history.Output{Receipt: &history.Receipt{Status: "committed", Fingerprint: fpA, RemoteID: "r1"}})
	for i := range b.ops {
		b.ops[i].Workload = "register"
	}
	final := history.Op{ID: 99, Workload: "register", F: history.FGet, Key: "k", In: history.Input{Final: true}, Type: history.OK,
		Out: &history.Output{Record: rec("committed", fpA, "a1", 5, "r1", 2)}, Call: 30, Return: 31}
	if a := CheckDurable(append(b.ops, final)); len(a) != 0 {
		t.Fatalf("a durable commit was flagged: %v", a)
	}
	final.Out = &history.Output{Record: rec("pending", fpA, "a1", 5, "", 1)}
	if a := CheckDurable(append(b.ops, final)); len(a) != 1 || a[0].Op != 2 {
		t.Fatalf("a lost commit was not flagged: %v", a)
	}
	final.Out = &history.Output{Err: "not_found"}
	if a := CheckDurable(append(b.ops, final)); len(a) != 1 {
		t.Fatalf("a vanished record was not flagged: %v", a)
	}
}
