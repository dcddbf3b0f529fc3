// Package nemesis breaks a running cluster on a schedule while the workloads run:
// partitions and bad links, crashes, pauses, membership changes, a partition long
// enough that the returning node needs a snapshot, clock offsets on the leader, and
// (raftport.go) floods of idle sockets on the Raft ports while the leader is killed.
// Every fault is healed before the next one starts, and HealAll puts the cluster back
// together at the end.
package nemesis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/idemkv/idemkv/internal/testhooks"
	"github.com/idemkv/idemkv/jepsen-lite/internal/cluster"
	"github.com/idemkv/idemkv/jepsen-lite/internal/proxy"
)

// Families of faults, as --nemesis names them.
const (
	FamilyPartition  = "partition"
	FamilyKill       = "kill"
	FamilyPause      = "pause"
	FamilyMembership = "membership"
	FamilySnapshot   = "snapshot"
	FamilyClock      = "clock"
	// FamilyCombined holds two faults of different families at once.
	FamilyCombined = "combined"
)

// Families lists every family in a stable order.
var Families = []string{FamilyPartition, FamilyKill, FamilyPause, FamilyMembership, FamilySnapshot, FamilyClock, FamilyCombined}

// ParseFamilies parses --nemesis: "all", "none", or a comma-separated list.
func ParseFamilies(s string) ([]string, error) {
	switch strings.TrimSpace(s) {
	case "all":
		return append([]string(nil), Families...), nil
	case "none", "":
		return nil, nil
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		known := false
		for _, k := range Families {
			known = known || k == f
		}
		if !known {
			return nil, fmt.Errorf("nemesis: unknown family %q (known: all, none, %s)", f, strings.Join(Families, ", "))
		}
		out = append(out, f)
	}
	return out, nil
}

// Fault is one injected fault and its window.
type Fault struct {
	Family string `json:"family"`
	Kind   string `json:"kind"`
	// Start and End are nanoseconds since the run started; End is when it was healed.
	Start  int64  `json:"start"`
	End    int64  `json:"end"`
	Detail string `json:"detail"`
	Err    string `json:"error,omitempty"`
	// Findings are anomalies the fault itself observed (see faults.go).
	Findings []Finding `json:"findings,omitempty"`
}

// Config configures the schedule.
type Config struct {
	Families []string
	// Quiet is the longest pause between faults, Hold the longest a fault lasts.
	Quiet, Hold time.Duration
	// SnapshotGap is how many entries the others must commit past an isolated node
	// before it may come back (snapshot threshold + trailing logs, with a margin).
	SnapshotGap uint64
	// SnapshotSettle is how long the isolation lasts once the others reached the gap:
	// long enough for Raft's snapshot check (every interval to twice it) to run past
	// the entries the isolated node misses, so that the logs no longer hold them.
	// Reaching the gap alone did not make sure of it: a heal right after it let the
	// leader send entries instead of a snapshot, and a snapshot fault never fired.
	SnapshotSettle time.Duration
	Logger         *slog.Logger
	// Now is the run's clock (nanoseconds since start).
	Now func() int64
	// Seed makes the schedule reproducible.
	Seed uint64
	// AwaitRecovery, when set, is called after each heal with its time and returns
	// once the workload has recovered (or its limit passed): the quiet time between
	// faults starts from a working cluster, so each fault meets one.
	AwaitRecovery func(ctx context.Context, healedAt int64)
	// Writes, when set, lets the churn family hold back the workloads' writes.
	Writes WriteGate
}

// Nemesis injects faults into one cluster.
type Nemesis struct {
	cfg Config
	c   *cluster.Cluster
	r   *mrand.Rand
	log *slog.Logger

	mu      sync.Mutex
	faults  []Fault
	current string
	removed map[int]bool
	// findings of the fault in force, moved into its Fault when it ends.
	findings []Finding
	// clockRestarts counts the clock-restart faults begun, which set their direction
	// (clockRestart); like r, it is only used by the fault in force.
	clockRestarts int
	// clockJumps counts the clock-jump faults begun: the first goes to the leader
	// (clockJump).
	clockJumps int
}

// New returns a nemesis for c.
func New(cfg Config, c *cluster.Cluster) *Nemesis {
	return &Nemesis{cfg: cfg, c: c, r: mrand.New(mrand.NewPCG(cfg.Seed, cfg.Seed+1)), log: cfg.Logger, removed: map[int]bool{}}
}

// Faults returns the faults injected so far.
func (n *Nemesis) Faults() []Fault {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Fault(nil), n.faults...)
}

// Current names the fault in force, or "".
func (n *Nemesis) Current() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.current
}

func (n *Nemesis) jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + time.Duration(n.r.Int64N(int64(d/2)+1))
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Run injects faults until ctx ends. Each fault is healed before Run returns.
func (n *Nemesis) Run(ctx context.Context) {
	if len(n.cfg.Families) == 0 {
		<-ctx.Done()
		return
	}
	for {
		sleep(ctx, n.jitter(n.cfg.Quiet))
		if ctx.Err() != nil {
			return
		}
		family := n.cfg.Families[n.r.IntN(len(n.cfg.Families))]
		n.inject(ctx, family)
		if n.cfg.AwaitRecovery != nil && ctx.Err() == nil {
			n.cfg.AwaitRecovery(ctx, n.cfg.Now())
		}
	}
}

// kinds of each family.
var kinds = map[string][]string{
	FamilyPartition:  {"partition-halves", "partition-leader", "partition-bridge", "partition-ring", "link-slow", "link-flaky"},
	FamilyKill:       {"kill-one", "kill-leader", "kill-all"},
	FamilyPause:      {"pause-leader"},
	FamilyMembership: {"membership"},
	FamilySnapshot:   {"snapshot-isolate"},
	FamilyClock:      {"clock-skew"},
	FamilyCombined:   {"partition+kill", "pause+membership", "partition+clock"},
}

func (n *Nemesis) inject(ctx context.Context, family string) {
	list := kindsFor(family, n.c.Size())
	kind := list[n.r.IntN(len(list))]
	f := Fault{Family: family, Kind: kind, Start: n.cfg.Now()}
	n.mu.Lock()
	n.current = kind
	n.mu.Unlock()
	n.log.Info("nemesis: inject", "kind", kind)
	// Faults are held even when the run ends meanwhile, only shorter: ctx only cuts
	// holds short, and every step of a fault begun (finding the leader, setting a
	// hook, the later steps, probes, the heal) runs on heal, a context of its own, so
	// the run's end is never a step that failed.
	hold := n.jitter(n.cfg.Hold)
	heal := context.WithoutCancel(ctx)
	detail, err := n.apply(ctx, heal, kind, hold)
	f.End = n.cfg.Now()
	f.Findings = n.takeFindings()
	f.Detail = detail
	if err != nil {
		f.Err = err.Error()
		n.log.Warn("nemesis: fault did not go as planned", "kind", kind, "err", err)
	}
	n.mu.Lock()
	n.faults = append(n.faults, f)
	n.current = ""
	n.mu.Unlock()
}

func (n *Nemesis) leader(ctx context.Context) (int, error) {
	for range 50 {
		if l := n.c.Leader(ctx); l >= 0 {
			return l, nil
		}
		sleep(ctx, 100*time.Millisecond)
		if ctx.Err() != nil {
			break
		}
	}
	return -1, errors.New("no leader")
}

func (n *Nemesis) id(i int) string { return n.c.Nodes()[i].ID }

func (n *Nemesis) ids(list []int) string {
	var s []string
	for _, i := range list {
		s = append(s, n.id(i))
	}
	return strings.Join(s, ",")
}

func (n *Nemesis) others(excl ...int) []int {
	var out []int
	for i := range n.c.Size() {
		skip := false
		for _, e := range excl {
			skip = skip || e == i
		}
		if !skip {
			out = append(out, i)
		}
	}
	return out
}

func (n *Nemesis) apply(ctx, heal context.Context, kind string, hold time.Duration) (string, error) {
	if more, ok := moreKinds[kind]; ok {
		return more(n, ctx, heal, hold)
	}
	size := n.c.Size()
	switch kind {
	case "partition-halves":
		perm := n.r.Perm(size)
		minority := perm[:(size-1)/2]
		if len(minority) == 0 {
			minority = perm[:1]
		}
		majority := perm[len(minority):]
		sort.Ints(minority)
		sort.Ints(majority)
		err := n.holdCut(ctx, hold, between(minority, majority), func() { n.c.Partition([][]int{minority, majority}) })
		return fmt.Sprintf("%s | %s", n.ids(minority), n.ids(majority)), err

	case "partition-leader":
		l, err := n.leader(heal)
		if err != nil {
			return "", err
		}
		err = n.holdCut(ctx, hold, between([]int{l}, n.others(l)), func() { n.c.Partition([][]int{{l}, n.others(l)}) })
		return "isolated leader " + n.id(l), err

	case "partition-bridge":
		// One node sees both sides; the sides do not see each other. The bridge is
		// a follower and the leader is on one side: with the leader as the bridge,
		// only followers that never talk to each other would be cut.
		l, err := n.leader(heal)
		if err != nil {
			return "", err
		}
		rest := n.others(l)
		n.r.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
		bridge := rest[0]
		rest = append(rest[1:], l)
		a, b := rest[:len(rest)/2], rest[len(rest)/2:]
		err = n.holdCut(ctx, hold, between(a, b), func() { n.c.SetLinks(a, b, proxy.Setting{Mode: proxy.Cut}) })
		return fmt.Sprintf("bridge %s between %s and %s", n.id(bridge), n.ids(a), n.ids(b)), err

	case "partition-ring":
		// Every node sees its ring neighbours only: each sees a majority (for 3 and
		// 5 nodes), and no two agree on which.
		perm := n.r.Perm(size)
		pos := make([]int, size)
		for p, i := range perm {
			pos[i] = p
		}
		var cut []pair
		for i := range size {
			for j := range size {
				if d := (pos[i] - pos[j] + size) % size; i != j && d != 1 && d != size-1 {
					cut = append(cut, pair{i, j})
				}
			}
		}
		err := n.holdCut(ctx, hold, cut, func() {
			for _, l := range cut {
				n.c.Link(l.from, l.to).Set(proxy.Setting{Mode: proxy.Cut})
			}
		})
		return "ring " + n.ids(perm), err

	case "link-slow":
		lat := time.Duration(20+n.r.IntN(180)) * time.Millisecond
		all := n.others()
		err := n.holdLinks(ctx, hold, proxy.Setting{Mode: proxy.Delay, Latency: lat}, func(d proxy.Stats) error {
			if d.Delayed == 0 {
				return fmt.Errorf("nemesis: no chunk was delayed on %d links", len(all)*(len(all)-1))
			}
			return nil
		})
		return fmt.Sprintf("every link +%s", lat), err

	case "link-flaky":
		rate := 0.01 + n.r.Float64()*0.09
		all := n.others()
		var resets uint64
		err := n.holdLinks(ctx, hold, proxy.Setting{Mode: proxy.Flaky, DropRate: rate}, func(d proxy.Stats) error {
			if resets = d.Resets; resets == 0 {
				return fmt.Errorf("nemesis: no connection was reset on %d links", len(all)*(len(all)-1))
			}
			return nil
		})
		return fmt.Sprintf("every link resets with p=%.2f per chunk (%d resets)", rate, resets), err

	case "kill-one", "kill-leader", "kill-all":
		var victims []int
		switch kind {
		case "kill-one":
			victims = []int{n.r.IntN(size)}
		case "kill-leader":
			l, err := n.leader(heal)
			if err != nil {
				return "", err
			}
			victims = []int{l}
		default:
			victims = n.others()
		}
		var errs []error
		for _, v := range victims {
			if !n.c.Running(v) {
				errs = append(errs, fmt.Errorf("nemesis: %s was not running before the kill", n.id(v)))
			}
			errs = append(errs, n.c.Kill(v))
			if n.c.Running(v) {
				errs = append(errs, fmt.Errorf("nemesis: %s still runs after SIGKILL", n.id(v)))
			}
		}
		sleep(ctx, hold/2)
		for _, v := range victims {
			errs = append(errs, n.c.StartNode(v))
		}
		return "SIGKILL " + n.ids(victims), errors.Join(errs...)

	case "pause-leader":
		l, err := n.leader(heal)
		if err != nil {
			return "", err
		}
		if err := n.c.Pause(l); err != nil {
			return "", err
		}
		sleep(ctx, min(hold, 100*time.Millisecond))
		stopped := n.assertStopped(l)
		sleep(ctx, hold-min(hold, 100*time.Millisecond))
		return "SIGSTOP " + n.id(l), errors.Join(stopped, n.c.Resume(l))

	case "membership":
		return n.membership(ctx, heal, -1, false)

	case "partition+kill", "pause+membership", "partition+clock":
		return n.combined(ctx, heal, kind, hold)

	case "snapshot-isolate":
		return n.snapshotIsolate(ctx, heal, hold)

	case "clock-skew":
		l, err := n.leader(heal)
		if err != nil {
			return "", err
		}
		// Backwards by up to a minute, or forwards by up to 15 s: a forward jump
		// freezes the state machine's clock for as long after the heal (it never
		// runs backwards), which stalls the short agent leases, so it stays small.
		offset := -time.Duration(5+n.r.IntN(55)) * time.Second
		if n.r.IntN(2) == 0 {
			offset = time.Duration(2+n.r.IntN(13)) * time.Second
		}
		ms := offset.Milliseconds()
		st, err := n.c.SetHooks(heal, l, testhooks.StateUpdate{ClockOffsetMs: &ms})
		if err != nil {
			return "", err
		}
		if st.ClockOffsetMs != ms {
			return "", errors.Join(fmt.Errorf("nemesis: %s reports clock offset %d ms, set %d", n.id(l), st.ClockOffsetMs, ms), n.resetClocks(heal))
		}
		sleep(ctx, hold)
		return fmt.Sprintf("%s clock %+v", n.id(l), offset), n.resetClocks(heal)
	}
	return "", fmt.Errorf("nemesis: unknown fault %q", kind)
}

func (n *Nemesis) resetClocks(ctx context.Context) error {
	var errs []error
	zero := int64(0)
	for i := range n.c.Size() {
		if !n.c.Running(i) {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := n.c.SetHooks(cctx, i, testhooks.StateUpdate{ClockOffsetMs: &zero})
		cancel()
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// membership removes a node, wipes it, and adds it back as a new member. It never
// picks node spare (-1: any node may go). force forces the removal past the leader's
// check that the voters left that it reaches make a quorum.
func (n *Nemesis) membership(ctx, heal context.Context, spare int, force bool) (string, error) {
	l, err := n.leader(heal)
	if err != nil {
		return "", err
	}
	// Mostly a follower; sometimes the leader itself, which must hand over.
	candidates := n.others(l, spare)
	if len(candidates) == 0 {
		return "", errors.New("nemesis: no node to remove")
	}
	victim := candidates[n.r.IntN(len(candidates))]
	if n.r.IntN(4) == 0 && l != spare {
		victim = l
	}
	id := n.id(victim)
	rctx, cancel := context.WithTimeout(heal, 20*time.Second)
	defer cancel()
	if err := n.c.Remove(rctx, id, force); err != nil {
		// The answer may be lost while the removal went through (removing the
		// leader ends its leadership). Wiping a node that is still a voter would let
		// it vote twice in a term, which no real failure does; so go on only once the
		// configuration shows it gone.
		actx, stop := context.WithTimeout(heal, 15*time.Second)
		gone := n.awaitRemoved(actx, victim)
		stop()
		if !gone {
			return "remove " + id, err
		}
	}
	n.mu.Lock()
	n.removed[victim] = true
	n.mu.Unlock()
	if err := n.c.Terminate(victim, 10*time.Second); err != nil {
		return "remove " + id, err
	}
	if err := n.c.Wipe(victim); err != nil {
		return "remove " + id, err
	}
	sleep(ctx, time.Second)
	if err := n.rejoin(heal, victim); err != nil {
		return "remove " + id + ", wipe, add back", err
	}
	return "remove " + id + ", wipe, add back", nil
}

// awaitRemoved reports whether a leader other than node i shows a configuration
// without it, polling until ctx ends.
func (n *Nemesis) awaitRemoved(ctx context.Context, i int) bool {
	for ctx.Err() == nil {
		if l := n.c.Leader(ctx); l >= 0 && l != i {
			if info, err := n.c.Info(ctx, l); err == nil {
				member := false
				for _, m := range info.Nodes {
					member = member || m.ID == n.id(i)
				}
				if !member {
					return true
				}
			}
		}
		sleep(ctx, 200*time.Millisecond)
	}
	return false
}

// rejoin starts a wiped node (it joins through the others) and waits until it is a
// voter again.
func (n *Nemesis) rejoin(ctx context.Context, i int) error {
	if err := n.c.StartNode(i); err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if l := n.c.Leader(ctx); l >= 0 {
			if info, err := n.c.Info(ctx, l); err == nil {
				for _, m := range info.Nodes {
					if m.ID == n.id(i) && m.Suffrage == "voter" {
						n.mu.Lock()
						delete(n.removed, i)
						n.mu.Unlock()
						return nil
					}
				}
			}
		}
		sleep(ctx, 200*time.Millisecond)
	}
	return fmt.Errorf("nemesis: %s did not rejoin within a minute", n.id(i))
}

// snapshotIsolate cuts a follower off until the others have committed far enough past
// it that their logs no longer hold what it misses, so it must install a snapshot.
func (n *Nemesis) snapshotIsolate(ctx, heal context.Context, hold time.Duration) (string, error) {
	l, err := n.leader(heal)
	if err != nil {
		return "", err
	}
	victim := n.others(l)[n.r.IntN(n.c.Size()-1)]
	return n.isolateUntilSnapshot(ctx, heal, hold, victim)
}

// isolateUntilSnapshot cuts node victim off until the others have committed far
// enough past it that it must install a snapshot, then heals the network.
func (n *Nemesis) isolateUntilSnapshot(ctx, heal context.Context, hold time.Duration, victim int) (string, error) {
	var from uint64
	if info, err := n.c.Info(heal, victim); err == nil {
		from = info.AppliedIndex
	}
	n.c.Partition([][]int{{victim}, n.others(victim)})
	target := from + n.cfg.SnapshotGap
	var reached uint64
	// Wait for the gap, at least hold and at most a bounded time even if the run ends.
	deadline := time.Now().Add(max(4*hold, 30*time.Second))
	start := time.Now()
	wctx := heal
	for time.Now().Before(deadline) {
		if cur := n.c.Leader(wctx); cur >= 0 && cur != victim {
			if info, err := n.c.Info(wctx, cur); err == nil {
				reached = info.CommitIndex
			}
		}
		if reached >= target && time.Since(start) >= hold {
			sleep(wctx, n.cfg.SnapshotSettle)
			break
		}
		if ctx.Err() != nil && time.Since(start) >= hold {
			break
		}
		sleep(wctx, 200*time.Millisecond)
	}
	n.c.HealNetwork()
	detail := fmt.Sprintf("isolated %s at index %d until the others reached %d (wanted %d)", n.id(victim), from, reached, target)
	if reached < target && ctx.Err() != nil {
		// The workload stops with the run: a log that did not move after it proves
		// nothing either way (see holdCut).
		return detail + "; the run ended first", nil
	}
	if reached < target {
		return detail, fmt.Errorf("nemesis: the log did not move far enough for a snapshot install")
	}
	return detail, nil
}

// HealAll ends every fault: links pass, paused nodes continue, dead nodes start,
// removed nodes come back, clocks are reset. It waits up to limit for a healthy cluster.
func (n *Nemesis) HealAll(ctx context.Context, limit time.Duration) error {
	n.c.HealNetwork()
	var errs []error
	for i := range n.c.Size() {
		if n.c.Paused(i) {
			errs = append(errs, n.c.Resume(i))
		}
	}
	n.mu.Lock()
	removed := make([]int, 0, len(n.removed))
	for i := range n.removed {
		removed = append(removed, i)
	}
	n.mu.Unlock()
	for i := range n.c.Size() {
		if !n.c.Running(i) && !contains(removed, i) {
			errs = append(errs, n.c.StartNode(i))
		}
	}
	for _, i := range removed {
		_ = n.c.Terminate(i, 5*time.Second)
		errs = append(errs, n.c.Wipe(i), n.rejoin(ctx, i))
	}
	if err := n.c.WaitHealthy(ctx, limit); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrUnhealed, err))
	}
	errs = append(errs, n.resetClocks(ctx))
	return errors.Join(errs...)
}

func contains(list []int, x int) bool {
	for _, v := range list {
		if v == x {
			return true
		}
	}
	return false
}
