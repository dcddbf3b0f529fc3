package fsm

import "github.com/idemkv/idemkv"

// Data formats. A format is what a node can read: the log entries it decodes and the
// records, rules and snapshots it stores. Every node advertises the highest one it
// reads (OpAdvertise); the cluster's format (OpSetFormat) is replicated state that the
// leader raises once every member of the Raft configuration advertises the next one,
// and never lowers. The state machine decides from the cluster's format alone, never
// from what this binary could do, so every replica stores the same bytes, and no node
// is sent an entry or a record it cannot read (the way etcd's cluster version gates
// its features during a rolling upgrade).
const (
	// FormatApprovals is the format of the release before history (up to commit
	// 2d85395^): approvals, command versions 1 and 2, records without a history or
	// masked effect paths (record flags up to 1<<4), rules without options (rule
	// version 1). That release advertises nothing, so a member that never advertised
	// counts as this.
	FormatApprovals = 2
	// FormatHistory adds what issue 26 brought: records keep their history (record
	// flag 1<<5) and a kept effect its masked paths (1<<6); a reserve may keep its
	// effect (store_effect); rules carry options (rule version 2) and a resolve names
	// its token (command version 3).
	FormatHistory = 3
	// FormatVersion is the highest format this build reads and advertises.
	FormatVersion = FormatHistory
)

// FormatName says what format f brought, for messages.
func FormatName(f int) string {
	switch {
	case f <= FormatApprovals:
		return "approvals, without history"
	case f == FormatHistory:
		return "history, stored effects, masks and rule options"
	}
	return "a format this build does not know"
}

// RecordsHistory is the one predicate of what the history format gates: at cluster
// format format, the state machine records history events (and whatever lives only
// with a history, such as the tombstone of a released record that had one), keeps an
// effect for store_effect and masks it. Below it records are stored as the release
// before history stored them.
func RecordsHistory(format int) bool { return format >= FormatHistory }

// CommandFormat is the lowest cluster format at which cmd may be proposed: what a
// node must read to apply it as this build does. A proposer below it refuses the
// request (or writes it in the older form, where that loses nothing). An OpSetFormat
// is gated by the members' advertisements instead (node/format.go), and an
// OpAdvertise is skipped harmlessly by a release that does not know it.
func CommandFormat(cmd *Command) int {
	switch {
	case cmd.extended():
		return FormatHistory
	case cmd.Op == OpReserve && cmd.Reserve != nil && cmd.Reserve.StoreEffect:
		return FormatHistory
	}
	return FormatApprovals
}

// AtFormat makes rec, a record a decision function just made (no other copy shares
// it), what the cluster format stores: below FormatHistory, no history, no masked
// paths, and an effect only on a record that asked for an approval, as the release
// before history stored it.
func AtFormat(rec *idemkv.Record, format int) {
	if rec == nil || RecordsHistory(format) {
		return
	}
	rec.History, rec.HistoryDropped = nil, 0
	rec.EffectMask = nil
	if rec.Approval == nil {
		rec.Effect = nil
	}
}
