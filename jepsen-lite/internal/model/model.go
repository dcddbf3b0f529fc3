// Package model is the sequential specification of one idemkv record (docs/protocol.md section 1)
// for the porcupine linearizability checker, and the checks that run over a register
// history: linearizability per key, and a clock that never runs backwards.
//
// The register workload reserves with a one-hour lease, so within a run no lease can
// expire from the passage of time, and the model allows no recover decision: a
// recover is an anomaly. Records are never expired either (the workload's TTL is a
// day). What the model cannot predict, the Raft index that becomes a fence, it takes
// from the answer, and checks that a newly granted fence is higher than every fence
// seen for the key before. A reserve whose answer was lost leaves a pending record
// whose fence is unknown until some later answer shows it. The stamp of a stored
// outcome (committed_at, or a failure's updated_at) is taken from the first answer
// that shows it the same way, and every later answer must show the same.
//
// A stored outcome is compared field for field: status, fingerprint, remote id, remote
// URL, the result byte for byte (by its digest: the commit's own bytes, which the
// workload sends as the nodes encode them), the error code and the stamp. A replay
// that re-encodes or drops the result, or re-stamps committed_at, has no linearization.
package model

import (
	"fmt"
	"hash/fnv"

	"github.com/anishathalye/porcupine"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

// State is the model of one key.
type State struct {
	Present   bool
	Status    idemkv.Status
	Tool      string
	FP        string
	AttemptID string
	// Fence is the fence of the record, 0 while it is unknown (its grant was lost).
	Fence uint64
	// FenceLB is the highest fence ever seen for the key: a new grant must exceed it.
	FenceLB   uint64
	RemoteID  string
	RemoteURL string
	// Result is the digest of the committed result (history.Digest).
	Result    string
	ErrorCode string
	// Stamp is the stored outcome's committed_at (a failure's: its updated_at), 0
	// while no answer has shown it.
	Stamp int64
}

func (s State) String() string {
	if !s.Present {
		return fmt.Sprintf("absent (fences > %d)", s.FenceLB)
	}
	fence := fmt.Sprint(s.Fence)
	if s.Fence == 0 {
		fence = fmt.Sprintf("?>%d", s.FenceLB)
	}
	out := fmt.Sprintf("%s fp=%s attempt=%s fence=%s", s.Status, short(s.FP), short(s.AttemptID), fence)
	if s.RemoteID != "" {
		out += " remote=" + s.RemoteID
	}
	if s.RemoteURL != "" || s.Result != "" {
		out += fmt.Sprintf(" url=%s result=%s", s.RemoteURL, s.Result)
	}
	if s.Stamp != 0 {
		out += fmt.Sprintf(" at=%d", s.Stamp)
	}
	if s.ErrorCode != "" {
		out += " error=" + s.ErrorCode
	}
	return out
}

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// fenceCases tells whether fence may equal the record's fence and whether it may
// differ, and returns the state with the fence bound to it for the equal case.
func fenceCases(s State, fence uint64) (eq, neq bool, bound State) {
	if s.Fence != 0 {
		return fence == s.Fence, fence != s.Fence, s
	}
	if fence <= s.FenceLB {
		return false, true, s
	}
	bound = s
	bound.Fence, bound.FenceLB = fence, fence
	return true, true, bound
}

// observe checks a record read back against s and binds an unknown fence or stamp.
func observe(s State, r *history.Record) (State, bool) {
	if r == nil || !s.Present || idemkv.Status(r.Status) != s.Status || r.Fingerprint != s.FP || r.Tool != s.Tool ||
		r.AttemptID != s.AttemptID || r.RemoteID != s.RemoteID || r.RemoteURL != s.RemoteURL ||
		r.ResultDigest != s.Result || r.ErrorCode != s.ErrorCode {
		return s, false
	}
	switch s.Status {
	case idemkv.StatusCommitted:
		var ok bool
		if s, ok = bindStamp(s, r.CommittedAt); !ok {
			return s, false
		}
	case idemkv.StatusFailed:
		// A failed receipt's committed_at is the record's updated_at, which nothing
		// changes once the record is terminal.
		var ok bool
		if s, ok = bindStamp(s, r.UpdatedAt); !ok {
			return s, false
		}
	}
	if s.Fence == 0 {
		if r.Fence <= s.FenceLB {
			return s, false
		}
		s.Fence, s.FenceLB = r.Fence, r.Fence
	} else if r.Fence != s.Fence {
		return s, false
	}
	return s, true
}

// bindStamp binds the stamp of s's stored outcome to t, or checks t against it.
func bindStamp(s State, t int64) (State, bool) {
	if s.Stamp == 0 {
		s.Stamp = t
		return s, true
	}
	return s, s.Stamp == t
}

// outcomeMatches checks a receipt against the stored outcome of s and binds its stamp.
func outcomeMatches(s State, rc *history.Receipt) (State, bool) {
	if rc == nil || idemkv.Status(rc.Status) != s.Status || rc.Fingerprint != s.FP || rc.RemoteID != s.RemoteID ||
		rc.RemoteURL != s.RemoteURL || rc.ResultDigest != s.Result || rc.ErrorCode != s.ErrorCode {
		return s, false
	}
	return bindStamp(s, rc.CommittedAt)
}

// Step returns every state the key can be in after op answered out; none means the
// answer is impossible. out is nil when the outcome is unknown: then the operation may
// also not have happened at all.
func Step(s State, op *history.Op, out *history.Output) []State {
	var next []State
	if out == nil {
		next = append(next, s)
	}
	// errIs reports whether an error answer with code is consistent with out.
	errIs := func(code string) bool { return out == nil || out.Err == code }
	in := op.In
	switch op.F {
	case history.FGet:
		if out == nil {
			return next
		}
		if !s.Present {
			if out.Err == idemkv.CodeNotFound {
				next = append(next, s)
			}
			return next
		}
		if out.Err == "" {
			if b, ok := observe(s, out.Record); ok {
				next = append(next, b)
			}
		}
		return next

	case history.FReserve:
		switch {
		case !s.Present:
			n := State{Present: true, Status: idemkv.StatusPending, Tool: in.Tool, FP: in.Fingerprint,
				AttemptID: in.AttemptID, FenceLB: s.FenceLB}
			if out == nil {
				return append(next, n)
			}
			if out.Err == "" && out.Decision == string(idemkv.DecisionExecute) && out.Grant > s.FenceLB {
				n.Fence, n.FenceLB = out.Grant, out.Grant
				if b, ok := observe(n, out.Record); ok {
					next = append(next, b)
				}
			}
		case s.Tool != in.Tool || s.FP != in.Fingerprint:
			if out != nil && out.Err == "" && out.Decision == string(idemkv.DecisionConflict) {
				want := ""
				if s.Status == idemkv.StatusCommitted {
					want = s.RemoteID
				}
				if b, ok := observe(s, out.Record); ok && out.ConflictRemoteID == want {
					next = append(next, b)
				}
			}
		case s.Status.Terminal():
			if out != nil && out.Err == "" && out.Decision == string(idemkv.DecisionReplay) {
				if b, ok := outcomeMatches(s, out.Receipt); ok {
					if b, ok = observe(b, out.Record); ok {
						next = append(next, b)
					}
				}
			}
		case in.AttemptID == s.AttemptID:
			// The same attempt again: same fence, longer lease (invisible here).
			if out != nil && out.Err == "" && out.Decision == string(idemkv.DecisionExecute) {
				if b, ok := observe(s, out.Record); ok && out.Grant == b.Fence {
					next = append(next, b)
				}
			}
		default:
			// Another attempt holds a live lease.
			if out != nil && out.Err == "" && out.Decision == string(idemkv.DecisionInProgress) {
				if b, ok := observe(s, out.Record); ok {
					next = append(next, b)
				}
			}
		}
		return next

	case history.FCommit, history.FFail, history.FRelease, history.FHeartbeat:
		if !s.Present {
			if out != nil && errIs(idemkv.CodeNotFound) {
				next = append(next, s)
			}
			return next
		}
		if op.F != history.FHeartbeat && in.Fingerprint != s.FP {
			if out != nil && errIs(idemkv.CodeFingerprintMismatch) {
				next = append(next, s)
			}
			return next
		}
		eq, neq, b := fenceCases(s, in.Fence)
		if neq && out != nil && errIs(idemkv.CodeFenced) {
			next = append(next, s)
		}
		if !eq {
			return next
		}
		return append(next, transition(b, op, out)...)
	}
	return next
}

// transition is the owner's operation on a live record whose fence it holds.
func transition(s State, op *history.Op, out *history.Output) []State {
	in := op.In
	ok := func() bool { return out == nil || out.Err == "" }
	var n State
	switch {
	case s.Status.Terminal():
		switch op.F {
		case history.FCommit:
			if out == nil {
				return []State{s}
			}
			if ok() {
				if b, good := outcomeMatches(s, out.Receipt); good {
					return []State{b}
				}
			}
		case history.FFail:
			if out == nil {
				return []State{s}
			}
			if ok() {
				if b, good := observe(s, out.Record); good {
					return []State{b}
				}
			}
		default:
			if out == nil || out.Err == idemkv.CodeNotPending {
				return []State{s}
			}
		}
		return nil
	case op.F == history.FCommit:
		n = s
		n.Status, n.RemoteID, n.RemoteURL, n.Result = idemkv.StatusCommitted, in.RemoteID, in.RemoteURL, history.Digest(in.Result)
		if out == nil {
			return []State{n}
		}
		if ok() {
			if b, good := outcomeMatches(n, out.Receipt); good {
				return []State{b}
			}
		}
	case op.F == history.FFail:
		n = s
		n.Status, n.ErrorCode = idemkv.StatusFailed, in.ErrorCode
		if out == nil {
			return []State{n}
		}
		if ok() {
			if b, good := observe(n, out.Record); good {
				return []State{b}
			}
		}
	case op.F == history.FRelease:
		n = State{FenceLB: s.FenceLB}
		if out == nil || (ok() && out.Released) {
			return []State{n}
		}
	case op.F == history.FHeartbeat:
		if out == nil {
			return []State{s}
		}
		if ok() {
			if b, good := observe(s, out.Record); good {
				return []State{b}
			}
		}
	}
	return nil
}

// Porcupine is the model for porcupine: the input of an operation is its *history.Op,
// the output its *history.Output (nil when unknown). Histories are partitioned by key.
func Porcupine() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partition,
		Init:      func() []any { return []any{State{}} },
		Step: func(state, input, output any) []any {
			var out *history.Output
			if output != nil {
				out = output.(*history.Output)
			}
			next := Step(state.(State), input.(*history.Op), out)
			res := make([]any, len(next))
			for i, s := range next {
				res[i] = s
			}
			return res
		},
		Equal: func(a, b any) bool { return a.(State) == b.(State) },
		Hash: func(s any) uint64 {
			h := fnv.New64a()
			fmt.Fprintf(h, "%+v", s.(State))
			return h.Sum64()
		},
		DescribeOperation: describe,
		DescribeState:     func(s any) string { return s.(State).String() },
	}
	return nm.ToModel()
}

func partition(ops []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	var keys []string
	for _, op := range ops {
		k := op.Input.(*history.Op).Key
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], op)
	}
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, byKey[k])
	}
	return out
}

func describe(input, output any) string {
	op := input.(*history.Op)
	in := op.In
	var call string
	switch op.F {
	case history.FReserve:
		call = fmt.Sprintf("reserve(%s fp=%s attempt=%s)", op.Key, short(in.Fingerprint), short(in.AttemptID))
	case history.FCommit:
		call = fmt.Sprintf("commit(%s fence=%d remote=%s)", op.Key, in.Fence, in.RemoteID)
	case history.FFail:
		call = fmt.Sprintf("fail(%s fence=%d code=%s)", op.Key, in.Fence, in.ErrorCode)
	case history.FRelease:
		call = fmt.Sprintf("release(%s fence=%d)", op.Key, in.Fence)
	case history.FHeartbeat:
		call = fmt.Sprintf("heartbeat(%s fence=%d)", op.Key, in.Fence)
	default:
		call = fmt.Sprintf("%s(%s)", op.F, op.Key)
	}
	if output == nil {
		return call + " -> ?"
	}
	out := output.(*history.Output)
	switch {
	case out.Err != "":
		return call + " -> " + out.Err
	case out.Decision != "":
		s := call + " -> " + out.Decision
		if out.Grant != 0 {
			s += fmt.Sprintf(" fence=%d", out.Grant)
		}
		return s
	case out.Receipt != nil:
		return call + " -> " + out.Receipt.Status + " " + out.Receipt.RemoteID
	case out.Record != nil:
		return fmt.Sprintf("%s -> %s fence=%d %s", call, out.Record.Status, out.Record.Fence, out.Record.RemoteID)
	case out.Released:
		return call + " -> released"
	}
	return call + " -> ok"
}
