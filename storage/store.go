// Package storage keeps idemkv's replicated state in Pebble: records, their expiry
// index, node metadata and the state machine's bookkeeping (applied index, clock).
//
// It only stores and retrieves; it never decides. Every rule about what a record may
// become lives in package fsm. Writes go through a Batch, which keeps a record and its
// expiry index entry in step, so that no caller can update one without the other.
//
// A fatal error from Pebble fails the store for good, whichever goroutine met it
// (fatal.go): every later operation refuses with ErrFailed, and the hooks of OnFailure
// (the state machine's halt) hear of it at once.
package storage

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/idemkv/idemkv"
)

// Store is an open Pebble database holding idemkv state. Reads are safe from any
// goroutine; writes go through one Batch at a time (the state machine's), and so does
// Restore, which replaces the database under the readers.
type Store struct {
	dir    string
	opts   Options // defaults filled
	logger *slog.Logger
	recent *recentRecords
	rules  ruleCache
	// filter is the record key filter in service (keyfilter.go), nil while none is;
	// nextFilter the one being built. filterScans counts the goroutines building one.
	filter      atomic.Pointer[keyFilter]
	nextFilter  atomic.Pointer[keyFilter]
	filterScans sync.WaitGroup
	// records is the number of stored records, as m/records holds it.
	records atomic.Int64
	// tombs is the number of stored tombstones, counted at open and kept in step by
	// the batches: while it is 0, a reserve of a new key needs no tombstone look-up.
	tombs atomic.Int64

	// mu guards db: readers hold it shared while they use db, a restore exclusively
	// while it swaps the directory under it. db is nil once closed, or when a restore
	// failed after closing the old database and could not open either (the state
	// machine halts then, and a restart recovers; see recoverSwap).
	mu sync.RWMutex
	db *pebble.DB
	// closed is set by Close: a restore then opens nothing again.
	closed bool

	// commitMu orders batch commits against snapshots: a snapshot's Pebble view and
	// the start of its write tracking fall between two commits. It guards captures,
	// the snapshots still tracking the keys that commits write.
	commitMu sync.Mutex
	captures map[*Snapshot]struct{}
	// captureSeq names the checkpoint directories of snapshots.
	captureSeq atomic.Uint64

	// failure is Pebble's fatal error, once it reported one (fatal.go).
	failure failure
}

// errClosed answers reads of a store that has no open database.
var errClosed = fmt.Errorf("%w: storage: the store is closed", idemkv.ErrInternal)

// open returns the database with mu held shared; the caller must RUnlock. A failed
// store opens nothing.
func (s *Store) open() (*pebble.DB, error) {
	if err := s.Failure(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	if s.db == nil {
		s.mu.RUnlock()
		return nil, errClosed
	}
	return s.db, nil
}

// Log attribute keys.
const (
	logKeyDir   = "dir"
	logKeyKeys  = "keys"
	logKeyBytes = "bytes"
	logKeyErr   = "err"
)

// DefaultCacheBytes is the block cache of a store opened without Options.CacheBytes.
// A reserve of a new key looks the key up in every level of the tree, through its
// filter and index blocks; a store of millions of records has more of those than the
// 32 MiB this used to be. The cache fills only as blocks are read, so a small store
// never uses it all. (Measured: reserve p99 at 10 million records against 10 thousand,
// +24% with 32 MiB in one run, +5% and +24% with 256 MiB in two: within this
// machine's run-to-run noise; see bench/README.md.)
const DefaultCacheBytes = 256 << 20

// Options tunes a store.
type Options struct {
	// CacheBytes sizes the block cache (default DefaultCacheBytes).
	CacheBytes int64
	// FS is the filesystem Pebble works through (default the OS's, whose files and
	// directories the store makes PrivateFileMode and PrivateDirMode). Fault tests put
	// an error-injecting or crash-simulating one here (Pebble's vfs is the seam).
	FS vfs.FS
}

// Open opens (creating if needed) the database in dir with default options.
func Open(dir string, logger *slog.Logger) (*Store, error) {
	return OpenWith(dir, logger, Options{})
}

// OpenWith opens (creating if needed) the database in dir. A restore that crashed
// between the two renames of its swap is undone first (recoverSwap).
func OpenWith(dir string, logger *slog.Logger, o Options) (*Store, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("component", "storage")
	if o.CacheBytes <= 0 {
		o.CacheBytes = DefaultCacheBytes
	}
	if o.FS == nil {
		o.FS = vfs.Default
	}
	o.FS = newPrivateFS(o.FS)
	s := &Store{dir: filepath.Clean(dir), opts: o, logger: logger, recent: newRecentRecords(recentCapacity),
		captures: make(map[*Snapshot]struct{})}
	if err := s.recoverSwap(); err != nil {
		return nil, err
	}
	db, err := s.openDB(s.dir, openLive)
	if err != nil {
		return nil, err
	}
	logger.Debug("opened", logKeyDir, s.dir)
	s.db = db
	// Only now that Pebble's lock is ours: another process may still use the dir.
	s.removeLeftovers()
	if err := s.loadRecordCount(); err != nil {
		return nil, errors.Join(err, db.Close())
	}
	s.buildFilter(db)
	return s, nil
}

// RecordCount is the number of stored records, expired but not yet swept ones
// included. It costs nothing: batches keep it in step with the records they write.
func (s *Store) RecordCount() int64 { return s.records.Load() }

// loadRecordCount sets the record and tombstone counts from the database (s.db, not
// yet shared or held exclusively).
func (s *Store) loadRecordCount() error {
	n, err := ensureRecordCount(s.db, s.logger)
	if err != nil {
		return err
	}
	tombs, err := countKeys(s.db, prefixTomb)
	if err != nil {
		return err
	}
	s.records.Store(n)
	s.tombs.Store(tombs)
	return nil
}

// ensureRecordCount reads the stored record count, or counts the records once and
// stores the count when there is none (a store written before it was kept, or a
// snapshot stream from one).
func ensureRecordCount(db *pebble.DB, logger *slog.Logger) (int64, error) {
	v, err := getValue(db, keyRecords)
	if err != nil {
		return 0, err
	}
	if len(v) == 8 {
		return int64(binary.BigEndian.Uint64(v)), nil
	}
	if v != nil {
		return 0, fmt.Errorf("%w: record count of %d bytes", ErrCorrupt, len(v))
	}
	n, err := countKeys(db, prefixRecord)
	if err != nil {
		return 0, err
	}
	if err := guard(func() error {
		return db.Set(keyRecords, binary.BigEndian.AppendUint64(nil, uint64(n)), pebble.Sync)
	}); err != nil {
		return 0, fmt.Errorf("storage: store the record count: %w", err)
	}
	logger.Info("counted the stored records", logKeyKeys, n)
	return n, nil
}

// countKeys counts the keys under prefix.
func countKeys(r pebble.Reader, prefix string) (int64, error) {
	it, err := r.NewIter(prefixIter(prefix))
	if err != nil {
		return 0, fmt.Errorf("storage: count %s: %w", prefix, err)
	}
	var n int64
	for it.First(); it.Valid(); it.Next() {
		n++
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return 0, fmt.Errorf("storage: count %s: %w", prefix, err)
	}
	return n, nil
}

// Close closes the database. Writes committed without sync that were not made durable
// by Sync may be lost by a crash, never by Close. Snapshots not yet written fail.
func (s *Store) Close() error {
	err := s.closeDB()
	// The scan of a record key filter ends at its next chunk: its database is gone.
	s.filterScans.Wait()
	return err
}

func (s *Store) closeDB() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.db == nil {
		return nil
	}
	s.dropCaptures()
	// A failed database may meet its fatal error again on the way out; that error only
	// repeats the failure, which the store has reported already (Failure, the hooks).
	err := guard(s.db.Close)
	s.db = nil
	if err != nil && s.Failure() != nil {
		s.logger.Warn("closing the failed store", logKeyErr, err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("storage: close: %w", err)
	}
	return nil
}

// Sync makes every write committed so far durable. The state machine commits with
// NoSync because Raft's log is the durable copy; before a snapshot lets Raft truncate
// that log, the state it covers must be on disk.
func (s *Store) Sync() error {
	db, err := s.open()
	if err != nil {
		return err
	}
	defer s.mu.RUnlock()
	if err := guard(func() error { return db.LogData(nil, pebble.Sync) }); err != nil {
		return fmt.Errorf("storage: sync: %w", err)
	}
	return nil
}

// Record returns the stored record of (tenant, key), or nil if there is none. Expiry
// is not applied here: deciding what an expired record means is the caller's business.
func (s *Store) Record(tenant, key string) (*idemkv.Record, error) {
	return s.record(tenant, key, true)
}

// RecordWithoutHistory is Record without the record's history (nil, and
// HistoryDropped 0), for the readers that answer without it: a reserve's answers
// never carry it, and decoding its events was most of a replay's decoding.
func (s *Store) RecordWithoutHistory(tenant, key string) (*idemkv.Record, error) {
	return s.record(tenant, key, false)
}

func (s *Store) record(tenant, key string, history bool) (*idemkv.Record, error) {
	if err := s.Failure(); err != nil {
		return nil, err
	}
	k := recordKey(tenant, key)
	v, ok := s.recent.get(k)
	if !ok {
		gen := s.recent.generation()
		db, err := s.open()
		if err != nil {
			return nil, err
		}
		if s.mayHoldRecord(k) {
			v, err = getValue(db, k)
		}
		s.mu.RUnlock()
		if err != nil {
			return nil, err
		}
		s.recent.fill(string(k), v, gen)
	}
	if v == nil {
		return nil, nil
	}
	return decodeRecordKeeping(tenant, key, v, history)
}

// ScanRecords calls fn for the records of tenant whose key starts with prefix and is
// greater than after, in key order, until fn returns false or an error.
func (s *Store) ScanRecords(tenant, prefix, after string, fn func(*idemkv.Record) (bool, error)) error {
	lower := recordKey(tenant, prefix)
	if after != "" {
		// Keys hold no 0x00, so after+"\x00" is the first key greater than after.
		if k := recordKey(tenant, after+"\x00"); bytes.Compare(k, lower) > 0 {
			lower = k
		}
	}
	db, err := s.open()
	if err != nil {
		return err
	}
	// fn runs with the store held shared: it must not call back into the store.
	defer s.mu.RUnlock()
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: prefixEnd(recordKey(tenant, prefix))})
	if err != nil {
		return fmt.Errorf("storage: scan: %w", err)
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		t, k, err := parseRecordKey(it.Key())
		if err != nil {
			return err
		}
		rec, err := decodeRecord(t, k, it.Value())
		if err != nil {
			return err
		}
		more, err := fn(rec)
		if err != nil || !more {
			return err
		}
	}
	return it.Error()
}

// Applied returns the last log index (and its term) whose effects are stored.
func (s *Store) Applied() (index, term uint64, err error) {
	db, err := s.open()
	if err != nil {
		return 0, 0, err
	}
	defer s.mu.RUnlock()
	return readApplied(db)
}

func readApplied(r pebble.Reader) (index, term uint64, err error) {
	v, err := getValue(r, keyApplied)
	if err != nil || v == nil {
		return 0, 0, err
	}
	if len(v) != 16 {
		return 0, 0, fmt.Errorf("%w: applied index is %d bytes", ErrCorrupt, len(v))
	}
	return binary.BigEndian.Uint64(v), binary.BigEndian.Uint64(v[8:]), nil
}

// Clock returns the stored state machine clock.
func (s *Store) Clock() (idemkv.Timestamp, error) {
	db, err := s.open()
	if err != nil {
		return 0, err
	}
	defer s.mu.RUnlock()
	v, err := getValue(db, keyClock)
	if err != nil || v == nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: clock is %d bytes", ErrCorrupt, len(v))
	}
	return idemkv.Timestamp(binary.BigEndian.Uint64(v)), nil
}

// Nodes returns the replicated node metadata, sorted by id.
func (s *Store) Nodes() ([]idemkv.NodeInfo, error) {
	db, err := s.open()
	if err != nil {
		return nil, err
	}
	defer s.mu.RUnlock()
	it, err := db.NewIter(prefixIter(prefixNode))
	if err != nil {
		return nil, fmt.Errorf("storage: nodes: %w", err)
	}
	defer it.Close()
	var nodes []idemkv.NodeInfo
	for it.First(); it.Valid(); it.Next() {
		n, err := decodeNode(string(it.Key()[len(prefixNode):]), it.Value())
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
	}
	return nodes, it.Error()
}

// ExpiryEntry is one entry of the expiry index.
type ExpiryEntry struct {
	ExpiresAt idemkv.Timestamp
	Tenant    string
	Key       string
}

// Overdue counts the entries of both expiry indexes (records, then tombstones) at or
// before now, stopping at limit, and returns the earliest expiry among them (0 if
// none): the sweeper's work. Its cost is O(min(overdue, limit)), never a scan of all
// records.
func (s *Store) Overdue(now idemkv.Timestamp, limit int) (count int, oldest idemkv.Timestamp, err error) {
	db, err := s.open()
	if err != nil {
		return 0, 0, err
	}
	defer s.mu.RUnlock()
	for _, x := range []expiryIndex{recordExpiry, tombExpiry} {
		first := true
		err = x.scan(db, now, limit-count, func(e ExpiryEntry) {
			if first && (oldest == 0 || e.ExpiresAt < oldest) {
				oldest = e.ExpiresAt
			}
			first = false
			count++
		})
		if err != nil {
			return count, oldest, err
		}
	}
	return count, oldest, nil
}

// Hash digests every record, node entry, approval rule and tombstone, in key order,
// and the cluster format once one is set. Bookkeeping (applied index, clock), the
// derived expiry indexes and the formats nodes advertised are left out, so replicas
// that applied the same commands hash equal whatever their snapshot history, and a
// node of the release before formats, which skips the advertisements, hashes equal to
// the others while the cluster format is unset.
func (s *Store) Hash() ([32]byte, error) {
	db, err := s.open()
	if err != nil {
		return [32]byte{}, err
	}
	defer s.mu.RUnlock()
	h := sha256.New()
	var lenBuf [binary.MaxVarintLen64]byte
	for _, p := range []string{prefixNode, prefixRecord, prefixRule, prefixTomb} {
		it, err := db.NewIter(prefixIter(p))
		if err != nil {
			return [32]byte{}, fmt.Errorf("storage: hash: %w", err)
		}
		for it.First(); it.Valid(); it.Next() {
			for _, b := range [][]byte{it.Key(), it.Value()} {
				h.Write(lenBuf[:binary.PutUvarint(lenBuf[:], uint64(len(b)))])
				h.Write(b)
			}
		}
		if err := errors.Join(it.Error(), it.Close()); err != nil {
			return [32]byte{}, fmt.Errorf("storage: hash: %w", err)
		}
	}
	v, err := getValue(db, keyFormat)
	if err != nil {
		return [32]byte{}, fmt.Errorf("storage: hash: %w", err)
	}
	if v != nil {
		for _, b := range [][]byte{keyFormat, v} {
			h.Write(lenBuf[:binary.PutUvarint(lenBuf[:], uint64(len(b)))])
			h.Write(b)
		}
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum, nil
}

// CheckExpiryIndex verifies that the expiry index holds exactly one entry per record,
// at the record's expires_at, and that the in-doubt index names exactly the pending
// records marked in doubt. Tests of every layer use it to prove the index is kept
// in step with the records through batches, sweeps, snapshots and restores.
func (s *Store) CheckExpiryIndex() error {
	db, err := s.open()
	if err != nil {
		return err
	}
	defer s.mu.RUnlock()
	snap := db.NewSnapshot()
	defer snap.Close()
	records := 0
	it, err := snap.NewIter(prefixIter(prefixRecord))
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		records++
		t, k, err := parseRecordKey(it.Key())
		if err != nil {
			it.Close()
			return err
		}
		at, err := storedExpiry(it.Value())
		if err != nil {
			it.Close()
			return err
		}
		v, err := getValue(snap, expiryKey(at, t, k))
		if err != nil {
			it.Close()
			return err
		}
		if v == nil {
			it.Close()
			return fmt.Errorf("%w: record %q/%q expiring at %s has no index entry", ErrCorrupt, t, k, at)
		}
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return err
	}
	if v, err := getValue(snap, keyRecords); err != nil {
		return err
	} else if len(v) != 8 || binary.BigEndian.Uint64(v) != uint64(records) {
		return fmt.Errorf("%w: %d records stored, the stored record count is %x", ErrCorrupt, records, v)
	}
	entries, err := checkIndexEntries(snap, prefixExpiry, "index entry", "record", func(tenant, key string) (idemkv.Timestamp, bool, error) {
		rec, err := getRecord(snap, tenant, key)
		if err != nil || rec == nil {
			return 0, false, err
		}
		return rec.ExpiresAt, true, nil
	})
	if err != nil {
		return err
	}
	if records != entries {
		return fmt.Errorf("%w: %d records but %d expiry entries", ErrCorrupt, records, entries)
	}
	if err := errors.Join(checkDoubtIndex(snap), checkWaitIndex(snap), checkTombIndex(snap)); err != nil {
		return err
	}
	// Scans start after the swept mark: an entry at or before it would never be swept.
	bound, err := sweptBound(snap)
	if err != nil {
		return err
	}
	below, err := snap.NewIter(&pebble.IterOptions{LowerBound: []byte(prefixExpiry), UpperBound: bound})
	if err != nil {
		return err
	}
	defer below.Close()
	if below.First() {
		e, _ := parseExpiryKey(below.Key())
		return fmt.Errorf("%w: index entry %q/%q at %s lies before the swept mark", ErrCorrupt, e.Tenant, e.Key, e.ExpiresAt)
	}
	return below.Error()
}

// Batch is an atomic group of writes whose reads see its own earlier writes, so that
// later log entries of one Raft batch observe earlier ones.
type Batch struct {
	b   *pebble.Batch
	s   *Store
	buf []byte
	// expiry remembers, per record key read or written through this batch, where its
	// index entry is, so that updating a record just read costs no second lookup.
	expiry map[string]knownExpiry
	// writes holds the value of every record this batch put (nil: deleted), for
	// reads later in the batch and, once committed, for the store's recent records.
	writes map[string][]byte
	// ruleWrites holds the approval rules this batch put (nil: deleted), for reads
	// later in the batch and, once committed, for the store's rule cache.
	ruleWrites map[string][]byte
	// absent holds the record keys this batch found missing in the store and has not
	// written since: a new record is read by the decision, then by the in-doubt and
	// approval-wait indexes as it is put, and each of those was a walk down Pebble's
	// memtables that ends in a miss. Nothing but this batch writes the store while it
	// is open, and its own writes are in writes, which is read first.
	absent map[string]struct{}
	// added is how many records this batch created less how many it deleted;
	// tombsAdded the same of tombstones.
	added, tombsAdded int64
}

type knownExpiry struct {
	at      idemkv.Timestamp
	present bool
}

// NewBatch starts a batch. Exactly one of Commit or Close must follow (Close after
// Commit is allowed).
//
// Batches and Restore both belong to the state machine's goroutine: a restore never
// swaps the database under an open batch, and the state machine, halted by a restore
// that left the store closed, opens none.
func (s *Store) NewBatch() *Batch {
	s.mu.RLock()
	db := s.db
	s.mu.RUnlock()
	if db == nil {
		panic("storage: a batch on a closed store")
	}
	return &Batch{b: db.NewIndexedBatch(), s: s, expiry: make(map[string]knownExpiry), writes: make(map[string][]byte)}
}

// Record returns the record of (tenant, key) as the batch sees it, or nil.
func (b *Batch) Record(tenant, key string) (*idemkv.Record, error) {
	k := recordKey(tenant, key)
	v, err := b.value(k)
	if err != nil {
		return nil, err
	}
	if v == nil {
		b.expiry[string(k)] = knownExpiry{}
		return nil, nil
	}
	rec, err := decodeRecord(tenant, key, v)
	if err != nil {
		return nil, err
	}
	b.expiry[string(k)] = knownExpiry{at: rec.ExpiresAt, present: true}
	return rec, nil
}

// value returns the stored value of record key k as this batch sees it, or nil: its
// own write first, then the store's recent records, then Pebble. What it reads from
// Pebble is the committed value, present or absent (the state machine is the only
// writer), so it becomes a recent record at once.
func (b *Batch) value(k []byte) ([]byte, error) {
	if v, ok := b.writes[string(k)]; ok {
		return v, nil
	}
	if _, ok := b.absent[string(k)]; ok {
		return nil, nil
	}
	if v, ok := b.s.recent.get(k); ok {
		return v, nil
	}
	// The batch's own writes were read above; what it has not written is in the store
	// only if the filter may hold it.
	var v []byte
	if b.s.mayHoldRecord(k) {
		var err error
		if v, err = getValue(b.b, k); err != nil {
			return nil, err
		}
	}
	b.s.recent.put(string(k), v)
	if v == nil {
		if b.absent == nil {
			b.absent = make(map[string]struct{})
		}
		b.absent[string(k)] = struct{}{}
	}
	return v, nil
}

// storedExpiry returns where the index entry of record key k is, if it has one.
func (b *Batch) storedExpiry(k []byte) (knownExpiry, error) {
	if e, ok := b.expiry[string(k)]; ok {
		return e, nil
	}
	v, err := b.value(k)
	if err != nil || v == nil {
		return knownExpiry{}, err
	}
	at, err := storedExpiry(v)
	return knownExpiry{at: at, present: true}, err
}

// PutRecord stores rec and moves its expiry index entry along with it.
func (b *Batch) PutRecord(rec *idemkv.Record) error {
	k := recordKey(rec.Tenant, rec.Key)
	if err := errors.Join(b.keepDoubtIndex(k, rec.Tenant, rec.Key, rec), b.keepWaitIndex(k, rec.Tenant, rec.Key, rec)); err != nil {
		return err
	}
	old, err := b.storedExpiry(k)
	if err != nil {
		return err
	}
	if old.present && old.at != rec.ExpiresAt {
		if err := b.b.Delete(expiryKey(old.at, rec.Tenant, rec.Key), nil); err != nil {
			return err
		}
	}
	b.buf, err = encodeRecord(b.buf[:0], rec)
	if err != nil {
		return err
	}
	// Before the commit, so that no reader finds the record in Pebble and not here.
	b.s.filterPut(k, !old.present)
	if err := b.b.Set(k, b.buf, nil); err != nil {
		return err
	}
	b.writes[string(k)] = slices.Clone(b.buf)
	if !old.present || old.at != rec.ExpiresAt {
		if err := b.b.Set(expiryKey(rec.ExpiresAt, rec.Tenant, rec.Key), nil, nil); err != nil {
			return err
		}
	}
	if !old.present {
		b.added++
	}
	b.expiry[string(k)] = knownExpiry{at: rec.ExpiresAt, present: true}
	return nil
}

// DeleteRecord removes the record of (tenant, key) and its expiry index entry. It
// reports whether there was a record.
func (b *Batch) DeleteRecord(tenant, key string) (bool, error) {
	k := recordKey(tenant, key)
	if err := errors.Join(b.keepDoubtIndex(k, tenant, key, nil), b.keepWaitIndex(k, tenant, key, nil)); err != nil {
		return false, err
	}
	old, err := b.storedExpiry(k)
	if err != nil || !old.present {
		return false, err
	}
	if err := b.b.Delete(expiryKey(old.at, tenant, key), nil); err != nil {
		return false, err
	}
	b.expiry[string(k)] = knownExpiry{}
	b.writes[string(k)] = nil
	b.added--
	return true, b.b.Delete(k, nil)
}

// Expired returns up to limit expiry index entries at or before now, earliest first,
// after the last entry marked swept.
func (b *Batch) Expired(now idemkv.Timestamp, limit int) ([]ExpiryEntry, error) {
	var out []ExpiryEntry
	err := scanExpired(b.b, now, limit, func(e ExpiryEntry) { out = append(out, e) })
	return out, err
}

// DeleteExpiry removes one index entry without touching records: for an entry that
// no longer matches its record, which only a bug could produce.
func (b *Batch) DeleteExpiry(e ExpiryEntry) error {
	return b.b.Delete(expiryKey(e.ExpiresAt, e.Tenant, e.Key), nil)
}

// MarkSwept records that no index entry up to and including e is left, so that later
// scans of the index start after it. Without the mark every scan would start at the
// oldest expiry and step over the tombstone of each entry swept before it (until
// compaction drops them): sweeping a backlog would cost its square, and counting it
// would cost every record ever swept.
//
// The mark stays valid because a record is only ever written with an expiry after the
// state machine clock, which is at or past the expiry of every swept entry.
func (b *Batch) MarkSwept(e ExpiryEntry) error {
	return b.b.Set(keySwept, expiryKey(e.ExpiresAt, e.Tenant, e.Key), nil)
}

// SetApplied records that every log entry up to index is reflected in the store.
// Written in the same batch as the entries' effects, it can never run ahead of them.
func (b *Batch) SetApplied(index, term uint64) error {
	var v [16]byte
	binary.BigEndian.PutUint64(v[:], index)
	binary.BigEndian.PutUint64(v[8:], term)
	return b.b.Set(keyApplied, v[:], nil)
}

// SetClock stores the state machine clock.
func (b *Batch) SetClock(ts idemkv.Timestamp) error {
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], uint64(ts))
	return b.b.Set(keyClock, v[:], nil)
}

// PutNode upserts the metadata of n.ID (suffrage and state are not stored).
func (b *Batch) PutNode(n idemkv.NodeInfo) error {
	return b.b.Set(nodeKey(n.ID), encodeNode(n), nil)
}

// DeleteNode removes the metadata of id and the format it advertised.
func (b *Batch) DeleteNode(id string) error {
	if err := b.b.Delete(nodeKey(id), nil); err != nil {
		return err
	}
	return b.b.Delete(formatKey(id), nil)
}

// Commit writes the batch atomically without syncing (see Store.Sync) and releases it.
func (b *Batch) Commit() error {
	// The state machine is the only writer, so the count read here is current.
	count := b.s.records.Load() + b.added
	if b.added != 0 {
		if err := b.b.Set(keyRecords, binary.BigEndian.AppendUint64(nil, uint64(count)), nil); err != nil {
			return fmt.Errorf("storage: commit: %w", err)
		}
	}
	if err := b.s.commit(b.b); err != nil {
		return fmt.Errorf("storage: commit: %w", err)
	}
	b.s.records.Store(count)
	b.s.tombs.Add(b.tombsAdded)
	b.s.recent.update(b.writes)
	b.s.rules.update(b.ruleWrites)
	b.s.keepFilter()
	return b.Close()
}

// Close discards the batch if it was not committed.
func (b *Batch) Close() error {
	if b.b == nil {
		return nil
	}
	err := b.b.Close()
	b.b = nil
	return err
}

func prefixIter(p string) *pebble.IterOptions {
	return &pebble.IterOptions{LowerBound: []byte(p), UpperBound: prefixEnd([]byte(p))}
}

// getValue returns a copy of the value at k, or nil if absent.
func getValue(r pebble.Reader, k []byte) ([]byte, error) {
	v, closer, err := r.Get(k)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("storage: get: %w", err)
	}
	out := slices.Clone(v)
	if out == nil {
		out = []byte{}
	}
	return out, closer.Close()
}

func getRecord(r pebble.Reader, tenant, key string) (*idemkv.Record, error) {
	v, err := getValue(r, recordKey(tenant, key))
	if err != nil || v == nil {
		return nil, err
	}
	return decodeRecord(tenant, key, v)
}

// checkIndexEntries counts the entries of the expiry index under prefix and checks that
// each names an object (what) that exists and expires when the entry says: lookup
// gives its expires_at, or false when it is absent.
func checkIndexEntries(snap *pebble.Snapshot, prefix string, entry, what string, lookup func(tenant, key string) (idemkv.Timestamp, bool, error)) (int, error) {
	entries := 0
	it, err := snap.NewIter(prefixIter(prefix))
	if err != nil {
		return 0, err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		entries++
		e, err := parseExpiryKey(it.Key())
		if err != nil {
			return 0, err
		}
		at, ok, err := lookup(e.Tenant, e.Key)
		if err != nil {
			return 0, err
		}
		if !ok || at != e.ExpiresAt {
			return 0, fmt.Errorf("%w: %s %q/%q at %s has no matching %s", ErrCorrupt, entry, e.Tenant, e.Key, e.ExpiresAt, what)
		}
	}
	return entries, it.Error()
}
