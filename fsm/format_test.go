package fsm

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"testing"

	"github.com/idemkv/idemkv"
	dto "github.com/prometheus/client_model/go"
)

// TestCommandFormat is the table of the gate predicate: the lowest cluster format at
// which each command may be proposed.
func TestCommandFormat(t *testing.T) {
	no := false
	rows := []struct {
		name string
		cmd  *Command
		want int
	}{
		{"plain reserve", reserveCmd(t0, "t0", "k", "a"), FormatApprovals},
		{"reserve asking approval (command version 2)", reserveCmd(t0, "t0", "k", "a", func(r *idemkv.ReserveRequest) {
			r.Approval = &idemkv.ApprovalAsk{Required: true, TTLMs: 1000}
			r.Effect = json.RawMessage(`{}`)
		}), FormatApprovals},
		{"reserve with store_effect", reserveCmd(t0, "t0", "k", "a", func(r *idemkv.ReserveRequest) {
			r.StoreEffect = true
			r.Effect = json.RawMessage(`{}`)
		}), FormatHistory},
		{"commit", commitCmd(t0, "t0", "k", 1, "R"), FormatApprovals},
		{"resolve without by", &Command{Op: OpResolve, Resolve: &idemkv.ResolveRequest{Tenant: "t0", Key: "k", Outcome: idemkv.ResolveCommitted}}, FormatApprovals},
		{"resolve naming its token", &Command{Op: OpResolve, Resolve: &idemkv.ResolveRequest{Tenant: "t0", Key: "k", Outcome: idemkv.ResolveCommitted, By: "ops"}}, FormatHistory},
		{"approval rule", &Command{Op: OpSetApprovalRule, Rule: &idemkv.ApprovalRule{Tenant: "t0", Tool: "x", TTLMs: 1000}}, FormatApprovals},
		{"rule storing effects", &Command{Op: OpSetApprovalRule, Rule: &idemkv.ApprovalRule{Tenant: "t0", Tool: "x", StoreEffect: true}}, FormatHistory},
		{"rule masking", &Command{Op: OpSetApprovalRule, Rule: &idemkv.ApprovalRule{Tenant: "t0", Tool: "x", Mask: []string{"/card"}}}, FormatHistory},
		{"rule without approval", &Command{Op: OpSetApprovalRule, Rule: &idemkv.ApprovalRule{Tenant: "t0", Tool: "x", RequireApproval: &no}}, FormatHistory},
		{"set node", &Command{Op: OpSetNode, Node: &idemkv.NodeInfo{ID: "n1"}}, FormatApprovals},
		{"advertise", &Command{Op: OpAdvertise, Node: &idemkv.NodeInfo{ID: "n1", Format: 3}}, FormatApprovals},
		{"set format (gated by the advertisements)", &Command{Op: OpSetFormat, Format: 3}, FormatApprovals},
		{"sweep", &Command{Op: OpSweep, Sweep: &SweepArgs{}}, FormatApprovals},
	}
	for _, r := range rows {
		if got := CommandFormat(r.cmd); got != r.want {
			t.Errorf("%s: CommandFormat = %d, want %d", r.name, got, r.want)
		}
	}
	for f, want := range map[int]bool{FormatApprovals: false, FormatHistory: true, FormatHistory + 1: true} {
		if RecordsHistory(f) != want {
			t.Errorf("RecordsHistory(%d) = %v", f, !want)
		}
	}
}

func TestAtFormat(t *testing.T) {
	full := func() *idemkv.Record {
		return &idemkv.Record{Tenant: "t0", Key: "k", Status: idemkv.StatusPending, Effect: json.RawMessage(`{"a":1}`),
			EffectMask: []string{"/a"}, History: []idemkv.HistoryEvent{{At: t0, Event: idemkv.EventExecute}}, HistoryDropped: 2}
	}
	rec := full()
	AtFormat(rec, FormatHistory)
	if !reflect.DeepEqual(rec, full()) {
		t.Errorf("format 3 changed the record: %+v", rec)
	}
	AtFormat(rec, FormatApprovals)
	if rec.History != nil || rec.HistoryDropped != 0 || rec.EffectMask != nil || rec.Effect != nil {
		t.Errorf("format 2 kept %+v", rec)
	}
	asked := full()
	asked.Approval = &idemkv.Approval{ID: "apr_1", State: idemkv.ApprovalWaiting}
	AtFormat(asked, FormatApprovals)
	if string(asked.Effect) != `{"a":1}` || asked.History != nil {
		t.Errorf("format 2 must keep an approval's effect (the release before history did) and drop the rest: %+v", asked)
	}
	AtFormat(nil, FormatApprovals) // a decision that stores nothing
}

// TestClusterFormatGatesTheStateMachine: below format 3 the state machine stores what
// the release before history stored, whatever the entries carry; an OpSetFormat raises
// the format (never lowers it), and from then on histories are recorded.
func TestClusterFormatGatesTheStateMachine(t *testing.T) {
	h := openHarnessAt(t, t.TempDir(), 0)
	if got := h.f.Format(); got != FormatApprovals {
		t.Fatalf("a new state machine is at format %d", got)
	}
	before, _ := h.f.StateHash()
	storing := func(r *idemkv.ReserveRequest) { r.Effect = json.RawMessage(`{"amount":1}`) }
	rs := h.apply(reserveCmd(t0, "t0", "old", "a", storing),
		&Command{Op: OpSetApprovalRule, Now: t0, Rule: &idemkv.ApprovalRule{Tenant: "t0", Tool: "x", StoreEffect: true}},
		&Command{Op: OpAdvertise, Now: t0, Node: &idemkv.NodeInfo{ID: "n1", Format: 3}})
	mustOK(t, rs[0], rs[2])
	if rs[1].Err == nil || !errors.Is(rs[1].Err, idemkv.ErrUnavailable) {
		t.Errorf("a rule with options at format 2: %+v", rs[1])
	}
	if rec := rs[0].Reserve.Record; rec.History != nil || rec.Effect != nil {
		t.Errorf("format 2 answered a record with history %v and effect %s", rec.History, rec.Effect)
	}
	if rec, err := h.f.Get("t0", "old", t0); err != nil || rec.History != nil || rec.Effect != nil {
		t.Errorf("format 2 stored %+v (%v)", rec, err)
	}
	if _, ok, _ := h.f.ApprovalRule("t0", "x"); ok {
		t.Error("format 2 stored a rule with options")
	}
	if h.f.Advertised("n1") != 3 || h.f.Advertised("n2") != FormatApprovals {
		t.Errorf("advertised n1 %d, n2 %d", h.f.Advertised("n1"), h.f.Advertised("n2"))
	}
	if after, _ := h.f.StateHash(); after == before {
		t.Error("the reserve changed no state")
	}

	hashAt2, _ := h.f.StateHash()
	mustOK(t, h.apply(&Command{Op: OpSetFormat, Now: t0, Format: FormatHistory})...)
	if h.f.Format() != FormatHistory {
		t.Fatalf("format %d after raising it to 3", h.f.Format())
	}
	if hashAt3, _ := h.f.StateHash(); hashAt3 == hashAt2 {
		t.Error("the cluster format is replicated state but the state hash does not cover it")
	}
	mustOK(t, h.apply(&Command{Op: OpSetFormat, Now: t0, Format: FormatApprovals})...)
	if h.f.Format() != FormatHistory {
		t.Errorf("an OpSetFormat lowered the format to %d", h.f.Format())
	}
	rs = h.apply(reserveCmd(t0+1, "t0", "new", "a", storing))
	mustOK(t, rs...)
	rec, err := h.f.Get("t0", "new", t0+1)
	if err != nil || len(rec.History) != 1 || rec.History[0].Event != idemkv.EventExecute || string(rec.Effect) != `{"amount":1}` {
		t.Errorf("format 3 stored %+v (%v)", rec, err)
	}

	// A record with a history from before the gate (a store of a build that wrote
	// histories unconditionally) leaves no tombstone at format 2: the one predicate.
	fresh := openHarnessAt(t, t.TempDir(), 0)
	b := fresh.st.NewBatch()
	old := &idemkv.Record{Tenant: "t0", Key: "h", Tool: "create_ticket", Fingerprint: fpA, Status: idemkv.StatusPending,
		Fence: 7, AttemptID: "a", CreatedAt: t0, UpdatedAt: t0, LeaseExpiresAt: t0 + lease, ExpiresAt: t0 + ttl,
		History: []idemkv.HistoryEvent{{At: t0, Event: idemkv.EventExecute, Fence: 7}}}
	if err := b.PutRecord(old); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	mustOK(t, fresh.apply(&Command{Op: OpRelease, Now: t0 + 1, Release: &idemkv.ReleaseRequest{Tenant: "t0", Key: "h", Fingerprint: fpA, Fence: 7}})...)
	if tomb, err := fresh.st.Tombstone("t0", "h"); err != nil || tomb != nil {
		t.Errorf("format 2 left a tombstone %+v (%v)", tomb, err)
	}

	// Both survive a restart.
	h.close()
	h = openHarness(t, h.dir)
	if h.f.Format() != FormatHistory || h.f.Advertised("n1") != 3 {
		t.Errorf("after reopening: format %d, n1 advertised %d", h.f.Format(), h.f.Advertised("n1"))
	}
	if v := testutilGauge(t, h); v != FormatHistory {
		t.Errorf("idemkv_cluster_format = %v after reopening", v)
	}
}

func testutilGauge(t *testing.T, h *harness) float64 {
	t.Helper()
	var d dto.Metric
	if err := h.m.ClusterFormat.Write(&d); err != nil {
		t.Fatal(err)
	}
	return d.GetGauge().GetValue()
}

// TestClusterFormatSnapshotRestore: the format and the advertisements travel in a
// snapshot; a removed node's advertisement goes with it.
func TestClusterFormatSnapshotRestore(t *testing.T) {
	src := openHarnessAt(t, t.TempDir(), 0)
	populate(t, src, 50)
	mustOK(t, src.apply(&Command{Op: OpAdvertise, Now: t0, Node: &idemkv.NodeInfo{ID: "n1", Format: 3}},
		&Command{Op: OpSetNode, Now: t0, Node: &idemkv.NodeInfo{ID: "n2", RaftAddr: "r2"}},
		&Command{Op: OpAdvertise, Now: t0, Node: &idemkv.NodeInfo{ID: "n2", Format: 3}},
		&Command{Op: OpSetFormat, Now: t0, Format: FormatHistory},
		&Command{Op: OpRemoveNode, Now: t0, Node: &idemkv.NodeInfo{ID: "n2"}})...)
	if src.f.Advertised("n2") != FormatApprovals {
		t.Errorf("a removed node's advertisement stayed: %d", src.f.Advertised("n2"))
	}
	data, want := snapshotBytes(t, src)

	dst := openHarnessAt(t, t.TempDir(), 0)
	if err := dst.f.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
		t.Fatal(err)
	}
	got := stateOf(t, dst.f)
	if got.hash != want.hash || dst.f.Format() != FormatHistory || dst.f.Advertised("n1") != 3 || dst.f.Advertised("n2") != FormatApprovals {
		t.Errorf("restored: hash equal %v, format %d, n1 %d, n2 %d", got.hash == want.hash, dst.f.Format(),
			dst.f.Advertised("n1"), dst.f.Advertised("n2"))
	}
	if !reflect.DeepEqual(got.nodes, want.nodes) || got.nodes[0].Format != 3 {
		t.Errorf("nodes %+v, want %+v", got.nodes, want.nodes)
	}
	// A snapshot from before any format restores at format 2, over a store at 3.
	old := openHarnessAt(t, t.TempDir(), 0)
	populate(t, old, 10)
	oldData, _ := snapshotBytes(t, old)
	if err := dst.f.Restore(io.NopCloser(bytes.NewReader(oldData))); err != nil {
		t.Fatal(err)
	}
	if dst.f.Format() != FormatApprovals || dst.f.Advertised("n1") != FormatApprovals {
		t.Errorf("after restoring a format-2 snapshot: format %d, n1 %d", dst.f.Format(), dst.f.Advertised("n1"))
	}
}

// TestReadFormatStandsForTheOlderRelease: a replica reading format 2 skips an
// advertisement as that release skips an unknown op, and halts on what it could not
// read: a raise to 3, a command of version 3, a snapshot holding histories.
func TestReadFormatStandsForTheOlderRelease(t *testing.T) {
	older := func(t *testing.T) *harness {
		h := openHarnessAt(t, t.TempDir(), 0)
		h.f.ReadFormat(FormatApprovals)
		return h
	}
	t.Run("advertisement skipped", func(t *testing.T) {
		h := older(t)
		rs := h.apply(&Command{Op: OpAdvertise, Now: t0, Node: &idemkv.NodeInfo{ID: "n1", Format: 3}}, reserveCmd(t0, "t0", "k", "a"))
		if rs[0].Err == nil || !errors.Is(rs[0].Err, ErrMalformedCommand) || rs[1].Err != nil {
			t.Errorf("results %+v %+v", rs[0], rs[1])
		}
		if h.f.Err() != nil || h.f.Advertised("n1") != FormatApprovals {
			t.Errorf("halted %v, advertised %d", h.f.Err(), h.f.Advertised("n1"))
		}
	})
	for name, cmd := range map[string]*Command{
		"raise to 3":        {Op: OpSetFormat, Now: t0, Format: FormatHistory},
		"command version 3": {Op: OpResolve, Now: t0, Resolve: &idemkv.ResolveRequest{Tenant: "t0", Key: "k", Outcome: idemkv.ResolveNotExecuted, By: "ops"}},
	} {
		t.Run(name, func(t *testing.T) {
			h := older(t)
			rs := h.apply(cmd)
			if h.f.Err() == nil || rs[0].Err == nil || !errors.Is(rs[0].Err, idemkv.ErrOutcomeUnknown) {
				t.Errorf("not halted: %+v, %v", rs[0], h.f.Err())
			}
		})
	}
	t.Run("snapshot with histories", func(t *testing.T) {
		src := openHarnessAt(t, t.TempDir(), 0)
		mustOK(t, src.apply(&Command{Op: OpSetFormat, Now: t0, Format: FormatHistory}, reserveCmd(t0, "t0", "k", "a"))...)
		data, _ := snapshotBytes(t, src)
		h := older(t)
		if err := h.f.Restore(io.NopCloser(bytes.NewReader(data))); err == nil || h.f.Err() == nil {
			t.Errorf("restored a format-3 snapshot: %v", err)
		}
	})
	t.Run("snapshot without", func(t *testing.T) {
		src := openHarnessAt(t, t.TempDir(), 0)
		populate(t, src, 20)
		data, _ := snapshotBytes(t, src)
		h := older(t)
		if err := h.f.Restore(io.NopCloser(bytes.NewReader(data))); err != nil || h.f.Err() != nil {
			t.Errorf("a format-2 snapshot: %v", err)
		}
	})
}

// A snapshot (or a backup) of a newer release's cluster format is refused, also by a
// node that reads the newest format it knows: a rollback restoring a newer backup.
func TestSnapshotOfANewerFormatIsRefused(t *testing.T) {
	src := openHarnessAt(t, t.TempDir(), 0)
	populate(t, src, 10)
	b := src.st.NewBatch()
	if err := b.SetClusterFormat(FormatVersion + 1); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	data, _ := snapshotBytes(t, src)
	dst := openHarnessAt(t, t.TempDir(), 0)
	if err := dst.f.Restore(io.NopCloser(bytes.NewReader(data))); err == nil || dst.f.Err() == nil {
		t.Errorf("restored a snapshot of cluster format %d: %v", FormatVersion+1, err)
	}
}
