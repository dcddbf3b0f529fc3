package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
)

// TestMain lets the test binary be the agent the demo spawns: the demo runs
// os.Executable() "agent" ..., which here is this binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "agent" {
		if err := agent(os.Args[2:], os.Stdout); err != nil {
			os.Stderr.WriteString("agent: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestDemo: two agent processes killed with SIGKILL while they wait, one card, one
// approval, one refund, and a replay.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	if err := demo(context.Background(), &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	t.Log(s)
	for _, want := range []string{"killed agent run 1", "killed agent run 2", "approver: 1 card(s) waiting", "refunded: re_0001",
		"already refunded: re_0001 (replayed", "payments: 1 refund(s) made"} {
		if !strings.Contains(s, want) {
			t.Errorf("transcript lacks %q", want)
		}
	}
}
