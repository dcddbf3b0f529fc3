package node

import (
	"context"
	"fmt"
	"strings"

	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
)

// The version gate (fsm/format.go, docs/operations.md "Upgrading"). Each node
// advertises the data format it reads: the leader its own when it establishes and at
// its clock ticks, a joining node in its join request. Once every member of the Raft
// configuration advertises a format above the cluster's, the leader raises the
// cluster's to it. Until then nothing that needs it is proposed: the request is
// refused, or written in the older form where that loses nothing.

// Format is the highest data format this node reads and advertises.
func (n *Node) Format() int {
	if n.cfg.AsFormat != 0 {
		return n.cfg.AsFormat
	}
	return fsm.FormatVersion
}

// ClusterFormat is the cluster's data format as this node's state machine holds it.
func (n *Node) ClusterFormat() int { return n.fsm.Format() }

// AdvertisePending reports whether the replicated state does not hold the format this
// node reads yet: it joined through a leader of the release before formats, or came
// back upgraded and has not led since. `idemkv serve --join` then joins again, which
// advertises it (a leader advertises itself).
func (n *Node) AdvertisePending() bool {
	return n.knowsFormats() && n.fsm.Err() == nil && n.fsm.Advertised(n.cfg.ID) != n.Format()
}

// knowsFormats reports whether this node plays a release that advertises formats: one
// that stands for the release before (Config.AsFormat) proposes neither
// advertisements nor raises, as that release did not.
func (n *Node) knowsFormats() bool { return n.Format() > fsm.FormatApprovals }

// advanceFormat, on the leader, advertises this node's format if the replicated state
// does not hold it yet and raises the cluster's format when every member advertises
// more. apply proposes one command and waits for it to apply.
func (n *Node) advanceFormat(apply func(*fsm.Command) error) error {
	if !n.knowsFormats() || n.raft.State() != raft.Leader {
		return nil
	}
	if n.fsm.Advertised(n.cfg.ID) != n.Format() {
		self := idemkv.NodeInfo{ID: n.cfg.ID, Format: n.Format()}
		if err := apply(&fsm.Command{Op: fsm.OpAdvertise, Node: &self}); err != nil {
			return err
		}
	}
	target, _, err := n.memberFormat()
	if err != nil || target <= n.fsm.Format() {
		return err
	}
	if err := apply(&fsm.Command{Op: fsm.OpSetFormat, Format: target}); err != nil {
		return err
	}
	n.log.Info("raised the cluster format", "format", target, "brings", fsm.FormatName(target))
	return nil
}

// memberFormat is the lowest format any member of the Raft configuration advertised
// (voters and nonvoters alike: both apply every entry), never above this build's, and
// the members that advertise less than this build reads.
func (n *Node) memberFormat() (lowest int, older []string, err error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return 0, nil, err
	}
	lowest = fsm.FormatVersion
	for _, s := range f.Configuration().Servers {
		adv := n.fsm.Advertised(string(s.ID))
		lowest = min(lowest, adv)
		if adv < fsm.FormatVersion {
			older = append(older, fmt.Sprintf("%s (format %d)", s.ID, adv))
		}
	}
	return lowest, older, nil
}

// checkFormat refuses cmd when the cluster's format is below what it needs, naming the
// members that hold the format back.
func (n *Node) checkFormat(cmd *fsm.Command) error {
	need, have := fsm.CommandFormat(cmd), n.fsm.Format()
	if need <= have {
		return nil
	}
	what := cmd.Op.String()
	switch {
	case cmd.Op == fsm.OpReserve:
		what = "store_effect"
	case cmd.Op == fsm.OpSetApprovalRule || cmd.Op == fsm.OpRemoveApprovalRule:
		what = "an approval rule with store_effect, mask or require_approval: false"
	}
	_, older, err := n.memberFormat()
	who := "the cluster has not raised its format yet; it does within a clock tick once every member advertises it"
	if err == nil && len(older) > 0 {
		who = "members that read less: " + strings.Join(older, ", ") + "; upgrade them (docs/operations.md, \"Upgrading\")"
	}
	return idemkv.Errorf(idemkv.ErrUnavailable, "%s needs the cluster's data format %d (%s) and the cluster's is %d: %s",
		what, need, fsm.FormatName(need), have, who)
}

// checkJoinFormat refuses a node that reads less than the cluster's format: it could
// apply neither the snapshot it would be sent nor the entries after it.
func (n *Node) checkJoinFormat(req *idemkv.JoinRequest) error {
	adv := joinFormat(req)
	if have := n.fsm.Format(); adv < have {
		return idemkv.Invalid("format", "node %s reads data format %d and this cluster's is %d (%s): it could not read the state it would be sent; upgrade it to a release that reads format %d before it joins",
			req.ID, adv, have, fsm.FormatName(have), have)
	}
	return nil
}

// joinFormat is the format a join request advertises: none is the release before formats.
func joinFormat(req *idemkv.JoinRequest) int {
	if req.Format == 0 {
		return fsm.FormatApprovals
	}
	return req.Format
}

// advertiseJoined records the format of a node that joined and raises the cluster's
// when it was the last one holding it back.
func (n *Node) advertiseJoined(ctx context.Context, req *idemkv.JoinRequest) error {
	if !n.knowsFormats() {
		return nil
	}
	apply := func(cmd *fsm.Command) error {
		_, err := n.propose(ctx, cmd)
		return err
	}
	// A join without a format is of the release before formats: its node reads
	// FormatApprovals, whatever it advertised before (a node downgraded by hand).
	if adv := joinFormat(req); n.fsm.Advertised(req.ID) != adv {
		ni := idemkv.NodeInfo{ID: req.ID, Format: adv}
		if err := apply(&fsm.Command{Op: fsm.OpAdvertise, Node: &ni}); err != nil {
			return err
		}
	}
	return n.advanceFormat(apply)
}
