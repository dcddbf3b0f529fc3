package workload

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

// Tool classes of SPEC section 4 as the agent workload uses them.
const (
	ClassIdempotent     = "idempotent_mutation"
	ClassProbe          = "non_idempotent_mutation+probe"
	ClassNonIdemNoProbe = "non_idempotent_mutation"
)

// Outcomes of one delivery of an agent operation.
const (
	OutcomeCommitted = "committed" // executed (or found by the probe) and the receipt stored
	OutcomeReplayed  = "replayed"  // a stored receipt came back
	OutcomeConflict  = "conflict"  // the key holds another effect
	OutcomeInDoubt   = "in_doubt"  // recover without a probe: left for a person
	OutcomeAbandoned = "abandoned" // the worker gave up (timeout after the effect, or the run ended)
	OutcomeReleased  = "released"  // the effect certainly did not happen; the key was given back
	OutcomeFailed    = "failed"    // a stored failure came back
)

// Downstream is the simulated service the agents call: it counts effects per key and
// answers probes, the way a ticket system answers "is there a ticket with this
// external id?".
type Downstream struct {
	mu      sync.Mutex
	effects map[string][]Effect
	seq     int
	r       *mrand.Rand
	// TimeoutAfterEffect is the chance that a call creates the effect and then fails
	// as if the worker's timeout fired.
	TimeoutAfterEffect float64
	// RefuseBeforeEffect is the chance that a call fails without creating anything.
	RefuseBeforeEffect float64
}

// Effect is one side effect the downstream performed.
type Effect struct {
	Key      string `json:"key"`
	Args     string `json:"args"`
	RemoteID string `json:"remote_id"`
	Class    string `json:"class"`
}

// NewDownstream returns an empty downstream.
func NewDownstream(seed uint64) *Downstream {
	return &Downstream{effects: map[string][]Effect{}, r: mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		TimeoutAfterEffect: 0.1, RefuseBeforeEffect: 0.05}
}

var (
	errTimeoutAfterEffect = errors.New("downstream: timed out (the effect happened)")
	errRefused            = errors.New("downstream: refused (nothing happened)")
)

// Execute performs the effect of key with args.
func (d *Downstream) Execute(key, args, class string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	x := d.r.Float64()
	if x < d.RefuseBeforeEffect {
		return "", errRefused
	}
	d.seq++
	id := fmt.Sprintf("T-%d", d.seq)
	if class == ClassIdempotent {
		// An idempotent effect is an upsert: running it again changes nothing and
		// answers with the same id.
		for _, e := range d.effects[key] {
			if e.Args == args {
				id = e.RemoteID
			}
		}
	}
	d.effects[key] = append(d.effects[key], Effect{Key: key, Args: args, RemoteID: id, Class: class})
	if x < d.RefuseBeforeEffect+d.TimeoutAfterEffect {
		return "", errTimeoutAfterEffect
	}
	return id, nil
}

// Probe looks the effect of key up.
func (d *Downstream) Probe(key string) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if list := d.effects[key]; len(list) > 0 {
		return list[0].RemoteID, true
	}
	return "", false
}

// Effects returns every effect by key.
func (d *Downstream) Effects() map[string][]Effect {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string][]Effect, len(d.effects))
	for k, v := range d.effects {
		out[k] = append([]Effect(nil), v...)
	}
	return out
}

// AgentConfig configures the agent workload.
type AgentConfig struct {
	Workers int
	// Interval between new operations.
	Interval time.Duration
	// Lease of every reserve; short, so that abandoned attempts are recovered.
	Lease time.Duration
	// Deadline bounds one delivery.
	Deadline time.Duration
}

// AgentOp is one business operation, delivered to one or more workers.
type AgentOp struct {
	Key   string
	Args  string
	Class string
	FP    string
}

// Agent is the agent workload.
type Agent struct {
	cfg  AgentConfig
	api  *API
	rec  *history.Recorder
	down *Downstream

	mu   sync.Mutex
	keys []string
	ops  []AgentOp
}

// NewAgent prepares the workload.
func NewAgent(cfg AgentConfig, api *API, rec *history.Recorder, down *Downstream) *Agent {
	return &Agent{cfg: cfg, api: api, rec: rec, down: down}
}

// Keys lists every key used.
func (a *Agent) Keys() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.keys...)
}

type delivery struct {
	op AgentOp
}

// Run generates operations until ctx ends and waits for the deliveries in flight.
func (a *Agent) Run(ctx context.Context) {
	queue := make(chan delivery, 1024)
	var workers sync.WaitGroup
	for i := range a.cfg.Workers {
		workers.Add(1)
		go func() {
			defer workers.Done()
			r := mrand.New(mrand.NewPCG(uint64(i)+1000, uint64(time.Now().UnixNano())))
			process := 100000 + i
			for d := range queue {
				a.deliver(ctx, i, &process, r, d.op)
			}
		}()
	}
	r := mrand.New(mrand.NewPCG(7, uint64(time.Now().UnixNano())))
	var timers sync.WaitGroup
	tick := time.NewTicker(a.cfg.Interval)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			timers.Wait()
			close(queue)
			workers.Wait()
			return
		case <-tick.C:
		}
		op := a.newOp(n, r)
		// Redelivery: the same operation reaches one to three workers, the later
		// ones after a delay, as a queue redelivers after a visibility timeout.
		copies := 1 + r.IntN(3)
		for c := range copies {
			delay := time.Duration(0)
			if c > 0 {
				delay = time.Duration(r.IntN(int(2 * a.cfg.Lease)))
			}
			timers.Add(1)
			go func() {
				defer timers.Done()
				select {
				case <-time.After(delay):
					select {
					case queue <- delivery{op: op}:
					case <-ctx.Done():
					}
				case <-ctx.Done():
				}
			}()
		}
	}
}

func (a *Agent) newOp(n int, r *mrand.Rand) AgentOp {
	a.mu.Lock()
	defer a.mu.Unlock()
	classes := []string{ClassProbe, ClassProbe, ClassProbe, ClassNonIdemNoProbe, ClassIdempotent}
	op := AgentOp{Key: fmt.Sprintf("agent:%d", n), Args: fmt.Sprintf(`{"ticket":%d,"title":"incident %d"}`, n, n),
		Class: classes[r.IntN(len(classes))]}
	if len(a.ops) > 0 && r.IntN(10) == 0 {
		// A key reused with other arguments: a conflict, and nothing must execute.
		prev := a.ops[r.IntN(len(a.ops))]
		op.Key, op.Class = prev.Key, prev.Class
		op.Args = fmt.Sprintf(`{"ticket":%d,"title":"other arguments %d"}`, n, n)
	} else {
		a.keys = append(a.keys, op.Key)
	}
	fp, err := fingerprint.Of([]byte(op.Args))
	if err != nil {
		panic(fmt.Sprintf("workload: fingerprint of %s: %v", op.Args, err))
	}
	op.FP = fp
	a.ops = append(a.ops, op)
	return op
}

// deliver runs the production loop of SPEC section 4 for one delivery and records it
// as one operation of the history.
func (a *Agent) deliver(ctx context.Context, worker int, process *int, r *mrand.Rand, op AgentOp) {
	h := &history.Op{Process: *process, Client: worker, Workload: "agent", F: history.FDo, Key: op.Key,
		In: history.Input{Class: op.Class, Args: op.Args, Fingerprint: op.FP}}
	a.rec.Invoke(h)
	dctx, cancel := context.WithTimeout(ctx, a.cfg.Deadline)
	defer cancel()
	out, msg := a.run(dctx, r, op)
	typ := history.OK
	if out.Decision == OutcomeAbandoned {
		typ = history.Info
		*process += a.cfg.Workers
	}
	a.rec.Complete(h, typ, out, msg)
}

func (a *Agent) node(r *mrand.Rand) int { return r.IntN(len(a.api.Addrs())) }

// retry calls f until it gives a determinate answer or ctx ends.
func retry(ctx context.Context, f func() result) result {
	backoff := 50 * time.Millisecond
	for {
		res := f()
		if res.typ == history.OK || ctx.Err() != nil {
			return res
		}
		select {
		case <-ctx.Done():
			return res
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (a *Agent) run(ctx context.Context, r *mrand.Rand, op AgentOp) (*history.Output, string) {
	attempt := newID()
	out := &history.Output{}
	for ctx.Err() == nil {
		req := idemkv.ReserveRequest{Tenant: Tenant, Key: op.Key, Tool: "jepsen.tickets", Actor: "agent",
			Fingerprint: op.FP, AttemptID: attempt, LeaseTTLMs: a.cfg.Lease.Milliseconds()}
		var (
			res     *idemkv.ReserveResult
			granted time.Time
		)
		rr := retry(ctx, func() result {
			var r2 result
			granted = time.Now()
			_, res, r2 = a.api.Reserve(ctx, a.node(r), &req)
			return r2
		})
		if rr.typ != history.OK || res == nil {
			out.Decision = OutcomeAbandoned
			return out, "reserve: " + rr.msg
		}
		switch res.Decision {
		case idemkv.DecisionReplay:
			out.Replayed = true
			out.Receipt = toReceipt(res.Receipt)
			out.Decision = OutcomeReplayed
			if res.Receipt != nil && res.Receipt.Status == idemkv.StatusFailed {
				out.Decision = OutcomeFailed
			}
			return out, ""
		case idemkv.DecisionConflict:
			out.Decision = OutcomeConflict
			if res.Conflict != nil {
				out.ConflictRemoteID = res.Conflict.ExistingRemoteID
				out.ConflictFP = res.Conflict.ExistingFingerprint
			}
			return out, ""
		case idemkv.DecisionInProgress:
			// Wait for the other attempt's outcome, or for its lease to run out.
			wait := min(time.Until(res.LeaseExpiresAt.Time())+50*time.Millisecond, 2*time.Second)
			if wait > 0 {
				a.api.Get(ctx, a.node(r), op.Key, wait)
			}
			continue
		case idemkv.DecisionRecover:
			switch op.Class {
			case ClassNonIdemNoProbe:
				out.Decision = OutcomeInDoubt
				return out, ""
			case ClassProbe:
				if id, found := a.down.Probe(op.Key); found {
					return a.commit(ctx, r, op, res.Fence, id, out)
				}
			}
		}
		// execute, or recover that must (or may) run the effect again. A grant whose
		// answer took long may have a lease that is already running out; executing
		// then could race a recovering worker, so ask again with the same attempt
		// (which keeps the fence and extends the lease if the key is still ours).
		if time.Since(granted) > a.cfg.Lease/2 {
			continue
		}
		fence := res.Fence
		id, err := a.down.Execute(op.Key, op.Args, op.Class)
		switch {
		case errors.Is(err, errRefused):
			out.Decision = OutcomeReleased
			rel := retry(ctx, func() result {
				_, r2 := a.api.Release(ctx, a.node(r), &idemkv.ReleaseRequest{Tenant: Tenant, Key: op.Key, Fingerprint: op.FP, Fence: fence})
				return r2
			})
			if rel.typ != history.OK {
				out.Decision = OutcomeAbandoned
			}
			return out, rel.msg
		case err != nil:
			out.Effects++
			out.Decision = OutcomeAbandoned
			return out, err.Error()
		}
		out.Effects++
		return a.commit(ctx, r, op, fence, id, out)
	}
	out.Decision = OutcomeAbandoned
	return out, "deadline"
}

// commit stores the receipt, retrying until it is stored or fenced.
func (a *Agent) commit(ctx context.Context, r *mrand.Rand, op AgentOp, fence uint64, id string, out *history.Output) (*history.Output, string) {
	var co *history.Output
	res := retry(ctx, func() result {
		var r2 result
		co, r2 = a.api.Commit(ctx, a.node(r), &idemkv.CommitRequest{Tenant: Tenant, Key: op.Key, Fingerprint: op.FP,
			Fence: fence, RemoteSystem: "tickets", RemoteID: id})
		return r2
	})
	switch {
	case res.typ != history.OK:
		out.Decision = OutcomeAbandoned
		return out, "commit: " + res.msg
	case co.Err != "":
		// Fenced: a newer attempt owns the key; this delivery's outcome is its.
		out.Decision = OutcomeAbandoned
		return out, "commit: " + co.Err
	}
	out.Receipt = co.Receipt
	out.Decision = OutcomeCommitted
	if co.Receipt != nil && co.Receipt.Status == string(idemkv.StatusFailed) {
		out.Decision = OutcomeFailed
	}
	return out, ""
}

// FinalRecords reads every agent key after the last heal.
func (a *Agent) FinalRecords(ctx context.Context) (map[string]*idemkv.Record, error) {
	recs := map[string]*idemkv.Record{}
	for _, key := range a.Keys() {
		var last result
		got := false
		for try := 0; try < 50 && ctx.Err() == nil; try++ {
			out, rec, r := a.api.Get(ctx, try%len(a.api.Addrs()), key, 0)
			last = r
			if r.typ == history.OK {
				if out.Err == "" {
					recs[key] = rec
				}
				got = true
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if !got {
			return nil, fmt.Errorf("workload: final read of %s never answered: %s", key, last.msg)
		}
	}
	return recs, nil
}

// AgentAnomaly is one violation found by CheckAgents.
type AgentAnomaly struct {
	Kind   string `json:"kind"`
	Key    string `json:"key"`
	Detail string `json:"detail"`
}

// Anomaly kinds of the agent workload.
const (
	AnomalyDoubleEffect    = "double-effect"
	AnomalyLostReceipt     = "lost-receipt"
	AnomalyReceiptMismatch = "receipt-mismatch"
	AnomalyPhantomReceipt  = "phantom-receipt"
	AnomalyWrongConflict   = "wrong-conflict"
	AnomalyMissedConflict  = "missed-conflict"
)

// CheckAgents judges the agent workload: no non-idempotent effect twice, every
// acknowledged receipt still stored and identical, conflicts exactly where the
// arguments differed.
func CheckAgents(ops []history.Op, effects map[string][]Effect, final map[string]*idemkv.Record) []AgentAnomaly {
	var out []AgentAnomaly
	add := func(kind, key, format string, args ...any) {
		out = append(out, AgentAnomaly{Kind: kind, Key: key, Detail: fmt.Sprintf(format, args...)})
	}
	keys := map[string]bool{}
	for k := range effects {
		keys[k] = true
	}
	byKey := map[string][]*history.Op{}
	for i := range ops {
		op := &ops[i]
		if op.Workload != "agent" || op.F != history.FDo {
			continue
		}
		byKey[op.Key] = append(byKey[op.Key], op)
		keys[op.Key] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, key := range sorted {
		eff := effects[key]
		list := byKey[key]
		nonIdem := 0
		for _, e := range eff {
			if e.Class != ClassIdempotent {
				nonIdem++
			}
		}
		if nonIdem > 1 {
			add(AnomalyDoubleEffect, key, "%d effects of a non-idempotent operation: %v", nonIdem, eff)
		}
		rec := final[key]
		// Acknowledged receipts: every one the same, and the one stored at the end.
		for _, op := range list {
			if op.Type != history.OK || op.Out == nil || op.Out.Receipt == nil {
				continue
			}
			rc := op.Out.Receipt
			switch {
			case rec == nil:
				add(AnomalyLostReceipt, key, "op %d was acknowledged %s %s, the record is gone", op.ID, rc.Status, rc.RemoteID)
			case string(rec.Status) != rc.Status || rec.Fingerprint != rc.Fingerprint || remoteID(rec) != rc.RemoteID:
				add(AnomalyReceiptMismatch, key, "op %d was acknowledged %s %s, the record holds %s %s",
					op.ID, rc.Status, rc.RemoteID, rec.Status, remoteID(rec))
			}
			if rc.Status == string(idemkv.StatusCommitted) && !hasEffect(eff, rc.RemoteID) {
				add(AnomalyPhantomReceipt, key, "op %d got receipt %s that no effect produced", op.ID, rc.RemoteID)
			}
		}
		// Conflicts: only where another argument set used the key, naming it; and an
		// argument set other than the one stored never ends with a stored outcome.
		argSets := map[string]bool{}
		for _, op := range list {
			argSets[op.In.Fingerprint] = true
		}
		stored := ""
		if rec != nil {
			stored = rec.Fingerprint
		}
		for _, op := range list {
			if op.Type != history.OK || op.Out == nil {
				continue
			}
			switch d := op.Out.Decision; {
			case d == OutcomeConflict && (len(argSets) < 2 || op.Out.ConflictFP == op.In.Fingerprint || !argSets[op.Out.ConflictFP]):
				add(AnomalyWrongConflict, key, "op %d got a conflict naming %s; the key saw %d argument sets", op.ID, op.Out.ConflictFP, len(argSets))
			case stored != "" && op.In.Fingerprint != stored &&
				(d == OutcomeCommitted || d == OutcomeReplayed || d == OutcomeFailed || d == OutcomeInDoubt):
				add(AnomalyMissedConflict, key, "op %d carries other arguments than stored and got %s", op.ID, d)
			}
		}
	}
	return out
}

func remoteID(r *idemkv.Record) string {
	if r.Receipt == nil {
		return ""
	}
	return r.Receipt.RemoteID
}

func hasEffect(eff []Effect, id string) bool {
	for _, e := range eff {
		if e.RemoteID == id {
			return true
		}
	}
	return false
}
