package workload

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

// The short-lease workload puts time inside the model. The register workload leases
// for an hour so that its model can ignore time; here leases last one or two seconds
// and records a few, so within a run leases run out, holders are recovered from,
// committed records expire and their keys are granted afresh, all while the nemesis
// runs. Its checker (CheckLeases) reads the times the state machine stamped on every
// answer: no two attempts ever hold live leases on a key at the same stamped time,
// recover is granted only once the previous holder's lease_expires_at has passed, and
// fences grow with the stamps.

const (
	leaseTool = "jepsen.lease"
	leaseFP   = "sha256:3333333333333333333333333333333333333333333333333333333333333333"
)

// Anomaly kinds of the short-lease workload.
const (
	// AnomalyEarlyRecover: a recover was granted at a stamped time before the lease
	// the previous holder was told it had.
	AnomalyEarlyRecover = "early-recover"
	// AnomalyOverlappingLeases: a new attempt was granted the key while the previous
	// holder's lease was live and nothing had ended it.
	AnomalyOverlappingLeases = "overlapping-leases"
	// AnomalyFenceOrder: a grant stamped later carries a lower fence.
	AnomalyFenceOrder = "fence-order"
	// AnomalyStaleFenceAccepted: a commit with a fence older than a grant that was
	// answered before the commit was sent succeeded.
	AnomalyStaleFenceAccepted = "stale-fence-accepted"
)

// LeaseConfig configures the short-lease workload.
type LeaseConfig struct {
	Clients int
	Keys    int
	// Leases are drawn from [LeaseMin, LeaseMax]; TTL is every record's retention.
	LeaseMin, LeaseMax time.Duration
	TTL                time.Duration
}

// Lease is the short-lease workload.
type Lease struct {
	cfg LeaseConfig
	api *API
	rec *history.Recorder
}

// NewLease prepares the workload.
func NewLease(cfg LeaseConfig, api *API, rec *history.Recorder) *Lease {
	cfg.Clients, cfg.Keys = max(cfg.Clients, 1), max(cfg.Keys, 1)
	return &Lease{cfg: cfg, api: api, rec: rec}
}

type leaseClient struct {
	id, process int
	r           *mrand.Rand
}

// Run runs the clients until ctx ends.
func (w *Lease) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for i := range w.cfg.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &leaseClient{id: i, process: 200000 + i, r: mrand.New(mrand.NewPCG(uint64(i)+99, uint64(time.Now().UnixNano())))}
			for ctx.Err() == nil {
				w.step(ctx, c)
			}
		}()
	}
	wg.Wait()
}

func (w *Lease) pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// call records one operation around send, which returns its output and result.
func (w *Lease) call(ctx context.Context, c *leaseClient, f, key string, in history.Input, send func(node int) (*history.Output, result)) (*history.Output, result) {
	node := c.r.IntN(len(w.api.Addrs()))
	op := &history.Op{Process: c.process, Client: 100000 + c.id, Workload: "lease", F: f, Key: key, In: in, Node: w.api.Addrs()[node]}
	w.rec.Invoke(op)
	out, r := send(node)
	if ctx.Err() != nil && r.typ != history.OK {
		r = result{typ: history.Info, msg: "run ended: " + r.msg}
	}
	w.rec.Complete(op, r.typ, out, r.msg)
	if r.typ == history.Info {
		c.process += w.cfg.Clients
	}
	if r.typ != history.OK {
		w.pause(ctx, time.Duration(50+c.r.IntN(200))*time.Millisecond)
	}
	return out, r
}

func (w *Lease) step(ctx context.Context, c *leaseClient) {
	lease := w.cfg.LeaseMin + time.Duration(c.r.Int64N(int64(w.cfg.LeaseMax-w.cfg.LeaseMin)+1))
	lease = lease.Truncate(time.Millisecond)
	if c.r.IntN(4) == 0 {
		w.lateCommit(ctx, c, lease)
		return
	}
	key := fmt.Sprintf("lease:%d", c.r.IntN(w.cfg.Keys))
	out := w.reserve(ctx, c, key, lease)
	switch {
	case out == nil:
	case out.Decision == string(idemkv.DecisionExecute) || out.Decision == string(idemkv.DecisionRecover):
		w.hold(ctx, c, key, out.Grant, lease)
	case out.Decision == string(idemkv.DecisionInProgress):
		// Come back somewhere around the holder's lease.
		w.pause(ctx, time.Duration(c.r.Int64N(int64(lease))))
	}
}

// reserve reserves key with lease; a reserve whose answer was lost is asked again with
// the same attempt id, twice. It returns the answer, nil when there was none or it was
// an error.
func (w *Lease) reserve(ctx context.Context, c *leaseClient, key string, lease time.Duration) *history.Output {
	req := idemkv.ReserveRequest{Tenant: Tenant, Key: key, Tool: leaseTool, Actor: fmt.Sprintf("lease-%d", c.id),
		Fingerprint: leaseFP, AttemptID: idemkv.NewAttemptID(), LeaseTTLMs: lease.Milliseconds(), TTLMs: w.cfg.TTL.Milliseconds()}
	for try := 0; try < 3 && ctx.Err() == nil; try++ {
		out, r := w.call(ctx, c, history.FReserve, key, history.Input{Tool: leaseTool, Fingerprint: leaseFP, AttemptID: req.AttemptID},
			func(node int) (*history.Output, result) {
				out, _, r := w.api.Reserve(ctx, node, &req)
				return out, r
			})
		switch {
		case r.typ == history.Info:
			continue
		case r.typ != history.OK || out.Err != "":
			return nil
		}
		return out
	}
	return nil
}

// lateCommit works the client's own key, which no other client reserves: it takes the
// key, lets the lease run out and commits just after. Nobody recovered the key, so the
// fence is still current and the commit lands (docs/protocol.md section 1: an expired
// lease does not by itself void a commit); a reserve right after must replay its
// receipt until the record expires (CheckAcknowledged). On the shared keys a commit
// that late is nearly always fenced.
func (w *Lease) lateCommit(ctx context.Context, c *leaseClient, lease time.Duration) {
	key := fmt.Sprintf("lease:own:%d", c.id)
	out := w.reserve(ctx, c, key, lease)
	if out == nil || (out.Decision != string(idemkv.DecisionExecute) && out.Decision != string(idemkv.DecisionRecover)) {
		return
	}
	w.pause(ctx, lease+time.Duration(c.r.Int64N(int64(lease/4))))
	if ctx.Err() != nil {
		return
	}
	in := history.Input{Fingerprint: leaseFP, Fence: out.Grant, RemoteID: fmt.Sprintf("L-%s-%d", key, out.Grant)}
	in.RemoteURL, in.Result = remoteURL(c.r, "jepsen", in.RemoteID), randomResult(c.r, in.RemoteID)
	w.call(ctx, c, history.FCommit, key, in, func(node int) (*history.Output, result) {
		return w.api.Commit(ctx, node, &idemkv.CommitRequest{Tenant: Tenant, Key: key, Fingerprint: leaseFP, Fence: out.Grant,
			RemoteSystem: "jepsen", RemoteID: in.RemoteID, RemoteURL: in.RemoteURL, Result: in.Result})
	})
	w.reserve(ctx, c, key, lease)
}

// hold uses a grant: a few heartbeats, then a commit, a release, or nothing at all
// (the holder "dies" and the lease runs out), and sometimes, long after, a zombie
// commit with the old fence.
func (w *Lease) hold(ctx context.Context, c *leaseClient, key string, fence uint64, lease time.Duration) {
	in := history.Input{Fingerprint: leaseFP, Fence: fence}
	for hb := c.r.IntN(3); hb > 0 && ctx.Err() == nil; hb-- {
		w.pause(ctx, time.Duration(c.r.Int64N(int64(lease/2))))
		hin := in
		hin.Fingerprint = ""
		out, r := w.call(ctx, c, history.FHeartbeat, key, hin, func(node int) (*history.Output, result) {
			return w.api.Heartbeat(ctx, node, &idemkv.HeartbeatRequest{Tenant: Tenant, Key: key, Fence: fence, LeaseTTLMs: lease.Milliseconds()})
		})
		if r.typ == history.OK && out.Err != "" {
			return
		}
	}
	w.pause(ctx, time.Duration(c.r.Int64N(int64(lease/2))))
	commit := func() {
		cin := in
		cin.RemoteID = fmt.Sprintf("L-%s-%d", key, fence)
		cin.RemoteURL, cin.Result = remoteURL(c.r, "jepsen", cin.RemoteID), randomResult(c.r, cin.RemoteID)
		w.call(ctx, c, history.FCommit, key, cin, func(node int) (*history.Output, result) {
			return w.api.Commit(ctx, node, &idemkv.CommitRequest{Tenant: Tenant, Key: key, Fingerprint: leaseFP, Fence: fence,
				RemoteSystem: "jepsen", RemoteID: cin.RemoteID, RemoteURL: cin.RemoteURL, Result: cin.Result})
		})
	}
	switch n := c.r.IntN(20); {
	case n < 5:
		commit()
	case n < 10:
		w.call(ctx, c, history.FRelease, key, in, func(node int) (*history.Output, result) {
			return w.api.Release(ctx, node, &idemkv.ReleaseRequest{Tenant: Tenant, Key: key, Fingerprint: leaseFP, Fence: fence})
		})
	case n < 14:
		// A zombie: it wakes after its lease and commits as if it still held the key.
		w.pause(ctx, lease+time.Duration(c.r.Int64N(int64(lease))))
		if ctx.Err() == nil {
			commit()
		}
	}
}

// grantInfo is what the answers showed about one fence on one key.
type grantInfo struct {
	fence    uint64
	decision string
	// stamp is the earliest updated_at of a grant answer: when the lease began.
	stamp int64
	// expiry is the latest lease_expires_at any acknowledged answer reported.
	expiry int64
	// ends are the run times at which a commit, fail or release of the fence was
	// sent (its outcome may be unknown): from then on its lease may have ended
	// before its expiry.
	ends []int64
	// granted is when the first grant answer came back (run time).
	granted int64
	op      int64
}

func (g *grantInfo) endedBefore(t int64) bool {
	for _, e := range g.ends {
		if e < t {
			return true
		}
	}
	return false
}

// CheckLeases judges the short-lease workload from the stamped times in its answers.
func CheckLeases(ops []history.Op) []AgentAnomaly {
	byKey := map[string]map[uint64]*grantInfo{}
	get := func(key string, fence uint64) *grantInfo {
		m := byKey[key]
		if m == nil {
			m = map[uint64]*grantInfo{}
			byKey[key] = m
		}
		g := m[fence]
		if g == nil {
			g = &grantInfo{fence: fence}
			m[fence] = g
		}
		return g
	}
	for i := range ops {
		op := &ops[i]
		if op.Workload != "lease" {
			continue
		}
		switch op.F {
		case history.FCommit, history.FFail, history.FRelease:
			if op.Type != history.Fail {
				g := get(op.Key, op.In.Fence)
				g.ends = append(g.ends, op.Call)
			}
		}
		if op.Type != history.OK || op.Out == nil || op.Out.Err != "" || op.Out.Record == nil {
			continue
		}
		rec := op.Out.Record
		switch {
		case op.F == history.FReserve && (op.Out.Decision == string(idemkv.DecisionExecute) || op.Out.Decision == string(idemkv.DecisionRecover)):
			g := get(op.Key, op.Out.Grant)
			if g.decision == "" || rec.UpdatedAt < g.stamp {
				g.stamp = rec.UpdatedAt
			}
			if g.decision == "" || op.Return < g.granted {
				g.granted, g.op = op.Return, op.ID
			}
			if g.decision == "" || op.Out.Decision == string(idemkv.DecisionRecover) {
				g.decision = op.Out.Decision
			}
			g.expiry = max(g.expiry, rec.LeaseExpiresAt)
		case op.F == history.FHeartbeat && rec.Fence == op.In.Fence:
			g := get(op.Key, rec.Fence)
			g.expiry = max(g.expiry, rec.LeaseExpiresAt)
		}
	}

	var out []AgentAnomaly
	add := func(kind, key, format string, args ...any) {
		out = append(out, AgentAnomaly{Kind: kind, Key: key, Detail: fmt.Sprintf(format, args...)})
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		var grants []*grantInfo
		for _, g := range byKey[key] {
			if g.decision != "" {
				grants = append(grants, g)
			}
		}
		sort.Slice(grants, func(i, j int) bool { return grants[i].fence < grants[j].fence })
		for i := 1; i < len(grants); i++ {
			a, b := grants[i-1], grants[i]
			if b.stamp < a.stamp {
				add(AnomalyFenceOrder, key, "fence %d granted at stamp %d, before fence %d at %d", b.fence, b.stamp, a.fence, a.stamp)
			}
			// If a's holder may have ended its lease before b's grant came back, an
			// attempt nobody saw may have been granted in between; b is then judged
			// against that one, which the history does not show.
			if b.stamp >= a.expiry || a.endedBefore(b.granted) {
				continue
			}
			if b.decision == string(idemkv.DecisionRecover) {
				add(AnomalyEarlyRecover, key, "op %d: fence %d recovered at stamp %d; fence %d (op %d) was told its lease lasts until %d (%d ms later)",
					b.op, b.fence, b.stamp, a.fence, a.op, a.expiry, a.expiry-b.stamp)
			} else {
				add(AnomalyOverlappingLeases, key, "op %d: fence %d granted at stamp %d while fence %d (op %d) held a lease until %d and had not ended it",
					b.op, b.fence, b.stamp, a.fence, a.op, a.expiry)
			}
		}
	}
	return out
}

// CheckStaleFences judges every workload that commits with the fences it was granted
// (the register, short leases, approvals): a commit must not succeed with a fence
// older than one whose grant came back before the commit was sent. Fences are Raft
// indexes, so that grant applied before the commit did, and made the older fence
// stale whatever happened after it (a release, a commit, an expiry: a record the older
// fence could land on is gone). The short-lease workload makes a few such zombie
// commits a run, the register's clients hundreds (a fifth of their writes reuse a
// fence seen for the key), which porcupine also rejects, without naming the fence.
func CheckStaleFences(ops []history.Op) []AgentAnomaly {
	type wkey struct{ workload, key string }
	type seen struct {
		granted int64 // when the first answer granting the fence came back (run time)
		op      int64
	}
	grants := map[wkey]map[uint64]seen{}
	var commits []*history.Op
	for i := range ops {
		op := &ops[i]
		switch op.Workload {
		case "register", "lease", "approvals":
		default:
			continue
		}
		if op.Type != history.OK || op.Out == nil || op.Out.Err != "" {
			continue
		}
		switch {
		case op.F == history.FReserve && op.Out.Grant != 0 &&
			(op.Out.Decision == string(idemkv.DecisionExecute) || op.Out.Decision == string(idemkv.DecisionRecover)):
			k := wkey{op.Workload, op.Key}
			m := grants[k]
			if m == nil {
				m = map[uint64]seen{}
				grants[k] = m
			}
			if g, ok := m[op.Out.Grant]; !ok || op.Return < g.granted {
				m[op.Out.Grant] = seen{granted: op.Return, op: op.ID}
			}
		case op.F == history.FCommit:
			commits = append(commits, op)
		}
	}
	var out []AgentAnomaly
	for _, c := range commits {
		m := grants[wkey{c.Workload, c.Key}]
		fences := make([]uint64, 0, len(m))
		for f := range m {
			if f > c.In.Fence && m[f].granted < c.Call {
				fences = append(fences, f)
			}
		}
		if len(fences) == 0 {
			continue
		}
		slices.Sort(fences)
		g := m[fences[0]]
		out = append(out, AgentAnomaly{Kind: AnomalyStaleFenceAccepted, Key: c.Key,
			Detail: fmt.Sprintf("op %d committed with fence %d after fence %d was granted (op %d)", c.ID, c.In.Fence, fences[0], g.op)})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}
