package history

import (
	"bufio"
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

func TestRecorder(t *testing.T) {
	var buf bytes.Buffer
	r := NewRecorder(time.Now(), &buf)
	a := &Op{Workload: "register", F: FReserve, Key: "k", In: Input{AttemptID: "a1"}}
	b := &Op{Workload: "register", F: FGet, Key: "k"}
	c := &Op{Workload: "register", F: FCommit, Key: "k"}
	r.Invoke(a)
	r.Invoke(b)
	r.Invoke(c)
	r.Complete(a, OK, &Output{Decision: "execute", Grant: 7}, "")
	r.Complete(b, Info, nil, "timeout")
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	if a.ID != 1 || b.ID != 2 || a.Return < a.Call {
		t.Fatalf("ids %d %d, a %d..%d", a.ID, b.ID, a.Call, a.Return)
	}
	if s := r.Stats(); s.OK != 1 || s.Info != 1 || s.Running != 1 || s.Fail != 0 {
		t.Fatalf("stats %+v", s)
	}
	ops := r.Ops()
	ops[0].Key = "changed"
	if a.Key != "k" {
		t.Fatal("Ops shares its operations with the recorder")
	}
	var events []event
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		events = append(events, e)
	}
	if len(events) != 5 {
		t.Fatalf("%d events, want 3 invokes and 2 completions", len(events))
	}
	last := events[3]
	if last.Type != OK || last.ID != 1 || last.Out == nil || last.Out.Grant != 7 || events[0].In.AttemptID != "a1" {
		t.Fatalf("events %+v", events)
	}
	if events[4].Type != Info || events[4].Error != "timeout" {
		t.Fatalf("info event %+v", events[4])
	}
}
