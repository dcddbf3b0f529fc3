package nemesis

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/idemkv/idemkv/internal/testhooks"
)

// combined holds two faults of different families at once, each asserting its effect
// as it does alone:
//
//   - partition+kill: the leader is isolated, and while it is, a node of the majority
//     is killed and restarted, so the majority side has no quorum until it is back;
//   - pause+membership: the leader is stopped, and once the others have elected a new
//     leader, a follower is removed by force (the new leader refuses it otherwise),
//     wiped and added back; on three nodes the new configuration has no quorum until
//     the paused node continues;
//   - partition+clock: the leader's clock is offset while the cluster is split in
//     halves, so the stamps come from whichever side leads.
func (n *Nemesis) combined(ctx, heal context.Context, kind string, hold time.Duration) (string, error) {
	l, err := n.leader(heal)
	if err != nil {
		return "", err
	}
	var (
		mu      sync.Mutex
		details []string
		errs    []error
		wg      sync.WaitGroup
	)
	note := func(detail string, err error) {
		mu.Lock()
		defer mu.Unlock()
		details = append(details, detail)
		errs = append(errs, err)
	}
	switch kind {
	case "partition+kill":
		others := n.others(l)
		victim := others[n.r.IntN(len(others))]
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := n.holdCut(ctx, hold, between([]int{l}, others), func() { n.c.Partition([][]int{{l}, others}) })
			note("isolated leader "+n.id(l), err)
		}()
		sleep(ctx, hold/4)
		var kerr []error
		kerr = append(kerr, n.c.Kill(victim))
		if n.c.Running(victim) {
			kerr = append(kerr, fmt.Errorf("nemesis: %s still runs after SIGKILL", n.id(victim)))
		}
		sleep(ctx, hold/3)
		kerr = append(kerr, n.c.StartNode(victim))
		note("SIGKILL "+n.id(victim), errors.Join(kerr...))

	case "pause+membership":
		if err := n.c.Pause(l); err != nil {
			return "", err
		}
		sleep(ctx, min(hold, 100*time.Millisecond))
		note("SIGSTOP "+n.id(l), n.assertStopped(l))
		// The membership change goes through the leader the others elect.
		deadline := time.Now().Add(max(hold, 5*time.Second))
		for time.Now().Before(deadline) {
			if cur := n.c.Leader(heal); cur >= 0 && cur != l {
				break
			}
			sleep(heal, 100*time.Millisecond)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Forced: the leader refuses a removal that leaves the voters it reaches
			// short of a quorum, as this one does while the old leader is paused;
			// the fault is that window, which an operator's --force opens.
			note(n.membership(ctx, heal, l, true))
		}()
		sleep(ctx, hold)
		note("SIGCONT "+n.id(l), n.c.Resume(l))

	case "partition+clock":
		offset := -time.Duration(5+n.r.IntN(55)) * time.Second
		if n.r.IntN(2) == 0 {
			offset = time.Duration(2+n.r.IntN(13)) * time.Second
		}
		ms := offset.Milliseconds()
		st, err := n.c.SetHooks(heal, l, testhooks.StateUpdate{ClockOffsetMs: &ms})
		if err == nil && st.ClockOffsetMs != ms {
			err = fmt.Errorf("nemesis: %s reports clock offset %d ms, set %d", n.id(l), st.ClockOffsetMs, ms)
		}
		note(fmt.Sprintf("%s clock %+v", n.id(l), offset), err)
		perm := n.r.Perm(n.c.Size())
		minority := perm[:max(1, (n.c.Size()-1)/2)]
		majority := perm[len(minority):]
		sort.Ints(minority)
		sort.Ints(majority)
		err = n.holdCut(ctx, hold, between(minority, majority), func() { n.c.Partition([][]int{minority, majority}) })
		note(fmt.Sprintf("%s | %s", n.ids(minority), n.ids(majority)), errors.Join(err, n.resetClocks(heal)))

	default:
		return "", fmt.Errorf("nemesis: unknown combination %q", kind)
	}
	wg.Wait()
	return joinDetails(details), errors.Join(errs...)
}

func joinDetails(d []string) string {
	out := ""
	for i, s := range d {
		if i > 0 {
			out += "; "
		}
		out += s
	}
	return out
}
