package fsm

import (
	"fmt"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/wire"
	"github.com/idemkv/idemkv/storage"
)

// Op names the state change a Command asks for.
type Op uint8

const (
	OpReserve Op = iota + 1
	OpCommit
	OpFail
	OpRelease
	OpHeartbeat
	// OpSweep deletes up to Sweep.Limit records with expires_at <= Now.
	OpSweep
	// OpSetNode upserts Node (id, raft_addr, api_addr) in the replicated membership metadata.
	OpSetNode
	// OpRemoveNode deletes Node.ID from the membership metadata.
	OpRemoveNode
	// OpDoubt marks a pending record in doubt (the holder of its fence asks).
	OpDoubt
	// OpResolve settles an in-doubt record without a fence: commit or release.
	OpResolve
	// OpDecideApproval approves or denies the approval a record waits for.
	OpDecideApproval
	// OpSetApprovalRule sets the approval rule of Rule.Tenant and Rule.Tool.
	OpSetApprovalRule
	// OpRemoveApprovalRule deletes it.
	OpRemoveApprovalRule
	// OpLogCheckpoint changes no state: the leader appends one now and then for
	// raft-wal's log verifier (node/verify.go), which checksums the entries between two
	// of them on every node. It carries no payload; its stamp is a proposal's like any
	// other (the node's clock reads every applied entry as freshly stamped).
	OpLogCheckpoint
	// OpAdvertise records the data format Node.ID reads (Node.Format). A node of the
	// release before formats does not know the op: it logs the entry as undecodable and
	// applies nothing, which is all it needs to do (it keeps no formats).
	OpAdvertise
	// OpSetFormat raises the cluster's data format to Format (format.go). The leader
	// proposes it only once every member advertises Format, so no node that cannot
	// read the format ever meets it.
	OpSetFormat
)

var opNames = [...]string{
	OpReserve:    "reserve",
	OpCommit:     "commit",
	OpFail:       "fail",
	OpRelease:    "release",
	OpHeartbeat:  "heartbeat",
	OpSweep:      "sweep",
	OpSetNode:    "set_node",
	OpRemoveNode: "remove_node",
	OpDoubt:      "doubt",
	OpResolve:    "resolve",
	// Approvals.
	OpDecideApproval:     "decide_approval",
	OpSetApprovalRule:    "set_approval_rule",
	OpRemoveApprovalRule: "remove_approval_rule",
	OpLogCheckpoint:      "log_checkpoint",
	OpAdvertise:          "advertise",
	OpSetFormat:          "set_format",
}

func (o Op) String() string {
	if o >= OpReserve && int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Command is one Raft log entry. Now is the proposing leader's wall clock (Unix ms).
// The node has already validated the request, filled defaults (LeaseTTLMs, TTLMs or
// ExpiresAt), generated AttemptID if empty, and computed Fingerprint (Effect is nil).
// Exactly the payload field that matches Op is set.
type Command struct {
	Op        Op
	Now       idemkv.Timestamp
	Reserve   *idemkv.ReserveRequest
	Commit    *idemkv.CommitRequest
	Fail      *idemkv.FailRequest
	Release   *idemkv.ReleaseRequest
	Heartbeat *idemkv.HeartbeatRequest
	Doubt     *idemkv.DoubtRequest
	Resolve   *idemkv.ResolveRequest
	Approval  *idemkv.DecideApprovalRequest
	Rule      *idemkv.ApprovalRule
	Sweep     *SweepArgs
	// Node carries ID, RaftAddr and APIAddr only (OpAdvertise: ID and Format):
	// suffrage and state are Raft's live view of the member, not replicated metadata,
	// so they are not encoded.
	Node *idemkv.NodeInfo
	// Format is the cluster format an OpSetFormat raises to.
	Format int
}

// SweepArgs bounds one sweep entry so that a single log entry never turns into an
// unbounded Pebble batch. Limit <= 0 means DefaultSweepLimit.
type SweepArgs struct{ Limit int }

// DefaultSweepLimit is the number of records one sweep entry deletes when its Limit is
// not positive.
const DefaultSweepLimit = 1000

// commandVersion is the first byte of every encoded command. A node that meets a
// version it does not know must refuse the entry rather than guess at its layout.
// Version 2 is version 1 with a reserve's approval ask after its last field; only a
// reserve that asks for approval is written as version 2, so every other entry stays
// readable by a node that knows version 1 alone (a rolling upgrade). The approval ops
// are new ops, which such a node refuses either way.
//
// Version 3 is version 1 followed by what issue 26 added, for the ops that carry it: a
// reserve's approval ask behind a presence byte, a resolve's By (who resolved), a
// rule's flags and masks. It too is written only when that is set.
const (
	commandVersion         = 1
	commandVersionApproval = 2
	commandVersionExtended = 3
)

// extended reports whether c needs version 3.
func (c *Command) extended() bool {
	switch c.Op {
	case OpResolve:
		return c.Resolve != nil && c.Resolve.By != ""
	case OpSetApprovalRule, OpRemoveApprovalRule:
		return c.Rule != nil && storage.RuleHasOptions(*c.Rule)
	}
	return false
}

// ErrMalformedCommand is wrapped by every DecodeCommand error; it also wraps
// idemkv.ErrInternal because a log entry that does not decode is a bug, never a
// client's fault.
var ErrMalformedCommand = fmt.Errorf("%w: malformed command", idemkv.ErrInternal)

// AppendBinary appends the binary encoding of c to dst: a version byte, the op, the
// stamped time, then the op's fields in a fixed order (uvarint lengths for strings and
// raw JSON, varints for numbers).
func (c *Command) AppendBinary(dst []byte) ([]byte, error) {
	version := byte(commandVersion)
	if c.Op == OpReserve && c.Reserve != nil && c.Reserve.Approval != nil {
		version = commandVersionApproval
	}
	if c.extended() {
		version = commandVersionExtended
	}
	dst = append(dst, version, byte(c.Op))
	dst = wire.AppendVarint(dst, int64(c.Now))
	switch c.Op {
	case OpReserve:
		r := c.Reserve
		if r == nil {
			return nil, errMissing(c.Op)
		}
		dst = wire.AppendString(dst, r.Tenant)
		dst = wire.AppendString(dst, r.Key)
		dst = wire.AppendString(dst, r.Tool)
		dst = wire.AppendString(dst, r.Actor)
		dst = wire.AppendString(dst, r.Fingerprint)
		dst = wire.AppendBytes(dst, r.Effect)
		dst = wire.AppendString(dst, r.AttemptID)
		dst = wire.AppendVarint(dst, r.LeaseTTLMs)
		dst = wire.AppendVarint(dst, r.TTLMs)
		dst = wire.AppendVarint(dst, int64(r.ExpiresAt))
		if a := r.Approval; a != nil {
			var required byte
			if a.Required {
				required = 1
			}
			dst = append(dst, required)
			dst = wire.AppendVarint(dst, a.TTLMs)
			dst = wire.AppendString(dst, a.Summary)
		}
	case OpCommit:
		r := c.Commit
		if r == nil {
			return nil, errMissing(c.Op)
		}
		dst = wire.AppendString(dst, r.Tenant)
		dst = wire.AppendString(dst, r.Key)
		dst = wire.AppendString(dst, r.Fingerprint)
		dst = wire.AppendUvarint(dst, r.Fence)
		dst = wire.AppendString(dst, r.RemoteSystem)
		dst = wire.AppendString(dst, r.RemoteID)
		dst = wire.AppendString(dst, r.RemoteURL)
		dst = wire.AppendBytes(dst, r.Result)
	case OpFail:
		r := c.Fail
		if r == nil {
			return nil, errMissing(c.Op)
		}
		dst = wire.AppendString(dst, r.Tenant)
		dst = wire.AppendString(dst, r.Key)
		dst = wire.AppendString(dst, r.Fingerprint)
		dst = wire.AppendUvarint(dst, r.Fence)
		dst = wire.AppendString(dst, r.Error.Code)
		dst = wire.AppendString(dst, r.Error.Message)
		dst = wire.AppendBytes(dst, r.Error.Details)
	case OpRelease:
		r := c.Release
		if r == nil {
			return nil, errMissing(c.Op)
		}
		dst = wire.AppendString(dst, r.Tenant)
		dst = wire.AppendString(dst, r.Key)
		dst = wire.AppendString(dst, r.Fingerprint)
		dst = wire.AppendUvarint(dst, r.Fence)
	case OpHeartbeat:
		r := c.Heartbeat
		if r == nil {
			return nil, errMissing(c.Op)
		}
		dst = wire.AppendString(dst, r.Tenant)
		dst = wire.AppendString(dst, r.Key)
		dst = wire.AppendUvarint(dst, r.Fence)
		dst = wire.AppendVarint(dst, r.LeaseTTLMs)
	case OpDoubt:
		r := c.Doubt
		if r == nil {
			return nil, errMissing(c.Op)
		}
		dst = wire.AppendString(dst, r.Tenant)
		dst = wire.AppendString(dst, r.Key)
		dst = wire.AppendString(dst, r.Fingerprint)
		dst = wire.AppendUvarint(dst, r.Fence)
	case OpResolve:
		r := c.Resolve
		if r == nil {
			return nil, errMissing(c.Op)
		}
		dst = wire.AppendString(dst, r.Tenant)
		dst = wire.AppendString(dst, r.Key)
		dst = wire.AppendString(dst, r.Fingerprint)
		dst = wire.AppendString(dst, string(r.Outcome))
		dst = wire.AppendString(dst, r.RemoteSystem)
		dst = wire.AppendString(dst, r.RemoteID)
		dst = wire.AppendString(dst, r.RemoteURL)
		dst = wire.AppendBytes(dst, r.Result)
		if version == commandVersionExtended {
			dst = wire.AppendString(dst, r.By)
		}
	case OpDecideApproval:
		r := c.Approval
		if r == nil {
			return nil, errMissing(c.Op)
		}
		dst = wire.AppendString(dst, r.Tenant)
		dst = wire.AppendString(dst, r.Key)
		dst = wire.AppendString(dst, r.ApprovalID)
		dst = wire.AppendString(dst, r.Fingerprint)
		dst = wire.AppendString(dst, string(r.Decision))
		dst = wire.AppendString(dst, r.Approver)
		dst = wire.AppendString(dst, r.Reason)
	case OpSetApprovalRule, OpRemoveApprovalRule:
		r := c.Rule
		if r == nil {
			return nil, errMissing(c.Op)
		}
		dst = wire.AppendString(dst, r.Tenant)
		dst = wire.AppendString(dst, r.Tool)
		dst = wire.AppendVarint(dst, r.TTLMs)
		if version == commandVersionExtended {
			dst = storage.AppendRuleOptions(dst, *r)
		}
	case OpSweep:
		if c.Sweep == nil {
			return nil, errMissing(c.Op)
		}
		dst = wire.AppendVarint(dst, int64(c.Sweep.Limit))
	case OpSetNode, OpRemoveNode:
		n := c.Node
		if n == nil {
			return nil, errMissing(c.Op)
		}
		dst = wire.AppendString(dst, n.ID)
		dst = wire.AppendString(dst, n.RaftAddr)
		dst = wire.AppendString(dst, n.APIAddr)
	case OpAdvertise:
		n := c.Node
		if n == nil {
			return nil, errMissing(c.Op)
		}
		dst = wire.AppendString(dst, n.ID)
		dst = wire.AppendUvarint(dst, uint64(n.Format))
	case OpSetFormat:
		dst = wire.AppendUvarint(dst, uint64(c.Format))
	case OpLogCheckpoint:
	default:
		return nil, fmt.Errorf("%w: cannot encode unknown %s", idemkv.ErrInternal, c.Op)
	}
	return dst, nil
}

func errMissing(op Op) error {
	return fmt.Errorf("%w: %s command without its payload", idemkv.ErrInternal, op)
}

// DecodeCommand parses an encoding made by AppendBinary. It never panics and copies
// everything it keeps, so b may be reused by the caller (Raft's log buffers are).
func DecodeCommand(b []byte) (*Command, error) {
	d := wire.NewDecoder(b, ErrMalformedCommand)
	v := d.Byte()
	if d.Err() == nil && v != commandVersion && v != commandVersionApproval && v != commandVersionExtended {
		return nil, fmt.Errorf("%w: unknown version %d", ErrMalformedCommand, v)
	}
	c := &Command{Op: Op(d.Byte())}
	if d.Err() == nil && v == commandVersionApproval && c.Op != OpReserve {
		return nil, fmt.Errorf("%w: version %d of %s", ErrMalformedCommand, v, c.Op)
	}
	if d.Err() == nil && v == commandVersionExtended && c.Op != OpResolve && c.Op != OpSetApprovalRule && c.Op != OpRemoveApprovalRule {
		return nil, fmt.Errorf("%w: version %d of %s", ErrMalformedCommand, v, c.Op)
	}
	c.Now = idemkv.Timestamp(d.Varint())
	if err := d.Err(); err != nil {
		return nil, err
	}
	switch c.Op {
	case OpReserve:
		r := &idemkv.ReserveRequest{}
		r.Tenant = d.Text()
		r.Key = d.Text()
		r.Tool = d.Text()
		r.Actor = d.Text()
		r.Fingerprint = d.Text()
		r.Effect = d.Bytes()
		r.AttemptID = d.Text()
		r.LeaseTTLMs = d.Varint()
		r.TTLMs = d.Varint()
		r.ExpiresAt = idemkv.Timestamp(d.Varint())
		if v == commandVersionApproval {
			a := &idemkv.ApprovalAsk{}
			switch required := d.Byte(); {
			case d.Err() != nil:
			case required > 1:
				d.Fail("approval required byte %d", required)
			default:
				a.Required = required == 1
			}
			a.TTLMs = d.Varint()
			a.Summary = d.Text()
			r.Approval = a
		}
		c.Reserve = r
	case OpCommit:
		r := &idemkv.CommitRequest{}
		r.Tenant = d.Text()
		r.Key = d.Text()
		r.Fingerprint = d.Text()
		r.Fence = d.Uvarint()
		r.RemoteSystem = d.Text()
		r.RemoteID = d.Text()
		r.RemoteURL = d.Text()
		r.Result = d.Bytes()
		c.Commit = r
	case OpFail:
		r := &idemkv.FailRequest{}
		r.Tenant = d.Text()
		r.Key = d.Text()
		r.Fingerprint = d.Text()
		r.Fence = d.Uvarint()
		r.Error.Code = d.Text()
		r.Error.Message = d.Text()
		r.Error.Details = d.Bytes()
		c.Fail = r
	case OpRelease:
		r := &idemkv.ReleaseRequest{}
		r.Tenant = d.Text()
		r.Key = d.Text()
		r.Fingerprint = d.Text()
		r.Fence = d.Uvarint()
		c.Release = r
	case OpHeartbeat:
		r := &idemkv.HeartbeatRequest{}
		r.Tenant = d.Text()
		r.Key = d.Text()
		r.Fence = d.Uvarint()
		r.LeaseTTLMs = d.Varint()
		c.Heartbeat = r
	case OpDoubt:
		r := &idemkv.DoubtRequest{}
		r.Tenant = d.Text()
		r.Key = d.Text()
		r.Fingerprint = d.Text()
		r.Fence = d.Uvarint()
		c.Doubt = r
	case OpResolve:
		r := &idemkv.ResolveRequest{}
		r.Tenant = d.Text()
		r.Key = d.Text()
		r.Fingerprint = d.Text()
		r.Outcome = idemkv.ResolveOutcome(d.Text())
		r.RemoteSystem = d.Text()
		r.RemoteID = d.Text()
		r.RemoteURL = d.Text()
		r.Result = d.Bytes()
		if v == commandVersionExtended {
			r.By = d.Text()
		}
		c.Resolve = r
	case OpDecideApproval:
		r := &idemkv.DecideApprovalRequest{}
		r.Tenant = d.Text()
		r.Key = d.Text()
		r.ApprovalID = d.Text()
		r.Fingerprint = d.Text()
		r.Decision = idemkv.ApprovalVerdict(d.Text())
		r.Approver = d.Text()
		r.Reason = d.Text()
		c.Approval = r
	case OpSetApprovalRule, OpRemoveApprovalRule:
		r := &idemkv.ApprovalRule{}
		r.Tenant = d.Text()
		r.Tool = d.Text()
		r.TTLMs = d.Varint()
		if v == commandVersionExtended {
			storage.DecodeRuleOptions(&d, r)
		}
		c.Rule = r
	case OpSweep:
		limit := d.Varint()
		if d.Err() == nil && (limit < 0 || limit > 1<<31-1) {
			d.Fail("sweep limit %d out of range", limit)
		}
		c.Sweep = &SweepArgs{Limit: int(limit)}
	case OpSetNode, OpRemoveNode:
		n := &idemkv.NodeInfo{}
		n.ID = d.Text()
		n.RaftAddr = d.Text()
		n.APIAddr = d.Text()
		c.Node = n
	case OpAdvertise:
		n := &idemkv.NodeInfo{ID: d.Text()}
		n.Format = decodeFormat(&d)
		c.Node = n
	case OpSetFormat:
		c.Format = decodeFormat(&d)
	case OpLogCheckpoint:
	default:
		return nil, fmt.Errorf("%w: unknown %s", ErrMalformedCommand, c.Op)
	}
	if err := d.Finish(); err != nil {
		return nil, err
	}
	return c, nil
}

// decodeFormat reads a data format, 1 to 255.
func decodeFormat(d *wire.Decoder) int {
	f := d.Uvarint()
	if d.Err() == nil && (f == 0 || f > 255) {
		d.Fail("format %d out of range", f)
	}
	return int(f)
}

// IsLogCheckpoint reports whether data, a log entry's, is an OpLogCheckpoint command.
// raft-wal's verifier asks it of every entry appended, so it reads two bytes only.
func IsLogCheckpoint(data []byte) bool {
	return len(data) >= 2 && data[0] == commandVersion && Op(data[1]) == OpLogCheckpoint
}
