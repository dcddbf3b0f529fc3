// Package node wires Raft, the state machine and Pebble into one idemkv node: the
// thing cmd/idemkv serves over HTTP and a Go program can embed in-process.
//
// A node proposes every state change through Raft and answers only after the state
// machine applied it; it serves linearizable reads with a read index. It never speaks
// HTTP itself (api does) and never decides a record's fate (fsm does).
package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/raft-wal/verifier"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/expiry"
	"github.com/idemkv/idemkv/fsm"
	"github.com/idemkv/idemkv/metrics"
	"github.com/idemkv/idemkv/storage"
)

// Config configures a node. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// ID names the node in the cluster; it must never change for a data dir.
	ID string
	// DataDir holds the Raft log, snapshots and the Pebble store. Open makes it, and
	// everything in it, private to the user the node runs as (datadir.go).
	DataDir string
	// RaftLog is the Raft log backend, RaftLogBolt or RaftLogWAL. Empty means the one
	// the data dir already holds, or DefaultRaftLog for a new data dir. A data dir
	// keeps its backend: naming the other one fails Open with ErrRaftLogMismatch.
	RaftLog string
	// RaftWALSegmentBytes sizes the segment files of the wal backend (default
	// DefaultRaftWALSegmentBytes); a change applies to segments created after it.
	RaftWALSegmentBytes int
	// RaftLogVerifyInterval is how often the leader appends a checkpoint for the Raft
	// log verifier (verify.go; default DefaultRaftLogVerifyInterval). Negative turns the
	// verifier off: no checkpoints, and no verifier in front of the log store.
	RaftLogVerifyInterval time.Duration
	// RaftLogVerifyEntries bounds a checkpoint's range: the leader appends one sooner
	// than RaftLogVerifyInterval once this many entries followed its last (default
	// DefaultRaftLogVerifyEntries).
	RaftLogVerifyEntries int
	// RaftAddr is the address the Raft transport listens on.
	RaftAddr string
	// RaftAdvertise is the address peers dial; default RaftAddr.
	RaftAdvertise string
	// APIAddr is this node's HTTP API address as clients and peers reach it; it is
	// replicated so any node can name the leader's API address.
	APIAddr string
	// Bootstrap makes a node with no Raft state form a single-node cluster of itself.
	// A node with state ignores it.
	Bootstrap bool
	// Joining says the node is started to join a cluster (idemkv serve --join): a
	// data dir restored from a backup, which starts a new cluster, is then refused
	// until it has been started once without it.
	Joining bool
	// PeerAddresses overrides, per peer ID, the address this node dials for that peer.
	PeerAddresses map[string]string
	// RaftTLS, when set, wraps Raft traffic in TLS in both directions; set ClientAuth
	// and ClientCAs for mutual TLS. PeerTLS builds one that also binds each peer's
	// certificate to the node ids it names.
	RaftTLS *tls.Config
	// RaftHandshakeTimeout, RaftIdleTimeout, RaftMaxPending and
	// RaftMaxPendingPerSource bound the connections the Raft listener accepts
	// (defaults DefaultRaftHandshakeTimeout, DefaultRaftIdleTimeout,
	// DefaultRaftMaxPending, DefaultRaftMaxPendingPerSource; raftlisten.go says how
	// a full listener makes room).
	RaftHandshakeTimeout    time.Duration
	RaftIdleTimeout         time.Duration
	RaftMaxPending          int
	RaftMaxPendingPerSource int

	Limits idemkv.Limits
	// CacheBytes sizes Pebble's block cache (default storage.DefaultCacheBytes).
	CacheBytes int64
	Logger     *slog.Logger
	Metrics    *metrics.Metrics

	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	// CommitTimeout is how long the leader's replication to a follower waits with no
	// new entry before it sends an AppendEntries anyway (hashicorp/raft picks a wait
	// between it and twice it). That is how followers learn the commit index of the
	// last write and apply it, since heartbeats carry none: a follower may be up to
	// twice this behind on a write once writes stop. It is also nearly all that an
	// idle cluster costs. Three idle nodes on loopback, 2 cores: at 5 ms the leader
	// used 7.1-7.6% of a core and each follower 2.0-2.2%, with these rounds (about
	// 120 a second to each follower) 95% of its AppendEntries and heartbeats the
	// rest; at 50 ms (hashicorp/raft's default), 1.7-2.0% and 0.5-0.6%.
	CommitTimeout     time.Duration
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	TrailingLogs      uint64
	// MaxAppendEntries bounds the entries sent (and group-committed) at once.
	MaxAppendEntries int
	// ApplyTimeout bounds how long a proposal may wait when the caller's context has
	// no deadline.
	ApplyTimeout time.Duration

	// Sweep configures the expiry sweeper that runs on the leader.
	Sweep expiry.Config

	// ClockTick is how long a leader may stamp nothing before it stamps an entry of its
	// own, to keep the state machine clock near real time in a quiet period (default
	// DefaultClockTick; negative: never). A node restarted after a quiet period resumes
	// the state machine clock from its last stamp, so this bounds how far behind real
	// time it resumes, besides the time the cluster was down; and followers measure
	// their clock offset at each stamp (half of LocalAnswerMargin at most). Each tick is one small
	// Raft entry, fsynced on every node.
	ClockTick time.Duration
	// LocalAnswerMargin is how far past this node's time a terminal record's expiry
	// must lie for the node to answer from its own state, and how old its measured
	// clock offset and its last contact with a leader may be (default
	// node.LocalAnswerMargin; the largest offset allowed is half of it). Widen it where
	// clocks are worse than NTP keeps them; tests narrow it to see it act.
	LocalAnswerMargin time.Duration

	// AsFormat, for tests only, makes the node stand for the release whose data format
	// it names (fsm.FormatApprovals, the release before history): it advertises that
	// format, proposes no advertisement or format change as that release did not, and
	// its state machine halts on any entry or restored record of a newer format
	// (fsm.FSM.ReadFormat). 0: fsm.FormatVersion, what this build reads.
	AsFormat int

	// Now is the clock the leader stamps commands with; default time.Now.
	Now func() time.Time
	// Monotonic measures real time for the bound on stamps (fsm.BoundStamp); default Go's
	// monotonic clock, which wall-clock steps do not move. Tests that move Now by hand
	// to let time pass move this with it.
	Monotonic func() time.Duration

	// PebbleFS is the filesystem under the Pebble store (default the OS's). Fault
	// tests put an error-injecting or crash-simulating vfs.FS here.
	PebbleFS vfs.FS
	// WrapRaftStores, when set, receives the Raft log, stable and snapshot stores the
	// node opened in DataDir and returns the ones Raft and the node use instead. Fault
	// tests wrap them to inject errors; the node still closes the originals.
	WrapRaftStores func(RaftStores) RaftStores
}

// RaftStores are the durable stores under Raft.
type RaftStores struct {
	Log       raft.LogStore
	Stable    raft.StableStore
	Snapshots raft.SnapshotStore
}

// DefaultConfig returns the defaults of `idemkv serve`.
func DefaultConfig() Config {
	return Config{
		ID:                    "n1",
		DataDir:               "idemkv-data",
		RaftAddr:              "127.0.0.1:7421",
		APIAddr:               "127.0.0.1:7420",
		HeartbeatTimeout:      1000 * time.Millisecond,
		ElectionTimeout:       1000 * time.Millisecond,
		LeaderLeaseTimeout:    500 * time.Millisecond,
		CommitTimeout:         5 * time.Millisecond,
		SnapshotThreshold:     8192,
		SnapshotInterval:      2 * time.Minute,
		TrailingLogs:          10240,
		MaxAppendEntries:      512,
		RaftWALSegmentBytes:   DefaultRaftWALSegmentBytes,
		RaftLogVerifyInterval: DefaultRaftLogVerifyInterval,
		RaftLogVerifyEntries:  DefaultRaftLogVerifyEntries,
		ApplyTimeout:          10 * time.Second,
		ClockTick:             DefaultClockTick,
		LocalAnswerMargin:     LocalAnswerMargin,
		RaftHandshakeTimeout:  DefaultRaftHandshakeTimeout,
		RaftIdleTimeout:       DefaultRaftIdleTimeout,
		RaftMaxPending:        DefaultRaftMaxPending,
		// cmd passes the test build's offset clock in; a library user gets the wall
		// clock.
		Now: time.Now,

		RaftMaxPendingPerSource: DefaultRaftMaxPendingPerSource,
	}
}

func (c *Config) withDefaults() {
	d := DefaultConfig()
	if c.RaftAdvertise == "" {
		c.RaftAdvertise = c.RaftAddr
	}
	setDur := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	setDur(&c.HeartbeatTimeout, d.HeartbeatTimeout)
	setDur(&c.ElectionTimeout, d.ElectionTimeout)
	setDur(&c.LeaderLeaseTimeout, d.LeaderLeaseTimeout)
	setDur(&c.CommitTimeout, d.CommitTimeout)
	setDur(&c.SnapshotInterval, d.SnapshotInterval)
	setDur(&c.ApplyTimeout, d.ApplyTimeout)
	setDur(&c.ClockTick, d.ClockTick)
	setDur(&c.LocalAnswerMargin, d.LocalAnswerMargin)
	setDur(&c.RaftLogVerifyInterval, DefaultRaftLogVerifyInterval)
	if c.RaftLogVerifyEntries <= 0 {
		c.RaftLogVerifyEntries = DefaultRaftLogVerifyEntries
	}
	setDur(&c.RaftHandshakeTimeout, d.RaftHandshakeTimeout)
	setDur(&c.RaftIdleTimeout, d.RaftIdleTimeout)
	if c.RaftMaxPending == 0 {
		c.RaftMaxPending = d.RaftMaxPending
	}
	if c.RaftMaxPendingPerSource == 0 {
		c.RaftMaxPendingPerSource = d.RaftMaxPendingPerSource
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = d.SnapshotThreshold
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = d.TrailingLogs
	}
	if c.MaxAppendEntries == 0 {
		c.MaxAppendEntries = d.MaxAppendEntries
	}
	if c.RaftWALSegmentBytes == 0 {
		c.RaftWALSegmentBytes = d.RaftWALSegmentBytes
	}
	if c.Now == nil {
		c.Now = d.Now
	}
	if c.Monotonic == nil {
		c.Monotonic = monotonic
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Metrics == nil {
		c.Metrics = metrics.New()
	}
	c.Limits = c.Limits.WithDefaults()
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	switch {
	case c.ID == "":
		return errors.New("node: an ID is required")
	case c.DataDir == "":
		return errors.New("node: a data dir is required")
	case c.RaftAddr == "":
		return errors.New("node: a raft address is required")
	case c.APIAddr == "":
		return errors.New("node: an API address is required")
	case c.LeaderLeaseTimeout > c.HeartbeatTimeout && c.HeartbeatTimeout != 0:
		return errors.New("node: the leader lease must not exceed the heartbeat timeout")
	case c.RaftMaxPending < 0 || c.RaftMaxPendingPerSource < 0 || c.RaftHandshakeTimeout < 0 || c.RaftIdleTimeout < 0:
		return errors.New("node: the raft listener's bounds must not be negative (zero means the default)")
	case c.ClockTick > 0 && c.ClockTick < time.Millisecond:
		// The leader looks every half tick: a tick of a nanosecond made a ticker of
		// zero, which panics.
		return fmt.Errorf("node: the clock tick must be at least 1ms (zero: the default, negative: never), not %s", c.ClockTick)
	}
	if err := c.Sweep.Validate(); err != nil {
		return err
	}
	if err := checkRaftLog(c.RaftLog, c.RaftWALSegmentBytes); err != nil {
		return err
	}
	return c.Limits.Validate()
}

// DefaultClockTick is Config.ClockTick's default: a tenth of LocalAnswerMargin. The
// leader looks every half tick, so in a quiet cluster a follower's offset is never
// older than a tick and a half (9 s), far inside the margin.
const DefaultClockTick = LocalAnswerMargin / 10

// raftShutdownTimeout bounds how long Close waits for Raft's goroutines.
const raftShutdownTimeout = 30 * time.Second

// Node is one member of an idemkv cluster.
type Node struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics.Metrics

	store     *storage.Store
	fsm       *fsm.FSM
	raft      *raft.Raft
	transport *heartbeatTransport
	// heldState: the node started with a Raft log, term or snapshot, or records
	// applied, of its own (HeldState).
	heldState bool
	// raftLog is the Raft log and stable store opened in the data dir, closed by the
	// node even when WrapRaftStores put others in front of it.
	raftLog raftLogStore
	// logs is Raft's log as Raft reads it: the cache over the verifier over the
	// (possibly wrapped) store.
	logs     *raft.LogCache
	verifier *verifier.LogStore
	// logCuts is where Raft cut the log's tail, and verifiedLog the store behind
	// the verifier, for its reports (verify.go).
	logCuts     tailCuts
	verifiedLog raft.LogStore

	clock *stampClock

	// readyTerm is the term in which this node, as leader, has applied a barrier: only
	// then is its commit index a safe read index.
	readyTerm atomic.Uint64

	leaderNotify <-chan bool
	leaderMu     sync.Mutex
	leaderCancel context.CancelFunc
	leaderWG     sync.WaitGroup

	sweeper *expiry.Sweeper
	peers   peerContacts

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

// Open starts a node: it opens (or creates) the data dir, restores the state machine
// if its snapshot is ahead of Pebble, starts Raft, and bootstraps if asked to and new.
func Open(cfg Config) (*Node, error) {
	cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := privateDataDir(cfg.DataDir, cfg.Logger.With("node", cfg.ID)); err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.ID), metrics: cfg.Metrics, clock: &stampClock{wall: cfg.Now, mono: cfg.Monotonic}}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	if err := n.open(); err != nil {
		n.cancel()
		n.closeResources()
		return nil, err
	}
	n.wg.Add(4)
	go n.watchLogChecksums()
	go n.watchLeadership()
	go n.watchHalt()
	go n.watchClock()
	return n, nil
}

// watchHalt stops Raft once the state machine halts (a failed restore, a storage error
// while applying). A replica that cannot apply must neither lead nor count entries as
// applied; Raft's log replays what it missed after a restart. The node stays open so
// that /readyz and the log say why.
func (n *Node) watchHalt() {
	defer n.wg.Done()
	select {
	case <-n.ctx.Done():
		return
	case <-n.fsm.Halted():
	}
	n.log.Error("state machine halted; stopping raft on this node, restart it once the store is healthy", "err", n.fsm.Err())
	n.stopLeaderWork()
	if err := n.raft.Shutdown().Error(); err != nil {
		n.log.Error("stopping raft after the halt", "err", err)
	}
}

func (n *Node) open() error {
	restored, err := checkRestoreDone(n.cfg.DataDir, n.cfg.Joining)
	if err != nil {
		return err
	}
	// First, so that a configuration that asks for the other backend changes nothing.
	backend, err := chooseRaftLog(n.cfg.DataDir, n.cfg.RaftLog)
	if err != nil {
		return err
	}
	if n.store, err = storage.OpenWith(filepath.Join(n.cfg.DataDir, "pebble"), n.log, storage.Options{CacheBytes: n.cfg.CacheBytes, FS: n.cfg.PebbleFS}); err != nil {
		return err
	}
	if n.fsm, err = fsm.New(n.store, n.metrics, n.log); err != nil {
		return err
	}
	if n.cfg.AsFormat != 0 {
		n.fsm.ReadFormat(n.cfg.AsFormat)
	}
	if c := n.fsm.Clock(); c != 0 {
		n.clock.prev = c.Time()
	}
	hlog := newHCLogger(n.log)
	if n.raftLog, err = openRaftLog(n.cfg.DataDir, backend, n.cfg.RaftWALSegmentBytes, hlog); err != nil {
		return err
	}
	n.raftLog = haltWhenSealed(n.raftLog, n.fsm.Halt)
	n.log.Info("raft log opened", "backend", backend)
	fileSnaps, err := openSnapshotStore(n.cfg.DataDir, hlog)
	if err != nil {
		return err
	}
	stores := RaftStores{Log: n.raftLog, Stable: n.raftLog, Snapshots: fileSnaps}
	if n.cfg.WrapRaftStores != nil {
		stores = n.cfg.WrapRaftStores(stores)
		stores.Log = keepMonotonic(n.raftLog, stores.Log)
	}
	if n.cfg.RaftLogVerifyInterval > 0 {
		n.verifier = n.verifyLog(stores.Log)
		stores.Log = n.verifier
	}
	if n.logs, err = raft.NewLogCache(1024, stores.Log); err != nil {
		return fmt.Errorf("node: raft log cache: %w", err)
	}
	logs, stable, snaps := n.logs, stores.Stable, stores.Snapshots
	if n.clock.liveAfter, err = logs.LastIndex(); err != nil {
		return fmt.Errorf("node: raft log: %w", err)
	}
	if err := n.restoreIfBehind(snaps); err != nil {
		return err
	}
	stream, err := newStreamLayer(n.cfg.ID, n.cfg.RaftAddr, n.cfg.RaftAdvertise, n.cfg.RaftTLS,
		listenPolicy{handshake: n.cfg.RaftHandshakeTimeout, idle: n.cfg.RaftIdleTimeout, maxPending: n.cfg.RaftMaxPending, perSource: n.cfg.RaftMaxPendingPerSource},
		n.log, n.metrics.RaftConnsClosed)
	if err != nil {
		return err
	}
	// MaxRPCsInFlight 1 turns pipelined replication off. With the default of 2 both
	// pipeline channels are unbuffered, and a follower's rejection (a higher term after
	// a leadership transfer, say) can leave the sender parked forever on one channel
	// and the decoder on the other: that follower gets heartbeats but never another
	// entry, and Raft.Shutdown hangs (seen here as a node that never stopped, and
	// reported against hashicorp/raft by others). Entries are still batched, so one
	// round trip per batch is all it costs on a LAN.
	tcfg := &raft.NetworkTransportConfig{Stream: stream, MaxPool: 5, Timeout: 10 * time.Second, Logger: hlog, MaxRPCsInFlight: 1}
	var peers *peerAddresses
	if len(n.cfg.PeerAddresses) > 0 {
		peers = &peerAddresses{overrides: n.cfg.PeerAddresses, self: raft.ServerID(n.cfg.ID), advertise: raft.ServerAddress(stream.Addr().String())}
		tcfg.ServerAddressProvider = peers
	}
	n.transport = &heartbeatTransport{NetworkTransport: raft.NewNetworkTransportWithConfig(tcfg), contacts: &n.peers}
	if restored {
		if err := checkRestoredFor(snaps, raft.ServerID(n.cfg.ID), n.transport.LocalAddr(), n.cfg.DataDir); err != nil {
			return err
		}
	}

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(n.cfg.ID)
	rc.Logger = hlog
	rc.HeartbeatTimeout = n.cfg.HeartbeatTimeout
	rc.ElectionTimeout = n.cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = n.cfg.LeaderLeaseTimeout
	rc.CommitTimeout = n.cfg.CommitTimeout
	rc.SnapshotThreshold = n.cfg.SnapshotThreshold
	rc.SnapshotInterval = n.cfg.SnapshotInterval
	rc.TrailingLogs = n.cfg.TrailingLogs
	rc.MaxAppendEntries = n.cfg.MaxAppendEntries
	rc.BatchApplyCh = true
	// Pebble keeps the applied state across restarts; replaying the log tail on top of
	// it is cheap, restoring the whole snapshot on every start is not. The FSM skips
	// entries at or below its stored applied index, and restoreIfBehind covers a Pebble
	// that is older than the newest snapshot.
	rc.NoSnapshotRestoreOnStart = true
	notify := make(chan bool, 16)
	rc.NotifyCh = notify
	n.leaderNotify = notify

	hasRaft, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		return fmt.Errorf("node: inspect raft state: %w", err)
	}
	applied, _, err := n.store.Applied()
	if err != nil {
		return fmt.Errorf("node: read the applied index: %w", err)
	}
	n.heldState = hasRaft || applied > 0
	if !hasRaft && !n.cfg.Bootstrap {
		// A new member, or one that lost its data dir: it votes once it has caught
		// up (votefence.go). One that bootstraps has its own log from the start.
		n.transport.fence = newVoteFence(rc.LocalID, n.transport.LocalAddr(), n.log)
	}
	// Raft appends through the watch, and the transport sends nothing while an append
	// is held past the limit (stall.go).
	watch := newAppendWatch(logs, n.appendStallLimit(), n.log)
	n.transport.appends = watch
	if n.raft, err = raft.NewRaft(rc, n.raftFSM(), watch, stable, snaps, n.transport); err != nil {
		return fmt.Errorf("node: start raft: %w", err)
	}
	if f := n.transport.fence; f != nil {
		f.raft.Store(n.raft)
	}
	stream.preferMembers(n.raft, n.cfg.PeerAddresses)
	if peers != nil {
		peers.raft.Store(n.raft)
	}
	if n.cfg.Bootstrap {
		if !hasRaft {
			if applied > 0 {
				// A store that applied entries of a log this node no longer has (its
				// Raft files were removed, or a restore was cut short before its
				// snapshot): a new cluster's first entries would be skipped as old.
				return fmt.Errorf("node: the store of %s has applied index %d but Raft has no log or snapshot: refusing to bootstrap a new cluster over it; empty the data dir and restore a backup, or join the node to its cluster", n.cfg.DataDir, applied)
			}
			conf := raft.Configuration{Servers: []raft.Server{{
				ID: rc.LocalID, Address: n.transport.LocalAddr(), Suffrage: raft.Voter,
			}}}
			if err := n.raft.BootstrapCluster(conf).Error(); err != nil {
				return fmt.Errorf("node: bootstrap: %w", err)
			}
			n.log.Info("bootstrapped a new single-node cluster", "raft_addr", n.transport.LocalAddr())
		}
	}
	n.sweeper = expiry.New(n.cfg.Sweep, n, n.metrics, n.log)
	if restored {
		if err := startedRestored(n.cfg.DataDir); err != nil {
			return fmt.Errorf("node: %w", err)
		}
	}
	return nil
}

// restoreIfBehind restores the newest snapshot into Pebble when Pebble's state is older
// than it. That happens when Pebble lost unsynced writes that the snapshot (whose log
// prefix is compacted away) covers, when the store was wiped, or when a snapshot
// install was interrupted. Raft itself will not restore, because of
// NoSnapshotRestoreOnStart.
//
// Raft labels a snapshot with the index of the last entry it dispatched, which may be
// a no-op or barrier that never reached the state machine; the state inside is that of
// the applied index stored in the stream. Comparing Pebble's applied index with that
// one decides, reading only the snapshot's header (the first pairs of a snapshot an
// older version wrote); entries between it and the label change no state, so the
// applied index then moves up to the label. (It used to read the log one index at a
// time between the two: a million lookups on a wiped store of a million entries; issue
// 12, defect 7.) A restore that a crash cut short leaves Pebble at its old state
// (storage.OpenWith puts the old store back), which this then finds behind.
func (n *Node) restoreIfBehind(snaps raft.SnapshotStore) error {
	list, err := snaps.List()
	if err != nil {
		return fmt.Errorf("node: list snapshots: %w", err)
	}
	applied := n.fsm.AppliedIndex()
	if len(list) == 0 || list[0].Index <= applied {
		return nil
	}
	meta := list[0]
	_, rc, err := snaps.Open(meta.ID)
	if err != nil {
		return fmt.Errorf("node: open snapshot %s: %w", meta.ID, err)
	}
	inside, _, err := storage.SnapshotApplied(rc)
	if cerr := rc.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("node: read snapshot %s: %w", meta.ID, err)
	}
	if inside > meta.Index {
		return fmt.Errorf("node: snapshot %s holds applied index %d past its label %d: %w", meta.ID, inside, meta.Index, storage.ErrCorrupt)
	}
	if inside == 0 || applied < inside {
		n.log.Warn("state machine is behind the newest snapshot; restoring it",
			"applied_index", applied, "snapshot_applied_index", inside, "snapshot_index", meta.Index)
		_, rc, err := snaps.Open(meta.ID)
		if err != nil {
			return fmt.Errorf("node: open snapshot %s: %w", meta.ID, err)
		}
		if err := n.fsm.Restore(rc); err != nil {
			return fmt.Errorf("node: restore snapshot %s: %w", meta.ID, err)
		}
	}
	return n.fsm.SkipTo(meta.Index, meta.Term)
}

// Close stops the node. A leader first hands leadership to another voter, so the
// cluster does not wait out an election timeout. Order: sweeper and leader loops →
// Raft → transport → Raft log → state machine → Pebble. The API server, which calls
// into the node, must be shut down by its owner before Close.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		if n.raft != nil {
			if err := n.TransferLeadership(); err != nil {
				n.log.Warn("leadership transfer before shutdown failed", "err", err)
			}
		}
		n.cancel()
		n.stopLeaderWork()
		if n.raft != nil {
			done := make(chan error, 1)
			go func() { done <- n.raft.Shutdown().Error() }()
			select {
			case err := <-done:
				if err != nil {
					n.closeErr = errors.Join(n.closeErr, fmt.Errorf("node: raft shutdown: %w", err))
				}
			case <-time.After(raftShutdownTimeout):
				// A Raft goroutine is stuck: closing the stores under it could corrupt
				// them, and waiting would keep the process from ever exiting. Leave them
				// to the process exit; the log and Pebble recover on the next start.
				n.closeErr = fmt.Errorf("node: raft did not shut down within %s; stores left open", raftShutdownTimeout)
				n.log.Error("raft shutdown is stuck; giving up on a clean close", "timeout", raftShutdownTimeout)
				return
			}
		}
		n.wg.Wait()
		n.closeErr = errors.Join(n.closeErr, n.closeResources())
	})
	return n.closeErr
}

func (n *Node) closeResources() error {
	var errs []error
	if n.transport != nil {
		n.transport.stopHeartbeats() // before the log store closes under a heartbeat
		errs = append(errs, n.transport.Close())
	}
	if n.verifier != nil {
		errs = append(errs, n.verifier.Close()) // stops its goroutine; the store is closed below
	}
	if n.raftLog != nil {
		errs = append(errs, n.raftLog.Close())
	}
	if n.fsm != nil {
		errs = append(errs, n.fsm.Close())
	}
	if n.store != nil {
		errs = append(errs, n.store.Close())
	}
	return errors.Join(errs...)
}

func (n *Node) voters() int {
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return 0
	}
	c := 0
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			c++
		}
	}
	return c
}

// RaftAdvertiseOrAddr is the Raft address peers dial.
func (c Config) RaftAdvertiseOrAddr() string {
	if c.RaftAdvertise != "" {
		return c.RaftAdvertise
	}
	return c.RaftAddr
}

// TransferLeadership hands leadership to another voter if this node leads a cluster
// of more than one voter; otherwise it does nothing.
func (n *Node) TransferLeadership() error {
	if n.raft.State() != raft.Leader || n.voters() < 2 {
		return nil
	}
	if err := n.raft.LeadershipTransfer().Error(); err != nil {
		return fmt.Errorf("node: leadership transfer: %w", err)
	}
	return nil
}
