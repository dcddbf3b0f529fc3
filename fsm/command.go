package fsm

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/idemkv/idemkv"
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
	Sweep     *SweepArgs
	// Node carries ID, RaftAddr and APIAddr only: suffrage and state are Raft's live
	// view of the member, not replicated metadata, so they are not encoded.
	Node *idemkv.NodeInfo
}

// SweepArgs bounds one sweep entry so that a single log entry never turns into an
// unbounded Pebble batch. Limit <= 0 means DefaultSweepLimit.
type SweepArgs struct{ Limit int }

// DefaultSweepLimit is the number of records one sweep entry deletes when its Limit is
// not positive.
const DefaultSweepLimit = 1000

// commandVersion is the first byte of every encoded command. A node that meets a
// version it does not know must refuse the entry rather than guess at its layout.
const commandVersion = 1

// ErrMalformedCommand is wrapped by every DecodeCommand error; it also wraps
// idemkv.ErrInternal because a log entry that does not decode is a bug, never a
// client's fault.
var ErrMalformedCommand = fmt.Errorf("%w: malformed command", idemkv.ErrInternal)

// AppendBinary appends the binary encoding of c to dst: a version byte, the op, the
// stamped time, then the op's fields in a fixed order (uvarint lengths for strings and
// raw JSON, varints for numbers).
func (c *Command) AppendBinary(dst []byte) ([]byte, error) {
	dst = append(dst, commandVersion, byte(c.Op))
	dst = binary.AppendVarint(dst, int64(c.Now))
	switch c.Op {
	case OpReserve:
		r := c.Reserve
		if r == nil {
			return nil, errMissing(c.Op)
		}
		dst = appendString(dst, r.Tenant)
		dst = appendString(dst, r.Key)
		dst = appendString(dst, r.Tool)
		dst = appendString(dst, r.Actor)
		dst = appendString(dst, r.Fingerprint)
		dst = appendBytes(dst, r.Effect)
		dst = appendString(dst, r.AttemptID)
		dst = binary.AppendVarint(dst, r.LeaseTTLMs)
		dst = binary.AppendVarint(dst, r.TTLMs)
		dst = binary.AppendVarint(dst, int64(r.ExpiresAt))
	case OpCommit:
		r := c.Commit
		if r == nil {
			return nil, errMissing(c.Op)
		}
		dst = appendString(dst, r.Tenant)
		dst = appendString(dst, r.Key)
		dst = appendString(dst, r.Fingerprint)
		dst = binary.AppendUvarint(dst, r.Fence)
		dst = appendString(dst, r.RemoteSystem)
		dst = appendString(dst, r.RemoteID)
		dst = appendString(dst, r.RemoteURL)
		dst = appendBytes(dst, r.Result)
	case OpFail:
		r := c.Fail
		if r == nil {
			return nil, errMissing(c.Op)
		}
		dst = appendString(dst, r.Tenant)
		dst = appendString(dst, r.Key)
		dst = appendString(dst, r.Fingerprint)
		dst = binary.AppendUvarint(dst, r.Fence)
		dst = appendString(dst, r.Error.Code)
		dst = appendString(dst, r.Error.Message)
		dst = appendBytes(dst, r.Error.Details)
	case OpRelease:
		r := c.Release
		if r == nil {
			return nil, errMissing(c.Op)
		}
		dst = appendString(dst, r.Tenant)
		dst = appendString(dst, r.Key)
		dst = appendString(dst, r.Fingerprint)
		dst = binary.AppendUvarint(dst, r.Fence)
	case OpHeartbeat:
		r := c.Heartbeat
		if r == nil {
			return nil, errMissing(c.Op)
		}
		dst = appendString(dst, r.Tenant)
		dst = appendString(dst, r.Key)
		dst = binary.AppendUvarint(dst, r.Fence)
		dst = binary.AppendVarint(dst, r.LeaseTTLMs)
	case OpSweep:
		if c.Sweep == nil {
			return nil, errMissing(c.Op)
		}
		dst = binary.AppendVarint(dst, int64(c.Sweep.Limit))
	case OpSetNode, OpRemoveNode:
		n := c.Node
		if n == nil {
			return nil, errMissing(c.Op)
		}
		dst = appendString(dst, n.ID)
		dst = appendString(dst, n.RaftAddr)
		dst = appendString(dst, n.APIAddr)
	default:
		return nil, fmt.Errorf("%w: cannot encode unknown %s", idemkv.ErrInternal, c.Op)
	}
	return dst, nil
}

func errMissing(op Op) error {
	return fmt.Errorf("%w: %s command without its payload", idemkv.ErrInternal, op)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// DecodeCommand parses an encoding made by AppendBinary. It never panics and copies
// everything it keeps, so b may be reused by the caller (Raft's log buffers are).
func DecodeCommand(b []byte) (*Command, error) {
	d := decoder{b: b}
	if v := d.byte(); d.err == nil && v != commandVersion {
		return nil, fmt.Errorf("%w: unknown version %d", ErrMalformedCommand, v)
	}
	c := &Command{Op: Op(d.byte())}
	c.Now = idemkv.Timestamp(d.varint())
	if d.err != nil {
		return nil, d.err
	}
	switch c.Op {
	case OpReserve:
		r := &idemkv.ReserveRequest{}
		r.Tenant = d.string()
		r.Key = d.string()
		r.Tool = d.string()
		r.Actor = d.string()
		r.Fingerprint = d.string()
		r.Effect = d.bytes()
		r.AttemptID = d.string()
		r.LeaseTTLMs = d.varint()
		r.TTLMs = d.varint()
		r.ExpiresAt = idemkv.Timestamp(d.varint())
		c.Reserve = r
	case OpCommit:
		r := &idemkv.CommitRequest{}
		r.Tenant = d.string()
		r.Key = d.string()
		r.Fingerprint = d.string()
		r.Fence = d.uvarint()
		r.RemoteSystem = d.string()
		r.RemoteID = d.string()
		r.RemoteURL = d.string()
		r.Result = d.bytes()
		c.Commit = r
	case OpFail:
		r := &idemkv.FailRequest{}
		r.Tenant = d.string()
		r.Key = d.string()
		r.Fingerprint = d.string()
		r.Fence = d.uvarint()
		r.Error.Code = d.string()
		r.Error.Message = d.string()
		r.Error.Details = d.bytes()
		c.Fail = r
	case OpRelease:
		r := &idemkv.ReleaseRequest{}
		r.Tenant = d.string()
		r.Key = d.string()
		r.Fingerprint = d.string()
		r.Fence = d.uvarint()
		c.Release = r
	case OpHeartbeat:
		r := &idemkv.HeartbeatRequest{}
		r.Tenant = d.string()
		r.Key = d.string()
		r.Fence = d.uvarint()
		r.LeaseTTLMs = d.varint()
		c.Heartbeat = r
	case OpSweep:
		limit := d.varint()
		if d.err == nil && (limit < 0 || limit > 1<<31-1) {
			d.fail("sweep limit %d out of range", limit)
		}
		c.Sweep = &SweepArgs{Limit: int(limit)}
	case OpSetNode, OpRemoveNode:
		n := &idemkv.NodeInfo{}
		n.ID = d.string()
		n.RaftAddr = d.string()
		n.APIAddr = d.string()
		c.Node = n
	default:
		return nil, fmt.Errorf("%w: unknown %s", ErrMalformedCommand, c.Op)
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	return c, nil
}

// decoder consumes b front to back; the first error sticks and turns every later read
// into a zero value, so the field lists above read straight without error checks.
type decoder struct {
	b   []byte
	err error
}

var errShort = errors.New("truncated")

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrMalformedCommand, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail("%v", errShort)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) raw() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail("length %d exceeds the %d bytes left", n, len(d.b))
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string { return string(d.raw()) }

// bytes returns a copy, or nil for an empty field, so that absent raw JSON stays
// absent after a round trip.
func (d *decoder) bytes() []byte {
	v := d.raw()
	if len(v) == 0 {
		return nil
	}
	return append([]byte(nil), v...)
}
