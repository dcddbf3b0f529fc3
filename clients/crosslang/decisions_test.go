package crosslang_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
)

// The decision scenarios the Python and TypeScript in-memory stores are held to
// (testdata/decisions), run through the server's own decision functions: the vectors
// say what the server does, not what a store was written to do (issue 24, point 9).

type scenario struct {
	Name  string `json:"name"`
	Steps []step `json:"steps"`
}

type step struct {
	At       int64  `json:"at"`
	Call     string `json:"call"`
	Attempt  string `json:"attempt"`
	FP       string `json:"fp"`
	Tool     string `json:"tool"`
	LeaseMs  int64  `json:"lease_ms"`
	TTLMs    int64  `json:"ttl_ms"`
	Fence    string `json:"fence"`
	RemoteID string `json:"remote_id"`
	Code     string `json:"code"`
	Outcome  string `json:"outcome"`
	Want     struct {
		Decision string `json:"decision"`
		Fence    string `json:"fence"`
		Error    string `json:"error"`
		Status   string `json:"status"`
		InDoubt  *bool  `json:"in_doubt"`
		RemoteID string `json:"remote_id"`
		Attempts uint32 `json:"attempts"`
	} `json:"want"`
}

var fingerprints = map[string]string{
	"A": "sha256:" + "a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0",
	"B": "sha256:" + "b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1",
}

func TestDecisionVectorsAreTheServers(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "decisions", "vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Scenarios []scenario `json:"scenarios"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	steps := 0
	for _, sc := range doc.Scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			var (
				cur    *idemkv.Record
				fences []uint64
			)
			const start = idemkv.Timestamp(1_800_000_000_000)
			for i, s := range sc.Steps {
				now := start + idemkv.Timestamp(s.At)
				fp := fingerprints[or(s.FP, "A")]
				fence := func() uint64 {
					switch {
					case len(fences) == 0:
						return 1
					case s.Fence == "previous" && len(fences) > 1:
						return fences[len(fences)-2]
					case s.Fence == "never":
						return fences[len(fences)-1] + 1000
					}
					return fences[len(fences)-1]
				}
				var (
					next     *idemkv.Record
					res      *idemkv.ReserveResult
					release  bool
					err      error
					holdNext = true
				)
				switch s.Call {
				case "reserve":
					next, res = fsm.Decide(cur, &idemkv.ReserveRequest{Tenant: "acme", Key: "k", Tool: or(s.Tool, "create_ticket"),
						Fingerprint: fp, AttemptID: s.Attempt, LeaseTTLMs: orInt(s.LeaseMs, 30000), TTLMs: orInt(s.TTLMs, 86400000)},
						now, uint64(i+1))
				case "commit":
					next, _, err = fsm.DecideCommit(cur, &idemkv.CommitRequest{Tenant: "acme", Key: "k", Fingerprint: fp, Fence: fence(),
						RemoteSystem: "tickets", RemoteID: s.RemoteID}, now)
				case "fail":
					next, _, err = fsm.DecideFail(cur, &idemkv.FailRequest{Tenant: "acme", Key: "k", Fingerprint: fp, Fence: fence(),
						Error: idemkv.ErrorInfo{Code: s.Code, Message: "failed"}}, now)
				case "release":
					release, err = fsm.DecideRelease(cur, &idemkv.ReleaseRequest{Tenant: "acme", Key: "k", Fingerprint: fp, Fence: fence()}, now)
				case "heartbeat":
					next, err = fsm.DecideHeartbeat(cur, &idemkv.HeartbeatRequest{Tenant: "acme", Key: "k", Fence: fence(),
						LeaseTTLMs: orInt(s.LeaseMs, 30000)}, now)
				case "doubt":
					next, _, err = fsm.DecideDoubt(cur, &idemkv.DoubtRequest{Tenant: "acme", Key: "k", Fingerprint: fp, Fence: fence()}, now)
				case "resolve":
					next, _, release, err = fsm.DecideResolve(cur, &idemkv.ResolveRequest{Tenant: "acme", Key: "k", Fingerprint: fp,
						Outcome: idemkv.ResolveOutcome(s.Outcome), RemoteSystem: "tickets", RemoteID: s.RemoteID}, now)
				case "get":
					holdNext = false
				default:
					t.Fatalf("step %d: unknown call %q", i, s.Call)
				}
				if holdNext && next != nil {
					cur = next
				}
				if release {
					cur = nil
				}
				w := s.Want
				if code := idemkv.CodeOf(err); err != nil && code != w.Error || err == nil && w.Error != "" {
					t.Fatalf("step %d (%s): error %v, want %q", i, s.Call, err, w.Error)
				}
				if res != nil {
					if string(res.Decision) != w.Decision {
						t.Fatalf("step %d: decision %s, want %s", i, res.Decision, w.Decision)
					}
					switch w.Fence {
					case "new":
						if len(fences) > 0 && res.Fence <= fences[len(fences)-1] || res.Fence == 0 {
							t.Fatalf("step %d: fence %d is not new (granted %v)", i, res.Fence, fences)
						}
						fences = append(fences, res.Fence)
					case "same":
						if res.Fence != fences[len(fences)-1] {
							t.Fatalf("step %d: fence %d, want %d", i, res.Fence, fences[len(fences)-1])
						}
					}
				}
				live := cur
				if fsm.Expired(cur, now) {
					live = nil
				}
				if w.Status != "" {
					got := "absent"
					if live != nil {
						got = string(live.Status)
					}
					if got != w.Status {
						t.Fatalf("step %d: status %s, want %s", i, got, w.Status)
					}
				}
				if w.InDoubt != nil && (live == nil || live.InDoubt != *w.InDoubt) {
					t.Fatalf("step %d: in doubt %+v, want %v", i, live, *w.InDoubt)
				}
				if w.RemoteID != "" && (live == nil || live.Receipt == nil || live.Receipt.RemoteID != w.RemoteID) {
					t.Fatalf("step %d: receipt of %+v, want remote id %s", i, live, w.RemoteID)
				}
				if w.Attempts != 0 && (live == nil || live.Attempts != w.Attempts) {
					t.Fatalf("step %d: attempts of %+v, want %d", i, live, w.Attempts)
				}
				steps++
			}
		})
	}
	if steps < 40 {
		t.Fatalf("only %d steps ran", steps)
	}
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func orInt(v, def int64) int64 {
	if v == 0 {
		return def
	}
	return v
}
