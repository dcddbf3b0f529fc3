//go:build unix

package freeport

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// Two test processes draw from the same range. One that handed a port out keeps it for
// its life, though nothing listens on it while its node is stopped: the other must
// never draw it. The CI run that failed had node's cluster tests find a port taken by
// another package's test binary for more than 10 s. The child here is this test binary
// again: it takes a quarter of a narrow range and waits; this process then takes all it
// can of the same range and must get none of the child's.
func TestAPortHandedOutIsNeverAnotherProcesssToo(t *testing.T) {
	const n = 40
	if lo, err := strconv.Atoi(os.Getenv("FREEPORT_CHILD_LOW")); err == nil {
		spanLow, spanHigh = lo, lo+4*n
		for range n {
			addr, err := Addr()
			if err != nil {
				fmt.Println("error", err)
				os.Exit(1)
			}
			fmt.Println(addr)
		}
		fmt.Println("done")
		_, _ = io.Copy(io.Discard, os.Stdin) // hold the claims until the parent is done
		os.Exit(0)
	}
	// A range of its own for each run (-count) of the test.
	lo := 21500 + 4*n*int(runs.Add(1)-1)

	cmd := exec.Command(os.Args[0], "-test.run=^TestAPortHandedOutIsNeverAnotherProcesssToo$")
	cmd.Env = append(os.Environ(), "FREEPORT_CHILD_LOW="+strconv.Itoa(lo))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	childs := map[string]bool{}
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != "done" {
		if strings.HasPrefix(sc.Text(), "error") {
			t.Fatalf("child: %s", sc.Text())
		}
		childs[sc.Text()] = true
	}
	if len(childs) != n {
		t.Fatalf("the child handed out %d ports, want %d", len(childs), n)
	}

	defer func(l, h int) { spanLow, spanHigh = l, h }(spanLow, spanHigh)
	spanLow, spanHigh = lo, lo+4*n
	got := 0
	for {
		addr, err := Addr()
		if err != nil {
			break // the range is used up
		}
		if childs[addr] {
			t.Fatalf("%s handed out here while the child process holds it", addr)
		}
		got++
	}
	// Everything the child does not hold, less whatever else listens in the range.
	if got == 0 {
		t.Fatal("no port the child does not hold was handed out")
	}
	t.Logf("the child held %d ports of [%d, %d); this process got %d others", n, lo, lo+4*n, got)
}

var runs atomic.Int32
