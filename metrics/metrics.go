// Package metrics declares every Prometheus metric idemkv exports, in one place, so
// names and labels stay consistent across the API, the node and the sweeper.
//
// It must never import the server packages: they import it.
package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics holds the collectors. Every component takes a *Metrics; tests make their own
// with New, so registries never clash.
type Metrics struct {
	Registry *prometheus.Registry

	// Decisions counts reserve decisions by tool and decision. Its tool label comes
	// from requests: pass it through Tools.
	Decisions *prometheus.CounterVec
	// Tools bounds the values of the tool label, in all and per tenant
	// (DefaultMaxToolLabels, DefaultMaxToolLabelsPerTenant).
	Tools *BoundedLabel
	// Requests times API requests by endpoint and status code.
	Requests *prometheus.HistogramVec
	// ApplyLatency times a proposal from Raft Apply to the state machine's answer.
	ApplyLatency prometheus.Histogram
	// ApplyBatch is the number of log entries the state machine applied in one batch.
	ApplyBatch prometheus.Histogram
	// WriteStages times the stages of a write on the node that serves it (Stage*):
	// where a new operation's time goes, stage by stage, without a tracer. Observe
	// through Stage, which holds each stage's series.
	WriteStages *prometheus.HistogramVec
	stages      [numStages]prometheus.Observer
	// LeaderChanges counts observed leadership changes.
	LeaderChanges prometheus.Counter
	// RaftLogVerifications counts the ranges of the Raft log that raft-wal's verifier
	// checked on this node, by result: ok, mismatch (what this node wrote or reads back
	// is not what the leader wrote), unchecked (compacted away before the check, or
	// the node started inside the range).
	RaftLogVerifications *prometheus.CounterVec
	// ClockStampsClamped counts command stamps this node kept within the clock bound
	// because its wall clock ran outside it (fsm.BoundStamp).
	ClockStampsClamped prometheus.Counter
	// LongPollWakeups counts long-polls woken by an entry that may have changed their
	// record; each then takes a read index.
	LongPollWakeups prometheus.Counter
	// LocalAnswers counts reserves a node answered from its own applied state, with
	// no read index and no leader, by decision (replay or conflict against a
	// committed or failed record: docs/protocol.md "Followers").
	LocalAnswers *prometheus.CounterVec
	// RaftConnsClosed counts connections the Raft listener closed before Raft saw
	// them, or because an RPC claimed a node id the peer's certificate does not name,
	// by reason (node/raftlisten.go).
	RaftConnsClosed *prometheus.CounterVec
	// ApprovalRequests counts new approval requests (not the retries that see the same
	// one) by tool; ApprovalDecisions counts decisions by tool and verdict (approve,
	// deny). The proposing node counts them once the entry applied.
	ApprovalRequests  *prometheus.CounterVec
	ApprovalDecisions *prometheus.CounterVec

	// ClusterFormat is the cluster's data format as this node's state machine holds it
	// (fsm/format.go); it rises once every member reads the next one.
	ClusterFormat prometheus.Gauge

	// Sweeper figures.
	Swept         prometheus.Counter
	SweepDuration prometheus.Histogram
	SweepBacklog  prometheus.Gauge
	OldestOverdue prometheus.Gauge
}

const namespace = "idemkv"

// The stages of a write that WriteStages times. The API's own: reading and decoding
// the body, the checks before the store is called, writing the answer. The node's:
// its checks and local look-ups before proposing. Raft's, as hashicorp/raft times them
// (node.RaftStageSink): the leader's append until its log write is durable, from that
// append's start until a quorum has the entry (commit), the hand-off of committed
// entries to the state machine's goroutine, one batch's apply, and on the way: one
// AppendEntries round trip to a follower and a follower's own log write.
const (
	StageRead = iota
	StageValidate
	StagePrepare
	StageRespond
	StageLeaderAppend
	StageCommit
	StageFSMEnqueue
	StageFSMApply
	StageAppendRPC
	StageFollowerAppend
	numStages
)

// StageNames are the stage label's values, indexed by Stage*.
var StageNames = [numStages]string{
	StageRead: "read", StageValidate: "validate", StagePrepare: "prepare", StageRespond: "respond",
	StageLeaderAppend: "leader_append", StageCommit: "commit", StageFSMEnqueue: "fsm_enqueue",
	StageFSMApply: "fsm_apply", StageAppendRPC: "append_rpc", StageFollowerAppend: "follower_append",
}

// Stage returns the observer of stage s (a Stage* constant), looked up once in New.
func (m *Metrics) Stage(s int) prometheus.Observer { return m.stages[s] }

// DefaultMaxToolLabels is how many distinct tool names get series of their own. An
// agent fleet has tens of tools; a client sending 1,000 made-up names made 1,000
// series that lived until restart.
const DefaultMaxToolLabels = 200

// DefaultMaxToolLabelsPerTenant is how many of those one tenant's requests may claim:
// with a cap in all only, one tenant sending 200 made-up names left every other tenant's
// tools in "other" until restart. It leaves room for several tenants' tens of tools,
// and a tool name one tenant claimed counts for every tenant that uses it.
const DefaultMaxToolLabelsPerTenant = 50

// OtherLabel is the value every label value beyond a BoundedLabel's cap folds into.
const OtherLabel = "other"

// BoundedLabel keeps the values of a label that clients choose to a fixed number:
// the first max distinct values seen keep their name, the rest count as OtherLabel,
// so a hostile or buggy client cannot grow the series without bound. Each value is
// claimed by the owner (the tenant) whose request brought it first, and one owner
// claims at most maxPerOwner, so that no tenant can take every series from the others.
type BoundedLabel struct {
	mu          sync.RWMutex
	max         int
	maxPerOwner int
	seen        map[string]struct{}
	// claimed counts the values each owner brought first; it holds at most max owners.
	claimed map[string]int
}

// NewBoundedLabel returns a BoundedLabel keeping max values in all and maxPerOwner
// per owner (0 or less: every value folds into OtherLabel).
func NewBoundedLabel(max, maxPerOwner int) *BoundedLabel {
	return &BoundedLabel{max: max, maxPerOwner: maxPerOwner, seen: map[string]struct{}{}, claimed: map[string]int{}}
}

// SetMax changes the caps. Values already admitted keep their series.
func (b *BoundedLabel) SetMax(max, maxPerOwner int) {
	b.mu.Lock()
	b.max, b.maxPerOwner = max, maxPerOwner
	b.mu.Unlock()
}

// Value returns v if it has its own series, or if there is room for one in all and
// among owner's, and otherwise OtherLabel.
func (b *BoundedLabel) Value(owner, v string) string {
	// Almost every call names a value seen before: every reserve of every request
	// asks, so those share the lock.
	b.mu.RLock()
	_, ok := b.seen[v]
	b.mu.RUnlock()
	if ok {
		return v
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.seen[v]; ok {
		return v
	}
	if len(b.seen) >= b.max || b.claimed[owner] >= b.maxPerOwner {
		return OtherLabel
	}
	b.seen[v] = struct{}{}
	b.claimed[owner]++
	return v
}

// New creates the collectors and registers them, with the Go and process collectors,
// in a fresh registry.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		Registry: reg,
		Tools:    NewBoundedLabel(DefaultMaxToolLabels, DefaultMaxToolLabelsPerTenant),
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "decisions_total",
			Help: "Reserve decisions by tool and decision.",
		}, []string{"tool", "decision"}),
		Requests: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "http_request_duration_seconds",
			Help:    "API request latency by endpoint and status code.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}, []string{"endpoint", "code"}),
		ApplyLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "raft_apply_duration_seconds",
			Help:    "Time from proposing a command to Raft until the state machine answered.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}),
		ApplyBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "fsm_apply_batch_entries",
			Help:    "Log entries applied by the state machine in one Pebble batch.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		WriteStages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "write_stage_duration_seconds",
			Help:    "Stages of a write on the node that serves it: read, validate, respond (API), prepare (node, before proposing), leader_append, commit, fsm_enqueue, fsm_apply, append_rpc, follower_append (Raft's own timers).",
			Buckets: prometheus.ExponentialBuckets(0.00001, 2, 20),
		}, []string{"stage"}),
		LeaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "raft_leader_changes_total",
			Help: "Leadership changes observed by this node.",
		}),
		RaftLogVerifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "raft_log_verifications_total",
			Help: "Ranges of the Raft log checked against the leader's checksum, by result (ok, mismatch, unchecked).",
		}, []string{"result"}),
		ClockStampsClamped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "clock_stamps_clamped_total",
			Help: "Command stamps kept within the clock bound because this node's wall clock jumped or drifted outside it.",
		}),
		LongPollWakeups: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "long_poll_wakeups_total",
			Help: "Long-polls woken by an applied entry that may have changed their record.",
		}),
		LocalAnswers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "reserve_local_answers_total",
			Help: "Reserves answered from this node's own state, with no read index and no leader (replay or conflict against a committed or failed record), by decision.",
		}, []string{"decision"}),
		RaftConnsClosed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "raft_connections_closed_total",
			Help: "Connections the Raft listener closed: evicted or refused while in their handshake (source_full, listener_full, refused), a failed handshake (handshake), or an RPC that claimed another node's id (wrong_node_id).",
		}, []string{"reason"}),
		ApprovalRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "approval_requests_total",
			Help: "New approval requests (a reserve that needs approval on an absent record), by tool.",
		}, []string{"tool"}),
		ApprovalDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "approval_decisions_total",
			Help: "Approvals decided, by tool and decision (approve, deny).",
		}, []string{"tool", "decision"}),
		Swept: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "expiry_swept_records_total",
			Help: "Records deleted by the expiry sweeper, and tombstones of released records (their history) past their expiry.",
		}),
		SweepDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "expiry_sweep_duration_seconds",
			Help:    "Duration of one sweep round (until the backlog is gone).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		ClusterFormat: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "cluster_format",
			Help: "The cluster's data format as this node's state machine holds it; it rises once every member advertises the next one.",
		}),
		SweepBacklog: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "expiry_backlog_records",
			Help: "Records past expires_at that are not swept yet, and tombstones of released records past theirs.",
		}),
		OldestOverdue: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "expiry_oldest_overdue_seconds",
			Help: "How long the oldest expired, unswept record has been overdue.",
		}),
	}
	for i, name := range StageNames {
		m.stages[i] = m.WriteStages.WithLabelValues(name)
	}
	reg.MustRegister(m.Decisions, m.Requests, m.ApplyLatency, m.ApplyBatch, m.WriteStages, m.LeaderChanges, m.RaftLogVerifications, m.ClockStampsClamped, m.LongPollWakeups, m.LocalAnswers, m.RaftConnsClosed,
		m.ApprovalRequests, m.ApprovalDecisions, m.ClusterFormat, m.Swept, m.SweepDuration, m.SweepBacklog, m.OldestOverdue,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// NodeStats are a node's Raft and storage figures, read on every scrape.
type NodeStats struct {
	// State is one of RaftStates.
	State        string
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64 // applied by the state machine
	LastLogIndex uint64
	// LastContact is how long ago this node last heard from the leader: 0 on the
	// leader, negative when it never has.
	LastContact time.Duration
	// Records counts the stored records, expired but unswept ones included.
	Records int
	// InDoubt counts the pending records marked in doubt, waiting for a resolve;
	// InDoubtOldestAge is how long the oldest of them has waited (0 if none).
	InDoubt          int
	InDoubtOldestAge time.Duration
	// ClockOffset is the state machine clock minus this node's wall clock, as the node
	// last measured it (ClockMeasured).
	ClockOffset   time.Duration
	ClockMeasured bool
	// LocalAnswers: the node answers replays and conflicts from its own state now.
	LocalAnswers bool
	// ApprovalsWaiting counts the approvals nobody answered yet (lapsed ones left
	// out); ApprovalOldestAge is how long the oldest of them has waited (0 if none).
	ApprovalsWaiting  int
	ApprovalOldestAge time.Duration
	// VotesWithheld: the node started without Raft state and refuses votes until it
	// has caught up with a leader.
	VotesWithheld bool
}

// RaftStates are the values of the state label of idemkv_raft_state.
var RaftStates = []string{"follower", "candidate", "leader", "shutdown"}

var (
	descRaftState = prometheus.NewDesc(namespace+"_raft_state",
		"1 for the Raft state this node is in, 0 for the others.", []string{"state"}, nil)
	descTerm = prometheus.NewDesc(namespace+"_raft_term",
		"Current Raft term.", nil, nil)
	descCommitIndex = prometheus.NewDesc(namespace+"_raft_commit_index",
		"Highest log index known to be committed.", nil, nil)
	descAppliedIndex = prometheus.NewDesc(namespace+"_raft_applied_index",
		"Highest log index the state machine has applied.", nil, nil)
	descLastLogIndex = prometheus.NewDesc(namespace+"_raft_last_log_index",
		"Highest index in this node's Raft log.", nil, nil)
	descLastContact = prometheus.NewDesc(namespace+"_raft_last_contact_seconds",
		"Time since this node last heard from the leader (0 on the leader; absent if never).", nil, nil)
	descRecords = prometheus.NewDesc(namespace+"_records_stored",
		"Records stored, expired but not yet swept ones included.", nil, nil)
	descInDoubt = prometheus.NewDesc(namespace+"_records_in_doubt",
		"Pending records marked in doubt: an attempt died and nobody can tell whether its effect happened. Each waits for idemkv resolve.", nil, nil)
	descInDoubtAge = prometheus.NewDesc(namespace+"_in_doubt_oldest_age_seconds",
		"How long the oldest in-doubt record has waited for a resolve (0 when there is none).", nil, nil)
	descClockOffset = prometheus.NewDesc(namespace+"_clock_offset_seconds",
		"The state machine clock minus this node's wall clock, measured at the latest stamp it applied (absent until measured).", nil, nil)
	descLocalAnswers = prometheus.NewDesc(namespace+"_local_answers_enabled",
		"1 while this node answers replays and conflicts from its own state; 0 while its clock is unanchored, its offset unmeasured or beyond the margin, or it has not heard a leader for longer than the margin.", nil, nil)
	descApprovalsWaiting = prometheus.NewDesc(namespace+"_approvals_waiting",
		"Approval requests nobody has approved or denied yet, lapsed ones left out.", nil, nil)
	descApprovalAge = prometheus.NewDesc(namespace+"_approval_oldest_waiting_seconds",
		"How long the oldest waiting approval has waited for a decision (0 when there is none).", nil, nil)
	descVotesWithheld = prometheus.NewDesc(namespace+"_raft_votes_withheld",
		"1 while this node, started without Raft state (a new member, or one that lost its data dir), refuses votes until it has caught up with a leader.", nil, nil)
)

// RegisterNode adds the figures of a running node to the registry, read from stats on
// every scrape. It fails if a node is registered already.
func (m *Metrics) RegisterNode(stats func() NodeStats) error {
	return m.Registry.Register(nodeCollector(stats))
}

type nodeCollector func() NodeStats

func (c nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRaftState, descTerm, descCommitIndex, descAppliedIndex,
		descLastLogIndex, descLastContact, descRecords, descInDoubt, descInDoubtAge, descClockOffset, descLocalAnswers, descApprovalsWaiting, descApprovalAge, descVotesWithheld} {
		ch <- d
	}
}

func (c nodeCollector) Collect(ch chan<- prometheus.Metric) {
	s := c()
	for _, state := range RaftStates {
		v := 0.0
		if state == s.State {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descRaftState, prometheus.GaugeValue, v, state)
	}
	ch <- prometheus.MustNewConstMetric(descTerm, prometheus.GaugeValue, float64(s.Term))
	ch <- prometheus.MustNewConstMetric(descCommitIndex, prometheus.GaugeValue, float64(s.CommitIndex))
	ch <- prometheus.MustNewConstMetric(descAppliedIndex, prometheus.GaugeValue, float64(s.AppliedIndex))
	ch <- prometheus.MustNewConstMetric(descLastLogIndex, prometheus.GaugeValue, float64(s.LastLogIndex))
	if s.LastContact >= 0 {
		ch <- prometheus.MustNewConstMetric(descLastContact, prometheus.GaugeValue, s.LastContact.Seconds())
	}
	ch <- prometheus.MustNewConstMetric(descRecords, prometheus.GaugeValue, float64(s.Records))
	ch <- prometheus.MustNewConstMetric(descInDoubt, prometheus.GaugeValue, float64(s.InDoubt))
	ch <- prometheus.MustNewConstMetric(descInDoubtAge, prometheus.GaugeValue, s.InDoubtOldestAge.Seconds())
	if s.ClockMeasured {
		ch <- prometheus.MustNewConstMetric(descClockOffset, prometheus.GaugeValue, s.ClockOffset.Seconds())
	}
	local := 0.0
	if s.LocalAnswers {
		local = 1
	}
	ch <- prometheus.MustNewConstMetric(descLocalAnswers, prometheus.GaugeValue, local)
	ch <- prometheus.MustNewConstMetric(descApprovalsWaiting, prometheus.GaugeValue, float64(s.ApprovalsWaiting))
	ch <- prometheus.MustNewConstMetric(descApprovalAge, prometheus.GaugeValue, s.ApprovalOldestAge.Seconds())
	withheld := 0.0
	if s.VotesWithheld {
		withheld = 1
	}
	ch <- prometheus.MustNewConstMetric(descVotesWithheld, prometheus.GaugeValue, withheld)
}
