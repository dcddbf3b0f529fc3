package main

import (
	"strings"
	"testing"

	"github.com/idemkv/idemkv/internal/freeport"
)

// idemkv status fails (a non-zero exit) when it can reach no node, rather than print
// an empty table.
func TestStatusFailsWhenNoNodeAnswers(t *testing.T) {
	a, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	b, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cli(t, "status", "--endpoint", a, "--endpoint", b, "--timeout", "2s")
	if err == nil {
		t.Fatalf("status succeeded with no node listening: %q", out)
	}
	// Refused for the right reason: the nodes, not the flags.
	if !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("status failed with %v, want the refused connection", err)
	}
}
