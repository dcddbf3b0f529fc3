package nemesis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testhooks"
)

// The fault family of issue 22, point 1: a machine that boots with its clock hours off
// and starts idemkv before NTP corrects it, alone and behind a partition.
const FamilyClockRestart = "clock-restart"

// FindingClockRestartExpired: right after a node restarted with its clock hours fast
// took the lead, a lease taken seconds before ran out, or a record committed seconds
// before with hours of retention was gone.
const FindingClockRestartExpired = "expired-by-restart"

func init() {
	Families = append(Families, FamilyClockRestart)
	kinds[FamilyClockRestart] = []string{"clock-restart", "clock-restart+partition"}
	moreKinds["clock-restart"] = func(n *Nemesis, ctx, heal context.Context, hold time.Duration) (string, error) {
		return n.clockRestart(ctx, heal, hold, false)
	}
	moreKinds["clock-restart+partition"] = func(n *Nemesis, ctx, heal context.Context, hold time.Duration) (string, error) {
		return n.clockRestart(ctx, heal, hold, true)
	}
}

// clockRestartTries is how often the whole cluster is restarted until the node with the
// shifted clock wins the first election, before anything anchors it.
const clockRestartTries = 3

// clockRestart takes a 60 s lease and commits a record with 1 h retention, kills every
// node (SIGKILL), and starts one again first with its clock shifted by hours (forwards
// two times in three: every third one goes back, so that a run of a few is sure to hold
// forward shifts; a random sign once gave five backward ones in a row, and the
// sabotage it must catch survives those), the others a moment later, so that the shifted node most often
// wins the first election of the quiet restart, when only the stamps in its own log tell
// it the time. Once it leads, another attempt at the lease must find it in progress and
// the record must replay; then, with partition, the cluster is split in halves for half
// the hold; then every clock is reset and a 1 s lease must run out in time.
func (n *Nemesis) clockRestart(ctx, heal context.Context, hold time.Duration, partition bool) (string, error) {
	victim := n.r.IntN(n.c.Size())
	shift := time.Duration(2+n.r.IntN(4)) * time.Hour
	n.clockRestarts++
	if n.clockRestarts%3 == 0 {
		shift = -shift
	}
	stamp := n.cfg.Now()
	leaseKey, keptKey := fmt.Sprintf("clock-restart-lease-%d", stamp), fmt.Sprintf("clock-restart-kept-%d", stamp)
	fp := strings.Repeat("e", 64)
	lease := idemkv.ReserveRequest{Tenant: probeTenant, Key: leaseKey, Tool: "probe", Fingerprint: fp,
		AttemptID: "holder-" + leaseKey, LeaseTTLMs: 60_000, TTLMs: 3_600_000}
	if err := n.probeReserveOnce(heal, lease, idemkv.DecisionExecute); err != nil {
		return "", fmt.Errorf("nemesis: lease probe: %w", err)
	}
	if err := n.probeCommit(heal, keptKey, fp); err != nil {
		return "", fmt.Errorf("nemesis: kept probe: %w", err)
	}
	env := fmt.Sprintf("%s=%s", testhooks.EnvClockOffset, shift)
	var errs []error
	led := false
	tries := 0
	for tries < clockRestartTries && !led && ctx.Err() == nil {
		tries++
		for i := range n.c.Size() {
			errs = append(errs, n.c.Kill(i))
		}
		errs = append(errs, n.c.StartNodeWithEnv(victim, env))
		sleep(heal, time.Second)
		for _, o := range n.others(victim) {
			errs = append(errs, n.c.StartNode(o))
		}
		l, err := n.leader(heal)
		if err != nil {
			errs = append(errs, err)
			break
		}
		led = l == victim
	}
	detail := fmt.Sprintf("%s restarted with its clock %+v (whole cluster SIGKILLed %d times)", n.id(victim), shift, tries)
	if !led {
		detail += "; it never won the first election, so its first stamps were not a leader's"
	} else {
		detail += "; it led first"
	}
	other := lease
	other.AttemptID = "other-" + leaseKey
	expired := []string{}
	if err := n.probeReserveOnce(heal, other, idemkv.DecisionInProgress); err != nil {
		expired = append(expired, "the 60 s lease: "+err.Error())
	}
	if err := n.probeReserveOnce(heal, n.probeReserve(keptKey, fp), idemkv.DecisionReplay); err != nil {
		expired = append(expired, "the record kept for 1 h: "+err.Error())
	}
	if len(expired) > 0 {
		n.find(FindingClockRestartExpired, "after %s: %s", detail, strings.Join(expired, "; "))
		detail += "; EXPIRED " + strings.Join(expired, "; ")
	} else {
		detail += "; the lease held and the record replayed"
	}
	if partition {
		perm := n.r.Perm(n.c.Size())
		minority, majority := perm[:(n.c.Size()-1)/2], perm[(n.c.Size()-1)/2:]
		err := n.holdCut(ctx, hold/2, between(minority, majority), func() { n.c.Partition([][]int{minority, majority}) })
		errs = append(errs, err)
		detail += fmt.Sprintf("; then %s | %s", n.ids(minority), n.ids(majority))
	} else {
		sleep(ctx, hold/2)
	}
	if err := n.resetClocks(heal); err != nil {
		return detail, errors.Join(append(errs, err)...)
	}
	if err := n.probeTimeMoves(heal); err != nil {
		n.find(FindingTimeFrozen, "after %s: %v", detail, err)
		detail += "; leases did NOT run out in time after the reset"
	}
	return detail, errors.Join(errs...)
}

// probeReserveOnce asks for req through whichever node leads, retrying unavailability
// for 30 s, and says how the decision differs from want.
func (n *Nemesis) probeReserveOnce(ctx context.Context, req idemkv.ReserveRequest, want idemkv.Decision) error {
	var got idemkv.Decision
	if err := n.onLeader(ctx, func(l int) error {
		var rr idemkv.ReserveResult
		err := n.c.Call(ctx, l, "POST", "/v1/reserve", req, &rr)
		got = rr.Decision
		return err
	}); err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("%s, want %s", got, want)
	}
	return nil
}
