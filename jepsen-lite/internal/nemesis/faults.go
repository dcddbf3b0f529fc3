package nemesis

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testhooks"
)

// The fault families of issue 12: leader churn with no write in between, storage
// faults under a running node, and clock jumps of minutes on one node.
const (
	FamilyChurn     = "churn"
	FamilyStorage   = "storage"
	FamilyClockJump = "clock-jump"

	FamilyStorageSnapshot = "storage-snapshot"
	FamilyStorageDiskFull = "storage-disk-full"
	FamilyStorageStall    = "storage-stall"
	FamilyChurnTransfer   = "churn-transfer"
)

// Finding kinds: what a family saw itself that the history cannot show.
const (
	// FindingWedged: after leader churn without writes, a node did not serve ready,
	// a linearizable read or a replay within churnProbeLimit.
	FindingWedged = "wedged-after-churn"
	// FindingStalledLeaderKept: while the leader's Raft log held every append (a disk
	// that stopped completing writes), no other node led within stallElectionLimit.
	FindingStalledLeaderKept = "stalled-leader-kept"
	// FindingTimeFrozen: after a clock jump was undone, a short lease did not run out
	// within timeProbeLimit of its end.
	FindingTimeFrozen = "time-frozen"
)

// ErrUnhealed marks a HealAll whose every process runs and every fault is off, yet
// the nodes did not come back as voters that agree on a leader within 90 s: the
// system under test failed, not the harness (a replica halted for good, say).
var ErrUnhealed = errors.New("nemesis: the cluster did not heal")

// OnlyUnhealed reports whether err (from HealAll) is ErrUnhealed and nothing else.
func OnlyUnhealed(err error) bool {
	if err == nil || !errors.Is(err, ErrUnhealed) {
		return false
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if e != nil && !errors.Is(e, ErrUnhealed) {
				return false
			}
		}
	}
	return true
}

// Finding is an anomaly a fault family observed while it ran; the verdict counts it.
type Finding struct {
	Kind   string `json:"kind"`
	Detail string `json:"detail"`
}

// WriteGate holds back the workloads' writes for a read-only phase.
type WriteGate interface {
	PauseWrites()
	ResumeWrites()
}

func init() {
	Families = append(Families, FamilyChurn, FamilyStorage, FamilyClockJump)
	kinds[FamilyChurn] = []string{"churn-transfer", "churn-restart"}
	kinds[FamilyStorage] = []string{"disk-full", "raft-log-write", "raft-log-read", "raft-log-stall", "snapshot-install-fails"}
	kinds[FamilyClockJump] = []string{"clock-jump"}
	// One kind each, for tests that need a given fault to happen in a short run; not
	// part of "all".
	kinds[FamilyStorageSnapshot] = []string{"snapshot-install-fails"}
	kinds[FamilyStorageDiskFull] = []string{"disk-full"}
	kinds[FamilyStorageStall] = []string{"raft-log-stall"}
	kinds[FamilyChurnTransfer] = []string{"churn-transfer"}
}

// moreKinds injects the kinds of the families in this file.
var moreKinds = map[string]func(n *Nemesis, ctx, heal context.Context, hold time.Duration) (string, error){
	"churn-transfer": func(n *Nemesis, ctx, heal context.Context, _ time.Duration) (string, error) {
		return n.churn(heal, false)
	},
	"churn-restart": func(n *Nemesis, ctx, heal context.Context, _ time.Duration) (string, error) {
		return n.churn(heal, true)
	},
	"disk-full":              storageFault(testhooks.FaultPebbleFull),
	"raft-log-write":         storageFault(testhooks.FaultRaftLogWrite),
	"raft-log-read":          storageFault(testhooks.FaultRaftLogRead),
	"raft-log-stall":         (*Nemesis).raftLogStall,
	"snapshot-install-fails": (*Nemesis).snapshotInstallFails,
	"clock-jump":             (*Nemesis).clockJump,
}

func (n *Nemesis) find(kind, format string, args ...any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.findings = append(n.findings, Finding{Kind: kind, Detail: fmt.Sprintf(format, args...)})
}

func (n *Nemesis) takeFindings() []Finding {
	n.mu.Lock()
	defer n.mu.Unlock()
	f := n.findings
	n.findings = nil
	return f
}

// Churn sizes. Every election appends a no-op and the new leader's barrier, neither
// of which reaches the state machine; the old wedge came after 32 elections (a gap of
// 64 entries). 48 transfers is half as many again, and restarts add elections of
// their own.
const (
	churnTransfers  = 48
	churnRestarts   = 6
	churnProbeLimit = 15 * time.Second
	churnSettle     = 6 * time.Second
	probeTenant     = "jepsen-probe"
)

// churn holds back every workload write, then moves leadership around many times
// (transfers, or graceful restarts of the leader, which hand leadership over), and
// then asks every node for readiness, a linearizable read and a replay of a key
// committed before: all must come within churnProbeLimit, with no write in between.
func (n *Nemesis) churn(ctx context.Context, restarts bool) (string, error) {
	key := fmt.Sprintf("churn-%d", n.cfg.Now())
	fp := strings.Repeat("c", 64)
	if err := n.probeCommit(ctx, key, fp); err != nil {
		return "", fmt.Errorf("nemesis: probe key: %w", err)
	}
	if n.cfg.Writes != nil {
		n.cfg.Writes.PauseWrites()
		defer n.cfg.Writes.ResumeWrites()
		// Writes already sent finish within the op timeout (3 s), and the records of
		// the short-lease workload (TTL 3 s) expire and are swept soon after: each of
		// those is an entry that reaches the state machine and would hide a wedge.
		sleep(ctx, churnSettle)
	}
	var moves, fails int
	var errs []error
	if restarts {
		for range churnRestarts {
			l, err := n.leader(ctx)
			if err != nil {
				errs = append(errs, err)
				break
			}
			if err := n.c.Terminate(l, 10*time.Second); err != nil {
				errs = append(errs, err)
			}
			if err := n.c.StartNode(l); err != nil {
				errs = append(errs, err)
			}
			if err := n.c.WaitHealthy(ctx, 30*time.Second); err != nil {
				errs = append(errs, err)
				break
			}
			moves++
		}
	}
	for range churnTransfers {
		l, err := n.leader(ctx)
		if err != nil {
			errs = append(errs, err)
			break
		}
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = n.c.TransferLeadership(tctx, l)
		cancel()
		if err != nil {
			fails++
			continue
		}
		moves++
		// Wait until some node leads in a later term than l did.
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if nl := n.c.Leader(ctx); nl >= 0 && nl != l {
				break
			}
			sleep(ctx, 20*time.Millisecond)
		}
	}
	detail := fmt.Sprintf("%d leadership moves (%d transfers refused) with writes held back", moves, fails)
	if restarts {
		detail = fmt.Sprintf("%d graceful leader restarts, then %s", churnRestarts, detail)
	}
	if err := n.probeServed(ctx, key, fp); err != nil {
		n.find(FindingWedged, "after %s: %v", detail, err)
		detail += "; reads NOT served"
		// One write that reaches the state machine ends such a wedge; without it the
		// final reads of a run that ends now would wait forever and judge nothing.
		if err := n.probeCommit(ctx, key+"-unwedge", fp); err != nil {
			detail += "; the write after it failed too: " + err.Error()
		}
	} else {
		detail += "; every node then served ready, a linearizable read and a replay"
	}
	return detail, errors.Join(errs...)
}

func (n *Nemesis) probeReserve(key, fp string) idemkv.ReserveRequest {
	return idemkv.ReserveRequest{Tenant: probeTenant, Key: key, Tool: "probe", Fingerprint: fp,
		AttemptID: "probe-" + key, LeaseTTLMs: 60_000, TTLMs: 3_600_000}
}

// probeCommit reserves and commits key, retrying through leader changes.
func (n *Nemesis) probeCommit(ctx context.Context, key, fp string) error {
	err := n.onLeader(ctx, func(l int) error {
		var rr idemkv.ReserveResult
		if err := n.c.Call(ctx, l, "POST", "/v1/reserve", n.probeReserve(key, fp), &rr); err != nil {
			return err
		}
		if rr.Decision == idemkv.DecisionReplay {
			return nil
		}
		commit := idemkv.CommitRequest{Tenant: probeTenant, Key: key, Fingerprint: fp, Fence: rr.Fence,
			RemoteSystem: "probe", RemoteID: key}
		return n.c.Call(ctx, l, "POST", "/v1/commit", commit, nil)
	})
	if err != nil {
		return fmt.Errorf("no committed probe key: %w", err)
	}
	return nil
}

// onLeader calls f with whichever node leads until it succeeds, for up to 30 s.
func (n *Nemesis) onLeader(ctx context.Context, f func(leader int) error) error {
	var last error
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		l, err := n.leader(ctx)
		if err != nil {
			last = err
			continue
		}
		if last = f(l); last == nil {
			return nil
		}
		sleep(ctx, 200*time.Millisecond)
	}
	return fmt.Errorf("nothing succeeded within 30 s: %w", last)
}

// probeServed asks every running node for readiness, a linearizable read of key and
// a replay of it, until all three answer on every node or churnProbeLimit passes.
func (n *Nemesis) probeServed(ctx context.Context, key, fp string) error {
	deadline := time.Now().Add(churnProbeLimit)
	path := "/v1/records/" + url.PathEscape(probeTenant) + "/" + url.PathEscape(key)
	var last error
	for {
		last = nil
		for i := range n.c.Size() {
			if !n.c.Running(i) {
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			st, err := n.c.Status(pctx, i, "/readyz")
			if err == nil && st != 200 {
				err = fmt.Errorf("/readyz answered %d", st)
			}
			var rec idemkv.Record
			if err == nil {
				err = n.c.Call(pctx, i, "GET", path, nil, &rec)
			}
			if err == nil && rec.Status != idemkv.StatusCommitted {
				err = fmt.Errorf("read %s as %q", key, rec.Status)
			}
			var rr idemkv.ReserveResult
			if err == nil {
				err = n.c.Call(pctx, i, "POST", "/v1/reserve", n.probeReserve(key, fp), &rr)
			}
			if err == nil && rr.Decision != idemkv.DecisionReplay {
				err = fmt.Errorf("reserve of the committed %s answered %q", key, rr.Decision)
			}
			cancel()
			if err != nil {
				last = errors.Join(last, fmt.Errorf("%s: %w", n.id(i), err))
			}
		}
		if last == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("not served within %s: %w", churnProbeLimit, last)
		}
		sleep(ctx, 250*time.Millisecond)
	}
}

// storageFault returns the injector of one storage fault on one node (the leader
// half the time): on for the hold, then off; a node the fault stopped is started
// again, as an operator would once the disk is fixed.
func storageFault(fault string) func(n *Nemesis, ctx, heal context.Context, hold time.Duration) (string, error) {
	return func(n *Nemesis, ctx, heal context.Context, hold time.Duration) (string, error) {
		victim := n.r.IntN(n.c.Size())
		if n.r.IntN(2) == 0 {
			if l, err := n.leader(heal); err == nil {
				victim = l
			}
		}
		if _, err := n.c.SetFaults(heal, victim, []string{fault}); err != nil {
			return "", err
		}
		sleep(ctx, hold)
		return n.clearFault(heal, victim, fault, ctx.Err() != nil)
	}
}

// clearFault switches the faults off on node i (or starts it again if they stopped
// it) and describes what the fault did. A fault that never fired is a harness error,
// unless the end of the run cut its hold short (cutShort): the workload stops with
// the run, and a fault of a store nobody writes to proves nothing either way (see
// holdCut).
func (n *Nemesis) clearFault(ctx context.Context, i int, fault string, cutShort bool) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	st, err := n.c.SetFaults(cctx, i, nil)
	cancel()
	if err == nil {
		fired := st.Injected[fault]
		detail := fmt.Sprintf("%s on %s: %d operations failed, node kept running", fault, n.id(i), fired)
		if fired == 0 && cutShort {
			return detail + " (the run ended during the hold)", nil
		}
		if fired == 0 {
			return detail, fmt.Errorf("nemesis: %s on %s never fired", fault, n.id(i))
		}
		// A node whose state machine halted on a storage error stops Raft and says so
		// on /readyz until it is restarted on a healthy store, as its log asks the
		// operator to: do that.
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		rerr := n.c.Call(rctx, i, "GET", "/readyz", nil, nil)
		cancel()
		if rerr != nil && strings.Contains(rerr.Error(), "halted") {
			detail = fmt.Sprintf("%s on %s: %d operations failed, the node halted; restarted", fault, n.id(i), fired)
			return detail, errors.Join(n.c.Terminate(i, 10*time.Second), n.c.StartNode(i))
		}
		return detail, nil
	}
	if n.c.Running(i) && !n.c.Paused(i) {
		// Alive but not answering: stop it the hard way before starting it again.
		_ = n.c.Kill(i)
	}
	detail := fmt.Sprintf("%s on %s stopped the node; started again", fault, n.id(i))
	return detail, n.c.StartNode(i)
}

// stallElectionLimit is how long after the leader's first held append another node
// must lead: the node's stall limit (five election timeouts and at least 5 s: 5 s with
// jepsen-lite's nodes) and an election, with room for a loaded machine.
const stallElectionLimit = 15 * time.Second

// raftLogStall holds every Raft log append of the leader, as a disk that stopped
// completing writes, and requires another node to lead within stallElectionLimit of
// the first held append: the held leader must stop telling the followers it is there.
// Then the disk completes the writes again, and the old leader must follow.
func (n *Nemesis) raftLogStall(ctx, heal context.Context, hold time.Duration) (string, error) {
	l, err := n.leader(heal)
	if err != nil {
		return "", err
	}
	fault := testhooks.FaultRaftLogStall
	if _, err := n.c.SetFaults(heal, l, []string{fault}); err != nil {
		return "", err
	}
	start := time.Now()
	// The workload's writes reach the leader's log at once; wait for one to be held.
	held := false
	for !held && time.Since(start) < 10*time.Second && ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(heal, time.Second)
		st, err := n.c.Faults(cctx, l)
		cancel()
		held = err == nil && st.Injected[fault] > 0
		if !held {
			sleep(ctx, 50*time.Millisecond)
		}
	}
	detail := "raft-log-stall on the leader " + n.id(l)
	var elected time.Duration
	ok := false
	if held {
		elected, ok = n.awaitLeaderOtherThan(ctx, l, stallElectionLimit)
	}
	switch {
	case !held:
		detail += ": no append held"
	case ok:
		detail += fmt.Sprintf(": a new leader %s after the first held append", elected.Round(10*time.Millisecond))
	case ctx.Err() != nil:
		detail += ": the run ended before another node led"
	default:
		n.find(FindingStalledLeaderKept, "no other node led within %s of the first held Raft log append of the leader %s",
			stallElectionLimit, n.id(l))
		detail += ": no other node led"
	}
	sleep(ctx, max(0, hold-time.Since(start)))
	d, err := n.clearFault(heal, l, fault, ctx.Err() != nil)
	return detail + "; " + d, err
}

// snapshotInstallFails cuts a follower off until it needs a snapshot, with every
// snapshot read on it failing midway, lets the install fail for the hold, then lets
// it succeed.
func (n *Nemesis) snapshotInstallFails(ctx, heal context.Context, hold time.Duration) (string, error) {
	l, err := n.leader(heal)
	if err != nil {
		return "", err
	}
	victim := n.others(l)[n.r.IntN(n.c.Size()-1)]
	if _, err := n.c.SetFaults(heal, victim, []string{testhooks.FaultSnapshotRestore}); err != nil {
		return "", err
	}
	iso, isoErr := n.isolateUntilSnapshot(ctx, heal, hold, victim)
	// The install starts once the leader next contacts the victim; wait for the first
	// cut read (even when the run is ending), then hold the fault.
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		var st testhooks.FaultState
		if err := n.c.Call(heal, victim, "GET", testhooks.PathFaults, nil, &st); err != nil || st.Injected[testhooks.FaultSnapshotRestore] > 0 {
			break
		}
		sleep(heal, 200*time.Millisecond)
	}
	sleep(ctx, hold)
	detail, err := n.clearFault(heal, victim, testhooks.FaultSnapshotRestore, ctx.Err() != nil)
	return iso + "; " + detail, errors.Join(isoErr, err)
}

// clockJump moves one node's clock forward by minutes, then back by minutes, then
// resets it. Only a leader stamps, so the first jump of a run goes to the leader, and
// two in three after it: a run whose jumps all went to followers (which stamp only
// once they lead) tested nothing of the stamp bound. Each offset must read back from
// the node, and the detail says whether the node led when its forward jump ended.
func (n *Nemesis) clockJump(ctx, heal context.Context, hold time.Duration) (string, error) {
	n.clockJumps++
	victim := n.r.IntN(n.c.Size())
	toLeader := n.r.IntN(3) > 0 || n.clockJumps == 1
	role := "a node drawn at random"
	if toLeader {
		role = "no leader found: a node drawn at random"
		if l, err := n.leader(heal); err == nil {
			victim, role = l, "the leader"
		}
	}
	fwd := time.Duration(2+n.r.IntN(4)) * time.Minute
	back := -time.Duration(2+n.r.IntN(4)) * time.Minute
	led := false
	for i, off := range []time.Duration{fwd, back} {
		ms := off.Milliseconds()
		st, err := n.c.SetHooks(heal, victim, testhooks.StateUpdate{ClockOffsetMs: &ms})
		if err != nil {
			return "", errors.Join(err, n.resetClocks(heal))
		}
		if st.ClockOffsetMs != ms {
			return "", errors.Join(fmt.Errorf("nemesis: %s reports clock offset %d ms, set %d", n.id(victim), st.ClockOffsetMs, ms), n.resetClocks(heal))
		}
		sleep(ctx, hold/2)
		if i == 0 {
			led = n.c.Leader(heal) == victim
		}
	}
	detail := fmt.Sprintf("%s (%s) clock %+v, then %+v", n.id(victim), role, fwd, back)
	if led {
		detail += "; it led when the forward jump ended"
	} else {
		detail += "; it did not lead when the forward jump ended"
	}
	if err := n.resetClocks(heal); err != nil {
		return detail, err
	}
	if err := n.probeTimeMoves(heal); err != nil {
		n.find(FindingTimeFrozen, "after %s: %v", detail, err)
		return detail + "; leases did NOT run out in time after the reset", nil
	}
	return detail + "; after the reset a 1 s lease ran out in time", nil
}

// timeProbeLimit is how long past its end a 1 s lease may still hold once every clock
// is right again. A bounded clock step may leave the state machine's clock somewhat
// ahead; a clock that took the jump whole stays minutes ahead.
const timeProbeLimit = 20 * time.Second

// probeTimeMoves takes a 1 s lease on a fresh key and asks for the key again, as
// another attempt, until it is granted recover: with every clock right, that must
// come within timeProbeLimit of the lease's end. A state machine clock that a jumped
// leader pushed minutes ahead (issue 12, defect 5) keeps answering in_progress.
func (n *Nemesis) probeTimeMoves(ctx context.Context) error {
	key := fmt.Sprintf("clock-%d", n.cfg.Now())
	fp := strings.Repeat("d", 64)
	first := idemkv.ReserveRequest{Tenant: probeTenant, Key: key, Tool: "probe", Fingerprint: fp,
		AttemptID: "probe-a-" + key, LeaseTTLMs: 1000, TTLMs: 3_600_000}
	second := first
	second.AttemptID = "probe-b-" + key
	var last error
	granted := false
	deadline := time.Now().Add(30 * time.Second)
	for !granted && time.Now().Before(deadline) && ctx.Err() == nil {
		var rr idemkv.ReserveResult
		if last = n.c.Call(ctx, n.anyRunning(), "POST", "/v1/reserve", first, &rr); last == nil {
			granted = rr.Decision == idemkv.DecisionExecute
			if !granted {
				return fmt.Errorf("the probe key %s was not fresh: %q", key, rr.Decision)
			}
			break
		}
		sleep(ctx, 200*time.Millisecond)
	}
	if !granted {
		return fmt.Errorf("no lease on the probe key: %w", last)
	}
	start := time.Now()
	sleep(ctx, 1100*time.Millisecond)
	var seen idemkv.Decision
	for time.Since(start) < time.Second+timeProbeLimit && ctx.Err() == nil {
		var rr idemkv.ReserveResult
		if err := n.c.Call(ctx, n.anyRunning(), "POST", "/v1/reserve", second, &rr); err == nil {
			if rr.Decision == idemkv.DecisionRecover {
				return nil
			}
			seen = rr.Decision
		}
		sleep(ctx, 500*time.Millisecond)
	}
	return fmt.Errorf("a 1 s lease still held %s after it began (last answer %q)", time.Since(start).Round(time.Second), seen)
}

func (n *Nemesis) anyRunning() int {
	for i := range n.c.Size() {
		if n.c.Running(i) && !n.c.Paused(i) {
			return i
		}
	}
	return 0
}
