package workload

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

// RegisterLease is the lease of every register reserve: long enough that no lease
// expires within a run, so the model has no time in it (see package model).
const RegisterLease = time.Hour

// The two effects that contend for a key; the second makes conflicts.
const (
	RegisterFP      = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	RegisterOtherFP = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	registerTool    = "jepsen.register"
)

// RegisterConfig configures the register workload.
type RegisterConfig struct {
	Clients int
	// Slots is how many keys are live at once; clients pick among them, so they contend.
	Slots int
	// OpsPerKey retires a key after about this many operations, which keeps every
	// key's history small enough for the checker.
	OpsPerKey int
}

// Register is the register workload: clients reserve, commit, fail, release,
// heartbeat and read a small set of keys with attempt ids and fences, some on purpose
// with stale fences.
type Register struct {
	cfg RegisterConfig
	api *API
	rec *history.Recorder

	mu     sync.Mutex
	gens   []int
	counts []int
	keys   []string
	fences map[string][]uint64
	// done is closed when Run's context ends.
	done chan struct{}
}

// NewRegister prepares the workload.
func NewRegister(cfg RegisterConfig, api *API, rec *history.Recorder) *Register {
	if cfg.Slots < 1 {
		cfg.Slots = 1
	}
	if cfg.OpsPerKey < 1 {
		cfg.OpsPerKey = 40
	}
	return &Register{cfg: cfg, api: api, rec: rec, gens: make([]int, cfg.Slots), counts: make([]int, cfg.Slots),
		fences: map[string][]uint64{}, done: make(chan struct{})}
}

// Keys lists every key the workload has used.
func (w *Register) Keys() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.keys...)
}

func (w *Register) pickKey(r *mrand.Rand) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := r.IntN(len(w.gens))
	key := fmt.Sprintf("reg:%d:%d", s, w.gens[s])
	if w.counts[s] == 0 {
		w.keys = append(w.keys, key)
	}
	w.counts[s]++
	if w.counts[s] >= w.cfg.OpsPerKey {
		w.gens[s]++
		w.counts[s] = 0
	}
	return key
}

func (w *Register) noteFence(key string, f uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, have := range w.fences[key] {
		if have == f {
			return
		}
	}
	w.fences[key] = append(w.fences[key], f)
}

func (w *Register) someFence(key string, r *mrand.Rand) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	list := w.fences[key]
	if len(list) == 0 {
		return 0
	}
	return list[r.IntN(len(list))]
}

type grant struct {
	fp    string
	fence uint64
}

// registerClient is one client's memory: the fences it holds and the reserves whose
// answers it lost (it retries them with the same attempt id, as a real client would).
type registerClient struct {
	id      int
	process int
	r       *mrand.Rand
	grants  map[string]grant
	lost    map[string]idemkv.ReserveRequest
	// backoff grows while no answer comes: a node without a leader, or a dead one,
	// answers at once, and a client hammering it would fill the history with unknown
	// outcomes, each of which the checker must place somewhere.
	backoff time.Duration
}

// Run runs the clients until ctx ends.
func (w *Register) Run(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() { close(w.done) })
	defer stop()
	var wg sync.WaitGroup
	for i := range w.cfg.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &registerClient{id: i, process: i, r: mrand.New(mrand.NewPCG(uint64(i), uint64(time.Now().UnixNano()))),
				grants: map[string]grant{}, lost: map[string]idemkv.ReserveRequest{}}
			for ctx.Err() == nil {
				w.step(ctx, c)
			}
		}()
	}
	wg.Wait()
}

func (w *Register) step(ctx context.Context, c *registerClient) {
	// Finish what the client holds first, most of the time, so keys move on.
	if len(c.lost) > 0 && c.r.IntN(10) < 7 {
		for key, req := range c.lost {
			w.reserve(ctx, c, key, req)
			return
		}
	}
	if len(c.grants) > 0 && c.r.IntN(10) < 7 {
		for key, g := range c.grants {
			w.useGrant(ctx, c, key, g)
			return
		}
	}
	key := w.pickKey(c.r)
	switch n := c.r.IntN(100); {
	case n < 50:
		fp := RegisterFP
		if c.r.IntN(10) == 0 {
			fp = RegisterOtherFP
		}
		w.reserve(ctx, c, key, idemkv.ReserveRequest{Tenant: Tenant, Key: key, Tool: registerTool,
			Actor: fmt.Sprintf("client-%d", c.id), Fingerprint: fp, AttemptID: idemkv.NewAttemptID(),
			LeaseTTLMs: RegisterLease.Milliseconds()})
	case n < 80:
		w.get(ctx, c, key)
	default:
		fence := w.someFence(key, c.r)
		if fence == 0 {
			w.get(ctx, c, key)
			return
		}
		w.useFence(ctx, c, key, grant{fp: RegisterFP, fence: fence}, true)
	}
}

func (w *Register) op(c *registerClient, f, key string, in history.Input) *history.Op {
	op := &history.Op{Process: c.process, Client: c.id, Workload: "register", F: f, Key: key, In: in}
	return op
}

// complete records the end of op; an unknown outcome retires the client's process
// id, as in Jepsen: the process may still be acting.
func (w *Register) complete(c *registerClient, op *history.Op, out *history.Output, r result) {
	w.rec.Complete(op, r.typ, out, r.msg)
	if r.typ == history.OK {
		c.backoff = 0
		return
	}
	if r.typ == history.Info {
		c.process += w.cfg.Clients
	}
	c.backoff = min(max(2*c.backoff, 50*time.Millisecond), time.Second)
	t := time.NewTimer(c.backoff/2 + time.Duration(c.r.Int64N(int64(c.backoff/2))))
	defer t.Stop()
	select {
	case <-t.C:
	case <-w.done:
	}
}

func (w *Register) node(c *registerClient) int { return c.r.IntN(len(w.api.Addrs())) }

func (w *Register) reserve(ctx context.Context, c *registerClient, key string, req idemkv.ReserveRequest) {
	op := w.op(c, history.FReserve, key, history.Input{Tool: req.Tool, Fingerprint: req.Fingerprint, AttemptID: req.AttemptID})
	op.Node = w.api.Addrs()[w.node(c)]
	w.rec.Invoke(op)
	out, res, r := w.api.Reserve(ctx, w.nodeIndex(op.Node), &req)
	if ctx.Err() != nil && r.typ != history.OK {
		r = result{typ: history.Info, msg: "run ended: " + r.msg}
	}
	w.complete(c, op, out, r)
	switch r.typ {
	case history.Info:
		c.lost[key] = req
	case history.Fail:
		delete(c.lost, key)
	case history.OK:
		delete(c.lost, key)
		if res != nil && (res.Decision == idemkv.DecisionExecute || res.Decision == idemkv.DecisionRecover) {
			c.grants[key] = grant{fp: req.Fingerprint, fence: res.Fence}
			w.noteFence(key, res.Fence)
		}
	}
}

func (w *Register) nodeIndex(addr string) int {
	for i, a := range w.api.Addrs() {
		if a == addr {
			return i
		}
	}
	return 0
}

func (w *Register) useGrant(ctx context.Context, c *registerClient, key string, g grant) {
	done := w.useFence(ctx, c, key, g, false)
	if done {
		delete(c.grants, key)
	}
}

// useFence runs commit, fail, release or heartbeat with fence g. It reports whether
// the grant is used up (a determinate answer to anything but a heartbeat).
func (w *Register) useFence(ctx context.Context, c *registerClient, key string, g grant, stale bool) bool {
	node := w.node(c)
	n := c.r.IntN(100)
	var (
		op  *history.Op
		out *history.Output
		r   result
	)
	in := history.Input{Fingerprint: g.fp, Fence: g.fence, Stale: stale}
	switch {
	case n < 55:
		in.RemoteID = fmt.Sprintf("R-%s-%d-%d", key, g.fence, c.id)
		in.RemoteURL, in.Result = remoteURL(c.r, "jepsen", in.RemoteID), randomResult(c.r, in.RemoteID)
		op = w.op(c, history.FCommit, key, in)
		op.Node = w.api.Addrs()[node]
		w.rec.Invoke(op)
		out, r = w.api.Commit(ctx, node, &idemkv.CommitRequest{Tenant: Tenant, Key: key, Fingerprint: g.fp, Fence: g.fence,
			RemoteSystem: "jepsen", RemoteID: in.RemoteID, RemoteURL: in.RemoteURL, Result: in.Result})
	case n < 65:
		in.ErrorCode = fmt.Sprintf("E%d", c.id)
		op = w.op(c, history.FFail, key, in)
		op.Node = w.api.Addrs()[node]
		w.rec.Invoke(op)
		out, r = w.api.Fail(ctx, node, &idemkv.FailRequest{Tenant: Tenant, Key: key, Fingerprint: g.fp, Fence: g.fence,
			Error: idemkv.ErrorInfo{Code: in.ErrorCode, Message: "jepsen"}})
	case n < 90:
		op = w.op(c, history.FRelease, key, in)
		op.Node = w.api.Addrs()[node]
		w.rec.Invoke(op)
		out, r = w.api.Release(ctx, node, &idemkv.ReleaseRequest{Tenant: Tenant, Key: key, Fingerprint: g.fp, Fence: g.fence})
	default:
		in.Fingerprint = ""
		op = w.op(c, history.FHeartbeat, key, in)
		op.Node = w.api.Addrs()[node]
		w.rec.Invoke(op)
		out, r = w.api.Heartbeat(ctx, node, &idemkv.HeartbeatRequest{Tenant: Tenant, Key: key, Fence: g.fence,
			LeaseTTLMs: RegisterLease.Milliseconds()})
	}
	if ctx.Err() != nil && r.typ != history.OK {
		r = result{typ: history.Info, msg: "run ended: " + r.msg}
	}
	w.complete(c, op, out, r)
	return r.typ == history.OK && op.F != history.FHeartbeat
}

func (w *Register) get(ctx context.Context, c *registerClient, key string) {
	node := w.node(c)
	op := w.op(c, history.FGet, key, history.Input{})
	op.Node = w.api.Addrs()[node]
	w.rec.Invoke(op)
	out, _, r := w.api.Get(ctx, node, key, 0)
	w.complete(c, op, out, r)
}

// FinalReads reads every key once more after the last heal, retrying each until it
// gets an answer, so that the checker sees where every acknowledged write ended up.
func (w *Register) FinalReads(ctx context.Context) error {
	c := &registerClient{id: 0, process: 1 << 20, r: mrand.New(mrand.NewPCG(1, 2))}
	for _, key := range w.Keys() {
		var last result
		ok := false
		for try := 0; try < 50 && ctx.Err() == nil; try++ {
			node := try % len(w.api.Addrs())
			op := w.op(c, history.FGet, key, history.Input{Final: true})
			op.Node = w.api.Addrs()[node]
			w.rec.Invoke(op)
			out, _, r := w.api.Get(ctx, node, key, 0)
			w.complete(c, op, out, r)
			if last = r; r.typ == history.OK {
				ok = true
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if !ok {
			return fmt.Errorf("workload: final read of %s never answered: %s", key, last.msg)
		}
	}
	return nil
}
