package model

import (
	"fmt"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
)

// Operations turns a register history into porcupine operations. Operations that
// certainly had no effect are left out, and so are reads with an unknown outcome (they
// constrain nothing). A write with an unknown outcome gets a return time after every
// other operation: it may take effect at any point from its invocation on.
func Operations(ops []history.Op) []porcupine.Operation {
	var end int64
	for i := range ops {
		end = max(end, ops[i].Return, ops[i].Call)
	}
	var out []porcupine.Operation
	for i := range ops {
		op := &ops[i]
		switch {
		case op.Type == history.OK && op.Out != nil:
			out = append(out, porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Call, Output: op.Out, Return: op.Return})
		case (op.Type == history.Info || op.Type == history.Invoke) && op.F != history.FGet:
			out = append(out, porcupine.Operation{ClientId: op.Client, Input: op, Call: op.Call, Output: nil, Return: end + 1})
		}
	}
	return out
}

// VisualizeKeys bounds the keys in the visualization of a valid history.
const VisualizeKeys = 150

// KeyResult is the verdict on one key.
type KeyResult struct {
	Key    string                `json:"key"`
	Ops    int                   `json:"ops"`
	Result porcupine.CheckResult `json:"result"`
}

// Result is the verdict on a register history.
type Result struct {
	Result porcupine.CheckResult `json:"result"`
	Keys   int                   `json:"keys"`
	Ops    int                   `json:"ops"`
	// Illegal and Unknown list the keys whose histories are not linearizable, or
	// whose check ran out of time.
	Illegal []KeyResult `json:"illegal,omitempty"`
	Unknown []KeyResult `json:"unknown,omitempty"`
	// Shown is how many keys the visualization holds.
	Shown int `json:"visualized_keys"`
	// Info is porcupine's linearization data for the HTML visualization.
	Info porcupine.LinearizationInfo `json:"-"`
}

// Check checks a register history for linearizability, key by key, each key within
// perKey. It also computes the data for the visualization of the whole history.
func Check(ops []history.Op, perKey time.Duration) Result {
	m := Porcupine()
	all := Operations(ops)
	parts := partition(all)
	res := Result{Result: porcupine.Ok, Keys: len(parts), Ops: len(all)}
	for _, part := range parts {
		kr := KeyResult{Key: part[0].Input.(*history.Op).Key, Ops: len(part)}
		kr.Result = porcupine.CheckOperationsTimeout(m, part, perKey)
		switch kr.Result {
		case porcupine.Illegal:
			res.Illegal = append(res.Illegal, kr)
			res.Result = porcupine.Illegal
		case porcupine.Unknown:
			res.Unknown = append(res.Unknown, kr)
			if res.Result == porcupine.Ok {
				res.Result = porcupine.Unknown
			}
		}
	}
	// The visualization shows the keys that failed, or else the first keys of the
	// run: a whole long run would make a page no browser opens.
	var show []porcupine.Operation
	illegal := map[string]bool{}
	for _, k := range res.Illegal {
		illegal[k.Key] = true
	}
	shown := 0
	for _, part := range parts {
		key := part[0].Input.(*history.Op).Key
		if (len(illegal) > 0 && illegal[key]) || (len(illegal) == 0 && shown < VisualizeKeys) {
			show = append(show, part...)
			shown++
		}
	}
	_, res.Info = porcupine.CheckOperationsVerbose(m, show, perKey*time.Duration(min(shown, 60)+1))
	res.Shown = shown
	return res
}

// ClockAnomaly is a record that showed an updated_at older than one shown before it
// in real time.
type ClockAnomaly struct {
	Key      string `json:"key"`
	Earlier  int64  `json:"earlier_op"`
	Later    int64  `json:"later_op"`
	Previous int64  `json:"previous_updated_at_ms"`
	Seen     int64  `json:"seen_updated_at_ms"`
}

func (a ClockAnomaly) String() string {
	return fmt.Sprintf("key %s: op %d saw updated_at %d after op %d had seen %d", a.Key, a.Later, a.Seen, a.Earlier, a.Previous)
}

// CheckClock checks that the state machine's clock never runs backwards as a client
// sees it: for each key, an answer that carries the record shows an updated_at no
// older than any answer that completed before this operation was invoked. Every write
// stamps the record with the state machine's time, which is the maximum of the leader
// times stamped so far, so this holds across leaders with skewed clocks.
func CheckClock(ops []history.Op) []ClockAnomaly {
	type obs struct {
		id        int64
		call, ret int64
		updatedAt int64
	}
	byKey := map[string][]obs{}
	for i := range ops {
		op := &ops[i]
		if op.Type != history.OK || op.Out == nil || op.Out.Record == nil || op.Out.Record.UpdatedAt == 0 {
			continue
		}
		byKey[op.Key] = append(byKey[op.Key], obs{op.ID, op.Call, op.Return, op.Out.Record.UpdatedAt})
	}
	var out []ClockAnomaly
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		list := byKey[k]
		byRet := append([]obs(nil), list...)
		sort.Slice(byRet, func(i, j int) bool { return byRet[i].ret < byRet[j].ret })
		sort.Slice(list, func(i, j int) bool { return list[i].call < list[j].call })
		var best obs
		j := 0
		for _, o := range list {
			for j < len(byRet) && byRet[j].ret < o.call {
				if byRet[j].updatedAt > best.updatedAt {
					best = byRet[j]
				}
				j++
			}
			if o.updatedAt < best.updatedAt {
				out = append(out, ClockAnomaly{Key: k, Earlier: best.id, Later: o.id, Previous: best.updatedAt, Seen: o.updatedAt})
			}
		}
	}
	return out
}

// DurabilityAnomaly is an acknowledged commit or fail that the final reads do not show.
type DurabilityAnomaly struct {
	Key    string `json:"key"`
	Op     int64  `json:"op"`
	Detail string `json:"detail"`
}

// CheckDurable checks that every acknowledged outcome survived: a commit answered
// "committed R" or a fail answered "failed C" must be what the final read of the key
// shows. A stored outcome is terminal, so nothing may ever replace it.
func CheckDurable(ops []history.Op) []DurabilityAnomaly {
	final := map[string]*history.Output{}
	for i := range ops {
		op := &ops[i]
		if op.In.Final && op.F == history.FGet && op.Type == history.OK {
			final[op.Key] = op.Out
		}
	}
	var out []DurabilityAnomaly
	for i := range ops {
		op := &ops[i]
		if op.Type != history.OK || op.Out == nil || op.Out.Err != "" || op.Workload != "register" {
			continue
		}
		var want *history.Record
		switch {
		case op.F == history.FCommit && op.Out.Receipt != nil:
			want = &history.Record{Status: op.Out.Receipt.Status, RemoteID: op.Out.Receipt.RemoteID, ErrorCode: op.Out.Receipt.ErrorCode}
		case op.F == history.FFail && op.Out.Record != nil:
			want = op.Out.Record
		default:
			continue
		}
		f, ok := final[op.Key]
		switch {
		case !ok:
			out = append(out, DurabilityAnomaly{Key: op.Key, Op: op.ID, Detail: "no final read"})
		case f.Err != "" || f.Record == nil:
			out = append(out, DurabilityAnomaly{Key: op.Key, Op: op.ID,
				Detail: fmt.Sprintf("acknowledged %s %s%s, finally %s", want.Status, want.RemoteID, want.ErrorCode, f.Err)})
		case f.Record.Status != want.Status || f.Record.RemoteID != want.RemoteID || f.Record.ErrorCode != want.ErrorCode:
			out = append(out, DurabilityAnomaly{Key: op.Key, Op: op.ID,
				Detail: fmt.Sprintf("acknowledged %s %s%s, finally %s %s%s", want.Status, want.RemoteID, want.ErrorCode,
					f.Record.Status, f.Record.RemoteID, f.Record.ErrorCode)})
		}
	}
	return out
}
