package cluster

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A node that ends by itself is reported; one the harness kills, or one that ends
// while a storage fault is set on it, is not. Before, a node that panicked in a
// background goroutine was started again by the final heal and the run was valid.
func TestUnexpectedExitsAreReported(t *testing.T) {
	dir := t.TempDir()
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	newCluster := func(binary string) *Cluster {
		c, err := New(Config{Binary: binary, Dir: t.TempDir(), Nodes: 1, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.closeLinks)
		return c
	}
	waitExit := func(c *Cluster) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for c.Running(0) {
			if time.Now().After(deadline) {
				t.Fatal("the node did not end")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	crash := newCluster(script("crash", "echo 'panic: boom' >&2; exit 2"))
	if err := crash.StartNode(0); err != nil {
		t.Fatal(err)
	}
	waitExit(crash)
	if got := crash.UnexpectedExits(); len(got) != 1 || !strings.Contains(got[0], "n1 (start #1) exited by itself") {
		t.Fatalf("a node that ended by itself: %q, want one exit reported", got)
	}

	killed := newCluster(script("sleeper", "exec sleep 60"))
	if err := killed.StartNode(0); err != nil {
		t.Fatal(err)
	}
	if err := killed.Kill(0); err != nil {
		t.Fatal(err)
	}
	if got := killed.UnexpectedExits(); len(got) != 0 {
		t.Fatalf("a node the harness killed: %q, want none", got)
	}

	faulted := newCluster(script("fault", "sleep 0.3; exit 1"))
	if err := faulted.StartNode(0); err != nil {
		t.Fatal(err)
	}
	faulted.setFaulted(0, true)
	waitExit(faulted)
	if got := faulted.UnexpectedExits(); len(got) != 0 {
		t.Fatalf("a node that ended under a storage fault: %q, want none", got)
	}
	// Started again, it holds no fault: ending by itself now is reported.
	if err := faulted.StartNode(0); err != nil {
		t.Fatal(err)
	}
	waitExit(faulted)
	if got := faulted.UnexpectedExits(); len(got) != 1 || !strings.Contains(got[0], "start #2") {
		t.Fatalf("the restarted node ending by itself: %q, want start #2 reported", got)
	}
}
