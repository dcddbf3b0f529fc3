package report

import (
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv/jepsen-lite/internal/history"
	"github.com/idemkv/idemkv/jepsen-lite/internal/nemesis"
	"github.com/idemkv/idemkv/jepsen-lite/internal/progress"
)

func TestBuckets(t *testing.T) {
	ms := int64(time.Millisecond)
	ops := []history.Op{
		{Type: history.OK, Call: 0, Return: 10 * ms},
		{Type: history.OK, Call: 0, Return: 30 * ms},
		{Type: history.Info, Call: 0, Return: 1500 * ms},
		{Type: history.Fail, Call: 0, Return: 1600 * ms},
		{Type: history.OK, Call: 0, Return: 1700 * ms, In: history.Input{Final: true}},
		{Type: history.Invoke, Call: 0},
	}
	b := Buckets(ops, 2*time.Second)
	if len(b) != 2 || b[0].OK != 2 || b[1].Info != 1 || b[1].Fail != 1 || b[1].OK != 0 {
		t.Fatalf("buckets %+v", b)
	}
	if b[0].P50 != 30*time.Millisecond || b[0].P99 != 30*time.Millisecond {
		t.Fatalf("latencies %+v", b[0])
	}
}

func TestWriteSVG(t *testing.T) {
	var sb strings.Builder
	faults := []nemesis.Fault{{Family: nemesis.FamilyKill, Kind: "kill-leader", Start: int64(time.Second), End: int64(3 * time.Second), Detail: "SIGKILL n1 <&>"}}
	avail, rec := 0.25, 1.0
	windows := []progress.Window{{Faults: []string{}, Start: 0, End: 1, Acked: 0, Writes: 9},
		{Faults: []string{"kill-leader"}, Start: 1, End: 3, Acked: 1, Writes: 4, Availability: &avail, RecoveredIn: &rec}}
	if err := WriteSVG(&sb, "title & more", []Bucket{{OK: 5, P50: time.Millisecond, P99: 9 * time.Millisecond}, {OK: 7}, {Info: 2}}, faults, windows); err != nil {
		t.Fatal(err)
	}
	svg := sb.String()
	// Well-formed XML, whatever the details hold.
	dec := xml.NewDecoder(strings.NewReader(svg))
	for {
		if _, err := dec.Token(); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("not well-formed: %v", err)
		}
	}
	if !strings.Contains(svg, "kill-leader") || !strings.Contains(svg, familyColor[nemesis.FamilyKill]) {
		t.Fatal("the fault window is not drawn")
	}
	if !strings.Contains(svg, ">25%</text>") || !strings.Contains(svg, "back 1.0 s after the heal") || !strings.Contains(svg, "no acknowledged write") {
		t.Fatal("availability, recovery or the window without progress is not drawn")
	}
	if strings.Count(svg, "<polyline") != 5 {
		t.Fatalf("want 5 series, got %d", strings.Count(svg, "<polyline"))
	}
}
