package workload

import (
	"encoding/json"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

const fpA, fpB = "sha256:aa", "sha256:bb"

func do(id int64, key, fp, decision string, rc *history.Receipt) history.Op {
	return history.Op{ID: id, Workload: "agent", F: history.FDo, Key: key, Type: history.OK,
		In: history.Input{Fingerprint: fp, Args: "args:" + fp, Class: ClassProbe}, Out: &history.Output{Decision: decision, Receipt: rc}}
}

func committed(id string) *history.Receipt {
	return &history.Receipt{Status: "committed", Fingerprint: fpA, RemoteID: id}
}

func stored(fp, remote string) *idemkv.Record {
	return &idemkv.Record{Fingerprint: fp, Status: idemkv.StatusCommitted, Receipt: &idemkv.StoredReceipt{RemoteID: remote}}
}

func kinds(a []AgentAnomaly) map[string]int {
	out := map[string]int{}
	for _, x := range a {
		out[x.Kind]++
	}
	return out
}

func TestCheckAgentsClean(t *testing.T) {
	conflict := do(3, "k", fpB, OutcomeConflict, nil)
	conflict.Out.ConflictFP = fpA
	ops := []history.Op{do(1, "k", fpA, OutcomeCommitted, committed("T-1")), do(2, "k", fpA, OutcomeReplayed, committed("T-1")), conflict}
	effects := map[string][]Effect{"k": {{Key: "k", Args: "args:" + fpA, RemoteID: "T-1", Class: ClassProbe}}}
	if a := CheckAgents(ops, effects, map[string]*idemkv.Record{"k": stored(fpA, "T-1")}); len(a) != 0 {
		t.Fatalf("a clean history has anomalies: %v", a)
	}
}

func TestCheckAgentsFindsEachAnomaly(t *testing.T) {
	effect := func(id string, class string) Effect {
		return Effect{Key: "k", Args: "args:" + fpA, RemoteID: id, Class: class}
	}
	pending := &idemkv.Record{Fingerprint: fpA, Status: idemkv.StatusPending}
	cases := []struct {
		name    string
		ops     []history.Op
		effects []Effect
		final   *idemkv.Record
		want    string
	}{
		{"double effect", []history.Op{do(1, "k", fpA, OutcomeCommitted, committed("T-1"))},
			[]Effect{effect("T-1", ClassProbe), effect("T-2", ClassProbe)}, stored(fpA, "T-1"), AnomalyDoubleEffect},
		{"lost receipt", []history.Op{do(1, "k", fpA, OutcomeCommitted, committed("T-1"))},
			[]Effect{effect("T-1", ClassProbe)}, nil, AnomalyLostReceipt},
		{"receipt changed", []history.Op{do(1, "k", fpA, OutcomeCommitted, committed("T-1"))},
			[]Effect{effect("T-1", ClassProbe)}, stored(fpA, "T-9"), AnomalyReceiptMismatch},
		{"receipt without effect", []history.Op{do(1, "k", fpA, OutcomeCommitted, committed("T-7"))},
			[]Effect{effect("T-1", ClassProbe)}, stored(fpA, "T-7"), AnomalyPhantomReceipt},
		{"conflict with one argument set", []history.Op{do(1, "k", fpA, OutcomeConflict, nil)},
			nil, stored(fpA, "T-1"), AnomalyWrongConflict},
		{"other arguments executed", []history.Op{do(1, "k", fpA, OutcomeCommitted, committed("T-1")), do(2, "k", fpB, OutcomeCommitted, &history.Receipt{Status: "committed", Fingerprint: fpA, RemoteID: "T-1"})},
			[]Effect{effect("T-1", ClassProbe)}, stored(fpA, "T-1"), AnomalyMissedConflict},
		{"committed without an effect", []history.Op{do(1, "k", fpA, OutcomeCommitted, committed("T-1"))},
			nil, stored(fpA, "T-1"), AnomalyMissingEffect},
		{"an effect and no record", []history.Op{do(1, "k", fpA, OutcomeAbandoned, nil)},
			[]Effect{effect("T-1", ClassProbe)}, nil, AnomalyOrphanEffect},
		{"an effect and a record left pending", []history.Op{do(1, "k", fpA, OutcomeAbandoned, nil)},
			[]Effect{effect("T-1", ClassProbe)}, pending, AnomalyOrphanEffect},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			final := map[string]*idemkv.Record{}
			if c.final != nil {
				final["k"] = c.final
			}
			got := kinds(CheckAgents(c.ops, map[string][]Effect{"k": c.effects}, final))
			if got[c.want] == 0 {
				t.Fatalf("want %s, got %v", c.want, got)
			}
		})
	}
	// An effect whose key ended in doubt is accounted for, whether the record or
	// only the client says so.
	for _, rec := range []*idemkv.Record{pending, {Fingerprint: fpA, Status: idemkv.StatusPending, InDoubt: true}} {
		ops := []history.Op{do(1, "k", fpA, OutcomeAbandoned, nil)}
		if !rec.InDoubt {
			ops = append(ops, do(2, "k", fpA, OutcomeInDoubt, nil))
		}
		if a := CheckAgents(ops, map[string][]Effect{"k": {effect("T-1", ClassProbe)}}, map[string]*idemkv.Record{"k": rec}); len(a) != 0 {
			t.Fatalf("an effect in doubt was flagged: %v", a)
		}
	}
	// Idempotent effects may repeat.
	ops := []history.Op{do(1, "k", fpA, OutcomeCommitted, committed("T-1"))}
	ops[0].In.Class = ClassIdempotent
	a := CheckAgents(ops, map[string][]Effect{"k": {effect("T-1", ClassIdempotent), effect("T-1", ClassIdempotent)}},
		map[string]*idemkv.Record{"k": stored(fpA, "T-1")})
	if len(a) != 0 {
		t.Fatalf("a repeated idempotent effect was flagged: %v", a)
	}
}

func TestDownstream(t *testing.T) {
	d := NewDownstream(1)
	d.TimeoutAfterEffect, d.RefuseBeforeEffect = 0, 0
	e, err := d.Execute("k", "{}", ClassProbe)
	if err != nil || e.RemoteID == "" || e.RemoteURL == "" || !json.Valid(e.Result) {
		t.Fatalf("Execute = %+v, %v", e, err)
	}
	if got, found := d.Probe("k"); !found || got.RemoteID != e.RemoteID || string(got.Result) != string(e.Result) || got.RemoteURL != e.RemoteURL {
		t.Fatalf("Probe = %+v, %v; want %+v", got, found, e)
	}
	if _, found := d.Probe("other"); found {
		t.Fatal("a probe found an effect that never happened")
	}
	d.TimeoutAfterEffect = 1
	if _, err := d.Execute("k2", "{}", ClassProbe); err == nil {
		t.Fatal("a timeout after the effect returned no error")
	}
	if _, found := d.Probe("k2"); !found {
		t.Fatal("the effect before the timeout is not visible to the probe")
	}
	again, _ := func() (Effect, error) { d.TimeoutAfterEffect = 0; return d.Execute("i", "{}", ClassIdempotent) }()
	twice, _ := d.Execute("i", "{}", ClassIdempotent)
	if again.RemoteID != twice.RemoteID || string(again.Result) != string(twice.Result) || len(d.Effects()["i"]) != 2 {
		t.Fatalf("idempotent effects: %+v %+v, %d effects", again, twice, len(d.Effects()["i"]))
	}
}

// Every acknowledged receipt is exactly the stored one and what its effect answered:
// the result's bytes, the remote URL and committed_at too.
func TestCheckAgentsReceiptsExactly(t *testing.T) {
	result := json.RawMessage(`{"zid":"T-1","ticket":{"n":2E+3,"title":"日本語"}}`)
	effects := map[string][]Effect{"k": {{Key: "k", Args: "args:" + fpA, RemoteID: "T-1", Class: ClassProbe, RemoteURL: "https://t/T-1", Result: result}}}
	full := func(raw []byte, url string, at int64) *history.Receipt {
		return &history.Receipt{Status: "committed", Fingerprint: fpA, RemoteID: "T-1", RemoteURL: url, ResultDigest: history.Digest(raw), CommittedAt: at}
	}
	final := func(raw []byte, url string, at int64) map[string]*idemkv.Record {
		return map[string]*idemkv.Record{"k": {Fingerprint: fpA, Status: idemkv.StatusCommitted,
			Receipt: &idemkv.StoredReceipt{RemoteID: "T-1", RemoteURL: url, Result: raw, CommittedAt: idemkv.Timestamp(at)}}}
	}
	ops := func(replay *history.Receipt) []history.Op {
		return []history.Op{do(1, "k", fpA, OutcomeCommitted, full(result, "https://t/T-1", 1000)), do(2, "k", fpA, OutcomeReplayed, replay)}
	}
	if a := CheckAgents(ops(full(result, "https://t/T-1", 1000)), effects, final(result, "https://t/T-1", 1000)); len(a) != 0 {
		t.Fatalf("exact replays have anomalies: %v", a)
	}
	canonical := json.RawMessage(`{"ticket":{"n":2000,"title":"日本語"},"zid":"T-1"}`)
	cases := []struct {
		name   string
		replay *history.Receipt
		final  map[string]*idemkv.Record
	}{
		{"a replay without the result", full(nil, "https://t/T-1", 1000), final(result, "https://t/T-1", 1000)},
		{"a replay with the result re-encoded", full(canonical, "https://t/T-1", 1000), final(result, "https://t/T-1", 1000)},
		{"a replay without the remote URL", full(result, "", 1000), final(result, "https://t/T-1", 1000)},
		{"a replay re-stamped", full(result, "https://t/T-1", 1001), final(result, "https://t/T-1", 1000)},
		{"the result stored re-encoded, replayed alike", full(canonical, "https://t/T-1", 1000), final(canonical, "https://t/T-1", 1000)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := kinds(CheckAgents(ops(c.replay), effects, c.final)); got[AnomalyReceiptMismatch] == 0 || len(got) != 1 {
				t.Fatalf("want only %s, got %v", AnomalyReceiptMismatch, got)
			}
		})
	}
	// Every answer agrees with the stored record, and none with what the tool
	// answered: the commit itself lost the result.
	lost := []history.Op{do(1, "k", fpA, OutcomeCommitted, full(nil, "https://t/T-1", 1000)), do(2, "k", fpA, OutcomeReplayed, full(nil, "https://t/T-1", 1000))}
	if got := kinds(CheckAgents(lost, effects, final(nil, "https://t/T-1", 1000))); got[AnomalyReceiptMismatch] != 2 || len(got) != 1 {
		t.Fatalf("a result the commit dropped: %v", got)
	}
}
