package idemkv

import (
	"encoding/json"
	"slices"
)

// History and explained conflicts (docs/protocol.md "History and explained
// conflicts"). The state machine writes a record's history, from the stamped time of
// each entry, in the same batch as the change it tells of; nothing else writes it.

// EventKind names what happened to a record.
type EventKind string

const (
	// EventExecute: an attempt was granted the key (a new record, or an approved one
	// whose approval the reserve consumed).
	EventExecute EventKind = "execute"
	// EventRecover: an attempt took the key over from one whose lease ran out; the
	// detail names the fence it replaced.
	EventRecover EventKind = "recover"
	EventCommit  EventKind = "commit"
	EventFail    EventKind = "fail"
	// EventRelease: the holder gave the key back. A release deletes the record (the
	// key is absent again); the event ends the history its tombstone keeps, which the
	// key's next record continues.
	EventRelease EventKind = "release"
	EventDoubt   EventKind = "doubt"
	// EventResolve: someone settled an in-doubt record; the actor is the token that
	// did, the detail the outcome. Resolved not executed, the record is deleted as by a
	// release, and the event ends its tombstone's history.
	EventResolve           EventKind = "resolve"
	EventApprovalRequested EventKind = "approval_requested"
	// EventApprovalDecided: the actor is the approver, the detail the verdict and the
	// reason.
	EventApprovalDecided EventKind = "approval_decided"
)

// Events lists every EventKind, in the order of docs/protocol.md.
var Events = []EventKind{EventExecute, EventRecover, EventCommit, EventFail, EventRelease,
	EventDoubt, EventResolve, EventApprovalRequested, EventApprovalDecided}

// MaxHistory is how many events a record keeps: the latest, oldest first; the older
// ones are counted in history_dropped. 16 hold the life of a record that recovered a
// dozen times; each event is 40 to 100 bytes stored (docs/operations.md measures it).
const MaxHistory = 16

// MaxEventDetail bounds an event's detail. A detail quotes what the request said (a
// receipt's remote id, an approver's reason), clipped to it.
const MaxEventDetail = 256

// HistoryEvent is one event of a record's history.
type HistoryEvent struct {
	At        Timestamp `json:"at"`
	Event     EventKind `json:"event"`
	Fence     uint64    `json:"fence,omitempty"`
	AttemptID string    `json:"attempt_id,omitempty"`
	Actor     string    `json:"actor,omitempty"`
	Detail    string    `json:"detail,omitempty"`
}

// WithEvent returns r's history with ev appended, keeping the latest MaxHistory; it
// never changes r's own slice, which other copies of the record may share.
func (r *Record) WithEvent(ev HistoryEvent) (history []HistoryEvent, dropped uint32) {
	ev.Detail = ClipText(ev.Detail, MaxEventDetail)
	h := append(slices.Clip(r.History), ev)
	dropped = r.HistoryDropped
	if over := len(h) - MaxHistory; over > 0 {
		h = slices.Clone(h[over:])
		dropped += uint32(over)
	}
	return h, dropped
}

// AddEvent appends ev to r's history (see WithEvent).
func (r *Record) AddEvent(ev HistoryEvent) { r.History, r.HistoryDropped = r.WithEvent(ev) }

// HasHistory reports whether r keeps a history. It is the one predicate of whether a
// record deleted by a release leaves a tombstone: records written before histories
// existed, or by a node that writes none, have neither.
func (r *Record) HasHistory() bool {
	return r != nil && (len(r.History) > 0 || r.HistoryDropped > 0)
}

// Tombstone is what a record deleted by a release (or a resolve not executed) leaves
// of itself: its history, ended by the event of the deletion, for an operator asking
// what happened to the key. It is not a record: the key is absent for every decision,
// list and read, and GET ?history=true answers not_found with it in the error's
// details (ErrorDetails). The key's next record continues its history and removes it;
// otherwise it lives until the record would have expired (ExpiresAt), and the expiry
// sweeper deletes it then.
type Tombstone struct {
	Tenant      string    `json:"tenant"`
	Key         string    `json:"idempotency_key"`
	Tool        string    `json:"tool"`
	Fingerprint string    `json:"effect_fingerprint"`
	ReleasedAt  Timestamp `json:"released_at"`
	ExpiresAt   Timestamp `json:"expires_at"`
	// History is oldest first, at most MaxHistory, its last event the release or
	// resolve; HistoryDropped counts the older ones.
	History        []HistoryEvent `json:"history"`
	HistoryDropped uint32         `json:"history_dropped"`
}

// WithoutHistory returns r without its history, sharing everything else: what every
// answer carries unless the caller asked for the history.
func (r *Record) WithoutHistory() *Record {
	if r == nil || (r.History == nil && r.HistoryDropped == 0) {
		return r
	}
	c := *r
	c.History, c.HistoryDropped = nil, 0
	return &c
}

// DiffEntry is one difference between the effect a record keeps and the one a
// conflicting reserve carried. Path is a JSON Pointer (RFC 6901) into the effect; a
// value absent on one side is omitted; a value under a masked path is "***"; a value
// longer than MaxDiffValue is replaced by a string that says what it was.
type DiffEntry struct {
	Path     string          `json:"path"`
	Stored   json.RawMessage `json:"stored,omitempty"`
	Received json.RawMessage `json:"received,omitempty"`
}

// Bounds of a conflict's diff.
const (
	// MaxDiffEntries: a conflict lists at most this many differences, in path order,
	// and counts the rest in diff_omitted.
	MaxDiffEntries = 32
	// MaxDiffValue: a stored or received value whose JSON is longer is shown as a
	// string naming its type, size and fingerprint.
	MaxDiffValue = 256
	// MaxDiffPath: a path longer than this (a chain of long member names) is cut, and
	// says how long it was.
	MaxDiffPath = 512
	// MaxEffectMasks bounds the masked paths of a rule; MaxMaskLen each one.
	MaxEffectMasks = 32
	MaxMaskLen     = 256
)

// MaskedValue is what a diff shows of a value under a masked path.
var MaskedValue = json.RawMessage(`"***"`)
