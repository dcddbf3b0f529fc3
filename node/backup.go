package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
	"github.com/idemkv/idemkv/metrics"
	"github.com/idemkv/idemkv/storage"
)

// Backup streams a consistent copy of the whole state to w: a read barrier first makes
// every write acknowledged before the call part of it, then a point-in-time view of
// Pebble is written while the node keeps serving. Only the leader takes backups; any
// other node fails with idemkv.ErrNotLeader before writing anything.
//
// The stream is the state machine's snapshot format (storage/snapshot.go: the store's
// files, each with its checksum, and a checksummed trailer), so a cut or corrupt copy
// is detectable. Restore seeds a new cluster from it, and from the record streams of
// older versions too.
func (n *Node) Backup(ctx context.Context, w io.Writer) error {
	if err := n.readIndex(ctx); err != nil {
		return err
	}
	snap := n.store.NewSnapshot()
	defer snap.Close()
	written, err := snap.WriteTo(&stopWriter{w: w, ctx: ctx, node: n.ctx})
	if err != nil {
		return fmt.Errorf("node: backup after %d bytes: %w", written, err)
	}
	index, _ := snap.Applied()
	n.log.Info("backup taken", "bytes", written, "applied_index", index)
	return nil
}

// stopWriter fails once the caller gives up or the node shuts down, so that a backup
// in progress stops and removes its checkpoint rather than stream on past Close.
type stopWriter struct {
	w         io.Writer
	ctx, node context.Context
}

func (s *stopWriter) Write(p []byte) (int, error) {
	if err := s.node.Err(); err != nil {
		return 0, idemkv.Errorf(idemkv.ErrUnavailable, "node is shutting down")
	}
	if err := s.ctx.Err(); err != nil {
		return 0, fmt.Errorf("backup cancelled: %w", err)
	}
	return s.w.Write(p)
}

// RestoreInfo describes a restored data dir.
type RestoreInfo struct {
	// Index and Term are those of the last log entry the backup reflects.
	Index, Term uint64
	// ContinuesAt is the log index the restored node continues after (in a later term):
	// Index plus restoreIndexGap. Every fence it grants is above it.
	ContinuesAt uint64
	// Records counts the restored records.
	Records int
}

// restoreIndexGap is how far past the backup's index a restored cluster starts its log.
// Fences are log indexes, and the cluster the backup came from may have gone on after
// it: attempts of that lost timeline can hold fences up to its last index, which a
// restored log continuing at the backup's index would grant again, so a stale holder's
// commit would be accepted. No such cluster appends a million entries a second (new
// operations peak at a few thousand per second on a three-node cluster, one or two log
// entries each; bench/README.md), so the gap is a million per second since the
// backup's state machine clock (its last stamped write),
// plus 2^32 for clocks that disagree. Fences stay below 2^53, where JavaScript numbers
// stop being exact, until the restored backups' ages add up to 2^53/10^6 s (285 years).
func restoreIndexGap(sinceBackup time.Duration) uint64 {
	const perSecond, floor = 1_000_000, 1 << 32
	const maxGap = 1 << 52
	secs := max(sinceBackup, 0).Seconds()
	if secs*perSecond >= maxGap-floor {
		return maxGap
	}
	return floor + uint64(secs*perSecond)
}

// keyCurrentTerm is where Raft keeps its current term in the stable store.
// Raft does not export the name; TestBackupWhileWritingThenRestoreLosesNothing fails if it changes.
var keyCurrentTerm = []byte("CurrentTerm")

// Restore seeds cfg.DataDir, which must be empty or absent, from a backup stream so
// that a node opened on it (same ID and Raft address) starts as a single-node cluster
// that continues where the backup ends; other nodes then join it.
//
// Fences are Raft indexes and must keep growing across the restore, past any fence the
// backed-up cluster may have granted after the backup, and the state machine skips
// entries at or below its applied index. So Restore writes, next to Pebble, a Raft
// snapshot at the backup's applied index plus restoreIndexGap, in the backup's term,
// whose configuration is this node alone, and stores that term as Raft's current term:
// the node's first election then happens in a later term and its first entry gets the
// index after the gap. This is what Consul's peers.json recovery does for a cluster
// that lost its quorum.
//
// On failure nothing is left in the data dir.
func Restore(cfg Config, r io.Reader) (info *RestoreInfo, err error) {
	cfg.withDefaults()
	switch {
	case cfg.ID == "":
		return nil, errors.New("node: restore: an ID is required")
	case cfg.DataDir == "":
		return nil, errors.New("node: restore: a data dir is required")
	}
	if err := checkRaftLog(cfg.RaftLog, cfg.RaftWALSegmentBytes); err != nil {
		return nil, err
	}
	advertise, err := restoreAddress(cfg.RaftAdvertiseOrAddr())
	if err != nil {
		return nil, err
	}
	// Refused before the dir is made private (which tightens everything under it): a
	// restore pointed at the wrong directory changes nothing in it.
	switch entries, err := os.ReadDir(cfg.DataDir); {
	case err == nil && len(entries) > 0:
		return nil, fmt.Errorf("node: restore: data dir %s is not empty; restore only into a new one", cfg.DataDir)
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("node: restore: %w", err)
	}
	if err := privateDataDir(cfg.DataDir, cfg.Logger.With("node", cfg.ID)); err != nil {
		return nil, fmt.Errorf("node: restore: %w", err)
	}
	// First in, last out: a restore that is killed leaves it, and a node refuses to
	// start on the data dir (checkRestoreDone), which would otherwise serve a part of
	// the backup, or nothing, as if it were the cluster's state.
	if err := writeFileSynced(cfg.DataDir, restoreMarker, []byte("a restore into this data dir started and has not finished\n")); err != nil {
		return nil, fmt.Errorf("node: restore: %w", err)
	}
	defer func() {
		if err == nil {
			// Restored, for the first start to see (checkRestoreDone); then no longer
			// unfinished.
			if err = writeFileSynced(cfg.DataDir, restoredMarker, []byte("restored from a backup: start without --join, as a new cluster's first node\n")); err == nil {
				if err = os.Remove(filepath.Join(cfg.DataDir, restoreMarker)); err == nil {
					err = syncPath(cfg.DataDir)
				}
			}
			if err != nil {
				info, err = nil, fmt.Errorf("node: restore: finishing: %w", err)
			}
			return
		}
		for _, name := range []string{"pebble", "pebble.restore-new", boltLogFile, walLogDir, snapshotsDir, raftLogMarker, restoredMarker, restoreMarker} {
			if rmErr := os.RemoveAll(filepath.Join(cfg.DataDir, name)); rmErr != nil {
				err = errors.Join(err, rmErr)
			}
		}
	}()
	backend, err := chooseRaftLog(cfg.DataDir, cfg.RaftLog)
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger.With("node", cfg.ID)
	st, err := storage.OpenWith(filepath.Join(cfg.DataDir, "pebble"), logger, storage.Options{CacheBytes: cfg.CacheBytes})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, st.Close()) }()
	f, err := fsm.New(st, metrics.New(), logger)
	if err != nil {
		return nil, err
	}
	if err := f.Restore(io.NopCloser(r)); err != nil {
		return nil, fmt.Errorf("node: restore: %w", err)
	}
	index, term, err := st.Applied()
	if err != nil {
		return nil, fmt.Errorf("node: restore: %w", err)
	}
	if index == 0 || term == 0 {
		return nil, fmt.Errorf("node: restore: the backup names no applied index: %w", storage.ErrCorrupt)
	}
	clock, err := st.Clock()
	if err != nil {
		return nil, fmt.Errorf("node: restore: %w", err)
	}
	// The wall clock, not the state machine's: how long the old cluster may have run on.
	continuesAt := index + restoreIndexGap(time.Since(clock.Time()))
	// No entry between changes the state: the restored store is the state at index.
	if err := f.SkipTo(continuesAt, term); err != nil {
		return nil, fmt.Errorf("node: restore: %w", err)
	}
	if err := writeRestoreSnapshot(cfg, logger, f, advertise, continuesAt, term); err != nil {
		return nil, err
	}
	if err := setCurrentTerm(cfg, backend, newHCLogger(logger), term); err != nil {
		return nil, err
	}
	records := int(st.RecordCount())
	logger.Info("restored a backup", "index", index, "term", term, "continues_at", continuesAt, "records", records, "raft_addr", advertise, "raft_log", backend)
	return &RestoreInfo{Index: index, Term: term, ContinuesAt: continuesAt, Records: records}, nil
}

// restoreMarker names the file a restore keeps in the data dir while it runs;
// restoredMarker the one it leaves for the node's first start.
const (
	restoreMarker  = "RESTORE-UNFINISHED"
	restoredMarker = "RESTORED"
)

// checkRestoreDone refuses a data dir a restore did not finish in, and a restored one
// that a node would join to a cluster: a restored node is a new cluster's first (its
// Raft log continues past the backup's index, and a cluster it joined would send it
// entries it skips as old). It reports whether the data dir was restored and has not
// been started since.
func checkRestoreDone(dataDir string, joining bool) (restored bool, err error) {
	switch _, err := os.Stat(filepath.Join(dataDir, restoreMarker)); {
	case err == nil:
		return false, fmt.Errorf("node: a restore into %s started and did not finish (it was stopped or killed), so the data dir holds part of a backup: empty it and run idemkv restore again", dataDir)
	case !errors.Is(err, os.ErrNotExist):
		return false, fmt.Errorf("node: %w", err)
	}
	switch _, err := os.Stat(filepath.Join(dataDir, restoredMarker)); {
	case err == nil && joining:
		return true, fmt.Errorf("node: %s holds a restored backup, which starts a new cluster: start this node without --join, then join the other nodes to it", dataDir)
	case err == nil:
		return true, nil
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	default:
		return false, fmt.Errorf("node: %w", err)
	}
}

// checkRestoredFor refuses to start a restored data dir as any node but the one it
// was restored for: the configuration in its Raft snapshot (writeRestoreSnapshot)
// names that node's ID and Raft address, and the data dir has no other. Another ID
// is not a voter there: it never elects itself, and the new cluster never has a
// leader. Another address (a --raft-addr or --advertise-raft-addr written otherwise:
// both are advertised as given, a host name staying a name, so a name and its IP
// differ) elects itself, but its registration names the address it advertises, and the
// nodes that join find no API address for the leader the configuration names: every
// request through them is unavailable.
func checkRestoredFor(snaps raft.SnapshotStore, id raft.ServerID, addr raft.ServerAddress, dataDir string) error {
	list, err := snaps.List()
	if err != nil {
		return fmt.Errorf("node: list snapshots: %w", err)
	}
	if len(list) == 0 {
		// Its Raft state is gone: open refuses to bootstrap over the store, and says so.
		return nil
	}
	servers := list[0].Configuration.Servers
	if len(servers) == 1 && servers[0].ID == id && servers[0].Address == addr {
		return nil
	}
	var names []string
	for _, s := range servers {
		names = append(names, fmt.Sprintf("%s at %s", s.ID, s.Address))
	}
	return fmt.Errorf("node: %s was restored for node %s, and this is node %s at %s: start it with the --id and Raft address "+
		"given to idemkv restore, written the same way (a host name is not its IP), or empty it and restore again "+
		"with this node's", dataDir, strings.Join(names, ", "), id, addr)
}

// startedRestored notes that a restored data dir's node started as its cluster's
// first: from now on it restarts as any node does, --join included.
func startedRestored(dataDir string) error {
	if err := os.Remove(filepath.Join(dataDir, restoredMarker)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return syncPath(dataDir)
}

// restoreAddress is the Raft address as the transport will advertise it, so the
// configuration in the snapshot names the node the way its peers will see it: as given,
// a name staying a name.
func restoreAddress(addr string) (raft.ServerAddress, error) {
	a, err := advertisedAddr(addr)
	if err != nil {
		return "", fmt.Errorf("node: restore: %w", err)
	}
	return raft.ServerAddress(a.String()), nil
}

func writeRestoreSnapshot(cfg Config, logger *slog.Logger, f *fsm.FSM, addr raft.ServerAddress, index, term uint64) error {
	snaps, err := openSnapshotStore(cfg.DataDir, newHCLogger(logger))
	if err != nil {
		return fmt.Errorf("node: restore: %w", err)
	}
	// The snapshot store only asks the transport to encode peer addresses for old
	// snapshot versions; an in-memory one does that the same way as the network one.
	_, trans := raft.NewInmemTransport(addr)
	defer trans.Close()
	conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: raft.ServerID(cfg.ID), Address: addr}}}
	sink, err := snaps.Create(raft.SnapshotVersionMax, index, term, conf, index, trans)
	if err != nil {
		return fmt.Errorf("node: restore: create snapshot: %w", err)
	}
	snap, err := f.Snapshot()
	if err != nil {
		return errors.Join(fmt.Errorf("node: restore: %w", err), sink.Cancel())
	}
	defer snap.Release()
	// Persist closes or cancels the sink.
	if err := snap.Persist(sink); err != nil {
		return fmt.Errorf("node: restore: %w", err)
	}
	return nil
}

func setCurrentTerm(cfg Config, backend string, hlog hclog.Logger, term uint64) error {
	s, err := openRaftLog(cfg.DataDir, backend, cfg.RaftWALSegmentBytes, hlog)
	if err != nil {
		return fmt.Errorf("node: restore: %w", err)
	}
	if err := s.SetUint64(keyCurrentTerm, term); err != nil {
		return errors.Join(fmt.Errorf("node: restore: set term: %w", err), s.Close())
	}
	return s.Close()
}
