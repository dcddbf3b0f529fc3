package fsm

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/idemkv/idemkv"
)

// sampleCommands holds one fully populated command per op.
func sampleCommands() []*Command {
	now := t0 + 123
	return []*Command{
		{Op: OpReserve, Now: now, Reserve: &idemkv.ReserveRequest{Tenant: tenant, Key: key, Tool: "create_ticket",
			Actor: "worker-1", Fingerprint: fpA, Effect: json.RawMessage(`{"title":"x"}`), AttemptID: "att-1",
			LeaseTTLMs: lease, TTLMs: ttl, ExpiresAt: t0 + 99}},
		{Op: OpCommit, Now: now, Commit: &idemkv.CommitRequest{Tenant: tenant, Key: key, Fingerprint: fpA, Fence: 1 << 40,
			RemoteSystem: "linear", RemoteID: "LIN-1842", RemoteURL: "https://linear.example/LIN-1842",
			Result: json.RawMessage(`{"id":"LIN-1842","ü":"✓"}`)}},
		{Op: OpFail, Now: now, Fail: &idemkv.FailRequest{Tenant: tenant, Key: key, Fingerprint: fpA, Fence: 3,
			Error: idemkv.ErrorInfo{Code: "rejected", Message: "no", Details: json.RawMessage(`[1,2]`)}}},
		{Op: OpRelease, Now: now, Release: &idemkv.ReleaseRequest{Tenant: tenant, Key: key, Fingerprint: fpA, Fence: 4}},
		{Op: OpHeartbeat, Now: now, Heartbeat: &idemkv.HeartbeatRequest{Tenant: tenant, Key: key, Fence: 5, LeaseTTLMs: 1000}},
		{Op: OpSweep, Now: now, Sweep: &SweepArgs{Limit: 500}},
		{Op: OpSetNode, Now: now, Node: &idemkv.NodeInfo{ID: "n1", RaftAddr: "127.0.0.1:7421", APIAddr: "127.0.0.1:7420"}},
		{Op: OpRemoveNode, Now: now, Node: &idemkv.NodeInfo{ID: "n2"}},
		{Op: OpDoubt, Now: now, Doubt: &idemkv.DoubtRequest{Tenant: tenant, Key: key, Fingerprint: fpA, Fence: 6}},
		{Op: OpResolve, Now: now, Resolve: &idemkv.ResolveRequest{Tenant: tenant, Key: key, Fingerprint: fpA,
			Outcome: idemkv.ResolveCommitted, RemoteSystem: "linear", RemoteID: "LIN-9", RemoteURL: "https://l/9",
			Result: json.RawMessage(`{"id":"LIN-9"}`)}},
		{Op: OpReserve, Now: now, Reserve: &idemkv.ReserveRequest{Tenant: tenant, Key: key, Tool: "refund",
			Fingerprint: fpA, Effect: json.RawMessage(`{"order":17}`), AttemptID: "att-1", LeaseTTLMs: lease, TTLMs: ttl,
			Approval: &idemkv.ApprovalAsk{Required: true, TTLMs: 60_000, Summary: "Refund 40 EUR\nto order 17"}}},
		{Op: OpDecideApproval, Now: now, Approval: &idemkv.DecideApprovalRequest{Tenant: tenant, Key: key, ApprovalID: "apr_9",
			Fingerprint: fpA, Decision: idemkv.VerdictDeny, Approver: "ana", Reason: "wrong order"}},
		{Op: OpSetApprovalRule, Now: now, Rule: &idemkv.ApprovalRule{Tenant: tenant, Tool: "refund", TTLMs: 120_000}},
		{Op: OpRemoveApprovalRule, Now: now, Rule: &idemkv.ApprovalRule{Tenant: tenant, Tool: "refund"}},
	}
}

// TestCommandVersions: only a reserve that asks for approval is written as version 2,
// so every other entry stays readable by a node that knows version 1 alone; a version
// 2 entry of another op is refused.
func TestCommandVersions(t *testing.T) {
	for _, c := range sampleCommands() {
		b, err := c.AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		want := byte(commandVersion)
		if c.Op == OpReserve && c.Reserve.Approval != nil {
			want = commandVersionApproval
		}
		if b[0] != want {
			t.Errorf("%s written as version %d, want %d", c.Op, b[0], want)
		}
		if c.Op == OpCommit {
			b[0] = commandVersionApproval
			if _, err := DecodeCommand(b); !errors.Is(err, ErrMalformedCommand) {
				t.Errorf("a version 2 commit decoded: %v", err)
			}
		}
	}
}

func TestCommandRoundTrip(t *testing.T) {
	cmds := sampleCommands()
	// Empty optional fields must come back empty (nil raw JSON stays nil).
	cmds = append(cmds,
		&Command{Op: OpReserve, Now: 1, Reserve: &idemkv.ReserveRequest{Tenant: "t", Key: "k", Tool: "x", Fingerprint: "f"}},
		&Command{Op: OpCommit, Now: -5, Commit: &idemkv.CommitRequest{Tenant: "t", Key: "k", Fence: 1}},
	)
	seen := map[Op]bool{}
	for _, c := range cmds {
		t.Run(c.Op.String(), func(t *testing.T) {
			b, err := c.AppendBinary([]byte("prefix"))
			if err != nil {
				t.Fatal(err)
			}
			if string(b[:6]) != "prefix" {
				t.Fatalf("AppendBinary overwrote dst: %q", b[:6])
			}
			got, err := DecodeCommand(b[6:])
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", got, c)
			}
			// Decoded fields must not alias the input: Raft reuses its buffers.
			for i := range b {
				b[i] = 0
			}
			if !reflect.DeepEqual(got, c) {
				t.Fatalf("decoded command changed when the input buffer was reused: %+v", got)
			}
			seen[c.Op] = true
		})
	}
	for op := OpReserve; op <= OpRemoveApprovalRule; op++ {
		if !seen[op] {
			t.Errorf("no round trip for %s", op)
		}
	}
}

func TestCommandEncodeRejectsMissingPayload(t *testing.T) {
	for op := OpReserve; op <= OpRemoveApprovalRule; op++ {
		if _, err := (&Command{Op: op}).AppendBinary(nil); !errors.Is(err, idemkv.ErrInternal) {
			t.Errorf("%s without payload: err = %v, want internal", op, err)
		}
	}
	if _, err := (&Command{Op: 99}).AppendBinary(nil); !errors.Is(err, idemkv.ErrInternal) {
		t.Errorf("unknown op: err = %v, want internal", err)
	}
}

func TestDecodeCommandRejects(t *testing.T) {
	valid, err := sampleCommands()[1].AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string][]byte{
		"empty":           nil,
		"unknown version": append([]byte{9}, valid[1:]...),
		"unknown op":      {commandVersion, 0, 0},
		"op past the end": {commandVersion, byte(OpLogCheckpoint + 1), 0},
		"trailing bytes":  append(append([]byte(nil), valid...), 0),
		"huge length":     {commandVersion, byte(OpRelease), 0, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"negative limit":  {commandVersion, byte(OpSweep), 0, 1},
		"bad varint":      {commandVersion, byte(OpSweep), 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
	}
	for i := range valid {
		bad[fmt.Sprintf("truncated at %d", i)] = valid[:i]
	}
	for name, b := range bad {
		c, err := DecodeCommand(b)
		if !errors.Is(err, ErrMalformedCommand) || !errors.Is(err, idemkv.ErrInternal) || c != nil {
			t.Errorf("%s: got %+v, %v; want a malformed-command error", name, c, err)
		}
	}
}

// FuzzDecodeCommand: hostile bytes never panic, and whatever decodes re-encodes to a
// command that decodes to the same value.
func FuzzDecodeCommand(f *testing.F) {
	for _, c := range sampleCommands() {
		b, err := c.AppendBinary(nil)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{commandVersion, byte(OpReserve), 0, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCommand(b)
		if err != nil {
			if c != nil || !errors.Is(err, ErrMalformedCommand) {
				t.Fatalf("failed decode returned %+v, %v", c, err)
			}
			return
		}
		again, err := c.AppendBinary(nil)
		if err != nil {
			t.Fatalf("decoded %+v does not re-encode: %v", c, err)
		}
		c2, err := DecodeCommand(again)
		if err != nil {
			t.Fatalf("re-encoding does not decode: %v", err)
		}
		if !reflect.DeepEqual(c, c2) {
			t.Fatalf("re-encoding changed the command:\n%+v\n%+v", c, c2)
		}
	})
}

// A log checkpoint round-trips with no payload, and IsLogCheckpoint tells it from
// every other command by its first two bytes.
func TestLogCheckpointIsANoOpCommand(t *testing.T) {
	buf, err := (&Command{Op: OpLogCheckpoint, Now: 5}).AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !IsLogCheckpoint(buf) {
		t.Fatalf("%x is not a log checkpoint", buf)
	}
	c, err := DecodeCommand(buf)
	if err != nil || c.Op != OpLogCheckpoint || c.Now != 5 {
		t.Fatalf("decoded %+v, %v", c, err)
	}
	if k, all := touched(c); all || k != (recordKey{}) {
		t.Fatalf("a checkpoint wakes %v (all %v)", k, all)
	}
	for op := OpReserve; op < OpLogCheckpoint; op++ {
		if IsLogCheckpoint([]byte{commandVersion, byte(op), 0}) {
			t.Fatalf("%s taken for a log checkpoint", op)
		}
	}
	if IsLogCheckpoint(nil) || IsLogCheckpoint([]byte{9, byte(OpLogCheckpoint), 0}) {
		t.Fatal("a short entry or another version taken for a log checkpoint")
	}
}
