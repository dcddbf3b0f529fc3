package client

import "github.com/idemkv/idemkv"

// Types you will meet. They are the root package's own types under the names a user
// of this package looks for, so that go doc ./client is enough; values of either name
// are interchangeable.
type (
	// Decision is a reserve's answer: execute, replay, conflict, in_progress or recover.
	// Outcome.Decision and the typed errors carry the one Do acted on.
	Decision = idemkv.Decision
	// Receipt is what a committed (or failed) operation stored and every replay
	// returns: remote_system, remote_id, remote_url, result, committed_at (or error).
	Receipt = idemkv.Receipt
	// Record is the stored state of one key: status (pending, committed, failed),
	// fence, attempts, lease, expiry, receipt or error, and in_doubt.
	Record = idemkv.Record
	// Status is a record's state.
	Status = idemkv.Status
	// Conflict explains a conflict: the reason and both fingerprints.
	Conflict = idemkv.Conflict
	// Consistency is a read's: Linearizable (the default) or Stale.
	Consistency = idemkv.Consistency
	// ResolveOutcome says how an in-doubt record is settled: ResolveCommitted or
	// ResolveNotExecuted.
	ResolveOutcome = idemkv.ResolveOutcome
)

// Decisions, as they travel on the wire.
const (
	DecisionExecute    = idemkv.DecisionExecute
	DecisionReplay     = idemkv.DecisionReplay
	DecisionConflict   = idemkv.DecisionConflict
	DecisionInProgress = idemkv.DecisionInProgress
	DecisionRecover    = idemkv.DecisionRecover
)

// Statuses of a record.
const (
	StatusPending   = idemkv.StatusPending
	StatusCommitted = idemkv.StatusCommitted
	StatusFailed    = idemkv.StatusFailed
)

// Read consistencies (GetRequest.Consistency, ListRequest.Consistency).
const (
	// Linearizable reads see every write acknowledged before them; the default.
	Linearizable = idemkv.Linearizable
	// Stale reads are served from the answering node's replica, possibly behind.
	Stale = idemkv.Stale
)

// Resolve outcomes (Client.Resolve).
const (
	ResolveCommitted   = idemkv.ResolveCommitted
	ResolveNotExecuted = idemkv.ResolveNotExecuted
)
