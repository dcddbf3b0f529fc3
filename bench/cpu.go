package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// userHZ is the unit of the CPU times in /proc/<pid>/stat: USER_HZ, which Linux fixes
// at 100 for every program that reads them, whatever the kernel's own tick.
const userHZ = 100

// procTimes is one process as /proc/<pid>/stat shows it.
type procTimes struct {
	ppid int
	// ticks is the CPU time the process spent (utime + stime) and that of its
	// children it has waited for (cutime + cstime): a PostgreSQL backend that exits
	// during a point moves its time into the postmaster's cutime, where it is still
	// counted.
	ticks int64
}

// parseStat reads the fields procTimes needs from the content of /proc/<pid>/stat.
// The command name (field 2) is in parentheses and may hold spaces and parentheses
// itself, so the fields are counted from the last ')'.
func parseStat(b []byte) (procTimes, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procTimes{}, fmt.Errorf("no command name in %q", b)
	}
	// After ')': state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt
	// cmajflt utime stime cutime cstime …
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return procTimes{}, fmt.Errorf("%d fields after the command name, want 15 or more", len(f))
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procTimes{}, fmt.Errorf("ppid %q: %w", f[1], err)
	}
	var t procTimes
	t.ppid = ppid
	for _, s := range f[11:15] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return procTimes{}, fmt.Errorf("CPU time %q: %w", s, err)
		}
		t.ticks += n
	}
	return t, nil
}

// cpuSample is the CPU time a system's processes had spent at one moment.
type cpuSample struct {
	seconds   float64
	processes int
}

// systemCPU sums the CPU time of the processes roots and all their descendants, as
// /proc under procDir shows them now: a PostgreSQL postmaster's backends, walsenders
// and background workers, a container's processes under the host pid of its init,
// each idemkv node. A root that is gone fails the sample: the figure would be short.
func systemCPU(procDir string, roots []int) (cpuSample, error) {
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return cpuSample{}, err
	}
	procs := make(map[int]procTimes, len(entries))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procDir, e.Name(), "stat"))
		if err != nil {
			continue // exited since the listing
		}
		t, err := parseStat(b)
		if err != nil {
			return cpuSample{}, fmt.Errorf("%s/%d/stat: %w", procDir, pid, err)
		}
		procs[pid] = t
	}
	in := make(map[int]bool, len(roots))
	for _, r := range roots {
		if _, ok := procs[r]; !ok {
			return cpuSample{}, fmt.Errorf("process %d of the system under test is gone", r)
		}
		in[r] = true
	}
	// member reports whether pid descends from a root (or is one), memoised.
	var member func(pid, depth int) bool
	member = func(pid, depth int) bool {
		if v, ok := in[pid]; ok {
			return v
		}
		t, ok := procs[pid]
		if !ok || t.ppid <= 1 || depth > 64 {
			in[pid] = false
			return false
		}
		v := member(t.ppid, depth+1)
		in[pid] = v
		return v
	}
	var s cpuSample
	for pid, t := range procs {
		if member(pid, 0) {
			s.seconds += float64(t.ticks) / userHZ
			s.processes++
		}
	}
	return s, nil
}

// pidsFlag is --cpu-pids: the processes of the system under test, comma separated.
type pidsFlag struct{ pids *[]int }

func (f pidsFlag) String() string {
	if f.pids == nil {
		return ""
	}
	s := make([]string, len(*f.pids))
	for i, p := range *f.pids {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

func (f pidsFlag) Set(v string) error {
	ps, err := ints(v)
	if err != nil {
		return err
	}
	*f.pids = append(*f.pids, ps...)
	return nil
}

// CPU is what the processes of a point's system spent while it was measured.
type CPU struct {
	// Seconds is their CPU time (user and system) over the measured window.
	Seconds float64 `json:"seconds"`
	// Processes is how many there were at the end (a PostgreSQL backend per
	// connection among them).
	Processes int `json:"processes"`
	// PerKOps is Seconds per thousand operations (a new operation is its reserve and
	// its commit): the figure that holds on a loaded machine, where throughput does
	// not.
	PerKOps float64 `json:"seconds_per_1k_ops"`
}

// perKOps is c's CPU seconds per thousand operations, 0 when not measured.
func (c *CPU) perKOps() float64 {
	if c == nil {
		return 0
	}
	return c.PerKOps
}

// cpuWindow samples the CPU time of the system's processes (options.cpuPids) as a
// point's measured window starts and ends (without --cpu-pids it leaves them out), and
// always the driver's own.
type cpuWindow struct {
	before, after             cpuSample
	driverBefore, driverAfter float64
	ok                        bool
	err                       error
}

func (w *cpuWindow) start(o options) {
	w.driverBefore = driverCPU()
	if len(o.cpuPids) == 0 {
		return
	}
	w.before, w.err = systemCPU(o.procDir, o.cpuPids)
}

func (w *cpuWindow) end(o options) {
	w.driverAfter = driverCPU()
	if len(o.cpuPids) == 0 || w.err != nil {
		return
	}
	w.after, w.err = systemCPU(o.procDir, o.cpuPids)
	w.ok = w.err == nil
}

// driverCPU is the CPU time (user and system) this process, the driver, has spent:
// it shares the machine with the system it measures, so what it spends there the
// system cannot, and results.md shows it beside the system's.
func driverCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// driverFigure is the driver's CPU over the window for ops operations.
func (w *cpuWindow) driverFigure(ops uint64) *CPU {
	c := &CPU{Seconds: w.driverAfter - w.driverBefore, Processes: 1}
	if ops > 0 {
		c.PerKOps = c.Seconds / float64(ops) * 1000
	}
	return c
}

// figure is the window's CPU for ops operations.
func (w *cpuWindow) figure(ops uint64) *CPU {
	c := &CPU{Seconds: w.after.seconds - w.before.seconds, Processes: w.after.processes}
	if ops > 0 {
		c.PerKOps = c.Seconds / float64(ops) * 1000
	}
	return c
}

// idleCores is the CPU use, in cores, under which a system counts as idle: an idle
// three-node idemkv cluster takes 12-15% of a core (its leader's AppendEntries every
// 5-10 ms: node/node.go, CommitTimeout), etcd's about 3%, PostgreSQL's servers less.
const idleCores = 0.2

// settle waits, at most o.settleMax, until the system's processes (o.cpuPids) use
// under idleCores over a second, and returns how long it waited and whether they went
// idle (false: o.settleMax ran out first). A point measures its
// own work then, not the memtable flushes and compactions (idemkv, etcd) or the
// checkpoints and vacuums (PostgreSQL) that the writes of the point before it left:
// those ran during whichever point came next, a replay point after 256 clients of
// writes most of all. Without --cpu-pids it does not wait.
func settle(ctx context.Context, o options) (waited time.Duration, idle bool, err error) {
	if len(o.cpuPids) == 0 || o.settleMax <= 0 {
		return 0, true, nil
	}
	start := time.Now()
	prev, err := systemCPU(o.procDir, o.cpuPids)
	if err != nil {
		return 0, false, err
	}
	for !idle && time.Since(start) < o.settleMax {
		t0 := time.Now()
		select {
		case <-ctx.Done():
			return 0, false, ctx.Err()
		case <-time.After(time.Second):
		}
		cur, err := systemCPU(o.procDir, o.cpuPids)
		if err != nil {
			return 0, false, err
		}
		idle = (cur.seconds-prev.seconds)/time.Since(t0).Seconds() < idleCores
		prev = cur
	}
	return time.Since(start), idle, nil
}

// runSettle is `bench settle --cpu-pids PIDS --settle-max D`: it waits as the comparison
// does before each point (settle, the one rule of what idle is) and says whether the
// processes went idle. run.sh's scale mode waits so for the compactions after its
// restores and snapshot installs.
func runSettle(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench settle", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := options{procDir: "/proc"}
	fs.Var(pidsFlag{&o.cpuPids}, "cpu-pids", "`PIDS` of the processes to wait for (with their descendants), comma separated")
	fs.DurationVar(&o.settleMax, "settle-max", 15*time.Minute, "the longest wait")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if len(o.cpuPids) == 0 || o.settleMax <= 0 {
		return errors.New("give --cpu-pids and a positive --settle-max")
	}
	waited, idle, err := settle(ctx, o)
	if err != nil {
		return err
	}
	if !idle {
		fmt.Fprintf(stdout, "still busy (over %.0f%% of a core) after %s\n", 100*idleCores, waited.Round(time.Second))
		return nil
	}
	fmt.Fprintf(stdout, "idle (under %.0f%% of a core) after %s\n", 100*idleCores, waited.Round(100*time.Millisecond))
	return nil
}
