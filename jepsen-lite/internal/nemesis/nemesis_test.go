package nemesis

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkv/idemkv/jepsen-lite/internal/cluster"
	"github.com/idemkv/idemkv/jepsen-lite/internal/proxy"
)

func TestParseFamilies(t *testing.T) {
	all, err := ParseFamilies("all")
	if err != nil || !slices.Equal(all, Families) {
		t.Fatalf("all = %v, %v", all, err)
	}
	none, err := ParseFamilies("none")
	if err != nil || len(none) != 0 {
		t.Fatalf("none = %v, %v", none, err)
	}
	two, err := ParseFamilies("kill, clock")
	if err != nil || !slices.Equal(two, []string{FamilyKill, FamilyClock}) {
		t.Fatalf("kill, clock = %v, %v", two, err)
	}
	if _, err := ParseFamilies("kill,meteor"); err == nil {
		t.Fatal("an unknown family was accepted")
	}
	for _, f := range Families {
		if len(kinds[f]) == 0 {
			t.Errorf("family %s has no faults", f)
		}
	}
}

// A partition-ring on three nodes cuts nothing (both other nodes are neighbours), so
// it is not drawn there; on five it is.
func TestRingOnlyWhereItCuts(t *testing.T) {
	if slices.Contains(kindsFor(FamilyPartition, 3), "partition-ring") {
		t.Fatal("partition-ring is drawn on three nodes")
	}
	if !slices.Contains(kindsFor(FamilyPartition, 5), "partition-ring") {
		t.Fatal("partition-ring is not drawn on five nodes")
	}
}

// A partition shows its effect through the proxies: cut links that carried no
// traffic, or links cut that it does not name, make it fail.
func TestPartitionAssertsItsEffect(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := cluster.New(cluster.Config{Nodes: 3, Dir: t.TempDir(), Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := New(Config{Logger: logger, Now: func() int64 { return 0 }}, c)
	// Node 1's Raft address answers, so bytes from node 0 to node 1 flow while the
	// link passes them.
	ln, err := net.Listen("tcp", c.Nodes()[1].RaftAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, conn) }()
		}
	}()
	cut01 := between([]int{0}, []int{1})

	// Nothing flows: the cut did nothing.
	err = n.holdCut(t.Context(), 200*time.Millisecond, cut01, func() { c.SetLinks([]int{0}, []int{1}, proxy.Setting{Mode: proxy.Cut}) })
	if err == nil || !strings.Contains(err.Error(), "dropped no traffic") {
		t.Fatalf("a cut without traffic passed: %v", err)
	}

	// Traffic from 0 to 1 during the cut is dropped: the partition acted.
	conn, err := net.Dial("tcp", c.Link(0, 1).Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
				_, _ = conn.Write([]byte("append entries"))
			}
		}
	}()
	err = n.holdCut(t.Context(), 300*time.Millisecond, cut01, func() { c.SetLinks([]int{0}, []int{1}, proxy.Setting{Mode: proxy.Cut}) })
	if err != nil {
		t.Fatalf("a cut that dropped traffic failed: %v", err)
	}

	// The run ends during the hold: nothing could be dropped, and that is no failure.
	ended, cancel := context.WithCancel(t.Context())
	cancel()
	err = n.holdCut(ended, 300*time.Millisecond, between([]int{1}, []int{2}), func() { c.SetLinks([]int{1}, []int{2}, proxy.Setting{Mode: proxy.Cut}) })
	if err != nil {
		t.Fatalf("a cut that the end of the run cut short failed: %v", err)
	}

	// It cut more than it names.
	err = n.holdCut(t.Context(), 100*time.Millisecond, cut01, func() { c.Partition([][]int{{0}, {1}, {2}}) })
	if err == nil || !strings.Contains(err.Error(), "links cut") {
		t.Fatalf("an extra cut passed: %v", err)
	}
}
