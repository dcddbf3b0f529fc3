package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/storage"
)

// Shape of the seeded records: what `idemkv bench` leaves behind after its new
// operations (loadgen's HTTPTarget and runner), so that the store the scale run
// measures against holds the same kind of records as one filled through the API.
const (
	seedTool         = "create_ticket"
	seedActor        = "bench"
	seedRemoteSystem = "bench"
	// seedWorkers is how many workers each simulated run spreads its keys over, like
	// the default 16 clients of a scale point.
	seedWorkers = 16
	// seedRunRecords is how many records one simulated bench run left behind: about 30
	// seconds of new operations at the throughput results.md shows. Each run has its own
	// random-looking run ID, so the keys spread over the key space as the keys of many
	// earlier runs would, rather than sitting in one block that new keys never touch.
	seedRunRecords = 100_000
	// seedRatePerSec spaces the records' creation times: they look as if written at
	// this rate up to the moment the seeding started.
	seedRatePerSec = 5000
)

type seedOptions struct {
	records int
	out     string
	tenant  string
	batch   int
	ttl     time.Duration
	tmpDir  string
	// history gives each record the two events a record of this binary's carries
	// after reserve and commit (execute, commit), as a store filled through the API
	// now holds them.
	history bool
}

func parseSeedFlags(args []string) (seedOptions, error) {
	var o seedOptions
	fs := flag.NewFlagSet("bench seed", flag.ContinueOnError)
	fs.IntVar(&o.records, "records", 0, "committed records to seed (required)")
	fs.StringVar(&o.out, "out", "", "backup file to write; must not exist (required)")
	fs.StringVar(&o.tenant, "tenant", "bench", "tenant of every record (idemkv bench's default)")
	fs.IntVar(&o.batch, "batch", 10_000, "records per storage batch")
	fs.DurationVar(&o.ttl, "ttl", 30*24*time.Hour, "retention of every record, counted from its creation (30 days is the longest idemkv accepts)")
	fs.BoolVar(&o.history, "history", false, "give every record the execute and commit events of its history, as this binary writes them")
	fs.StringVar(&o.tmpDir, "tmp-dir", "", "where to build the store (default: beside --out); needs room for about twice the backup")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.records <= 0:
		return o, errors.New("--records must be positive")
	case o.out == "":
		return o, errors.New("--out is required")
	case o.batch <= 0:
		return o, errors.New("--batch must be positive")
	case o.ttl < time.Minute || o.ttl > 30*24*time.Hour:
		return o, errors.New("--ttl must be between 1m and 720h (idemkv's retention limits)")
	}
	return o, nil
}

// seedInfo describes a written seed file.
type seedInfo struct {
	Records     int
	Bytes       int64
	Index, Term uint64
}

// seedKey is the key of seeded record i. It has the shape of the keys new operations
// of `idemkv bench` use, <run ID>/new/<worker>/<seq>, with an "s" before the worker
// number: loadgen writes the worker as bare digits, so no key a later bench run
// generates (…/new/<digits>/…, …/seed/…, …/hot/…) can ever equal a seeded one,
// whatever run ID it draws.
func seedKey(runIDs []string, i int) string {
	run, n := i/seedRunRecords, i%seedRunRecords
	return runIDs[run] + "/new/s" + strconv.Itoa(n%seedWorkers) + "/" + strconv.Itoa(n/seedWorkers+1)
}

// seedRunIDs derives one distinct 8-hex-digit run ID per simulated run, the way
// loadgen's run IDs look. They are a hash of the run number, so a given record count
// always produces the same keys.
func seedRunIDs(records int) []string {
	runs := (records + seedRunRecords - 1) / seedRunRecords
	ids := make([]string, 0, runs)
	seen := make(map[string]bool, runs)
	for salt := 0; len(ids) < runs; salt++ {
		sum := sha256.Sum256([]byte("idemkv-bench-seed/" + strconv.Itoa(salt)))
		id := hex.EncodeToString(sum[:4])
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

// seedRecord is committed record i of n, as a new operation of `idemkv bench` leaves
// it: reserved at log index 2i+1 (its fence) and committed at 2i+2. now is when the
// seeding started; the last record was created then.
func seedRecord(tenant, key string, i, n int, now idemkv.Timestamp, ttl time.Duration) *idemkv.Record {
	created := now - idemkv.Timestamp(int64(n-1-i)*1000/seedRatePerSec)
	committed := created + 2
	fence := uint64(2*i + 1)
	return &idemkv.Record{
		Tenant:      tenant,
		Key:         key,
		Fingerprint: benchFingerprint(key),
		Tool:        seedTool,
		Actor:       seedActor,
		Status:      idemkv.StatusCommitted,
		Fence:       fence,
		AttemptID:   key + "/1",
		Attempts:    1,
		CreatedAt:   created,
		UpdatedAt:   committed,
		ExpiresAt:   created + idemkv.Timestamp(ttl.Milliseconds()),
		Receipt: &idemkv.StoredReceipt{
			RemoteSystem: seedRemoteSystem,
			RemoteID:     "R-" + strconv.FormatUint(fence, 10),
			CommittedAt:  committed,
		},
	}
}

// addSeedHistory gives rec the history the state machine writes for a reserve and a
// commit of it: execute at its fence, then commit naming the receipt.
func addSeedHistory(rec *idemkv.Record) {
	rec.AddEvent(idemkv.HistoryEvent{At: rec.CreatedAt, Event: idemkv.EventExecute, Fence: rec.Fence, AttemptID: rec.AttemptID, Actor: rec.Actor})
	rec.AddEvent(idemkv.HistoryEvent{At: rec.UpdatedAt, Event: idemkv.EventCommit, Fence: rec.Fence, AttemptID: rec.AttemptID, Actor: rec.Actor,
		Detail: rec.Receipt.RemoteSystem + " " + rec.Receipt.RemoteID})
}

// benchFingerprint is loadgen's stand-in fingerprint of a key's effect.
func benchFingerprint(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// seed builds a real store holding o.records committed records and writes it to o.out
// in the snapshot format that `idemkv restore` reads. The file appears at o.out only
// once it is complete: an interrupted seed leaves no file that a cache would take for
// a finished one.
func seed(ctx context.Context, o seedOptions, progress io.Writer, logger *slog.Logger) (*seedInfo, error) {
	if _, err := os.Lstat(o.out); err == nil {
		return nil, fmt.Errorf("seed: %s exists; remove it or choose another --out", o.out)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("seed: %w", err)
	}
	dir := filepath.Dir(o.out)
	tmpDir := o.tmpDir
	if tmpDir == "" {
		tmpDir = dir
	}
	storeDir, err := os.MkdirTemp(tmpDir, ".seed-store-*")
	if err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	defer os.RemoveAll(storeDir)
	st, err := storage.Open(storeDir, logger)
	if err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	defer st.Close()

	var done atomic.Int64
	stop := reportEverySecond(progress, done.Load, func(n int64, perSec, avg float64) string {
		return fmt.Sprintf("seed: %d/%d records, %.0f records/s (%.0f average)", n, o.records, perSec, avg)
	})
	start := time.Now()
	index, term, err := fillStore(ctx, st, o, &done)
	stop()
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "seed: %d records stored in %s\n", o.records, time.Since(start).Round(time.Millisecond))

	tmp, err := os.CreateTemp(dir, ".seed-"+filepath.Base(o.out)+"-*")
	if err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	defer os.Remove(tmp.Name())
	// CreateTemp makes the file private; a seeded backup holds nothing secret, and the
	// cache is meant to be shared.
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("seed: %w", err)
	}
	cw := &progressWriter{w: tmp, ctx: ctx}
	stop = reportEverySecond(progress, cw.n.Load, func(n int64, perSec, _ float64) string {
		return fmt.Sprintf("seed: wrote %d MB of the backup, %.0f MB/s", n>>20, perSec/(1<<20))
	})
	start = time.Now()
	snap := st.NewSnapshot()
	written, err := snap.WriteTo(cw)
	stop()
	err = errors.Join(err, snap.Close())
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("seed: write backup: %w", err)
	}
	// A link fails if o.out appeared meanwhile, where a rename would replace it.
	if err := os.Link(tmp.Name(), o.out); err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	fmt.Fprintf(progress, "seed: wrote %s (%d bytes) in %s\n", o.out, written, time.Since(start).Round(time.Millisecond))
	return &seedInfo{Records: o.records, Bytes: written, Index: index, Term: term}, nil
}

// fillStore writes the records in batches. The applied index is that of the last
// record's commit, so every fence is below it and the restored node's first new entry
// gets a fence above all of them.
func fillStore(ctx context.Context, st *storage.Store, o seedOptions, done *atomic.Int64) (index, term uint64, err error) {
	runIDs := seedRunIDs(o.records)
	now := idemkv.TimestampOf(time.Now())
	term = 1
	for lo := 0; lo < o.records; lo += o.batch {
		if err := ctx.Err(); err != nil {
			return 0, 0, fmt.Errorf("seed: %w", err)
		}
		hi := min(lo+o.batch, o.records)
		b := st.NewBatch()
		var last *idemkv.Record
		for i := lo; i < hi; i++ {
			last = seedRecord(o.tenant, seedKey(runIDs, i), i, o.records, now, o.ttl)
			if o.history {
				addSeedHistory(last)
			}
			if err := b.PutRecord(last); err != nil {
				b.Close()
				return 0, 0, fmt.Errorf("seed: record %d: %w", i, err)
			}
		}
		index = uint64(2 * hi)
		err := errors.Join(b.SetApplied(index, term), b.SetClock(last.UpdatedAt))
		if err == nil {
			err = b.Commit()
		} else {
			b.Close()
		}
		if err != nil {
			return 0, 0, fmt.Errorf("seed: batch at record %d: %w", lo, err)
		}
		done.Store(int64(hi))
	}
	return index, term, nil
}

// reportEverySecond prints line(count, its rate over the last second, its average
// rate) to w once a second until the returned stop is called.
func reportEverySecond(w io.Writer, count func() int64, line func(n int64, perSec, avgPerSec float64) string) (stop func()) {
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		start := time.Now()
		prevAt, prev := start, int64(0)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case now := <-t.C:
				n := count()
				fmt.Fprintln(w, line(n, float64(n-prev)/now.Sub(prevAt).Seconds(), float64(n)/now.Sub(start).Seconds()))
				prevAt, prev = now, n
			}
		}
	}()
	return func() {
		close(quit)
		<-finished
	}
}

// progressWriter counts the bytes written and stops the write once ctx ends.
type progressWriter struct {
	w   io.Writer
	ctx context.Context
	n   atomic.Int64
}

func (p *progressWriter) Write(b []byte) (int, error) {
	if err := p.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := p.w.Write(b)
	p.n.Add(int64(n))
	return n, err
}

func runSeed(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseSeedFlags(args)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	info, err := seed(ctx, o, stderr, logger)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "seeded %s: %d records, %d bytes, index %d, term %d\n", o.out, info.Records, info.Bytes, info.Index, info.Term)
	return err
}
