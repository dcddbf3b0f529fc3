package nemesis

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkv/idemkv/jepsen-lite/internal/proxy"
)

// Each fault shows that it did what it names; a fault that did not is a harness error
// (Fault.Err), and the run is not judged on it. The checks read the proxies' counters
// and the processes' state, not the harness's own intentions.

// pair is a directed link.
type pair struct{ from, to int }

// between lists the directed links between a and b, both ways.
func between(a, b []int) []pair {
	var out []pair
	for _, i := range a {
		for _, j := range b {
			if i != j {
				out = append(out, pair{i, j}, pair{j, i})
			}
		}
	}
	return out
}

// cutLinks lists every directed link that is cut now.
func (n *Nemesis) cutLinks() []pair {
	var out []pair
	for i := range n.c.Size() {
		for j := range n.c.Size() {
			if i != j && n.c.Link(i, j).Setting().Mode == proxy.Cut {
				out = append(out, pair{i, j})
			}
		}
	}
	return out
}

func (n *Nemesis) linkStats(links []pair) proxy.Stats {
	var s proxy.Stats
	for _, l := range links {
		s = s.Add(n.c.Link(l.from, l.to).Stats())
	}
	return s
}

// holdCut applies a partition that must cut exactly the links in want, holds it and
// heals it. It fails when the proxies show other links cut, or when the cut links
// dropped no traffic during the hold (the leader heartbeats every follower many
// times a second, so a partition that separates anyone from the leader drops bytes).
func (n *Nemesis) holdCut(ctx context.Context, hold time.Duration, want []pair, apply func()) error {
	if len(want) == 0 {
		return fmt.Errorf("nemesis: the partition names no link to cut")
	}
	before := n.linkStats(want)
	apply()
	got := n.cutLinks()
	wantSet := map[pair]bool{}
	for _, l := range want {
		wantSet[l] = true
	}
	var err error
	if len(got) != len(wantSet) {
		err = fmt.Errorf("nemesis: %d links cut, the partition names %d", len(got), len(wantSet))
	}
	for _, l := range got {
		if !wantSet[l] && err == nil {
			err = fmt.Errorf("nemesis: link %s->%s is cut and the partition does not name it", n.id(l.from), n.id(l.to))
		}
	}
	sleep(ctx, hold)
	dropped := n.linkStats(want).Dropped - before.Dropped
	n.c.HealNetwork()
	// A hold that the end of the run cut short proves nothing either way: a partition
	// applied in the run's last milliseconds may see no heartbeat before it is healed.
	if err == nil && dropped == 0 && ctx.Err() == nil {
		err = fmt.Errorf("nemesis: the %d cut links dropped no traffic during the hold", len(want))
	}
	return err
}

// holdLinks applies a setting to every link, holds it, heals, and checks with check
// that the proxies saw it act.
func (n *Nemesis) holdLinks(ctx context.Context, hold time.Duration, s proxy.Setting, check func(d proxy.Stats) error) error {
	all := between(n.others(), n.others())
	before := n.linkStats(all)
	n.c.SetLinks(n.others(), n.others(), s)
	sleep(ctx, hold)
	after := n.linkStats(all)
	n.c.HealNetwork()
	if ctx.Err() != nil {
		return nil // cut short by the end of the run (see holdCut)
	}
	return check(proxy.Stats{Passed: after.Passed - before.Passed, Dropped: after.Dropped - before.Dropped,
		Delayed: after.Delayed - before.Delayed, Resets: after.Resets - before.Resets})
}

// assertStopped checks that a paused node's process really is stopped.
func (n *Nemesis) assertStopped(i int) error {
	st, err := n.c.ProcessState(i)
	if err != nil {
		return fmt.Errorf("nemesis: state of paused %s: %w", n.id(i), err)
	}
	if st != "T" {
		return fmt.Errorf("nemesis: %s was paused and its process state is %q, not T", n.id(i), st)
	}
	return nil
}

// kindsFor lists the fault kinds of a family that have an effect on a cluster of size
// nodes: on three nodes every node is its ring neighbours' neighbour, so a ring cuts
// nothing and is left out.
func kindsFor(family string, size int) []string {
	var out []string
	for _, k := range kinds[family] {
		if k == "partition-ring" && size < 4 {
			continue
		}
		out = append(out, k)
	}
	return out
}
