// Package history records what the workloads of jepsen-lite did: every operation from
// invocation to completion, in memory for the checkers and as JSON lines on disk for
// people. Timestamps are nanoseconds since the run started, from the monotonic clock.
package history

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"
)

// Type is how an operation completed, in Jepsen's terms.
type Type string

const (
	// Invoke marks an operation that has not completed.
	Invoke Type = "invoke"
	// OK: the system answered; the answer (which may be an error such as fenced) is
	// part of the history the model must explain.
	OK Type = "ok"
	// Fail: the operation certainly had no effect (refused before reaching the
	// cluster, or rejected as invalid).
	Fail Type = "fail"
	// Info: the outcome is unknown (timeout, connection lost, unavailable after
	// proposing). The operation may or may not have taken effect.
	Info Type = "info"
)

// Functions of the register workload, and of the agent workload.
const (
	FReserve   = "reserve"
	FCommit    = "commit"
	FFail      = "fail"
	FRelease   = "release"
	FHeartbeat = "heartbeat"
	FGet       = "get"
	FDo        = "do"
	// FDecide approves or denies an approval (the approvals workload).
	FDecide = "decide"
)

// Input is what an operation asked for.
type Input struct {
	Tool        string `json:"tool,omitempty"`
	Fingerprint string `json:"fp,omitempty"`
	AttemptID   string `json:"attempt,omitempty"`
	Fence       uint64 `json:"fence,omitempty"`
	RemoteID    string `json:"remote_id,omitempty"`
	ErrorCode   string `json:"error_code,omitempty"`
	// RemoteURL and Result are what a commit sent with its receipt: Result byte for
	// byte, as the answers must give it back (see Digest).
	RemoteURL string          `json:"remote_url,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	// Stale marks a register operation that deliberately carries an old fence.
	Stale bool `json:"stale,omitempty"`
	// Class and Args belong to the agent workload.
	Class string `json:"class,omitempty"`
	Args  string `json:"args,omitempty"`
	// Final marks the reads after the last heal.
	Final bool `json:"final,omitempty"`
	// ApprovalID and Verdict belong to the approvals workload's decisions.
	ApprovalID string `json:"approval,omitempty"`
	Verdict    string `json:"verdict,omitempty"`
}

// Record is the part of a stored record that the checkers look at.
type Record struct {
	Status      string `json:"status"`
	Fingerprint string `json:"fp"`
	Tool        string `json:"tool"`
	AttemptID   string `json:"attempt"`
	Fence       uint64 `json:"fence"`
	Attempts    uint32 `json:"attempts"`
	RemoteID    string `json:"remote_id,omitempty"`
	ErrorCode   string `json:"error_code,omitempty"`
	// RemoteURL, ResultDigest and CommittedAt are the stored receipt's, when
	// committed (ResultDigest is Digest of its result).
	RemoteURL    string `json:"remote_url,omitempty"`
	ResultDigest string `json:"result_digest,omitempty"`
	CommittedAt  int64  `json:"committed_at,omitempty"`
	// CreatedAt and UpdatedAt are the record's created_at and updated_at in Unix
	// milliseconds: the stamps of the entry that made the record and of the latest
	// that changed it.
	CreatedAt int64 `json:"created_at,omitempty"`
	UpdatedAt int64 `json:"updated_at"`
	// LeaseExpiresAt is the record's lease_expires_at in Unix milliseconds (0 when
	// no lease is held), ExpiresAt its expires_at: from then on it counts as absent.
	LeaseExpiresAt int64 `json:"lease_expires_at,omitempty"`
	ExpiresAt      int64 `json:"expires_at,omitempty"`
	// ApprovalID and ApprovalState are the record's approval, if it asked for one.
	ApprovalID    string `json:"approval,omitempty"`
	ApprovalState string `json:"approval_state,omitempty"`
}

// Receipt is the part of a receipt that the checkers look at: all of it but the
// key, the remote system and the error's message, with the result as its Digest. A
// replay must give back exactly the receipt the first answer gave.
type Receipt struct {
	Status       string `json:"status"`
	Fingerprint  string `json:"fp"`
	RemoteID     string `json:"remote_id,omitempty"`
	RemoteURL    string `json:"remote_url,omitempty"`
	ResultDigest string `json:"result_digest,omitempty"`
	ErrorCode    string `json:"error_code,omitempty"`
	// CommittedAt is committed_at in Unix milliseconds: the stamp of the commit, or
	// of the failure for a failed receipt.
	CommittedAt int64 `json:"committed_at,omitempty"`
}

// Same reports whether r and o are the same receipt, field for field.
func (r *Receipt) Same(o *Receipt) bool {
	return r != nil && o != nil && *r == *o
}

// Digest names a result by its exact bytes: "" for none, else the length and a prefix
// of its SHA-256. The history keeps digests of what the nodes answered, so that a
// result dropped, cut or re-encoded (keys sorted, numbers or escapes rewritten) on
// any path shows as another digest.
func Digest(raw []byte) string {
	if len(raw) == 0 {
		return ""
	}
	sum := sha256.Sum256(raw)
	return fmt.Sprintf("%d:%s", len(raw), hex.EncodeToString(sum[:8]))
}

// Output is what the system answered. Err is the wire code of an error answer.
type Output struct {
	Err              string   `json:"err,omitempty"`
	Decision         string   `json:"decision,omitempty"`
	Grant            uint64   `json:"grant,omitempty"`
	Record           *Record  `json:"record,omitempty"`
	Receipt          *Receipt `json:"receipt,omitempty"`
	ConflictRemoteID string   `json:"conflict_remote_id,omitempty"`
	ConflictFP       string   `json:"conflict_fp,omitempty"`
	Released         bool     `json:"released,omitempty"`
	// Replayed and Effects belong to the agent workload: whether Do's answer came
	// from a replay, and how many downstream effects this delivery caused.
	Replayed bool `json:"replayed,omitempty"`
	Effects  int  `json:"effects,omitempty"`
}

// Op is one operation.
type Op struct {
	ID       int64  `json:"id"`
	Process  int    `json:"process"`
	Client   int    `json:"client"`
	Workload string `json:"workload"`
	F        string `json:"f"`
	Key      string `json:"key"`
	Node     string `json:"node,omitempty"`
	In       Input  `json:"in"`

	Type   Type    `json:"type"`
	Out    *Output `json:"out,omitempty"`
	Error  string  `json:"error,omitempty"`
	Call   int64   `json:"call"`
	Return int64   `json:"return"`
}

// Write reports whether op asks to change a record: anything but a read, and none of
// the reads after the last heal.
func (o *Op) Write() bool { return o.F != FGet && !o.In.Final }

// AckedWrite reports whether op is a write the system answered with success: the
// progress the verdict requires (an answer that is an error code, even one the model
// expects such as fenced, is not progress).
func (o *Op) AckedWrite() bool {
	return o.Write() && o.Type == OK && o.Out != nil && o.Out.Err == ""
}

// Latency is how long a completed operation took.
func (o *Op) Latency() time.Duration { return time.Duration(o.Return - o.Call) }

// event is one line of history.jsonl.
type event struct {
	Type     Type    `json:"type"`
	ID       int64   `json:"id"`
	Time     int64   `json:"time"`
	Process  int     `json:"process"`
	Workload string  `json:"workload"`
	F        string  `json:"f"`
	Key      string  `json:"key"`
	Node     string  `json:"node,omitempty"`
	In       *Input  `json:"in,omitempty"`
	Out      *Output `json:"out,omitempty"`
	Error    string  `json:"error,omitempty"`
}

// Recorder collects operations. It is safe for concurrent use.
type Recorder struct {
	start time.Time

	mu     sync.Mutex
	w      *bufio.Writer
	werr   error
	ops    []*Op
	nextID int64
	// acked counts acknowledged writes by the second of the run they completed in,
	// for the nemesis to wait for recovery without copying the history.
	acked []int
}

// NewRecorder starts a history at start; events go to w as JSON lines (w may be nil).
func NewRecorder(start time.Time, w io.Writer) *Recorder {
	r := &Recorder{start: start}
	if w != nil {
		r.w = bufio.NewWriterSize(w, 64<<10)
	}
	return r
}

// Now is the current time of the history.
func (r *Recorder) Now() int64 { return int64(time.Since(r.start)) }

// Start is when the history began.
func (r *Recorder) Start() time.Time { return r.start }

// Invoke records that op starts now and gives it an ID.
func (r *Recorder) Invoke(op *Op) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nextID++
	op.ID = r.nextID
	op.Type = Invoke
	op.Call = r.Now()
	r.ops = append(r.ops, op)
	in := op.In
	r.write(event{Type: Invoke, ID: op.ID, Time: op.Call, Process: op.Process, Workload: op.Workload,
		F: op.F, Key: op.Key, Node: op.Node, In: &in})
}

// Complete records that op ended now as t, with out (nil unless t is OK) and a message.
func (r *Recorder) Complete(op *Op, t Type, out *Output, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	op.Type = t
	op.Out = out
	op.Error = msg
	op.Return = r.Now()
	if op.Return <= op.Call {
		op.Return = op.Call + 1
	}
	if op.AckedWrite() {
		sec := int(op.Return / int64(time.Second))
		for len(r.acked) <= sec {
			r.acked = append(r.acked, 0)
		}
		r.acked[sec]++
	}
	r.write(event{Type: t, ID: op.ID, Time: op.Return, Process: op.Process, Workload: op.Workload,
		F: op.F, Key: op.Key, Node: op.Node, Out: out, Error: msg})
}

func (r *Recorder) write(e event) {
	if r.w == nil || r.werr != nil {
		return
	}
	b, err := json.Marshal(e)
	if err != nil {
		r.werr = fmt.Errorf("history: encode event: %w", err)
		return
	}
	b = append(b, '\n')
	if _, err := r.w.Write(b); err != nil {
		r.werr = fmt.Errorf("history: write: %w", err)
	}
}

// Flush writes buffered events and reports the first write error.
func (r *Recorder) Flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.w == nil {
		return nil
	}
	if err := r.w.Flush(); err != nil && r.werr == nil {
		r.werr = err
	}
	return r.werr
}

// Ops returns a copy of every operation recorded so far, in invocation order. An
// operation still running appears with Type Invoke.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Op, len(r.ops))
	for i, op := range r.ops {
		out[i] = *op
	}
	return out
}

// AckedWrites returns the acknowledged writes per second of the run so far (the
// same count as AckedPerSecond of Ops).
func (r *Recorder) AckedWrites() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.acked...)
}

// AckedPerSecond counts acknowledged writes by the second they completed in, over n
// seconds.
func AckedPerSecond(ops []Op, n int) []int {
	out := make([]int, n)
	for i := range ops {
		if ops[i].AckedWrite() {
			if sec := int(ops[i].Return / int64(time.Second)); sec >= 0 && sec < n {
				out[sec]++
			}
		}
	}
	return out
}

// Stats counts completed operations.
type Stats struct {
	OK, Fail, Info, Running int
}

// Stats counts the operations recorded so far.
func (r *Recorder) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s Stats
	for _, op := range r.ops {
		switch op.Type {
		case OK:
			s.OK++
		case Fail:
			s.Fail++
		case Info:
			s.Info++
		default:
			s.Running++
		}
	}
	return s
}
