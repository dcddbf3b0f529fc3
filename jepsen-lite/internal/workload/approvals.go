package workload

import (
	"context"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

// The approvals workload (docs/protocol.md "Approvals"): agents ask to refund an
// order, approvers approve or deny what waits, agents resume and execute, sometimes die
// before committing, and sometimes ask for another refund under a key whose approval
// was granted, all while the nemesis crashes, partitions and moves the leader. Its
// checker (CheckApprovals) judges the history: no execute without an approval of that
// exact fingerprint, at most one execution per approval, and no acknowledged decision
// lost.

const approvalTool = "jepsen.refund"

// Anomaly kinds of the approvals workload.
const (
	// AnomalyUnapprovedExecute: a reserve was granted (execute or recover) for a
	// fingerprint no approval of the key was given for.
	AnomalyUnapprovedExecute = "unapproved-execute"
	// AnomalyApprovalReused: one approval granted execute to two fences.
	AnomalyApprovalReused = "approval-reused"
	// AnomalyLostDecision: after a decision was acknowledged, the key answered as if it
	// had not been taken (the same request still waiting, or a denied effect granted),
	// or a second decision on it succeeded.
	AnomalyLostDecision = "lost-decision"
)

// ApprovalsConfig configures the approvals workload.
type ApprovalsConfig struct {
	Clients int
	Slots   int
	// OpsPerKey retires a key after about this many operations.
	OpsPerKey int
}

// Approvals is the approvals workload.
type Approvals struct {
	cfg ApprovalsConfig
	api *API
	rec *history.Recorder

	mu     sync.Mutex
	gens   []int
	counts []int
	keys   []string
	// ids are the approval ids seen per key, for the approvers to decide.
	ids map[string][]string
	// revisits are keys whose grant an agent abandoned, to be asked again once the
	// lease ran out (so that the ask recovers): a key retires within a second or so,
	// long before a 2 s lease runs out, and without them no abandoned grant was ever
	// recovered (a 10 s run: 44 executes, no recover).
	revisits []revisit
}

// revisit is an abandoned grant to ask for again at due.
type revisit struct {
	key    string
	amount int
	due    time.Time
}

// approvalLease is the lease of every grant the workload asks for.
const approvalLease = 2 * time.Second

// NewApprovals prepares the workload.
func NewApprovals(cfg ApprovalsConfig, api *API, rec *history.Recorder) *Approvals {
	cfg.Clients, cfg.Slots = max(cfg.Clients, 2), max(cfg.Slots, 1)
	if cfg.OpsPerKey < 1 {
		cfg.OpsPerKey = 24
	}
	return &Approvals{cfg: cfg, api: api, rec: rec, gens: make([]int, cfg.Slots), counts: make([]int, cfg.Slots), ids: map[string][]string{}}
}

// Keys lists every key the workload has used.
func (w *Approvals) Keys() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.keys...)
}

func (w *Approvals) pickKey(r *mrand.Rand) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := r.IntN(len(w.gens))
	key := fmt.Sprintf("apr:%d:%d", s, w.gens[s])
	if w.counts[s] == 0 {
		w.keys = append(w.keys, key)
	}
	if w.counts[s]++; w.counts[s] >= w.cfg.OpsPerKey {
		w.gens[s]++
		w.counts[s] = 0
	}
	return key
}

func (w *Approvals) noteID(key, id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, seen := range w.ids[key] {
		if seen == id {
			return
		}
	}
	w.ids[key] = append(w.ids[key], id)
}

func (w *Approvals) someID(key string, r *mrand.Rand) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := w.ids[key]
	if len(ids) == 0 {
		return ""
	}
	return ids[r.IntN(len(ids))]
}

// refundEffect is the effect of refunding amount under key, and its fingerprint.
func refundEffect(key string, amount int) (json.RawMessage, string) {
	b, _ := json.Marshal(map[string]any{"key": key, "amount": amount, "currency": "EUR"})
	fp, _ := fingerprint.Of(b)
	return b, fp
}

type approvalClient struct {
	id, process int
	r           *mrand.Rand
}

// Run runs the agents and approvers until ctx ends.
func (w *Approvals) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for i := range w.cfg.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &approvalClient{id: i, process: 300000 + i, r: mrand.New(mrand.NewPCG(uint64(i)+7, uint64(time.Now().UnixNano())))}
			for ctx.Err() == nil {
				w.step(ctx, c)
			}
		}()
	}
	wg.Wait()
}

func (w *Approvals) pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (w *Approvals) call(ctx context.Context, c *approvalClient, f, key string, in history.Input, send func(node int) (*history.Output, result)) (*history.Output, result) {
	node := c.r.IntN(len(w.api.Addrs()))
	op := &history.Op{Process: c.process, Client: 300000 + c.id, Workload: "approvals", F: f, Key: key, In: in, Node: w.api.Addrs()[node]}
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

// dueRevisit takes a revisit whose time has come, if there is one.
func (w *Approvals) dueRevisit(now time.Time) (revisit, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, v := range w.revisits {
		if !v.due.After(now) {
			w.revisits = append(w.revisits[:i], w.revisits[i+1:]...)
			return v, true
		}
	}
	return revisit{}, false
}

func (w *Approvals) step(ctx context.Context, c *approvalClient) {
	if v, ok := w.dueRevisit(time.Now()); ok {
		// Another worker takes up the operation whose agent died: the lease ran out,
		// so the ask recovers the key (docs/protocol.md section 7: no second approval).
		w.ask(ctx, c, v.key, v.amount)
		return
	}
	key := w.pickKey(c.r)
	switch n := c.r.IntN(20); {
	case n < 9:
		w.ask(ctx, c, key, 40)
	case n < 11:
		// Another refund under the key: never covered by the key's approval.
		w.ask(ctx, c, key, 4000)
	default:
		w.decide(ctx, c, key)
	}
	w.pause(ctx, time.Duration(c.r.IntN(30))*time.Millisecond)
}

// ask reserves a refund that requires approval, retrying a lost answer with the same
// attempt id; a grant is committed, or abandoned as by an agent that died.
func (w *Approvals) ask(ctx context.Context, c *approvalClient, key string, amount int) {
	effect, fp := refundEffect(key, amount)
	req := idemkv.ReserveRequest{Tenant: Tenant, Key: key, Tool: approvalTool, Actor: fmt.Sprintf("agent-%d", c.id),
		Effect: effect, AttemptID: idemkv.NewAttemptID(), LeaseTTLMs: approvalLease.Milliseconds(), TTLMs: time.Hour.Milliseconds(),
		Approval: &idemkv.ApprovalAsk{Required: true, TTLMs: time.Hour.Milliseconds(), Summary: fmt.Sprintf("refund %d EUR (%s)", amount, key)}}
	for try := 0; try < 3 && ctx.Err() == nil; try++ {
		out, r := w.call(ctx, c, history.FReserve, key, history.Input{Tool: approvalTool, Fingerprint: fp, AttemptID: req.AttemptID},
			func(node int) (*history.Output, result) {
				out, _, r := w.api.Reserve(ctx, node, &req)
				return out, r
			})
		switch {
		case r.typ == history.Info:
			continue
		case r.typ != history.OK || out.Err != "":
			return
		case out.Decision == string(idemkv.DecisionNeedsApproval) && out.Record != nil:
			w.noteID(key, out.Record.ApprovalID)
		case out.Grant != 0:
			if c.r.IntN(4) == 0 {
				// The agent died after the grant; the lease runs out and a later ask
				// recovers.
				w.mu.Lock()
				w.revisits = append(w.revisits, revisit{key: key, amount: amount,
					due: time.Now().Add(approvalLease + time.Duration(100+c.r.IntN(500))*time.Millisecond)})
				w.mu.Unlock()
				return
			}
			cin := history.Input{Fingerprint: fp, Fence: out.Grant, RemoteID: fmt.Sprintf("RF-%s-%d", key, out.Grant)}
			cin.RemoteURL, cin.Result = remoteURL(c.r, "payments", cin.RemoteID), randomResult(c.r, cin.RemoteID)
			w.call(ctx, c, history.FCommit, key, cin, func(node int) (*history.Output, result) {
				return w.api.Commit(ctx, node, &idemkv.CommitRequest{Tenant: Tenant, Key: key, Fingerprint: fp, Fence: out.Grant,
					RemoteSystem: "payments", RemoteID: cin.RemoteID, RemoteURL: cin.RemoteURL, Result: cin.Result})
			})
		}
		return
	}
}

// decide approves (mostly) or denies one approval seen on key, with the fingerprint of
// the refund it was asked for: the 40 EUR one (a decision naming another is refused).
func (w *Approvals) decide(ctx context.Context, c *approvalClient, key string) {
	id := w.someID(key, c.r)
	if id == "" {
		return
	}
	_, fp := refundEffect(key, 40)
	verdict := idemkv.VerdictApprove
	if c.r.IntN(6) == 0 {
		verdict = idemkv.VerdictDeny
	}
	req := idemkv.DecideApprovalRequest{Tenant: Tenant, Key: key, ApprovalID: id, Fingerprint: fp, Decision: verdict,
		Approver: fmt.Sprintf("approver-%d", c.id), Reason: "jepsen"}
	out, r := w.call(ctx, c, history.FDecide, key, history.Input{Fingerprint: fp, ApprovalID: id, Verdict: string(verdict)},
		func(node int) (*history.Output, result) { return w.api.DecideApproval(ctx, node, &req) })
	if r.typ == history.OK && out.Err == "" && verdict == idemkv.VerdictApprove && c.r.IntN(2) == 0 {
		// A second worker, or a retry whose arguments changed since the approval:
		// "refund order 17" approved, "refund 4000" asked. It must get a conflict.
		w.ask(ctx, c, key, 4000)
	}
}

// FinalReads reads every key once more after the last heal.
func (w *Approvals) FinalReads(ctx context.Context) error {
	c := &approvalClient{id: 0, process: 1 << 21, r: mrand.New(mrand.NewPCG(3, 4))}
	for _, key := range w.Keys() {
		ok := false
		for try := 0; try < 50 && ctx.Err() == nil && !ok; try++ {
			_, r := w.call(ctx, c, history.FGet, key, history.Input{Final: true}, func(node int) (*history.Output, result) {
				out, _, r := w.api.Get(ctx, try%len(w.api.Addrs()), key, 0)
				return out, r
			})
			ok = r.typ == history.OK
			if !ok {
				time.Sleep(200 * time.Millisecond)
			}
		}
		if !ok {
			return fmt.Errorf("workload: final read of approval key %s never answered", key)
		}
	}
	return nil
}

// decisionOp is an approve or deny as the history shows it.
type decisionOp struct {
	op    *history.Op
	acked bool // answered 200: the decision was taken
}

// CheckApprovals judges the approvals workload.
func CheckApprovals(ops []history.Op) []AgentAnomaly {
	var out []AgentAnomaly
	add := func(kind, key, format string, args ...any) {
		out = append(out, AgentAnomaly{Kind: kind, Key: key, Detail: fmt.Sprintf(format, args...)})
	}
	requestFP := map[string]string{} // approval id -> fingerprint it was asked for
	decisions := map[string][]decisionOp{}
	var reserves, reads []*history.Op
	for i := range ops {
		op := &ops[i]
		if op.Workload != "approvals" {
			continue
		}
		switch op.F {
		case history.FReserve:
			if op.Type == history.OK && op.Out != nil && op.Out.Err == "" {
				reserves = append(reserves, op)
				if rec := op.Out.Record; op.Out.Decision == string(idemkv.DecisionNeedsApproval) && rec != nil {
					requestFP[rec.ApprovalID] = op.In.Fingerprint
				}
			}
		case history.FDecide:
			if op.Type == history.Fail {
				continue
			}
			acked := op.Type == history.OK && op.Out != nil && op.Out.Err == ""
			if op.Type == history.Info || acked {
				decisions[op.In.ApprovalID] = append(decisions[op.In.ApprovalID], decisionOp{op: op, acked: acked})
			}
		case history.FGet:
			if op.Type == history.OK && op.Out != nil && op.Out.Err == "" && op.Out.Record != nil {
				reads = append(reads, op)
			}
		}
	}
	// maybeApproved: approval ids an approve may have landed for (acknowledged or not).
	maybeApproved := map[string]bool{}
	for id, ds := range decisions {
		acked := 0
		for _, d := range ds {
			if d.op.In.Verdict == string(idemkv.VerdictApprove) {
				maybeApproved[id] = true
			}
			if d.acked {
				acked++
			}
		}
		if acked > 1 {
			add(AnomalyLostDecision, ds[0].op.Key, "approval %s was decided %d times; the first decision must stand", id, acked)
		}
	}
	grantsByApproval := map[string]map[uint64]int64{}
	for _, op := range reserves {
		rec := op.Out.Record
		if op.Out.Grant == 0 || rec == nil {
			continue
		}
		// The effect this client will run is the one it asked for.
		if rec.ApprovalID == "" || requestFP[rec.ApprovalID] != op.In.Fingerprint || !maybeApproved[rec.ApprovalID] {
			add(AnomalyUnapprovedExecute, op.Key, "op %d: %s granted fence %d for %s under approval %q (asked for %s, approved: %v)",
				op.ID, op.Out.Decision, op.Out.Grant, op.In.Fingerprint, rec.ApprovalID, requestFP[rec.ApprovalID], maybeApproved[rec.ApprovalID])
		}
		if op.Out.Decision == string(idemkv.DecisionExecute) && rec.ApprovalID != "" {
			m := grantsByApproval[rec.ApprovalID]
			if m == nil {
				m = map[uint64]int64{}
				grantsByApproval[rec.ApprovalID] = m
			}
			m[op.Out.Grant] = op.ID
		}
	}
	ids := make([]string, 0, len(grantsByApproval))
	for id := range grantsByApproval {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if m := grantsByApproval[id]; len(m) > 1 {
			add(AnomalyApprovalReused, "", "approval %s granted execute to %d fences: %v", id, len(m), m)
		}
	}
	// An acknowledged decision is never lost: no reserve or read that began after it
	// still sees the request waiting, and a denial is never followed by a grant.
	for id, ds := range decisions {
		for _, d := range ds {
			if !d.acked {
				continue
			}
			for _, op := range append(append([]*history.Op(nil), reserves...), reads...) {
				rec := op.Out.Record
				if op.Key != d.op.Key || op.Call <= d.op.Return || rec == nil || rec.ApprovalID != id {
					continue
				}
				switch {
				case rec.ApprovalState == string(idemkv.ApprovalWaiting):
					add(AnomalyLostDecision, op.Key, "op %d, begun after %s of %s was acknowledged (op %d), sees it waiting", op.ID, d.op.In.Verdict, id, d.op.ID)
				case d.op.In.Verdict == string(idemkv.VerdictDeny) && op.F == history.FReserve && op.Out.Grant != 0:
					add(AnomalyLostDecision, op.Key, "op %d was granted fence %d after approval %s was denied (op %d)", op.ID, op.Out.Grant, id, d.op.ID)
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}
