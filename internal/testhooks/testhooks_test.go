package testhooks

import (
	"testing"
	"time"
)

func TestParseModes(t *testing.T) {
	cases := []struct {
		in   []string
		want Mode
	}{
		{nil, 0},
		{[]string{""}, 0},
		{[]string{"stale-reads"}, StaleReads},
		{[]string{"ignore-fences, early-ack"}, IgnoreFences | EarlyAck},
		{[]string{"early-ack", "stale-reads,"}, EarlyAck | StaleReads},
		{[]string{"stale-reads,ignore-fences,early-ack"}, StaleReads | IgnoreFences | EarlyAck},
		{[]string{"fail-writes,internal-errors,early-recover,orphan-effects"}, FailWrites | InternalErrors | EarlyRecover | OrphanEffects},
		{[]string{"skip-failed-restore"}, SkipFailedRestore},
		{[]string{"wedge-gap"}, WedgeGap},
		{[]string{"unbounded-clock,unbounded-forward-clock"}, UnboundedClock | UnboundedForwardClock},
	}
	for _, c := range cases {
		got, err := ParseModes(c.in...)
		if err != nil {
			t.Fatalf("ParseModes(%q): %v", c.in, err)
		}
		if got != c.want {
			t.Errorf("ParseModes(%q) = %v, want %v", c.in, got, c.want)
		}
		back, err := ParseModes(got.String())
		if err != nil || back != got {
			t.Errorf("round trip of %v gave %v, %v", got, back, err)
		}
	}
	if _, err := ParseModes("stale-reads,lose-everything"); err == nil {
		t.Fatal("an unknown mode was accepted")
	}
}

func TestModeNames(t *testing.T) {
	if got := Mode(0).Names(); got == nil || len(got) != 0 {
		t.Fatalf("no modes should be an empty, non-nil list (JSON []), got %#v", got)
	}
	got := (StaleReads | EarlyAck).Names()
	if len(got) != 2 || got[0] != "stale-reads" || got[1] != "early-ack" {
		t.Fatalf("Names = %q", got)
	}
}

func TestParseClockOffset(t *testing.T) {
	for in, want := range map[string]time.Duration{"": 0, " ": 0, "90s": 90 * time.Second, "-2m": -2 * time.Minute} {
		got, err := ParseClockOffset(in)
		if err != nil || got != want {
			t.Errorf("ParseClockOffset(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseClockOffset("soon"); err == nil {
		t.Fatal("a malformed offset was accepted")
	}
}

// Every mode has one bit of its own and a name, and AllModes holds each: a mode left
// out of AllModes would escape the production build's check that none is on.
func TestEveryModeIsNamedAndInAllModes(t *testing.T) {
	var seen Mode
	names := map[string]bool{}
	for _, n := range modeNames {
		if n.mode == 0 || n.mode&(n.mode-1) != 0 {
			t.Errorf("mode %q is %b, not one bit", n.name, n.mode)
		}
		if seen&n.mode != 0 || names[n.name] {
			t.Errorf("mode %q (%b) named twice", n.name, n.mode)
		}
		seen |= n.mode
		names[n.name] = true
		if AllModes&n.mode == 0 {
			t.Errorf("mode %q is not in AllModes", n.name)
		}
	}
	if seen != AllModes {
		t.Errorf("AllModes %b holds modes without a name (named: %b)", AllModes, seen)
	}
}
