package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testhooks"
)

// The tests in this file restart real processes, killed with SIGKILL, with a wall clock
// hours off (the test build's clock offset, internal/testhooks): a machine that boots
// with a wrong clock and starts idemkv before NTP corrects it (issue 22, point 1).

func newHooksProc(t *testing.T, id, join string) *proc {
	p := newProc(t, id, join)
	p.bin = idemkvBinaryTagged(t, "idemkv_testhooks")
	return p
}

// clockVictims are a pending record whose 60 s lease attempt a1 holds and a record
// committed with a retention of 2 h: a stamp 3 h ahead makes the first recoverable and
// the second absent.
type clockVictims struct{ lease, kept idemkv.ReserveRequest }

func seedClockVictims(t *testing.T, endpoint string) clockVictims {
	t.Helper()
	v := clockVictims{
		lease: idemkv.ReserveRequest{Tenant: "acme", Key: "refund:17", Tool: "send_refund",
			Fingerprint: "sha256:" + strings.Repeat("a", 64), AttemptID: "a1", LeaseTTLMs: 60_000},
		kept: idemkv.ReserveRequest{Tenant: "acme", Key: "ticket:9", Tool: "create_ticket",
			Fingerprint: "sha256:" + strings.Repeat("b", 64), AttemptID: "a1", TTLMs: 2 * 3600_000},
	}
	if res := reserveOn(t, endpoint, v.lease); res.Decision != idemkv.DecisionExecute {
		t.Fatalf("reserve %s: %s, want execute", v.lease.Key, res.Decision)
	}
	res := reserveOn(t, endpoint, v.kept)
	if res.Decision != idemkv.DecisionExecute {
		t.Fatalf("reserve %s: %s, want execute", v.kept.Key, res.Decision)
	}
	commit := idemkv.CommitRequest{Tenant: "acme", Key: v.kept.Key, Fingerprint: v.kept.Fingerprint, Fence: res.Fence,
		RemoteSystem: "linear", RemoteID: "LIN-9"}
	if code, raw := call(t, http.MethodPost, endpoint, "/v1/commit", commit); code != 200 {
		t.Fatalf("commit: %d %s", code, raw)
	}
	return v
}

func reserveOn(t *testing.T, endpoint string, r idemkv.ReserveRequest) idemkv.ReserveResult {
	t.Helper()
	var res idemkv.ReserveResult
	waitFor(t, 30*time.Second, "reserve "+r.Key, func() error {
		code, raw := call(t, http.MethodPost, endpoint, "/v1/reserve", r)
		if code != 200 {
			return fmt.Errorf("%d %s", code, raw)
		}
		return json.Unmarshal(raw, &res)
	})
	return res
}

// clockVictimsBroken asks for both records again from another attempt, right after a
// restart with a clock 3 h fast, and says what went wrong: the lease must still be
// live, the record still kept.
func clockVictimsBroken(t *testing.T, endpoint string, v clockVictims) []string {
	t.Helper()
	var broken []string
	lease := v.lease
	lease.AttemptID = "a2"
	if res := reserveOn(t, endpoint, lease); res.Decision != idemkv.DecisionInProgress {
		broken = append(broken, fmt.Sprintf("a second attempt at %s, seconds into a 60 s lease: %s (fence %d), want in_progress",
			lease.Key, res.Decision, res.Fence))
	}
	kept := v.kept
	kept.AttemptID = "a2"
	if res := reserveOn(t, endpoint, kept); res.Decision != idemkv.DecisionReplay {
		broken = append(broken, fmt.Sprintf("%s, committed seconds ago with 2 h retention: %s, want replay", kept.Key, res.Decision))
	}
	return broken
}

var clampedRE = regexp.MustCompile(`(?m)^idemkv_clock_stamps_clamped_total ([0-9.e+]+)$`)

func clampedStamps(t *testing.T, endpoint string) float64 {
	t.Helper()
	code, raw := call(t, http.MethodGet, endpoint, "/metrics", nil)
	m := clampedRE.FindSubmatch(raw)
	if code != 200 || m == nil {
		t.Fatalf("metrics: %d, no idemkv_clock_stamps_clamped_total", code)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

const firstStampLog = "first stamp since start anchored at the state machine clock"

// restartSingleNodeClockAhead seeds the victims on one node, kills it and restarts it
// with its clock 3 h fast (and the sabotage modes of env), and reports what broke.
func restartSingleNodeClockAhead(t *testing.T, env ...string) (*proc, []string) {
	p := newHooksProc(t, "n1", "")
	p.start()
	p.waitReady()
	v := seedClockVictims(t, p.httpAddr)
	p.kill()
	p.env = append([]string{testhooks.EnvClockOffset + "=3h"}, env...)
	p.start()
	p.waitReady()
	return p, clockVictimsBroken(t, p.httpAddr, v)
}

func TestRestartWithClockAheadSingleNode(t *testing.T) {
	p, broken := restartSingleNodeClockAhead(t)
	for _, b := range broken {
		t.Errorf("after a restart with a clock 3 h fast, %s", b)
	}
	if n := clampedStamps(t, p.httpAddr); n < 1 {
		t.Errorf("idemkv_clock_stamps_clamped_total = %v after a restart 3 h fast, want the clamped first stamp counted", n)
	}
	if !strings.Contains(p.logText(), firstStampLog) {
		t.Errorf("the node did not log its clamped first stamp (%q)", firstStampLog)
	}
	var info idemkv.ClusterInfo
	code, raw := call(t, http.MethodGet, p.httpAddr, "/v1/cluster", nil)
	if code != 200 || json.Unmarshal(raw, &info) != nil || info.Clock == nil {
		t.Fatalf("cluster: %d %s", code, raw)
	}
	if info.Clock.OffsetMs == nil || *info.Clock.OffsetMs > -2*3600_000 || info.Clock.LocalAnswers {
		t.Errorf("clock after a restart 3 h fast: %s; want an offset near -3 h and no local answers", raw)
	}
}

// TestRestartWithClockAheadSabotageIsCaught runs the same restart on the code before the
// fix (the unanchored-stamps sabotage): the checks above must see both victims broken.
func TestRestartWithClockAheadSabotageIsCaught(t *testing.T) {
	_, broken := restartSingleNodeClockAhead(t, testhooks.EnvSabotage+"=unanchored-stamps")
	if len(broken) != 2 {
		t.Fatalf("the unanchored-stamps sabotage broke %d of 2 victims (%q): the test cannot tell the fix from the bug", len(broken), broken)
	}
}

// TestRestartWithClockAheadWinsElection kills the whole cluster and restarts it with
// one node's clock 3 h fast; that node has the shortest timeouts, so it wins the first
// election in the quiet after the restart, before anything anchors it.
func TestRestartWithClockAheadWinsElection(t *testing.T) {
	n1 := newHooksProc(t, "n1", "")
	n2 := newHooksProc(t, "n2", n1.httpAddr)
	n3 := newHooksProc(t, "n3", n1.httpAddr)
	procs := []*proc{n1, n2, n3}
	n1.start()
	n1.waitReady()
	n2.start()
	n3.start()
	waitFor(t, 30*time.Second, "three voters with addresses", func() error {
		code, raw := call(t, http.MethodGet, n1.httpAddr, "/v1/cluster", nil)
		var info idemkv.ClusterInfo
		if code != 200 || json.Unmarshal(raw, &info) != nil || len(info.Nodes) != 3 {
			return fmt.Errorf("cluster: %d %s", code, raw)
		}
		for _, ni := range info.Nodes {
			if ni.APIAddr == "" {
				return fmt.Errorf("node %s has no API address yet", ni.ID)
			}
		}
		return nil
	})
	v := seedClockVictims(t, n2.httpAddr)
	for _, p := range procs {
		p.kill()
	}
	n1.env = []string{testhooks.EnvClockOffset + "=3h"}
	slow := []string{"--heartbeat-timeout", "4s", "--election-timeout", "4s", "--leader-lease-timeout", "2s"}
	n2.extra, n3.extra = slow, slow
	for _, p := range procs {
		p.start()
	}
	waitFor(t, 30*time.Second, "n1 leads", func() error {
		code, raw := call(t, http.MethodGet, n2.httpAddr, "/v1/cluster", nil)
		var info idemkv.ClusterInfo
		if code != 200 || json.Unmarshal(raw, &info) != nil {
			return fmt.Errorf("cluster: %d %s", code, raw)
		}
		if info.Leader.ID == "" {
			return fmt.Errorf("no leader yet")
		}
		if info.Leader.ID != "n1" {
			t.Fatalf("%s won the election, not n1 whose clock is fast: the test did not set up what it means to", info.Leader.ID)
		}
		return nil
	})
	n1.waitReady()
	for _, b := range clockVictimsBroken(t, n2.httpAddr, v) {
		t.Errorf("after n1 restarted with a clock 3 h fast and won the election, %s", b)
	}
	if n := clampedStamps(t, n1.httpAddr); n < 1 {
		t.Errorf("idemkv_clock_stamps_clamped_total on n1 = %v, want its clamped first stamp counted", n)
	}
	if !strings.Contains(n1.logText(), firstStampLog) {
		t.Errorf("n1 did not log its clamped first stamp")
	}
}
