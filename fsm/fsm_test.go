package fsm

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testlog"
	"github.com/idemkv/idemkv/metrics"
	"github.com/idemkv/idemkv/storage"
	dto "github.com/prometheus/client_model/go"
)

// harness is an FSM on a real Pebble store, with a log index counter.
type harness struct {
	tb     testing.TB
	dir    string
	st     *storage.Store
	f      *FSM
	m      *metrics.Metrics
	next   uint64
	closed bool
}

// openHarness opens a harness whose cluster format is this build's (as a cluster of
// this build raises it at its first election), unless its store has one already.
func openHarness(tb testing.TB, dir string) *harness { return openHarnessAt(tb, dir, FormatVersion) }

// openHarnessAt opens a harness whose store, if it holds no cluster format yet, gets
// format (0: none, which reads as FormatApprovals). Setting it costs no log index.
func openHarnessAt(tb testing.TB, dir string, format int) *harness {
	tb.Helper()
	logger := testlog.New(tb)
	if _, ok := tb.(*testing.B); ok {
		logger = slog.New(slog.DiscardHandler)
	}
	st, err := storage.Open(dir, logger)
	if err != nil {
		tb.Fatal(err)
	}
	if _, set, err := st.ClusterFormat(); err != nil {
		tb.Fatal(err)
	} else if !set && format != 0 {
		b := st.NewBatch()
		if err := errors.Join(b.SetClusterFormat(format), b.Commit()); err != nil {
			tb.Fatal(err)
		}
	}
	m := metrics.New()
	f, err := New(st, m, logger)
	if err != nil {
		tb.Fatal(err)
	}
	h := &harness{tb: tb, dir: dir, st: st, f: f, m: m, next: f.AppliedIndex() + 1}
	tb.Cleanup(h.close)
	return h
}

func newHarness(tb testing.TB) *harness { return openHarness(tb, tb.TempDir()) }

func (h *harness) close() {
	if h.closed {
		return
	}
	h.closed = true
	if err := errors.Join(h.f.Close(), h.st.Close()); err != nil {
		h.tb.Error(err)
	}
}

func entry(tb testing.TB, index uint64, c *Command) *raft.Log {
	tb.Helper()
	b, err := c.AppendBinary(nil)
	if err != nil {
		tb.Fatal(err)
	}
	return &raft.Log{Index: index, Term: 2, Type: raft.LogCommand, Data: b}
}

// logs turns commands into entries at the next indexes.
func (h *harness) logs(cmds ...*Command) []*raft.Log {
	out := make([]*raft.Log, len(cmds))
	for i, c := range cmds {
		out[i] = entry(h.tb, h.next, c)
		h.next++
	}
	return out
}

// apply applies cmds as one batch and returns their results.
func (h *harness) apply(cmds ...*Command) []*Result {
	h.tb.Helper()
	return results(h.tb, h.f.ApplyBatch(h.logs(cmds...)))
}

func results(tb testing.TB, out []any) []*Result {
	tb.Helper()
	res := make([]*Result, len(out))
	for i, o := range out {
		if o == nil {
			continue
		}
		r, ok := o.(*Result)
		if !ok {
			tb.Fatalf("response %d is %T", i, o)
		}
		res[i] = r
	}
	return res
}

func reserveCmd(now idemkv.Timestamp, tn, k, attempt string, mod ...func(*idemkv.ReserveRequest)) *Command {
	r := &idemkv.ReserveRequest{Tenant: tn, Key: k, Tool: "create_ticket", Actor: "w", Fingerprint: fpA,
		AttemptID: attempt, LeaseTTLMs: lease, TTLMs: ttl}
	for _, m := range mod {
		m(r)
	}
	return &Command{Op: OpReserve, Now: now, Reserve: r}
}

func commitCmd(now idemkv.Timestamp, tn, k string, fence uint64, remoteID string) *Command {
	return &Command{Op: OpCommit, Now: now, Commit: &idemkv.CommitRequest{Tenant: tn, Key: k, Fingerprint: fpA,
		Fence: fence, RemoteSystem: "linear", RemoteID: remoteID, Result: json.RawMessage(`{"n":1}`)}}
}

func mustOK(tb testing.TB, rs ...*Result) {
	tb.Helper()
	for i, r := range rs {
		if r == nil || r.Err != nil {
			tb.Fatalf("result %d: %+v", i, r)
		}
	}
}

func histogram(tb testing.TB, h interface{ Write(*dto.Metric) error }) (count uint64, sum float64) {
	tb.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		tb.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

func TestApplyBatchLaterEntriesSeeEarlierOnes(t *testing.T) {
	h := newHarness(t)
	now := t0
	rs := h.apply(
		reserveCmd(now, tenant, "k1", "a1"),      // 1: execute, fence 1
		commitCmd(now+1, tenant, "k1", 1, "R-1"), // 2: sees the pending record of 1
		reserveCmd(now+2, tenant, "k1", "a2"),    // 3: replay of 2's receipt
		reserveCmd(now+3, tenant, "k2", "b1"),    // 4: execute, fence 4
		&Command{Op: OpRelease, Now: now + 4, Release: &idemkv.ReleaseRequest{Tenant: tenant, Key: "k2", Fingerprint: fpA, Fence: 4}},
		reserveCmd(now+5, tenant, "k2", "b2"),        // 6: execute again, fence 6
		commitCmd(now+6, tenant, "k2", 4, "R-stale"), // 7: fenced by 6
	)
	mustOK(t, rs[:6]...)
	if d := rs[0].Reserve; d.Decision != idemkv.DecisionExecute || d.Fence != 1 {
		t.Errorf("entry 1: %+v", d)
	}
	if rs[1].Receipt == nil || rs[1].Receipt.RemoteID != "R-1" || rs[1].Receipt.CommittedAt != now+1 {
		t.Errorf("entry 2: %+v", rs[1].Receipt)
	}
	if d := rs[2].Reserve; d.Decision != idemkv.DecisionReplay || d.Receipt.RemoteID != "R-1" {
		t.Errorf("entry 3: %+v", d)
	}
	if !rs[4].Released {
		t.Errorf("entry 5 not released: %+v", rs[4])
	}
	if d := rs[5].Reserve; d.Decision != idemkv.DecisionExecute || d.Fence != 6 {
		t.Errorf("entry 6: %+v", d)
	}
	if !errors.Is(rs[6].Err, idemkv.ErrFenced) {
		t.Errorf("entry 7: err = %v, want fenced", rs[6].Err)
	}
	if count, sum := histogram(t, h.m.ApplyBatch); count != 1 || sum != 7 {
		t.Errorf("apply batch histogram: %d batches, %v entries; want 1 batch of 7", count, sum)
	}
	if got := h.f.AppliedIndex(); got != 7 {
		t.Errorf("applied index = %d, want 7", got)
	}
	if err := h.f.CheckExpiryIndex(); err != nil {
		t.Error(err)
	}
}

func TestReapplyAfterRestartIsSkipped(t *testing.T) {
	dir := t.TempDir()
	h := openHarness(t, dir)
	reserve := entry(t, 1, reserveCmd(t0, tenant, key, "a1"))
	commit := entry(t, 2, commitCmd(t0+10, tenant, key, 1, "R-1"))
	mustOK(t, results(t, h.f.ApplyBatch([]*raft.Log{reserve, commit}))...)
	before, err := h.f.StateHash()
	if err != nil {
		t.Fatal(err)
	}
	recBefore, err := h.f.Get(tenant, key, t0+20)
	if err != nil {
		t.Fatal(err)
	}
	h.close()

	h = openHarness(t, dir)
	if got := h.f.AppliedIndex(); got != 2 {
		t.Fatalf("applied index after reopen = %d, want 2", got)
	}
	// Raft replays from its last snapshot: the reserve comes again after the commit.
	// Applied twice, it would find a committed record and answer replay (harmless), but
	// re-applied on its own it must not touch anything at all.
	if r := h.f.Apply(reserve); r != nil {
		t.Errorf("re-applied reserve answered %+v, want nil (skipped)", r)
	}
	out := h.f.ApplyBatch([]*raft.Log{reserve, commit})
	if out[0] != nil || out[1] != nil {
		t.Errorf("re-applied batch answered %v", out)
	}
	after, err := h.f.StateHash()
	if err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Error("state changed by re-applying entries at or below the applied index")
	}
	recAfter, err := h.f.Get(tenant, key, t0+20)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(recBefore, recAfter) || recAfter.Status != idemkv.StatusCommitted {
		t.Errorf("record changed:\n%+v\n%+v", recBefore, recAfter)
	}
	if count, _ := histogram(t, h.m.ApplyBatch); count != 0 {
		t.Errorf("skipped entries were observed as %d batches", count)
	}
	// A batch straddling the applied index applies only the new part.
	rs := results(t, h.f.ApplyBatch([]*raft.Log{commit, entry(t, 3, reserveCmd(t0+30, tenant, key, "a3"))}))
	if rs[0] != nil || rs[1] == nil || rs[1].Reserve.Decision != idemkv.DecisionReplay {
		t.Errorf("straddling batch: %+v %+v", rs[0], rs[1])
	}
}

func TestNonCommandEntriesAdvanceAppliedIndex(t *testing.T) {
	h := newHarness(t)
	logs := []*raft.Log{
		{Index: 1, Term: 1, Type: raft.LogConfiguration, Data: []byte("not a command")},
		{Index: 2, Term: 1, Type: raft.LogNoop},
		{Index: 3, Term: 1, Type: raft.LogBarrier},
		{Index: 4, Term: 1, Type: raft.LogCommand, Data: []byte{0xde, 0xad}},
		entry(t, 5, reserveCmd(t0, tenant, key, "a")),
	}
	out := h.f.ApplyBatch(logs)
	for i := range 3 {
		if out[i] != nil {
			t.Errorf("entry %d (%s) answered %v", i+1, logs[i].Type, out[i])
		}
	}
	if r, ok := out[3].(*Result); !ok || !errors.Is(r.Err, idemkv.ErrInternal) {
		t.Errorf("undecodable command answered %#v, want an internal error", out[3])
	}
	if r, ok := out[4].(*Result); !ok || r.Reserve == nil || r.Reserve.Fence != 5 {
		t.Errorf("command after the bad one answered %#v", out[4])
	}
	if got := h.f.AppliedIndex(); got != 5 {
		t.Errorf("applied index = %d, want 5", got)
	}
	out = h.f.ApplyBatch([]*raft.Log{{Index: 6, Term: 3, Type: raft.LogNoop}})
	if out[0] != nil || h.f.AppliedIndex() != 6 {
		t.Errorf("noop alone: %v, applied %d", out[0], h.f.AppliedIndex())
	}
}

func TestClockNeverRunsBackwards(t *testing.T) {
	dir := t.TempDir()
	h := openHarness(t, dir)
	late := t0 + 10_000
	mustOK(t, h.apply(reserveCmd(late, tenant, key, "a"))...)
	// A command stamped earlier (a new leader with a slower clock) runs at the clock.
	rs := h.apply(&Command{Op: OpHeartbeat, Now: t0, Heartbeat: &idemkv.HeartbeatRequest{Tenant: tenant, Key: key, Fence: 1, LeaseTTLMs: 60_000}})
	mustOK(t, rs...)
	if got := rs[0].Record.LeaseExpiresAt; got != late+60_000 {
		t.Errorf("lease = %s, want %s (clock + ttl)", got, late+60_000)
	}
	if rs[0].Record.UpdatedAt != late {
		t.Errorf("updated_at = %s, want the clock %s", rs[0].Record.UpdatedAt, late)
	}
	if got := h.f.Clock(); got != late {
		t.Errorf("clock = %s, want %s", got, late)
	}
	h.close()
	h = openHarness(t, dir)
	if got := h.f.Clock(); got != late {
		t.Errorf("clock after reopen = %s, want %s", got, late)
	}
	// Reserve of a fresh key stamped in the past is created at the clock.
	rs = h.apply(reserveCmd(t0-5_000, tenant, "other", "b"))
	mustOK(t, rs...)
	if got := rs[0].Reserve.Record.CreatedAt; got != late {
		t.Errorf("created_at = %s, want %s", got, late)
	}
}

func TestExpiredRecordsAreInvisibleBeforeSweep(t *testing.T) {
	h := newHarness(t)
	short := func(r *idemkv.ReserveRequest) { r.TTLMs = 60_000 }
	mustOK(t, h.apply(reserveCmd(t0, tenant, key, "a", short), reserveCmd(t0, tenant, "live", "b"))...)
	exp := t0 + 60_000
	if _, err := h.f.Get(tenant, key, exp-1); err != nil {
		t.Fatalf("get before expiry: %v", err)
	}
	if _, err := h.f.Get(tenant, key, exp); !errors.Is(err, idemkv.ErrNotFound) {
		t.Fatalf("get at expires_at: err = %v, want not found", err)
	}
	if rec, err := h.f.Lookup(tenant, key, exp-1); err != nil || rec == nil || rec.Key != key {
		t.Fatalf("lookup before expiry: %+v, %v", rec, err)
	}
	if rec, err := h.f.Lookup(tenant, key, exp); rec != nil || err != nil {
		t.Fatalf("lookup at expires_at: %+v, %v; want nothing and no error", rec, err)
	}
	list, err := h.f.List(&idemkv.ListRequest{Tenant: tenant, Limit: 10}, exp)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Records) != 1 || list.Records[0].Key != "live" {
		t.Errorf("list at expiry shows %d records (%v)", len(list.Records), keysOf(list.Records))
	}
	if n, oldest := h.f.Backlog(exp); n != 1 || oldest != exp {
		t.Errorf("backlog = %d, oldest %s; want 1, %s", n, oldest, exp)
	}
	// Commands act on the expired record as absent; the new grant outranks the old fence.
	rs := h.apply(commitCmd(exp, tenant, key, 1, "late"), reserveCmd(exp, tenant, key, "c"), commitCmd(exp, tenant, key, 1, "late"))
	if !errors.Is(rs[0].Err, idemkv.ErrNotFound) {
		t.Errorf("commit on expired record: err = %v, want not found", rs[0].Err)
	}
	if d := rs[1].Reserve; d.Decision != idemkv.DecisionExecute || d.Fence != 4 || d.Record.Attempts != 1 {
		t.Errorf("reserve after expiry: %+v", d)
	}
	if !errors.Is(rs[2].Err, idemkv.ErrFenced) {
		t.Errorf("old fence after re-reserve: err = %v, want fenced", rs[2].Err)
	}
	// The state machine clock alone hides records: a caller with a stale clock sees
	// nothing that the replicated clock says has expired.
	mustOK(t, h.apply(reserveCmd(t0+ttl, tenant, "bump", "d"))...)
	if _, err := h.f.Get(tenant, "live", 0); !errors.Is(err, idemkv.ErrNotFound) {
		t.Errorf("get with stale now after clock passed expiry: err = %v, want not found", err)
	}
	if rec, err := h.f.Lookup(tenant, "live", 0); rec != nil || err != nil {
		t.Errorf("lookup with stale now after clock passed expiry: %+v, %v; want nothing", rec, err)
	}
	if err := h.f.CheckExpiryIndex(); err != nil {
		t.Error(err)
	}
}

func keysOf(recs []*idemkv.Record) []string {
	var ks []string
	for _, r := range recs {
		ks = append(ks, r.Tenant+"/"+r.Key)
	}
	return ks
}

func TestSweepIsBoundedAndReportsMore(t *testing.T) {
	h := newHarness(t)
	var cmds []*Command
	for i := range 5 {
		cmds = append(cmds, reserveCmd(t0, tenant, fmt.Sprintf("dead-%d", i), "a", func(r *idemkv.ReserveRequest) {
			r.TTLMs = 60_000 + int64(i)
		}))
	}
	cmds = append(cmds, reserveCmd(t0, tenant, "live-1", "b"), reserveCmd(t0, "other", "live-2", "c"))
	mustOK(t, h.apply(cmds...)...)
	now := t0 + 70_000
	if n, oldest := h.f.Backlog(now); n != 5 || oldest != t0+60_000 {
		t.Fatalf("backlog = %d, oldest %s; want 5, %s", n, oldest, t0+60_000)
	}
	sweepInTurns(t, h, now, 2, []sweptWant{{2, true}, {2, true}, {1, false}, {0, false}})
	if n, _ := h.f.Backlog(now); n != 0 {
		t.Errorf("backlog after sweeping = %d", n)
	}
	for _, k := range [][2]string{{tenant, "live-1"}, {"other", "live-2"}} {
		if _, err := h.f.Get(k[0], k[1], now); err != nil {
			t.Errorf("live record %v: %v", k, err)
		}
	}
	// Oldest first: the sweeps removed dead-0 .. dead-4 in expiry order, and nothing
	// else is left in the tenant but the live record.
	list, err := h.f.List(&idemkv.ListRequest{Tenant: tenant, Limit: 100}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := keysOf(list.Records); !reflect.DeepEqual(got, []string{tenant + "/live-1"}) {
		t.Errorf("records left: %v", got)
	}
}

// TestSweepRechecksInBatch: a heartbeat earlier in the same batch moves expires_at;
// the sweep must see the moved index entry and leave the record alone.
func TestSweepRechecksInBatch(t *testing.T) {
	h := newHarness(t)
	mustOK(t, h.apply(reserveCmd(t0, tenant, key, "a", func(r *idemkv.ReserveRequest) { r.TTLMs = 60_000 }))...)
	rs := h.apply(
		&Command{Op: OpHeartbeat, Now: t0 + 59_000, Heartbeat: &idemkv.HeartbeatRequest{Tenant: tenant, Key: key, Fence: 1, LeaseTTLMs: 3_600_000}},
		&Command{Op: OpSweep, Now: t0 + 61_000, Sweep: &SweepArgs{Limit: 10}},
	)
	mustOK(t, rs...)
	if rs[1].Swept != 0 || rs[1].More {
		t.Errorf("sweep removed a record whose lease the heartbeat extended: %+v", rs[1])
	}
	rec, err := h.f.Get(tenant, key, t0+61_000)
	if err != nil {
		t.Fatal(err)
	}
	if rec.ExpiresAt != t0+59_000+3_600_000 {
		t.Errorf("expires_at = %s", rec.ExpiresAt)
	}
	if err := h.f.CheckExpiryIndex(); err != nil {
		t.Error(err)
	}
}

func TestList(t *testing.T) {
	h := newHarness(t)
	var cmds []*Command
	for _, k := range []string{"k1", "k2", "k3", "p/1", "p/2", "p/3"} {
		cmds = append(cmds, reserveCmd(t0, "a", k, "x"))
	}
	// Tenant "ab" sorts right after "a": the separator must keep it out of "a".
	cmds = append(cmds, reserveCmd(t0, "ab", "k0", "x"), reserveCmd(t0, "a.", "k0", "x"))
	mustOK(t, h.apply(cmds...)...)
	mustOK(t, h.apply(commitCmd(t0+1, "a", "k2", 2, "R"), commitCmd(t0+1, "a", "p/2", 5, "R"))...)

	page := func(req idemkv.ListRequest) ([]string, string) {
		t.Helper()
		if err := req.Validate(); err != nil {
			t.Fatal(err)
		}
		res, err := h.f.List(&req, t0+2)
		if err != nil {
			t.Fatal(err)
		}
		var ks []string
		for _, r := range res.Records {
			ks = append(ks, r.Key)
		}
		return ks, res.Next
	}
	tests := []struct {
		name string
		req  idemkv.ListRequest
		keys []string
		next string
	}{
		{"all", idemkv.ListRequest{Tenant: "a"}, []string{"k1", "k2", "k3", "p/1", "p/2", "p/3"}, ""},
		{"first page", idemkv.ListRequest{Tenant: "a", Limit: 4}, []string{"k1", "k2", "k3", "p/1"}, "p/1"},
		{"second page", idemkv.ListRequest{Tenant: "a", Limit: 4, After: "p/1"}, []string{"p/2", "p/3"}, ""},
		{"exact last page has no next", idemkv.ListRequest{Tenant: "a", Limit: 2, After: "p/1"}, []string{"p/2", "p/3"}, ""},
		{"prefix", idemkv.ListRequest{Tenant: "a", Prefix: "p/"}, []string{"p/1", "p/2", "p/3"}, ""},
		{"prefix and after", idemkv.ListRequest{Tenant: "a", Prefix: "p/", After: "p/1"}, []string{"p/2", "p/3"}, ""},
		{"after before the prefix", idemkv.ListRequest{Tenant: "a", Prefix: "p/", After: "a"}, []string{"p/1", "p/2", "p/3"}, ""},
		{"status", idemkv.ListRequest{Tenant: "a", Status: idemkv.StatusCommitted}, []string{"k2", "p/2"}, ""},
		{"status paged", idemkv.ListRequest{Tenant: "a", Status: idemkv.StatusPending, Limit: 2}, []string{"k1", "k3"}, "k3"},
		{"other tenant", idemkv.ListRequest{Tenant: "ab"}, []string{"k0"}, ""},
		{"empty tenant", idemkv.ListRequest{Tenant: "zz"}, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			keys, next := page(tc.req)
			if !reflect.DeepEqual(keys, tc.keys) || next != tc.next {
				t.Errorf("got %v next %q, want %v next %q", keys, next, tc.keys, tc.next)
			}
		})
	}
}

func TestNodesAndChanged(t *testing.T) {
	dir := t.TempDir()
	h := openHarness(t, dir)
	ch := h.f.Changed()
	select {
	case <-ch:
		t.Fatal("changed before anything was applied")
	default:
	}
	node := func(op Op, id, raftAddr string) *Command {
		return &Command{Op: op, Now: t0, Node: &idemkv.NodeInfo{ID: id, RaftAddr: raftAddr, APIAddr: "api-" + id}}
	}
	mustOK(t, h.apply(node(OpSetNode, "n3", "r3"), node(OpSetNode, "n1", "r1"), node(OpSetNode, "n2", "r2"),
		node(OpSetNode, "n1", "r1b"), node(OpRemoveNode, "n2", ""))...)
	select {
	case <-ch:
	default:
		t.Fatal("Changed not closed after a batch")
	}
	if next := h.f.Changed(); next == ch {
		t.Fatal("Changed was not replaced")
	}
	want := []idemkv.NodeInfo{{ID: "n1", RaftAddr: "r1b", APIAddr: "api-n1"}, {ID: "n3", RaftAddr: "r3", APIAddr: "api-n3"}}
	if got := h.f.Nodes(); !reflect.DeepEqual(got, want) {
		t.Errorf("nodes = %+v, want %+v", got, want)
	}
	// APIAddr pairs an ID with the Raft address registered with it, and nothing else.
	for _, c := range []struct{ id, raft, want string }{
		{"n1", "r1b", "api-n1"}, {"n1", "r1", ""}, {"n3", "r3", "api-n3"}, {"n2", "r2", ""}, {"n3", "r1b", ""},
	} {
		if got := h.f.APIAddr(c.id, c.raft); got != c.want {
			t.Errorf("APIAddr(%s, %s) = %q, want %q", c.id, c.raft, got, c.want)
		}
	}
	if rs := h.apply(node(OpSetNode, "", "r")); !errors.Is(rs[0].Err, idemkv.ErrInvalidArgument) {
		t.Errorf("node without id: %+v", rs[0])
	}
	h.close()
	h = openHarness(t, dir)
	if got := h.f.Nodes(); !reflect.DeepEqual(got, want) {
		t.Errorf("nodes after reopen = %+v, want %+v", got, want)
	}
}

// populate applies a mixed workload: every state, several tenants, big results (so a
// snapshot spans several restore batches), and node metadata.
func populate(tb testing.TB, h *harness, n int) {
	tb.Helper()
	big := json.RawMessage(`"` + strings.Repeat("x", 2000) + `"`)
	var cmds []*Command
	for i := range n {
		cmds = append(cmds, reserveCmd(t0+idemkv.Timestamp(i), fmt.Sprintf("t%d", i%3), fmt.Sprintf("key-%05d", i), "a"))
	}
	base := h.next
	mustOK(tb, h.apply(cmds...)...)
	cmds = cmds[:0]
	for i := range n {
		tn, k, fence := fmt.Sprintf("t%d", i%3), fmt.Sprintf("key-%05d", i), base+uint64(i)
		now := t0 + idemkv.Timestamp(n+i)
		switch i % 4 {
		case 0:
			c := commitCmd(now, tn, k, fence, fmt.Sprintf("R-%d", i))
			c.Commit.Result = big
			cmds = append(cmds, c)
		case 1:
			cmds = append(cmds, &Command{Op: OpFail, Now: now, Fail: &idemkv.FailRequest{Tenant: tn, Key: k, Fingerprint: fpA,
				Fence: fence, Error: idemkv.ErrorInfo{Code: "bad", Message: "m", Details: json.RawMessage(`{}`)}}})
		case 2:
			cmds = append(cmds, &Command{Op: OpHeartbeat, Now: now, Heartbeat: &idemkv.HeartbeatRequest{Tenant: tn, Key: k,
				Fence: fence, LeaseTTLMs: 120_000}})
		}
	}
	cmds = append(cmds, &Command{Op: OpSetNode, Now: t0, Node: &idemkv.NodeInfo{ID: "n1", RaftAddr: "r1", APIAddr: "a1"}})
	mustOK(tb, h.apply(cmds...)...)
}

type memSink struct {
	bytes.Buffer
	closed, cancelled bool
	failAfter         int
}

func (s *memSink) ID() string { return "mem" }
func (s *memSink) Cancel() error {
	s.cancelled = true
	return nil
}
func (s *memSink) Close() error {
	s.closed = true
	return nil
}
func (s *memSink) Write(p []byte) (int, error) {
	if s.failAfter > 0 && s.Len()+len(p) > s.failAfter {
		return 0, errors.New("disk full")
	}
	return s.Buffer.Write(p)
}

func allRecords(tb testing.TB, f *FSM) []*idemkv.Record {
	tb.Helper()
	var out []*idemkv.Record
	for _, tn := range []string{"t0", "t1", "t2", "junk"} {
		req := &idemkv.ListRequest{Tenant: tn, Limit: idemkv.MaxListLimit}
		for {
			res, err := f.List(req, 0)
			if err != nil {
				tb.Fatal(err)
			}
			out = append(out, res.Records...)
			if res.Next == "" {
				break
			}
			req.After = res.Next
		}
	}
	return out
}

type fsmState struct {
	hash    [32]byte
	records []*idemkv.Record
	applied uint64
	clock   idemkv.Timestamp
	nodes   []idemkv.NodeInfo
}

func stateOf(tb testing.TB, f *FSM) fsmState {
	tb.Helper()
	hash, err := f.StateHash()
	if err != nil {
		tb.Fatal(err)
	}
	if err := f.CheckExpiryIndex(); err != nil {
		tb.Fatal(err)
	}
	return fsmState{hash: hash, records: allRecords(tb, f), applied: f.AppliedIndex(), clock: f.Clock(), nodes: f.Nodes()}
}

// snapshotBytes snapshots h, then applies more entries before persisting, which must
// not leak into the snapshot (Raft persists concurrently with applies).
func snapshotBytes(t *testing.T, h *harness) ([]byte, fsmState) {
	t.Helper()
	want := stateOf(t, h.f)
	snap, err := h.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	mustOK(t, h.apply(reserveCmd(t0+1_000_000, "t0", "after-snapshot", "z"))...)
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	if !sink.closed || sink.cancelled {
		t.Fatalf("sink closed=%v cancelled=%v", sink.closed, sink.cancelled)
	}
	return sink.Bytes(), want
}

func TestSnapshotRestore(t *testing.T) {
	src := newHarness(t)
	populate(t, src, 3000)
	data, want := snapshotBytes(t, src)
	if len(want.records) != 3000 || len(want.nodes) != 1 {
		t.Fatalf("source has %d records, %d nodes", len(want.records), len(want.nodes))
	}

	dst := newHarness(t)
	// Whatever the destination held before must be gone after the restore.
	mustOK(t, dst.apply(reserveCmd(t0, "junk", "k", "a"), &Command{Op: OpSetNode, Now: t0,
		Node: &idemkv.NodeInfo{ID: "n9", RaftAddr: "r9"}})...)
	ch := dst.f.Changed()
	if err := dst.f.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	default:
		t.Error("Changed not closed by a restore")
	}
	got := stateOf(t, dst.f)
	if got.hash != want.hash {
		t.Error("state hash differs after restore")
	}
	if !reflect.DeepEqual(got.records, want.records) {
		t.Errorf("records differ after restore: %d vs %d", len(got.records), len(want.records))
	}
	if got.applied != want.applied || got.clock != want.clock || !reflect.DeepEqual(got.nodes, want.nodes) {
		t.Errorf("bookkeeping: applied %d clock %s nodes %v; want %d %s %v", got.applied, got.clock, got.nodes,
			want.applied, want.clock, want.nodes)
	}
	// The restored FSM continues where the source was at snapshot time.
	rs := results(t, dst.f.ApplyBatch([]*raft.Log{entry(t, want.applied, reserveCmd(t0, "t0", "skipped", "a")),
		entry(t, want.applied+1, reserveCmd(t0+2_000_000, "t0", "key-00000", "b"))}))
	if rs[0] != nil || rs[1] == nil || rs[1].Reserve.Decision != idemkv.DecisionReplay {
		t.Errorf("after restore: %+v %+v", rs[0], rs[1])
	}
}

func TestRestoreRejectsCorruptSnapshots(t *testing.T) {
	src := newHarness(t)
	populate(t, src, 40)
	data, _ := snapshotBytes(t, src)
	flip := func(i int) []byte {
		b := bytes.Clone(data)
		b[i] ^= 0x20
		return b
	}
	cases := map[string][]byte{
		"empty":             nil,
		"bad magic":         flip(0),
		"bad version":       flip(8),
		"bad applied index": flip(16),
		"flipped in data":   flip(len(data) / 2),
		"flipped count":     flip(len(data) - 5),
		"flipped checksum":  flip(len(data) - 1),
		"trailing garbage":  append(bytes.Clone(data), 0),
		"missing checksum":  data[:len(data)-4],
		"missing last byte": data[:len(data)-1],
	}
	for _, n := range []int{5, 9, 10, 100, len(data) / 3, len(data) - 13} {
		cases[fmt.Sprintf("truncated at %d", n)] = data[:n]
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			mustOK(t, h.apply(reserveCmd(t0, "t0", "pre-existing", "a"), &Command{Op: OpSetNode, Now: t0,
				Node: &idemkv.NodeInfo{ID: "n9", RaftAddr: "r9"}})...)
			// The state machine halts after the restore (TestFailedRestoreHalts), so
			// the state is read around its read methods.
			type state struct {
				hash    [32]byte
				applied uint64
				clock   idemkv.Timestamp
				nodes   string
			}
			read := func() state {
				hash, err := h.f.StateHash()
				if err != nil {
					t.Fatal(err)
				}
				return state{hash, h.f.AppliedIndex(), h.f.Clock(), fmt.Sprint(h.f.Nodes())}
			}
			before := read()
			err := h.f.Restore(io.NopCloser(bytes.NewReader(b)))
			if !errors.Is(err, idemkv.ErrInternal) {
				t.Fatalf("restore: err = %v, want an internal (corrupt) error", err)
			}
			// Nothing of the stream may be stored: the store is the one from before,
			// whole.
			if got := read(); got != before {
				t.Errorf("after a failed restore: %+v; before: %+v", got, before)
			}
			if err := h.f.CheckExpiryIndex(); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestPersistCancelsOnWriteError(t *testing.T) {
	h := newHarness(t)
	populate(t, h, 40)
	snap, err := h.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Release()
	sink := &memSink{failAfter: 1000}
	if err := snap.Persist(sink); err == nil {
		t.Fatal("persist succeeded on a failing sink")
	}
	if !sink.cancelled || sink.closed {
		t.Errorf("sink cancelled=%v closed=%v, want cancelled only", sink.cancelled, sink.closed)
	}
}

// BenchmarkApplyBatch applies reserve+commit pairs in batches of 64 entries (Raft's
// default MaxAppendEntries); one op is one pair.
func BenchmarkApplyBatch(b *testing.B) {
	h := newHarness(b)
	const pairsPerBatch = 32
	logs := make([]*raft.Log, 0, 2*pairsPerBatch)
	i := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i < b.N {
		logs = logs[:0]
		for j := 0; j < pairsPerBatch && i < b.N; j++ {
			k := fmt.Sprintf("bench-%09d", i)
			now := t0 + idemkv.Timestamp(i)
			logs = append(logs, entry(b, h.next, reserveCmd(now, tenant, k, "a")))
			logs = append(logs, entry(b, h.next+1, commitCmd(now, tenant, k, h.next, "R")))
			h.next += 2
			i++
		}
		for _, r := range h.f.ApplyBatch(logs) {
			if res := r.(*Result); res.Err != nil {
				b.Fatal(res.Err)
			}
		}
	}
}

// recordStream is h's state as a version-1 snapshot stream (every key and value).
func recordStream(t *testing.T, h *harness) []byte {
	t.Helper()
	snap := h.st.NewSnapshot()
	defer snap.Close()
	var buf bytes.Buffer
	if _, err := snap.WriteRecordsTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// snapshotPairs parses a version-1 snapshot stream into its key/value pairs, and
// buildSnapshot writes pairs back as a valid stream: together they let a test plant
// state that the FSM would never write itself.
func snapshotPairs(t *testing.T, data []byte) [][2][]byte {
	t.Helper()
	b := data[9:]
	var pairs [][2][]byte
	for b[0] == 0x01 {
		b = b[1:]
		var kv [2][]byte
		for i := range kv {
			n, w := binary.Uvarint(b)
			kv[i], b = b[w:w+int(n)], b[w+int(n):]
		}
		pairs = append(pairs, kv)
	}
	return pairs
}

func buildSnapshot(pairs [][2][]byte) []byte {
	b := []byte("IDEMKVSN\x01")
	for _, kv := range pairs {
		b = append(b, 0x01)
		for _, f := range kv {
			b = binary.AppendUvarint(b, uint64(len(f)))
			b = append(b, f...)
		}
	}
	b = append(b, 0x02)
	b = binary.BigEndian.AppendUint64(b, uint64(len(pairs)))
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

// TestSweepRechecksRecords plants a stray expiry index entry (as a bug could leave)
// pointing at a live record: the sweep must delete the stray entry, not the record.
func TestSweepRechecksRecords(t *testing.T) {
	src := newHarness(t)
	mustOK(t, src.apply(reserveCmd(t0, tenant, "live", "a"),
		reserveCmd(t0, tenant, "dead", "b", func(r *idemkv.ReserveRequest) { r.TTLMs = 60_000 }))...)
	pairs := snapshotPairs(t, recordStream(t, src))
	stray := binary.BigEndian.AppendUint64([]byte("x/"), uint64(t0+1))
	stray = append(append(append(stray, tenant...), 0), "live"...)
	pairs = append(pairs, [2][]byte{stray, nil})
	slices.SortFunc(pairs, func(a, b [2][]byte) int { return bytes.Compare(a[0], b[0]) })

	h := newHarness(t)
	if err := h.f.Restore(io.NopCloser(bytes.NewReader(buildSnapshot(pairs)))); err != nil {
		t.Fatal(err)
	}
	if err := h.f.CheckExpiryIndex(); err == nil {
		t.Fatal("CheckExpiryIndex missed the planted stray entry")
	}
	h.next = h.f.AppliedIndex() + 1
	rs := h.apply(&Command{Op: OpSweep, Now: t0 + 60_000, Sweep: &SweepArgs{Limit: 10}})
	mustOK(t, rs...)
	if rs[0].Swept != 1 || rs[0].More {
		t.Errorf("sweep: %+v, want 1 swept (dead only)", rs[0])
	}
	if _, err := h.f.Get(tenant, "live", t0+60_000); err != nil {
		t.Errorf("live record swept through a stray index entry: %v", err)
	}
	if _, err := h.f.Get(tenant, "dead", 0); !errors.Is(err, idemkv.ErrNotFound) {
		t.Errorf("expired record not swept: %v", err)
	}
	if err := h.f.CheckExpiryIndex(); err != nil {
		t.Errorf("stray entry left behind: %v", err)
	}
}

// sweptWant is what one sweep should answer.
type sweptWant struct {
	swept int
	more  bool
}

// sweepInTurns applies sweeps of at most limit at now, one per want, checking each
// answer and the expiry index after it.
func sweepInTurns(t *testing.T, h *harness, now idemkv.Timestamp, limit int, wants []sweptWant) {
	t.Helper()
	sweep := &Command{Op: OpSweep, Now: now, Sweep: &SweepArgs{Limit: limit}}
	for i, want := range wants {
		rs := h.apply(sweep)
		mustOK(t, rs...)
		if rs[0].Swept != want.swept || rs[0].More != want.more {
			t.Errorf("sweep %d: swept %d more %v, want %d %v", i, rs[0].Swept, rs[0].More, want.swept, want.more)
		}
		if err := h.f.CheckExpiryIndex(); err != nil {
			t.Fatalf("after sweep %d: %v", i, err)
		}
	}
}

// Every reserve of a new key looks the key up on the node that takes it before it is
// proposed. Get's not-found error names the key (a format and its allocations);
// Lookup's answer for an absent key allocates the store's key and nothing else.
func TestLookupOfAnAbsentKeyAllocatesOnlyItsKey(t *testing.T) {
	h := newHarness(t)
	mustOK(t, h.apply(reserveCmd(t0, tenant, key, "a"))...)
	if rec, err := h.f.Lookup(tenant, "never-put", t0); rec != nil || err != nil {
		t.Fatalf("lookup of an absent key: %+v, %v", rec, err)
	}
	allocs := waitKeyFilter(h)
	if allocs > 1 {
		t.Errorf("a lookup of an absent key made %.1f allocations, want the key's one", allocs)
	}
	if got := testing.AllocsPerRun(200, func() { _, _ = h.f.Get(tenant, "never-put", t0) }); got <= allocs {
		t.Errorf("Get of an absent key made %.1f allocations, Lookup %.1f: its error names the key", got, allocs)
	}
}

// TestLookupLeavesTheHistoryOut: the write paths' look-up (a reserve's local answer,
// the leader's look before it proposes) reads a record without its history, which no
// reserve's answer carries; Get, which answers GET ?history=true, reads it whole.
func TestLookupLeavesTheHistoryOut(t *testing.T) {
	h := newHarness(t)
	res := h.apply(reserveCmd(t0, tenant, key, "a"))
	mustOK(t, res...)
	mustOK(t, h.apply(commitCmd(t0+10, tenant, key, res[0].Reserve.Record.Fence, "LIN-1"))...)
	whole, err := h.f.Get(tenant, key, t0+20)
	if err != nil || len(whole.History) != 2 {
		t.Fatalf("Get: %+v, %v; want the execute and commit events", whole, err)
	}
	brief, err := h.f.Lookup(tenant, key, t0+20)
	if err != nil || !reflect.DeepEqual(brief, whole.WithoutHistory()) {
		t.Fatalf("Lookup: %+v, %v; want %+v", brief, err, whole.WithoutHistory())
	}
	next, answer := Decide(brief, reserveCmd(t0+20, tenant, key, "b").Reserve, t0+20, 0)
	if next != nil || answer.Decision != idemkv.DecisionReplay {
		t.Fatalf("a replay decided from the look-up: next %+v, answer %+v", next, answer)
	}
}

// waitKeyFilter waits, up to 10 s, until a Lookup of a key never put allocates no
// more than the store's key: the key filter answers once its scan of the store at open
// is done, and until then Pebble does, and allocates more. It returns the allocations
// of the last try.
func waitKeyFilter(h *harness) float64 {
	lookup := func() { _, _ = h.f.Lookup(tenant, "never-put", t0) }
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if allocs := testing.AllocsPerRun(200, lookup); allocs <= 1 || time.Now().After(deadline) {
			return allocs
		}
	}
}

// BenchmarkLookupAbsent: the look-up each new key's reserve makes before it is
// proposed, by Lookup and by Get (which builds a not-found error naming the key).
func BenchmarkLookupAbsent(b *testing.B) {
	h := newHarness(b)
	mustOK(b, h.apply(reserveCmd(t0, tenant, key, "a"))...)
	waitKeyFilter(h)
	b.Run("Lookup", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = h.f.Lookup(tenant, "never-put", t0)
		}
	})
	b.Run("Get", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = h.f.Get(tenant, "never-put", t0)
		}
	})
}
