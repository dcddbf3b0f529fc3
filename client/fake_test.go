package client

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
)

// memStore is an in-memory Store for unit tests of Do. It decides with the state
// machine's own pure decision functions, so it behaves as a node does, on a clock the
// test moves, with fault hooks to lose requests or answers.
type memStore struct {
	mu      sync.Mutex
	clock   time.Time // the fake clock, unless realClock
	real    bool
	recs    map[string]*idemkv.Record
	index   uint64
	changed chan struct{}
	calls   map[string]int
	// before runs ahead of an operation: an error means it never happened. after runs
	// once it took effect: an error means its answer was lost.
	before, after func(op string, n int) error
}

var _ Store = (*memStore)(nil)

func newMemStore() *memStore {
	return &memStore{
		clock:   time.Date(2026, 7, 29, 13, 0, 0, 0, time.UTC),
		recs:    map[string]*idemkv.Record{},
		changed: make(chan struct{}),
		calls:   map[string]int{},
	}
}

// faults installs the hooks; n is the 1-based count of calls of that op so far.
func (m *memStore) faults(before, after func(op string, n int) error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.before, m.after = before, after
}

func (m *memStore) now() idemkv.Timestamp {
	if m.real {
		return idemkv.TimestampOf(time.Now())
	}
	return idemkv.TimestampOf(m.clock)
}

// advance moves the fake clock and wakes long-polls, as an apply would.
func (m *memStore) advance(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.clock = m.clock.Add(d)
	m.signal()
}

func (m *memStore) signal() {
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *memStore) count(op string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[op]
}

func (m *memStore) record(tenant, key string) *idemkv.Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec := m.recs[tenant+"\x00"+key]
	if fsm.Expired(rec, m.now()) {
		return nil
	}
	return rec.Clone()
}

// op runs f under the lock between the fault hooks.
func op[T any](m *memStore, name string, f func(now idemkv.Timestamp) (T, error)) (T, error) {
	var zero T
	m.mu.Lock()
	m.calls[name]++
	n, before, after := m.calls[name], m.before, m.after
	m.mu.Unlock()
	if before != nil {
		if err := before(name, n); err != nil {
			return zero, err
		}
	}
	m.mu.Lock()
	v, err := f(m.now())
	m.mu.Unlock()
	if err != nil {
		return zero, err
	}
	if after != nil {
		if err := after(name, n); err != nil {
			return zero, err
		}
	}
	return v, nil
}

func rkey(tenant, key string) string { return tenant + "\x00" + key }

func (m *memStore) put(k string, next *idemkv.Record) {
	if next != nil {
		m.recs[k] = next
		m.signal()
	}
}

func (m *memStore) Reserve(ctx context.Context, req *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
	return op(m, "reserve", func(now idemkv.Timestamp) (*idemkv.ReserveResult, error) {
		r := *req
		if err := r.Validate(idemkv.Limits{}, now); err != nil {
			return nil, err
		}
		r.EnsureDefaults(idemkv.Limits{})
		m.index++
		if r.AttemptID == "" {
			r.AttemptID = fmt.Sprintf("server-%d", m.index)
		}
		next, res := fsm.Decide(m.recs[rkey(r.Tenant, r.Key)], &r, now, m.index)
		m.put(rkey(r.Tenant, r.Key), next)
		return res, nil
	})
}

func (m *memStore) Commit(ctx context.Context, req *idemkv.CommitRequest) (*idemkv.Receipt, error) {
	return op(m, "commit", func(now idemkv.Timestamp) (*idemkv.Receipt, error) {
		if err := req.Validate(idemkv.Limits{}); err != nil {
			return nil, err
		}
		next, receipt, err := fsm.DecideCommit(m.recs[rkey(req.Tenant, req.Key)], req, now)
		m.put(rkey(req.Tenant, req.Key), next)
		return receipt, err
	})
}

func (m *memStore) Fail(ctx context.Context, req *idemkv.FailRequest) (*idemkv.Record, error) {
	return op(m, "fail", func(now idemkv.Timestamp) (*idemkv.Record, error) {
		if err := req.Validate(idemkv.Limits{}); err != nil {
			return nil, err
		}
		next, rec, err := fsm.DecideFail(m.recs[rkey(req.Tenant, req.Key)], req, now)
		m.put(rkey(req.Tenant, req.Key), next)
		return rec, err
	})
}

func (m *memStore) Release(ctx context.Context, req *idemkv.ReleaseRequest) (*idemkv.ReleaseResult, error) {
	return op(m, "release", func(now idemkv.Timestamp) (*idemkv.ReleaseResult, error) {
		if err := req.Validate(); err != nil {
			return nil, err
		}
		k := rkey(req.Tenant, req.Key)
		ok, err := fsm.DecideRelease(m.recs[k], req, now)
		if ok {
			delete(m.recs, k)
			m.signal()
		}
		return &idemkv.ReleaseResult{Released: ok}, err
	})
}

func (m *memStore) Heartbeat(ctx context.Context, req *idemkv.HeartbeatRequest) (*idemkv.Record, error) {
	return op(m, "heartbeat", func(now idemkv.Timestamp) (*idemkv.Record, error) {
		r := *req
		if err := r.Validate(idemkv.Limits{}); err != nil {
			return nil, err
		}
		r.EnsureDefaults(idemkv.Limits{})
		next, err := fsm.DecideHeartbeat(m.recs[rkey(r.Tenant, r.Key)], &r, now)
		m.put(rkey(r.Tenant, r.Key), next)
		return next, err
	})
}

func (m *memStore) Doubt(ctx context.Context, req *idemkv.DoubtRequest) (*idemkv.Record, error) {
	return op(m, "doubt", func(now idemkv.Timestamp) (*idemkv.Record, error) {
		if err := req.Validate(); err != nil {
			return nil, err
		}
		next, rec, err := fsm.DecideDoubt(m.recs[rkey(req.Tenant, req.Key)], req, now)
		m.put(rkey(req.Tenant, req.Key), next)
		return rec, err
	})
}

func (m *memStore) Resolve(ctx context.Context, req *idemkv.ResolveRequest) (*idemkv.ResolveResult, error) {
	return op(m, "resolve", func(now idemkv.Timestamp) (*idemkv.ResolveResult, error) {
		if err := req.Validate(idemkv.Limits{}); err != nil {
			return nil, err
		}
		k := rkey(req.Tenant, req.Key)
		next, receipt, release, err := fsm.DecideResolve(m.recs[k], req, now)
		if err != nil {
			return nil, err
		}
		m.put(k, next)
		if release {
			delete(m.recs, k)
			m.signal()
		}
		return &idemkv.ResolveResult{Receipt: receipt, Released: release}, nil
	})
}

// Get long-polls as the node does: until the record is not pending, its lease ran
// out, or the wait has passed.
func (m *memStore) Get(ctx context.Context, req *idemkv.GetRequest) (*idemkv.Record, error) {
	r := *req
	if err := r.Validate(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(r.Wait)
	for {
		var changed chan struct{}
		rec, err := op(m, "get", func(now idemkv.Timestamp) (*idemkv.Record, error) {
			cur := m.recs[rkey(r.Tenant, r.Key)]
			if fsm.Expired(cur, now) {
				return nil, fmt.Errorf("%w: no record", idemkv.ErrNotFound)
			}
			if cur.Status == idemkv.StatusPending && cur.LeaseExpiresAt > now {
				changed = m.changed
			}
			return cur.Clone(), nil
		})
		if err != nil {
			return nil, err
		}
		wait := time.Until(deadline)
		if changed == nil || wait <= 0 {
			return rec, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, idemkv.Errorf(idemkv.ErrUnavailable, "wait cancelled: %v", ctx.Err())
		}
		t.Stop()
	}
}
