package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// writeStat writes a /proc/<pid>/stat under dir with the given parent and CPU ticks
// (utime, stime, cutime, cstime).
func writeStat(t *testing.T, dir string, pid, ppid int, comm string, ticks [4]int) {
	t.Helper()
	d := filepath.Join(dir, fmt.Sprint(pid))
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprintf("%d (%s) S %d 1 1 0 -1 4194560 100 0 0 0 %d %d %d %d 20 0 1 0 100 1000 10\n",
		pid, comm, ppid, ticks[0], ticks[1], ticks[2], ticks[3])
	if err := os.WriteFile(filepath.Join(d, "stat"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The system's CPU is its roots' and every descendant's, reaped children included,
// and nothing else's; a command name with spaces and parentheses does not shift the
// fields; a root that is gone fails the sample.
func TestSystemCPUSumsRootsAndDescendants(t *testing.T) {
	dir := t.TempDir()
	writeStat(t, dir, 100, 1, "runuser", [4]int{1, 1, 0, 0})
	writeStat(t, dir, 101, 100, "postgres", [4]int{100, 50, 30, 20}) // postmaster: reaped backends in cutime/cstime
	writeStat(t, dir, 102, 101, "postgres: walsender s1 (127.0.0.1) idle", [4]int{10, 10, 0, 0})
	writeStat(t, dir, 103, 102, "a) b (c", [4]int{5, 0, 0, 0}) // a grandchild
	writeStat(t, dir, 200, 1, "bash", [4]int{1000, 1000, 0, 0})
	writeStat(t, dir, 300, 7, "orphan", [4]int{1000, 0, 0, 0}) // parent 7 is not listed
	if err := os.MkdirAll(filepath.Join(dir, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := systemCPU(dir, []int{100, 101})
	if err != nil {
		t.Fatal(err)
	}
	want := float64(2+200+20+5) / userHZ
	if math.Abs(s.seconds-want) > 1e-9 || s.processes != 4 {
		t.Errorf("got %.2f s over %d processes, want %.2f s over 4", s.seconds, s.processes, want)
	}
	if _, err := systemCPU(dir, []int{100, 999}); err == nil || !strings.Contains(err.Error(), "999") {
		t.Errorf("a gone root: %v", err)
	}
}

// On the real /proc, this test's own process is found and has spent some CPU.
func TestSystemCPUOfThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	x := 0
	for i := range 50_000_000 {
		x += i % 7
	}
	s, err := systemCPU("/proc", []int{os.Getpid()})
	if err != nil {
		t.Fatal(err)
	}
	if s.seconds <= 0 || s.processes < 1 || x == 0 {
		t.Errorf("this process: %+v", s)
	}
}

func TestCPUWindowPerThousandOps(t *testing.T) {
	w := cpuWindow{before: cpuSample{seconds: 10}, after: cpuSample{seconds: 12.5, processes: 3}}
	c := w.figure(5000)
	if c.Seconds != 2.5 || c.PerKOps != 0.5 || c.Processes != 3 {
		t.Errorf("%+v", c)
	}
	if c := w.figure(0); c.PerKOps != 0 {
		t.Errorf("no operations: %+v", c)
	}
}

func TestParseFlagsCPUPidsNeedOneSystem(t *testing.T) {
	o, err := parseFlags([]string{"--pg", "postgres://x", "--cpu-pids", "12,13", "--cpu-pids", "14"})
	if err != nil || len(o.cpuPids) != 3 || o.cpuPids[2] != 14 {
		t.Fatalf("%v %v", o.cpuPids, err)
	}
	if _, err := parseFlags([]string{"--pg", "postgres://x", "--etcd", "a:1", "--cpu-pids", "12"}); err == nil {
		t.Errorf("two systems with one set of pids accepted")
	}
	if _, err := parseFlags([]string{"--pg", "postgres://x", "--cpu-pids", "12,x"}); err == nil {
		t.Errorf("a pid that is no number accepted")
	}
}

// settle waits while the system is busy (a core's worth of ticks a second, as a
// compaction takes) and returns once a second passes with almost none; it never waits
// past its bound, and without --cpu-pids it does not wait at all.
func TestSettleWaitsForTheSystemToGoIdle(t *testing.T) {
	dir := t.TempDir()
	writeStat(t, dir, 100, 1, "idemkv", [4]int{0, 0, 0, 0})
	var busyUntil atomic.Int64
	busyUntil.Store(time.Now().Add(2500 * time.Millisecond).UnixNano())
	stat := filepath.Join(dir, "100", "stat")
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticks := 0
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().UnixNano() < busyUntil.Load() {
				ticks += 5 // a whole core: 100 ticks a second
			}
			line := fmt.Sprintf("100 (idemkv) S 1 1 1 0 -1 4194560 100 0 0 0 %d 0 0 0 20 0 1 0 100 1000 10\n", ticks)
			_ = os.WriteFile(stat+".new", []byte(line), 0o644)
			_ = os.Rename(stat+".new", stat)
		}
	}()
	defer func() { close(stop); <-done }()
	o := options{procDir: dir, cpuPids: []int{100}, settleMax: 10 * time.Second}
	waited, idle, err := settle(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if waited < 2500*time.Millisecond || waited > 6*time.Second || !idle {
		t.Errorf("waited %v for a system busy for 2.5 s (idle %v)", waited, idle)
	}
	busyUntil.Store(time.Now().Add(time.Hour).UnixNano())
	o.settleMax = 2 * time.Second
	if waited, idle, err := settle(t.Context(), o); err != nil || waited > 4*time.Second || idle {
		t.Errorf("a system busy for good: waited %v (idle %v, %v), bound 2 s", waited, idle, err)
	}
	if waited, _, err := settle(t.Context(), options{procDir: dir}); err != nil || waited != 0 {
		t.Errorf("without --cpu-pids: waited %v (%v)", waited, err)
	}
}

// TestSettleSubcommandSaysWhetherIdle: `bench settle`, which run.sh's scale mode waits
// with, finds this idle test process idle at once, and refuses a call without processes.
func TestSettleSubcommandSaysWhetherIdle(t *testing.T) {
	var out strings.Builder
	err := runSettle(t.Context(), []string{"--cpu-pids", strconv.Itoa(os.Getpid()), "--settle-max", "5s"}, &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "idle (under 20% of a core) after ") {
		t.Errorf("bench settle said %q", out.String())
	}
	if err := runSettle(t.Context(), []string{"--settle-max", "5s"}, io.Discard, io.Discard); err == nil {
		t.Error("bench settle without --cpu-pids succeeded")
	}
}
