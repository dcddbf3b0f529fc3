package nemesis

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkv/idemkv/internal/raftflood"
)

// The Raft-port family of issue 22, point 7: a stranger floods every node's Raft port
// with idle sockets while the leader is killed. The survivors must still reach each
// other and elect a leader.
const (
	FamilyRaftPort = "raft-port"

	// FindingLeaderless: no node was leader within floodElectionLimit of the leader's
	// kill while the Raft ports were flooded.
	FindingLeaderless = "leaderless-under-flood"
)

// Flood sizes. The listener before the fix held 64 connections in their handshake
// and refused the newest: ~90 idle sockets per port kept a cluster leaderless for the
// whole flood. 128 per port, from 8 other loopback addresses (standing for other
// hosts), is twice that cap and puts every source over the per-source cap of 8.
const (
	floodSources   = 8
	floodPerSource = 16
	// floodElectionLimit bounds the election after the kill. Elections here take
	// about a second (500 ms timeouts); the flood may cost a few more on a loaded
	// machine, and the old listener never let one through in 32 s.
	floodElectionLimit = 10 * time.Second
	floodTakeHold      = 15 * time.Second
)

func init() {
	Families = append(Families, FamilyRaftPort)
	kinds[FamilyRaftPort] = []string{"raft-port-flood"}
	moreKinds["raft-port-flood"] = (*Nemesis).raftPortFlood
}

// raftPortFlood floods every node's Raft port (the node's own, not the harness's
// proxies: a stranger reaches the port directly) with idle sockets, kills the leader
// with SIGKILL, and requires a new leader within floodElectionLimit; the killed node
// restarts, and must come back, under the flood.
func (n *Nemesis) raftPortFlood(ctx, heal context.Context, hold time.Duration) (string, error) {
	l, err := n.leader(heal)
	if err != nil {
		return "", err
	}
	var targets []string
	for _, node := range n.c.Nodes() {
		targets = append(targets, node.RaftAddr)
	}
	f := raftflood.Start(targets, floodSources, floodPerSource)
	defer f.Stop()
	detail := func() string {
		return fmt.Sprintf("%d idle sockets per Raft port from 127.0.0.2-127.0.0.%d, SIGKILL of the leader %s (%d dials, %d closed by the nodes)",
			floodSources*floodPerSource, 1+floodSources, n.id(l), f.Dials(), f.ClosedByNode())
	}
	// The flood shows its effect: every socket dialled, and the nodes closing some
	// (the ones over their caps).
	if err := f.TakeHold(heal, len(targets)*floodSources*floodPerSource, floodTakeHold); err != nil {
		return detail(), err
	}
	var errs []error
	errs = append(errs, n.c.Kill(l))
	if n.c.Running(l) {
		errs = append(errs, fmt.Errorf("nemesis: %s still runs after SIGKILL", n.id(l)))
	}
	killed := time.Now()
	elected, ok := n.awaitLeaderOtherThan(heal, l, floodElectionLimit)
	if ok {
		n.log.Info("nemesis: new leader under the flood", "after", elected)
	} else {
		n.find(FindingLeaderless, "no leader within %s of the SIGKILL of the leader %s while every Raft port held %d idle sockets from %d other hosts",
			floodElectionLimit, n.id(l), floodSources*floodPerSource, floodSources)
	}
	sleep(ctx, max(0, hold/2-time.Since(killed)))
	errs = append(errs, n.c.StartNode(l))
	sleep(ctx, max(0, hold-time.Since(killed)))
	d := detail()
	if ok {
		d += fmt.Sprintf("; a new leader %s after the kill", elected.Round(10*time.Millisecond))
	}
	return d, errors.Join(errs...)
}

// awaitLeaderOtherThan waits up to limit until a running node other than old says it
// leads, and returns how long that took.
func (n *Nemesis) awaitLeaderOtherThan(ctx context.Context, old int, limit time.Duration) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < limit && ctx.Err() == nil {
		for i := range n.c.Size() {
			if i == old || !n.c.Running(i) {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			info, err := n.c.Info(cctx, i)
			cancel()
			if err == nil && info.Leader.ID == n.id(i) {
				return time.Since(start), true
			}
		}
		sleep(ctx, 100*time.Millisecond)
	}
	return 0, false
}
