package workload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/fingerprint"
	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

// Tool classes of docs/protocol.md section 4 as the agent workload uses them.
const (
	ClassIdempotent     = "idempotent_mutation"
	ClassProbe          = "non_idempotent_mutation+probe"
	ClassNonIdemNoProbe = "non_idempotent_mutation"
)

// Outcomes of one delivery of an agent operation.
const (
	OutcomeCommitted   = "committed"    // executed (or found by the probe) and the receipt stored
	OutcomeReplayed    = "replayed"     // a stored receipt came back
	OutcomeConflict    = "conflict"     // the key holds another effect
	OutcomeInDoubt     = "in_doubt"     // recover without a probe: left for a person
	OutcomeAbandoned   = "abandoned"    // the worker gave up (timeout after the effect, or the run ended)
	OutcomeNotExecuted = "not_executed" // the tool did not run in this delivery (a tool that reported not executed: key released)
	OutcomeFailed      = "failed"       // a stored failure came back
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

// Effect is one side effect the downstream performed, and the receipt it answered:
// its id, URL and result, which a receipt naming it must carry exactly.
type Effect struct {
	Key       string          `json:"key"`
	Args      string          `json:"args"`
	RemoteID  string          `json:"remote_id"`
	Class     string          `json:"class"`
	RemoteURL string          `json:"remote_url,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
}

// receipt is what the tool or the probe reports for e.
func (e Effect) receipt() *client.Result {
	return &client.Result{RemoteSystem: "tickets", RemoteID: e.RemoteID, RemoteURL: e.RemoteURL, Result: e.Result}
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

// Execute performs the effect of key with args and returns it.
func (d *Downstream) Execute(key, args, class string) (Effect, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	x := d.r.Float64()
	if x < d.RefuseBeforeEffect {
		return Effect{}, errRefused
	}
	d.seq++
	id := fmt.Sprintf("T-%d", d.seq)
	e := Effect{Key: key, Args: args, RemoteID: id, Class: class, RemoteURL: remoteURL(d.r, "tickets", id), Result: randomResult(d.r, id)}
	if class == ClassIdempotent {
		// An idempotent effect is an upsert: running it again changes nothing and
		// answers as the first run did.
		for _, prev := range d.effects[key] {
			if prev.Args == args {
				e = prev
			}
		}
	}
	d.effects[key] = append(d.effects[key], e)
	if x < d.RefuseBeforeEffect+d.TimeoutAfterEffect {
		return Effect{}, errTimeoutAfterEffect
	}
	return e, nil
}

// Heal stops the injected failures: every later call succeeds.
func (d *Downstream) Heal() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.TimeoutAfterEffect, d.RefuseBeforeEffect = 0, 0
}

// Probe looks the effect of key up.
func (d *Downstream) Probe(key string) (Effect, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if list := d.effects[key]; len(list) > 0 {
		return list[0], true
	}
	return Effect{}, false
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
	cfg    AgentConfig
	api    *API
	client *client.Client
	// pinned are clients that stay with one node each (see NewAgent).
	pinned []*client.Client
	rec    *history.Recorder
	down   *Downstream

	mu   sync.Mutex
	keys []string
	ops  []AgentOp
	// inDoubt holds the keys a delivery ended in doubt.
	inDoubt map[string]bool
}

// NewAgent prepares the workload. Its workers run the Go client's Do; api is for
// the final reads. Even workers share a client that follows the leader, as the Go
// client does; odd ones each use a client that stays with one node and never learns
// the leader, as one behind a load balancer does, so that reserves reach followers
// too: a follower answers their replays and conflicts itself (docs/protocol.md
// "Followers") and forwards the rest.
func NewAgent(cfg AgentConfig, api *API, rec *history.Recorder, down *Downstream) (*Agent, error) {
	newClient := func(endpoints []string, hc *http.Client) (*client.Client, error) {
		return client.New(client.Config{Endpoints: endpoints, Timeout: api.timeout, MaxAttempts: 3, HTTPClient: hc,
			BackoffMin: 20 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
			Run: client.RunConfig{LeaseTTL: cfg.Lease, CommitGrace: cfg.Deadline, PollWait: cfg.Lease}})
	}
	cl, err := newClient(api.Addrs(), api.HTTPClient())
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, api: api, client: cl, rec: rec, down: down, inDoubt: map[string]bool{}}
	blind := *api.HTTPClient()
	blind.Transport = leaderBlind{blind.Transport}
	addrs := api.Addrs()
	for i := range addrs {
		// Its own node first; the others only once that one failed.
		pc, err := newClient(append(slices.Clone(addrs[i:]), addrs[:i]...), &blind)
		if err != nil {
			return nil, err
		}
		a.pinned = append(a.pinned, pc)
	}
	return a, nil
}

// clientOf is the client worker uses.
func (a *Agent) clientOf(worker int) *client.Client {
	if worker%2 == 0 || len(a.pinned) == 0 {
		return a.client
	}
	return a.pinned[(worker/2)%len(a.pinned)]
}

// leaderBlind drops the leader header from every answer, so a client on it keeps
// talking to the node it chose.
type leaderBlind struct{ base http.RoundTripper }

func (t leaderBlind) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if resp != nil {
		resp.Header.Del(idemkv.HeaderLeader)
	}
	return resp, err
}

// CloseIdleConnections passes through to the base transport.
func (t leaderBlind) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
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
			process := 100000 + i
			for d := range queue {
				a.deliver(ctx, i, &process, d.op)
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

// deliver runs the production loop of docs/protocol.md section 4 for one delivery and records it
// as one operation of the history.
func (a *Agent) deliver(ctx context.Context, worker int, process *int, op AgentOp) {
	a.deliverAs(ctx, worker, process, op, false)
}

// deliverAs is deliver; final marks the deliveries of Settle.
func (a *Agent) deliverAs(ctx context.Context, worker int, process *int, op AgentOp, final bool) {
	h := &history.Op{Process: *process, Client: worker, Workload: "agent", F: history.FDo, Key: op.Key,
		In: history.Input{Class: op.Class, Args: op.Args, Fingerprint: op.FP, Final: final}}
	a.rec.Invoke(h)
	dctx, cancel := context.WithTimeout(ctx, a.cfg.Deadline)
	defer cancel()
	out, msg := a.run(dctx, a.clientOf(worker), op)
	typ := history.OK
	if out.Decision == OutcomeAbandoned {
		typ = history.Info
		*process += a.cfg.Workers
	}
	a.rec.Complete(h, typ, out, msg)
}

// run is one delivery: client.Do with the downstream call as the tool.
func (a *Agent) run(ctx context.Context, cl *client.Client, op AgentOp) (*history.Output, string) {
	out := &history.Output{}
	cop := client.Op{Tenant: Tenant, Key: op.Key, Tool: "jepsen.tickets", Actor: "agent",
		Effect: json.RawMessage(op.Args), LeaseTTL: a.cfg.Lease}
	switch op.Class {
	case ClassIdempotent:
		cop.Class = client.IdempotentMutation
	default:
		cop.Class = client.NonIdempotentMutation
	}
	if op.Class == ClassProbe {
		cop.Probe = func(context.Context) (*client.Result, error) {
			if e, found := a.down.Probe(op.Key); found {
				return e.receipt(), nil
			}
			return nil, nil
		}
	}
	var effects atomic.Int32
	res, err := cl.Do(ctx, cop, func(context.Context) (*client.Result, error) {
		e, err := a.down.Execute(op.Key, op.Args, op.Class)
		switch {
		case errors.Is(err, errRefused):
			return nil, client.NotExecuted(err)
		case err != nil:
			effects.Add(1)
			return nil, err
		}
		effects.Add(1)
		return e.receipt(), nil
	})
	out.Effects = int(effects.Load())
	var (
		conflict *client.ConflictError
		failed   *client.StoredFailureError
	)
	if err == nil {
		out.Receipt = toReceipt(res.Receipt)
		out.Replayed = res.Replayed
		out.Decision = OutcomeCommitted
		if res.Replayed {
			out.Decision = OutcomeReplayed
		}
		return out, ""
	}
	// Every error of Do is of exactly one kind (client.KindOf).
	switch client.KindOf(err) {
	case client.KindConflict:
		out.Decision = OutcomeConflict
		if errors.As(err, &conflict) {
			out.ConflictFP = conflict.Conflict.ExistingFingerprint
			out.ConflictRemoteID = conflict.Conflict.ExistingRemoteID
		}
	case client.KindInDoubt:
		out.Decision = OutcomeInDoubt
		a.mu.Lock()
		a.inDoubt[op.Key] = true
		a.mu.Unlock()
	case client.KindStoredFailure:
		out.Decision = OutcomeFailed
		if errors.As(err, &failed) {
			out.Receipt = toReceipt(failed.Receipt)
		}
	case client.KindNotExecuted:
		out.Decision = OutcomeNotExecuted
	default:
		// outcome_unknown (the tool may have run; the record stays pending) and
		// store_unavailable: the next delivery, or the settling after the run, finds out.
		out.Decision = OutcomeAbandoned
	}
	return out, err.Error()
}

// Settle redelivers, after the last heal, the operation of every key whose record is
// still pending and not in doubt, as a queue keeps redelivering until a worker
// finishes: so every effect ends with a committed record or one in doubt, and the
// checker can require exactly that. It returns how many deliveries it made, and
// how many keys were still to redeliver when limit passed (0 when it did not).
//
// limit bounds the redeliveries, not the reads: a store whose leases never run out
// (a state machine clock pushed minutes ahead) answers every redelivery in_progress
// for a whole Deadline, and rounds of them would outlast any run; the keys left
// pending are then the checker's to judge, with the reads still on ctx.
func (a *Agent) Settle(ctx context.Context, limit time.Duration) (made, left int, err error) {
	// The redeliveries meet a healthy downstream, as the cluster is healed: with its
	// failures left on (15% a call), a key whose three redeliveries each failed ended
	// pending, an orphan-effect the store had no part in (seen once in CI's 90 s run).
	a.down.Heal()
	sctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for round := 0; ; round++ {
		recs, err := a.FinalRecords(ctx)
		if err != nil {
			return made, 0, err
		}
		var todo []AgentOp
		a.mu.Lock()
		for _, key := range a.keys {
			rec := recs[key]
			if rec == nil || rec.Status != idemkv.StatusPending || rec.InDoubt || a.inDoubt[key] {
				continue
			}
			for _, op := range a.ops {
				if op.Key == key && op.FP == rec.Fingerprint {
					todo = append(todo, op)
					break
				}
			}
		}
		a.mu.Unlock()
		switch {
		case len(todo) == 0:
			return made, 0, nil
		case sctx.Err() != nil:
			return made, len(todo), nil
		case round == 3:
			// Three rounds made: what is still pending is the checker's to judge.
			return made, 0, nil
		}
		var wg sync.WaitGroup
		sem := make(chan struct{}, max(1, a.cfg.Workers))
		for i, op := range todo {
			sem <- struct{}{}
			if sctx.Err() != nil {
				<-sem
				break
			}
			wg.Add(1)
			made++
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				process := 300000 + round*len(todo) + i
				a.deliverAs(sctx, i%max(1, a.cfg.Workers), &process, op, true)
			}()
		}
		wg.Wait()
	}
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
			if ctx.Err() != nil && last.msg == "" {
				last.msg = ctx.Err().Error()
			}
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
	// AnomalyMissingEffect: Do said committed, and the downstream holds no effect of
	// those arguments (exactly one is owed).
	AnomalyMissingEffect = "missing-effect"
	// AnomalyOrphanEffect: an effect whose key ended neither committed with those
	// arguments nor in doubt, after Settle.
	AnomalyOrphanEffect = "orphan-effect"
)

// CheckAgents judges the agent workload: exactly one effect for every operation seen
// committed (none missing, no non-idempotent one twice), every effect on a key that
// ended committed with its arguments or in doubt, every acknowledged receipt still
// stored and identical, conflicts exactly where the arguments differed.
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
		fpOf := map[string]string{}
		inDoubt := rec != nil && rec.InDoubt
		for _, op := range list {
			fpOf[op.In.Args] = op.In.Fingerprint
			// The client said in doubt; a server that marks records in doubt says
			// so on the record too.
			inDoubt = inDoubt || op.Type == history.OK && op.Out != nil && op.Out.Decision == OutcomeInDoubt
		}
		// Exactly one effect for each operation seen committed.
		for _, op := range list {
			if op.Type != history.OK || op.Out == nil || op.Out.Receipt == nil || op.Out.Receipt.Status != string(idemkv.StatusCommitted) {
				continue
			}
			if n := countArgs(eff, op.In.Args); n == 0 {
				add(AnomalyMissingEffect, key, "op %d was acknowledged committed (%s) and no effect of its arguments happened",
					op.ID, op.Out.Receipt.RemoteID)
			}
		}
		// Every effect belongs to a key that ended committed with its arguments, or
		// in doubt.
		for _, e := range eff {
			switch {
			case rec != nil && rec.Status == idemkv.StatusCommitted && rec.Fingerprint == fpOf[e.Args]:
			case rec != nil && rec.Status == idemkv.StatusPending && inDoubt:
			default:
				status := "absent"
				if rec != nil {
					status = string(rec.Status)
					if rec.Status == idemkv.StatusPending {
						// Left pending after the redelivery: its lease (the stamped
						// time) tells whether a frozen clock kept it alive.
						status += fmt.Sprintf(" (fence %d, lease until %d)", rec.Fence, rec.LeaseExpiresAt)
					}
				}
				add(AnomalyOrphanEffect, key, "effect %s (%s) happened; the key ended %s", e.RemoteID, e.Args, status)
			}
		}
		// Acknowledged receipts: every one exactly the one stored at the end (so all
		// the same: the first answer's, down to the result's bytes and committed_at),
		// and a committed one exactly what the effect it names answered.
		var final *history.Receipt
		if rec != nil {
			final = toReceipt(rec.Outcome())
		}
		for _, op := range list {
			if op.Type != history.OK || op.Out == nil || op.Out.Receipt == nil {
				continue
			}
			rc := op.Out.Receipt
			switch {
			case rec == nil:
				add(AnomalyLostReceipt, key, "op %d was acknowledged %s %s, the record is gone", op.ID, rc.Status, rc.RemoteID)
			case !rc.Same(final):
				add(AnomalyReceiptMismatch, key, "op %d was acknowledged %s, the record holds %s (%s)",
					op.ID, describeReceipt(rc), describeReceipt(final), rec.Status)
			}
			if rc.Status != string(idemkv.StatusCommitted) {
				continue
			}
			e, found := effectOf(eff, rc.RemoteID)
			switch {
			case !found:
				add(AnomalyPhantomReceipt, key, "op %d got receipt %s that no effect produced", op.ID, rc.RemoteID)
			case rc.RemoteURL != e.RemoteURL || rc.ResultDigest != history.Digest(e.Result):
				add(AnomalyReceiptMismatch, key, "op %d got receipt %s with url %q result %s; effect %s answered url %q result %s",
					op.ID, rc.RemoteID, rc.RemoteURL, rc.ResultDigest, e.RemoteID, e.RemoteURL, history.Digest(e.Result))
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

// describeReceipt names every field of a receipt the checkers compare.
func describeReceipt(rc *history.Receipt) string {
	if rc == nil {
		return "no receipt"
	}
	return fmt.Sprintf("%s fp=%s remote=%s url=%q result=%s error=%s committed_at=%d",
		rc.Status, rc.Fingerprint, rc.RemoteID, rc.RemoteURL, rc.ResultDigest, rc.ErrorCode, rc.CommittedAt)
}

func countArgs(eff []Effect, args string) int {
	n := 0
	for _, e := range eff {
		if e.Args == args {
			n++
		}
	}
	return n
}

// effectOf finds the effect that answered with remote id id.
func effectOf(eff []Effect, id string) (Effect, bool) {
	for _, e := range eff {
		if e.RemoteID == id {
			return e, true
		}
	}
	return Effect{}, false
}
