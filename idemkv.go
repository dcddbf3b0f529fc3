// Package idemkv holds the domain types shared by every part of idemkv: records,
// decisions, receipts, the request and answer shapes of the API, their validation,
// and the sentinel errors.
//
// It must stay free of Raft, Pebble and HTTP: the client imports it, and a runtime that
// imports the client must not compile in the server.
package idemkv

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// Status is the state of a stored record.
type Status string

const (
	StatusPending   Status = "pending"
	StatusCommitted Status = "committed"
	StatusFailed    Status = "failed"
)

// Terminal reports whether no further transition can happen from s.
func (s Status) Terminal() bool { return s == StatusCommitted || s == StatusFailed }

// Decision is the answer to a reserve (docs/protocol.md section 1).
type Decision string

const (
	DecisionExecute    Decision = "execute"
	DecisionReplay     Decision = "replay"
	DecisionConflict   Decision = "conflict"
	DecisionInProgress Decision = "in_progress"
	DecisionRecover    Decision = "recover"
)

// Conflict reasons.
const (
	ReasonDifferentEffect = "idempotency_key_reused_with_different_effect"
	ReasonDifferentTool   = "idempotency_key_reused_with_different_tool"
)

// Timestamp is a point in time in Unix milliseconds. It travels in JSON as RFC 3339
// UTC with milliseconds; zero means unset and is omitted with omitempty.
type Timestamp int64

// TimestampOf converts t to a Timestamp.
func TimestampOf(t time.Time) Timestamp { return Timestamp(t.UnixMilli()) }

// Time converts ts back to a time.Time in UTC.
func (ts Timestamp) Time() time.Time { return time.UnixMilli(int64(ts)).UTC() }

// String formats ts as RFC 3339 UTC with milliseconds.
func (ts Timestamp) String() string {
	var b [len(TimeFormat) + 8]byte
	return string(ts.appendText(b[:0]))
}

// TimeFormat is the layout of every timestamp idemkv writes.
const TimeFormat = "2006-01-02T15:04:05.000Z07:00"

// MarshalText writes ts in TimeFormat, which encoding/json quotes. Timestamp is a
// TextMarshaler rather than a json.Marshaler because encoding/json scans and compacts
// whatever a MarshalJSON returns: for the four timestamps of every answer that scan
// cost more than formatting them (1.6% of a leader's CPU at 64 clients, issue 27).
// The JSON is the same.
func (ts Timestamp) MarshalText() ([]byte, error) {
	return ts.appendText(make([]byte, 0, len(TimeFormat))), nil
}

// AppendText appends what MarshalText writes (encoding.TextAppender).
func (ts Timestamp) AppendText(b []byte) ([]byte, error) {
	return ts.appendText(b), nil
}

// UnmarshalText reads what MarshalText writes, or any RFC 3339 time.
func (ts *Timestamp) UnmarshalText(b []byte) error {
	t, err := time.Parse(time.RFC3339Nano, string(b))
	if err != nil {
		return fmt.Errorf("timestamp must be RFC 3339: %w", err)
	}
	*ts = TimestampOf(t)
	return nil
}

// appendText appends ts in TimeFormat. Years 0 to 9999, every time idemkv stamps,
// are written digit by digit, as AppendFormat writes them but without parsing the
// layout on every call: a reserve's answer carries four timestamps, and formatting
// them took 1.3% of a leader's CPU under load (issue 27). Other years, which only a
// request's own expires_at can bring, go through AppendFormat.
func (ts Timestamp) appendText(b []byte) []byte {
	t := ts.Time()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, TimeFormat)
	}
	hour, minute, sec := t.Clock()
	ms := t.Nanosecond() / int(time.Millisecond)
	b = appendDigits(b, year, 4)
	b = append(b, '-')
	b = appendDigits(b, int(month), 2)
	b = append(b, '-')
	b = appendDigits(b, day, 2)
	b = append(b, 'T')
	b = appendDigits(b, hour, 2)
	b = append(b, ':')
	b = appendDigits(b, minute, 2)
	b = append(b, ':')
	b = appendDigits(b, sec, 2)
	b = append(b, '.')
	b = appendDigits(b, ms, 3)
	return append(b, 'Z')
}

// appendDigits appends v (0 <= v < 10^width) in exactly width decimal digits.
func appendDigits(b []byte, v, width int) []byte {
	var d [4]byte
	for i := width - 1; i >= 0; i-- {
		d[i] = byte('0' + v%10)
		v /= 10
	}
	return append(b, d[:width]...)
}

func (ts *Timestamp) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("timestamp must be an RFC 3339 string: %w", err)
	}
	return ts.UnmarshalText([]byte(s))
}

// Record is the stored state of one idempotency key (docs/protocol.md section 1).
type Record struct {
	Tenant         string    `json:"tenant"`
	Key            string    `json:"idempotency_key"`
	Fingerprint    string    `json:"effect_fingerprint"`
	Tool           string    `json:"tool"`
	Actor          string    `json:"actor,omitempty"`
	Status         Status    `json:"status"`
	Fence          uint64    `json:"fence"`
	AttemptID      string    `json:"attempt_id,omitempty"`
	Attempts       uint32    `json:"attempts"`
	CreatedAt      Timestamp `json:"created_at"`
	UpdatedAt      Timestamp `json:"updated_at"`
	LeaseExpiresAt Timestamp `json:"lease_expires_at,omitempty"`
	ExpiresAt      Timestamp `json:"expires_at"`
	// Receipt is set once the record is committed.
	Receipt *StoredReceipt `json:"receipt,omitempty"`
	// Error is set once the record is failed.
	Error *ErrorInfo `json:"error,omitempty"`
	// InDoubt marks a pending record whose attempt died with an outcome nobody can
	// learn (a non-idempotent tool without a probe). Its lease no longer matters: every
	// reserve answers recover without a fence, and only a resolve settles it.
	// InDoubtSince is when it was marked (stamped time). Both are omitted otherwise.
	InDoubt      bool      `json:"in_doubt,omitempty"`
	InDoubtSince Timestamp `json:"in_doubt_since,omitempty"`
	// Approval is set on a record that asked for one (awaiting_approval), and stays
	// once it is decided and consumed: who decided, when and why.
	Approval *Approval `json:"approval,omitempty"`
	// Effect is the effect's canonical JSON (RFC 8785), kept on a record that asked
	// for an approval so that the approver sees what they approve, or whose reserve
	// asked to store it (store_effect, or a rule) so that a conflict can say what
	// differs. Values under EffectMask were replaced by "***" before it was stored.
	Effect     json.RawMessage `json:"effect,omitempty"`
	EffectMask []string        `json:"effect_mask,omitempty"`
	// History is the record's latest events, oldest first (at most MaxHistory);
	// HistoryDropped counts the older ones. Answers carry them only when asked
	// (GET /v1/records/{tenant}/{key}?history=true).
	History        []HistoryEvent `json:"history,omitempty"`
	HistoryDropped uint32         `json:"history_dropped,omitempty"`
}

// StoredReceipt is what the downstream system said when the effect committed.
type StoredReceipt struct {
	RemoteSystem string          `json:"remote_system"`
	RemoteID     string          `json:"remote_id"`
	RemoteURL    string          `json:"remote_url,omitempty"`
	Result       json.RawMessage `json:"result,omitempty"`
	CommittedAt  Timestamp       `json:"committed_at"`
}

// ErrorInfo is a stored failure: the effect is known not to have happened, or to have
// failed permanently, and every retry gets this error back.
type ErrorInfo struct {
	Code    string          `json:"code"`
	Message string          `json:"message"`
	Details json.RawMessage `json:"details,omitempty"`
}

// Receipt is what a replay returns: the outcome of a terminal record in the shape of
// docs/protocol.md section 2. Status is committed or failed.
type Receipt struct {
	Key          string          `json:"idempotency_key"`
	Fingerprint  string          `json:"effect_fingerprint"`
	Status       Status          `json:"status"`
	RemoteSystem string          `json:"remote_system,omitempty"`
	RemoteID     string          `json:"remote_id,omitempty"`
	RemoteURL    string          `json:"remote_url,omitempty"`
	CommittedAt  Timestamp       `json:"committed_at,omitempty"`
	Result       json.RawMessage `json:"result,omitempty"`
	Error        *ErrorInfo      `json:"error,omitempty"`
}

// Outcome returns the receipt of a terminal record, or nil while it is pending.
func (r *Record) Outcome() *Receipt {
	switch r.Status {
	case StatusCommitted:
		out := &Receipt{Key: r.Key, Fingerprint: r.Fingerprint, Status: StatusCommitted}
		if r.Receipt != nil {
			out.RemoteSystem = r.Receipt.RemoteSystem
			out.RemoteID = r.Receipt.RemoteID
			out.RemoteURL = r.Receipt.RemoteURL
			out.CommittedAt = r.Receipt.CommittedAt
			out.Result = r.Receipt.Result
		}
		return out
	case StatusFailed:
		return &Receipt{Key: r.Key, Fingerprint: r.Fingerprint, Status: StatusFailed, CommittedAt: r.UpdatedAt, Error: r.Error}
	}
	return nil
}

// Clone returns a deep copy of r (raw JSON fields are shared: they are never mutated).
func (r *Record) Clone() *Record {
	if r == nil {
		return nil
	}
	c := *r
	if r.Receipt != nil {
		rc := *r.Receipt
		c.Receipt = &rc
	}
	if r.Error != nil {
		ec := *r.Error
		c.Error = &ec
	}
	if r.Approval != nil {
		ac := *r.Approval
		c.Approval = &ac
	}
	// Events are values: a clone may share the backing array as long as appends
	// never write into it (WithEvent clips it first).
	c.History = slices.Clip(r.History)
	return &c
}

// Conflict explains why a reserve was refused (docs/protocol.md section 2).
type Conflict struct {
	Status              string `json:"status"` // always "conflict"
	Reason              string `json:"reason"`
	ExistingFingerprint string `json:"existing_fingerprint"`
	ReceivedFingerprint string `json:"received_fingerprint"`
	ExistingRemoteID    string `json:"existing_remote_id,omitempty"`
	ExistingTool        string `json:"existing_tool,omitempty"`
	ReceivedTool        string `json:"received_tool,omitempty"`
	// Diff is set when the record keeps its effect (store_effect) and the reserve
	// carried one: the differences, at most MaxDiffEntries in path order, with
	// DiffOmitted counting the rest.
	Diff        []DiffEntry `json:"diff,omitempty"`
	DiffOmitted int         `json:"diff_omitted,omitempty"`
}

// ReserveRequest asks for the right to run an effect (POST /v1/reserve).
type ReserveRequest struct {
	Tenant      string `json:"tenant"`
	Key         string `json:"idempotency_key"`
	Tool        string `json:"tool"`
	Actor       string `json:"actor,omitempty"`
	Fingerprint string `json:"effect_fingerprint,omitempty"`
	// Effect, when set instead of Fingerprint, is fingerprinted by the server.
	Effect json.RawMessage `json:"effect,omitempty"`
	// AttemptID names this attempt; a retried reserve with the same id is the same
	// attempt. The server generates one when it is empty.
	AttemptID  string    `json:"attempt_id,omitempty"`
	LeaseTTLMs int64     `json:"lease_ttl_ms,omitempty"`
	TTLMs      int64     `json:"ttl_ms,omitempty"`
	ExpiresAt  Timestamp `json:"expires_at,omitempty"`
	// SideEffect is the caller's class of the tool (one of the SideEffect constants),
	// for telemetry only: it goes on the request's span and is neither stored nor
	// part of the decision.
	SideEffect string `json:"side_effect,omitempty"`
	// Approval asks for a person's approval before the effect runs (docs/protocol.md
	// "Approvals"); such a reserve must carry Effect.
	Approval *ApprovalAsk `json:"approval,omitempty"`
	// StoreEffect keeps the effect's canonical JSON in the record, so that a later
	// conflict against it carries a diff; such a reserve must carry Effect. A rule of
	// the tenant and tool can ask for it too (ApprovalRule.StoreEffect).
	StoreEffect bool `json:"store_effect,omitempty"`
	// EffectMask is set by the state machine from the rule of the tenant and tool:
	// the paths whose values the stored effect replaces by "***". It never travels
	// on the wire.
	EffectMask []string `json:"-"`
}

// The tool classes of the protocol (docs/protocol.md section 4): what a retry of a
// tool may do to the world.
const (
	SideEffectReadOnly              = "read_only"
	SideEffectIdempotentMutation    = "idempotent_mutation"
	SideEffectNonIdempotentMutation = "non_idempotent_mutation"
)

// ReserveResult is the decision and what comes with it.
type ReserveResult struct {
	Decision       Decision  `json:"decision"`
	Fence          uint64    `json:"fence,omitempty"`
	AttemptID      string    `json:"attempt_id,omitempty"`
	LeaseExpiresAt Timestamp `json:"lease_expires_at,omitempty"`
	Receipt        *Receipt  `json:"receipt,omitempty"`
	Conflict       *Conflict `json:"conflict,omitempty"`
	// Approval is set on needs_approval: the request to show the approver.
	Approval *Approval `json:"approval,omitempty"`
	Record   *Record   `json:"record"`
}

// CommitRequest stores the receipt of an executed effect (POST /v1/commit).
type CommitRequest struct {
	Tenant       string          `json:"tenant"`
	Key          string          `json:"idempotency_key"`
	Fingerprint  string          `json:"effect_fingerprint"`
	Fence        uint64          `json:"fence"`
	RemoteSystem string          `json:"remote_system"`
	RemoteID     string          `json:"remote_id"`
	RemoteURL    string          `json:"remote_url,omitempty"`
	Result       json.RawMessage `json:"result,omitempty"`
}

// FailRequest stores a permanent failure (POST /v1/fail).
type FailRequest struct {
	Tenant      string    `json:"tenant"`
	Key         string    `json:"idempotency_key"`
	Fingerprint string    `json:"effect_fingerprint"`
	Fence       uint64    `json:"fence"`
	Error       ErrorInfo `json:"error"`
}

// ReleaseRequest gives a key back: the effect certainly did not happen (POST /v1/release).
type ReleaseRequest struct {
	Tenant      string `json:"tenant"`
	Key         string `json:"idempotency_key"`
	Fingerprint string `json:"effect_fingerprint"`
	Fence       uint64 `json:"fence"`
}

// DoubtRequest marks a pending record in doubt (POST /v1/doubt). Only the holder of
// the current fence may: normally an attempt that was granted recover and has no probe.
// The answer is the record.
type DoubtRequest struct {
	Tenant      string `json:"tenant"`
	Key         string `json:"idempotency_key"`
	Fingerprint string `json:"effect_fingerprint"`
	Fence       uint64 `json:"fence"`
}

// ResolveOutcome is what an operator says happened to an in-doubt effect.
type ResolveOutcome string

const (
	// ResolveCommitted: the effect happened; the request carries its receipt.
	ResolveCommitted ResolveOutcome = "committed"
	// ResolveNotExecuted: the effect certainly did not happen; the key is released.
	ResolveNotExecuted ResolveOutcome = "not_executed"
)

// ResolveRequest settles an in-doubt record without a fence (POST /v1/resolve).
// Committed stores the receipt (answer: the receipt); not_executed releases the key
// (answer: {"released":true}). Any record that is not pending and in doubt is
// not_pending.
type ResolveRequest struct {
	Tenant       string          `json:"tenant"`
	Key          string          `json:"idempotency_key"`
	Fingerprint  string          `json:"effect_fingerprint"`
	Outcome      ResolveOutcome  `json:"outcome"`
	RemoteSystem string          `json:"remote_system,omitempty"`
	RemoteID     string          `json:"remote_id,omitempty"`
	RemoteURL    string          `json:"remote_url,omitempty"`
	Result       json.RawMessage `json:"result,omitempty"`
	// By names who resolves, for the record's history: the API sets it from the
	// authenticated token (its name and role); it never travels in a request body.
	By string `json:"-"`
}

// ResolveResult is the answer to a resolve: the receipt when committed, Released when
// not executed. On the wire it is the receipt, or {"released":true}.
type ResolveResult struct {
	Receipt  *Receipt
	Released bool
}

func (r ResolveResult) MarshalJSON() ([]byte, error) {
	if r.Receipt == nil {
		return json.Marshal(ReleaseResult{Released: r.Released})
	}
	return json.Marshal(r.Receipt)
}

func (r *ResolveResult) UnmarshalJSON(b []byte) error {
	var probe struct {
		Released *bool `json:"released"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return err
	}
	if probe.Released != nil {
		*r = ResolveResult{Released: *probe.Released}
		return nil
	}
	var rc Receipt
	if err := json.Unmarshal(b, &rc); err != nil {
		return err
	}
	*r = ResolveResult{Receipt: &rc}
	return nil
}

// ReleaseResult is the answer to a release.
type ReleaseResult struct {
	Released bool `json:"released"`
}

// HeartbeatRequest extends the lease of the attempt holding fence (POST /v1/heartbeat).
type HeartbeatRequest struct {
	Tenant     string `json:"tenant"`
	Key        string `json:"idempotency_key"`
	Fence      uint64 `json:"fence"`
	LeaseTTLMs int64  `json:"lease_ttl_ms,omitempty"`
}

// Consistency of a read.
type Consistency string

const (
	Linearizable Consistency = "linearizable"
	Stale        Consistency = "stale"
)

// GetRequest reads one record (GET /v1/records/{tenant}/{key}).
type GetRequest struct {
	Tenant string
	Key    string
	// Wait, when positive, long-polls until the record is not pending (or absent),
	// or Wait has passed; the record is returned as it is then.
	Wait        time.Duration
	Consistency Consistency
	// History includes the record's history in the answer (?history=true).
	History bool
}

// ListRequest pages through a tenant's records in key order (GET /v1/records/{tenant}).
type ListRequest struct {
	Tenant string
	Prefix string
	Status Status // empty: any
	Limit  int    // 0: DefaultListLimit
	After  string // exclusive key to start after
	// InDoubt lists only pending records marked in doubt (?in_doubt=true).
	InDoubt bool
	// Consistency is linearizable (default) or stale (served from the local replica).
	Consistency Consistency
}

// ListResult is one page of records; Next, when set, is the After of the next page.
type ListResult struct {
	Records []*Record `json:"records"`
	Next    string    `json:"next,omitempty"`
}

// InDoubtRequest pages through the in-doubt records of every tenant, oldest
// in_doubt_since first (GET /v1/in-doubt): what an operator paged by
// idemkv_records_in_doubt looks at, without knowing the tenant. Its answer is a
// ListResult whose Next is a DoubtPosition.
type InDoubtRequest struct {
	Limit int    // 0: DefaultListLimit
	After string // exclusive cursor: the Next of an earlier page (see DoubtPosition)
	// Consistency is linearizable (default) or stale (served from the local replica).
	Consistency Consistency
}

// NodeInfo describes one member of the cluster.
type NodeInfo struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	APIAddr  string `json:"api_addr"`
	Suffrage string `json:"suffrage"` // voter, nonvoter
	// State is the member's role as the answering node knows it: leader, follower,
	// candidate, shutdown, unreachable (the leader's heartbeats to it fail) or unknown
	// (a follower cannot see other followers).
	State string `json:"state"`
	// Reachable, when known, says whether the answering node hears from the member:
	// itself always; a leader for each follower.
	Reachable *bool `json:"reachable,omitempty"`
	// LastContact, when known, is when the member last answered: on a leader for an
	// unreachable follower, on a follower for its leader.
	LastContact string `json:"last_contact,omitempty"`
	// Format is the highest data format the member said it reads (docs/operations.md
	// "Upgrading"); a member of a release before formats says nothing and counts as 2.
	Format int `json:"format,omitempty"`
}

// LeaderInfo names the current leader.
type LeaderInfo struct {
	ID      string `json:"id"`
	APIAddr string `json:"api_addr"`
}

// ClusterInfo is the answer of GET /v1/cluster.
type ClusterInfo struct {
	Leader       LeaderInfo `json:"leader"`
	Nodes        []NodeInfo `json:"nodes"`
	Term         uint64     `json:"term"`
	CommitIndex  uint64     `json:"commit_index"`
	AppliedIndex uint64     `json:"applied_index"`
	// Format is the cluster's data format: what every member reads, and so what the
	// state machine writes. It only rises, once every member advertises the next one.
	Format int `json:"format,omitempty"`
	// Clock is the answering node's clock against the state machine's.
	Clock *ClockInfo `json:"clock,omitempty"`
}

// ClockInfo is what a node knows of its wall clock against the state machine clock
// (docs/protocol.md "Time").
type ClockInfo struct {
	// Anchored: the node has applied a live entry or stamped one since it started; until
	// then its stamps and reads follow the state machine clock, not its wall clock.
	Anchored bool `json:"anchored"`
	// OffsetMs is the state machine clock minus this node's wall clock, measured at the
	// latest stamp it applied, MeasuredAgoMs ago; absent until measured.
	OffsetMs      *int64 `json:"offset_ms,omitempty"`
	MeasuredAgoMs *int64 `json:"measured_ago_ms,omitempty"`
	// LocalAnswers: the node answers replays and conflicts of terminal records from its
	// own state; LocalAnswersOff says why not (unanchored, offset_unmeasured,
	// offset_beyond_margin, no_leader_contact).
	LocalAnswers    bool   `json:"local_answers"`
	LocalAnswersOff string `json:"local_answers_off,omitempty"`
}

// JoinRequest adds a node (POST /v1/cluster/join).
type JoinRequest struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	APIAddr  string `json:"api_addr"`
	// Format is the highest data format the joining node reads; absent (a release
	// before formats) counts as 2. A node that reads less than the cluster's format is
	// refused.
	Format int `json:"format,omitempty"`
	// HoldsState says whether the joining node started with state of its own: a Raft
	// log, term or snapshot, or records applied. Such a node that is not a member yet
	// is refused: its state is another cluster's (one rebuilt on the same addresses, or
	// the one a backup was restored from), or its own from before it was removed, and
	// Raft would let it lead with entries this cluster never committed, over entries
	// it did. Absent (a release before this field) is not checked.
	HoldsState *bool `json:"holds_state,omitempty"`
	// Stage is how the node joins. JoinLearner adds it as a nonvoter: it is sent the
	// log and the state but neither votes nor counts toward a quorum. JoinPromote makes
	// a nonvoter member a voter. `idemkv serve --join` does the first, waits until it
	// has what the cluster had committed, then does the second. Absent (a release before
	// stages) adds a voter at once, which counted toward every quorum before it held
	// anything: one whose raft_addr was wrong, added while a member was down, left the
	// others without a quorum for good.
	Stage string `json:"stage,omitempty"`
}

// Join stages (JoinRequest.Stage).
const (
	JoinLearner = "learner"
	JoinPromote = "promote"
)

// RemoveRequest removes a node (POST /v1/cluster/remove).
type RemoveRequest struct {
	ID string `json:"id"`
	// Force removes the node even when the voters left that the leader can reach are
	// short of their quorum: the cluster then commits nothing, the removal included,
	// until enough of them are back.
	Force bool `json:"force,omitempty"`
}
