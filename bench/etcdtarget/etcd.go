// Package etcdtarget runs the idemkv workload against etcd, the way a team that picked
// etcd for idempotency keys would build it: one key per record holding the record as
// JSON, reserve and commit as compare-and-set transactions, and the decision table of
// idemkv's fsm package applied by the client to what the transaction returns.
//
// It must never weaken etcd's guarantees to look good or bad: every write is a
// transaction that goes through etcd's Raft log, as a correct implementation needs.
package etcdtarget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
	"github.com/idemkv/idemkv/loadgen"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Config configures the target.
type Config struct {
	// Endpoints are etcd client URLs (host:port or http://host:port).
	Endpoints []string
	Tenant    string
	// Prefix namespaces the keys (default "/idemkv/").
	Prefix      string
	DialTimeout time.Duration
}

// Target is a loadgen.Target on etcd.
type Target struct {
	cli    *clientv3.Client
	prefix string
	tenant string
}

var _ loadgen.Target = (*Target)(nil)

// casAttempts bounds the read-decide-write loop of a reserve or commit that keeps
// losing its compare to concurrent writers; in the workload only recover and retried
// reserves ever loop.
const casAttempts = 8

// New connects to etcd and checks that it answers.
func New(ctx context.Context, cfg Config) (*Target, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, idemkv.Invalid("endpoints", "at least one etcd endpoint is required")
	}
	if err := idemkv.ValidTenant(cfg.Tenant); err != nil {
		return nil, err
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "/idemkv/"
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: cfg.DialTimeout, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd %v: %w: %v", cfg.Endpoints, idemkv.ErrUnavailable, err)
	}
	cctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	if _, err := cli.Get(cctx, cfg.Prefix+"ping"); err != nil {
		_ = cli.Close()
		return nil, fmt.Errorf("etcd %v: %w: %v", cfg.Endpoints, idemkv.ErrUnavailable, err)
	}
	return &Target{cli: cli, prefix: cfg.Prefix + cfg.Tenant + "/", tenant: cfg.Tenant}, nil
}

// Close implements loadgen.Target.
func (t *Target) Close() error { return t.cli.Close() }

// stored is the record as it sits in etcd, and what a compare needs to know about it.
type stored struct {
	rec   *idemkv.Record
	value []byte
	mod   int64
}

// decode reads a record. A fresh grant is written before its fence is known: its
// stored fence is 0 and its fence is the key's create revision, which later puts of the
// same key never change.
func (t *Target) decode(key string, kv []byte, create, mod int64) (*stored, error) {
	var rec idemkv.Record
	if err := json.Unmarshal(kv, &rec); err != nil {
		return nil, fmt.Errorf("etcd record %s: %w: %v", key, idemkv.ErrInternal, err)
	}
	if rec.Fence == 0 {
		rec.Fence = uint64(create)
	}
	return &stored{rec: &rec, value: kv, mod: mod}, nil
}

// Reserve implements loadgen.Target: one transaction puts the pending record if the key
// was never created and returns the stored one otherwise; the client decides on it
// and, for a recover, writes the new grant with a compare on the revision it read.
func (t *Target) Reserve(ctx context.Context, r *loadgen.Reserve) (loadgen.Reservation, error) {
	k := t.prefix + r.Key
	req := &idemkv.ReserveRequest{Tenant: t.tenant, Key: r.Key, Tool: r.Tool, Actor: "bench",
		Fingerprint: r.Fingerprint, AttemptID: r.AttemptID, LeaseTTLMs: r.LeaseTTLMs}
	req.EnsureDefaults(idemkv.Limits{}) // as a node does before deciding: fsm.Decide owns no defaults
	now := idemkv.TimestampOf(time.Now())
	fresh, _ := fsm.Decide(nil, req, now, 0)
	value, err := json.Marshal(fresh)
	if err != nil {
		return loadgen.Reservation{}, fmt.Errorf("%w: %v", idemkv.ErrInternal, err)
	}
	resp, err := t.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(value))).
		Else(clientv3.OpGet(k)).
		Commit()
	if err != nil {
		return loadgen.Reservation{}, wrap(err)
	}
	if resp.Succeeded {
		return loadgen.Reservation{Decision: idemkv.DecisionExecute, Fence: uint64(resp.Header.Revision), Pending: value}, nil
	}
	for range casAttempts {
		kvs := resp.Responses[0].GetResponseRange().Kvs
		var cur *stored
		if len(kvs) == 1 {
			if cur, err = t.decode(r.Key, kvs[0].Value, kvs[0].CreateRevision, kvs[0].ModRevision); err != nil {
				return loadgen.Reservation{}, err
			}
		}
		var curRec *idemkv.Record
		if cur != nil {
			curRec = cur.rec
		}
		// A grant made here gets a fence above every revision seen so far, so above any
		// fence granted before for this key; the compare makes it the only one.
		next, res := fsm.Decide(curRec, req, now, uint64(resp.Header.Revision)+1)
		if next == nil {
			return loadgen.Reservation{Decision: res.Decision, Fence: res.Fence}, nil
		}
		value, err := json.Marshal(next)
		if err != nil {
			return loadgen.Reservation{}, fmt.Errorf("%w: %v", idemkv.ErrInternal, err)
		}
		cmp := clientv3.Compare(clientv3.CreateRevision(k), "=", 0)
		if cur != nil {
			cmp = clientv3.Compare(clientv3.ModRevision(k), "=", cur.mod)
		}
		resp, err = t.cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(k, string(value))).Else(clientv3.OpGet(k)).Commit()
		if err != nil {
			return loadgen.Reservation{}, wrap(err)
		}
		if resp.Succeeded {
			fence := next.Fence
			if cur == nil {
				// Expired and deleted meanwhile: a fresh key again.
				fence = uint64(resp.Header.Revision)
			}
			return loadgen.Reservation{Decision: res.Decision, Fence: fence, Pending: value}, nil
		}
		now = idemkv.TimestampOf(time.Now())
	}
	return loadgen.Reservation{}, fmt.Errorf("reserve %s: %w: lost %d compares in a row", r.Key, idemkv.ErrUnavailable, casAttempts)
}

// Commit implements loadgen.Target: one transaction compares the stored value with
// the pending record that reserve wrote (its fence and fingerprint with it) and puts
// the committed record. When the compare fails, the returned record says why.
func (t *Target) Commit(ctx context.Context, c *loadgen.Commit) error {
	k := t.prefix + c.Key
	req := &idemkv.CommitRequest{Tenant: t.tenant, Key: c.Key, Fingerprint: c.Fingerprint,
		Fence: c.Reservation.Fence, RemoteSystem: c.RemoteSystem, RemoteID: c.RemoteID}
	expect := c.Reservation.Pending
	for range casAttempts {
		now := idemkv.TimestampOf(time.Now())
		var cur *idemkv.Record
		if expect != nil {
			var err error
			if cur, err = decodeGrant(expect, req.Fence); err != nil {
				return err
			}
		}
		next, _, err := fsm.DecideCommit(cur, req, now)
		if err != nil {
			return err
		}
		if next == nil {
			// Already committed with this fence: the first outcome stands.
			return nil
		}
		value, err := json.Marshal(next)
		if err != nil {
			return fmt.Errorf("%w: %v", idemkv.ErrInternal, err)
		}
		resp, err := t.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Value(k), "=", string(expect))).
			Then(clientv3.OpPut(k, string(value))).
			Else(clientv3.OpGet(k)).
			Commit()
		if err != nil {
			return wrap(err)
		}
		if resp.Succeeded {
			return nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return fmt.Errorf("commit %s: %w", c.Key, idemkv.ErrNotFound)
		}
		st, err := t.decode(c.Key, kvs[0].Value, kvs[0].CreateRevision, kvs[0].ModRevision)
		if err != nil {
			return err
		}
		if _, _, err := fsm.DecideCommit(st.rec, req, now); err != nil {
			return err
		}
		if st.rec.Status.Terminal() {
			return nil
		}
		// Still ours but rewritten (a retried reserve extended the lease): compare
		// against what is there now.
		expect = st.value
	}
	return fmt.Errorf("commit %s: %w: lost %d compares in a row", c.Key, idemkv.ErrUnavailable, casAttempts)
}

// decodeGrant reads the pending record a reserve wrote, with the fence it was granted.
func decodeGrant(value []byte, fence uint64) (*idemkv.Record, error) {
	var rec idemkv.Record
	if err := json.Unmarshal(value, &rec); err != nil {
		return nil, fmt.Errorf("pending record: %w: %v", idemkv.ErrInternal, err)
	}
	if rec.Fence == 0 {
		rec.Fence = fence
	}
	return &rec, nil
}

// wrap turns etcd's errors into the root sentinels: a bad request is the workload's
// fault, anything else means etcd could not answer.
func wrap(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("etcd: %w: %w", idemkv.ErrUnavailable, err)
	}
	if s, ok := status.FromError(err); ok && s.Code() == codes.InvalidArgument {
		return fmt.Errorf("etcd: %w: %v", idemkv.ErrInvalidArgument, err)
	}
	return fmt.Errorf("etcd: %w: %v", idemkv.ErrUnavailable, err)
}

// Delete removes every key of the tenant, so that tests start clean.
func (t *Target) Delete(ctx context.Context) error {
	_, err := t.cli.Delete(ctx, t.prefix, clientv3.WithPrefix())
	if err != nil {
		return wrap(err)
	}
	return nil
}

// Revision returns etcd's current revision, so tests can see that a read-only answer
// wrote nothing.
func (t *Target) Revision(ctx context.Context) (int64, error) {
	resp, err := t.cli.Get(ctx, strings.TrimSuffix(t.prefix, "/"))
	if err != nil {
		return 0, wrap(err)
	}
	return resp.Header.Revision, nil
}
