// Package pgtarget runs the idemkv workload against PostgreSQL: the "small database
// table" of idempotency keys, one row per record, reserve as INSERT … ON CONFLICT DO
// NOTHING RETURNING, commit as an UPDATE fenced on the grant, and the decision table of
// idemkv's fsm package applied by the client to the row it finds.
//
// It must never weaken PostgreSQL's durability to look good: the server runs with
// fsync and synchronous_commit on, and every write is its own committed statement.
package pgtarget

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
	"github.com/idemkv/idemkv/loadgen"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Config configures the target.
type Config struct {
	// DSN is a libpq connection string or URL.
	DSN    string
	Tenant string
	// Conns is the pool size: one connection per worker.
	Conns int
	// Table is created if absent (default idem_records).
	Table string
}

// Target is a loadgen.Target on PostgreSQL.
type Target struct {
	pool   *pgxpool.Pool
	tenant string

	reserveSQL, selectSQL, updateSQL, commitSQL string
}

var _ loadgen.Target = (*Target)(nil)

const casAttempts = 8

// New connects, creates the table and its fence sequence if needed, and checks that
// the server commits synchronously (anything else would not be the same durability).
func New(ctx context.Context, cfg Config) (*Target, error) {
	if err := idemkv.ValidTenant(cfg.Tenant); err != nil {
		return nil, err
	}
	if cfg.Table == "" {
		cfg.Table = "idem_records"
	}
	if !validTable(cfg.Table) {
		return nil, idemkv.Invalid("table", "table must be a plain identifier")
	}
	pc, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, idemkv.Invalid("dsn", "%v", err)
	}
	if cfg.Conns > 0 {
		pc.MaxConns = int32(cfg.Conns)
		pc.MinConns = int32(cfg.Conns)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w: %v", idemkv.ErrUnavailable, err)
	}
	t := &Target{pool: pool, tenant: cfg.Tenant}
	if err := t.prepare(ctx, cfg.Table); err != nil {
		pool.Close()
		return nil, err
	}
	return t, nil
}

func validTable(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i, r := range s {
		if r != '_' && (r < 'a' || r > 'z') && (i == 0 || r < '0' || r > '9') {
			return false
		}
	}
	return true
}

// columns of a record, in the order every query reads them.
const columns = `fingerprint, tool, actor, status, fence, attempt_id, attempts, created_at, updated_at,
	lease_expires_at, expires_at, remote_system, remote_id, committed_at`

func (t *Target) prepare(ctx context.Context, table string) error {
	var sync string
	if err := t.pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sync); err != nil {
		return fmt.Errorf("postgres: %w: %v", idemkv.ErrUnavailable, err)
	}
	if sync != "on" && sync != "remote_apply" && sync != "remote_write" {
		return fmt.Errorf("postgres: %w: synchronous_commit is %s; the comparison needs it on", idemkv.ErrInvalidArgument, sync)
	}
	ddl := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %[1]s (
	tenant text NOT NULL,
	key text NOT NULL,
	fingerprint text NOT NULL,
	tool text NOT NULL,
	actor text NOT NULL,
	status text NOT NULL,
	fence bigint NOT NULL,
	attempt_id text NOT NULL,
	attempts integer NOT NULL,
	created_at bigint NOT NULL,
	updated_at bigint NOT NULL,
	lease_expires_at bigint NOT NULL,
	expires_at bigint NOT NULL,
	remote_system text NOT NULL DEFAULT '',
	remote_id text NOT NULL DEFAULT '',
	committed_at bigint NOT NULL DEFAULT 0,
	PRIMARY KEY (tenant, key));
CREATE SEQUENCE IF NOT EXISTS %[1]s_fence`, table)
	if _, err := t.pool.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("postgres: create %s: %w: %v", table, idemkv.ErrUnavailable, err)
	}
	// One statement, one round trip: the insert wins, or the row that beat it comes
	// back. The row is read from the statement's snapshot, so a competing insert that
	// committed after it began is not seen; Reserve then asks again.
	t.reserveSQL = fmt.Sprintf(`WITH ins AS (
	INSERT INTO %[1]s (tenant, key, fingerprint, tool, actor, status, fence, attempt_id, attempts,
		created_at, updated_at, lease_expires_at, expires_at)
	VALUES ($1, $2, $3, $4, $5, 'pending', nextval('%[1]s_fence'), $6, 1, $7, $7, $8, $9)
	ON CONFLICT (tenant, key) DO NOTHING
	RETURNING fence)
SELECT true, fence, '', '', '', '', 0, '', 0, 0, 0, 0, 0, '', '', 0 FROM ins
UNION ALL
SELECT false, 0, %[2]s FROM %[1]s WHERE tenant = $1 AND key = $2`, table, columns)
	t.selectSQL = fmt.Sprintf(`SELECT %[2]s FROM %[1]s WHERE tenant = $1 AND key = $2`, table, columns)
	// A grant replaces the row it read, compared on its fence and update time; fence 0
	// asks for a new fence from the sequence.
	t.updateSQL = fmt.Sprintf(`UPDATE %[1]s SET fingerprint = $5, tool = $6, actor = $7, status = $8,
	fence = CASE WHEN $9::bigint = 0 THEN nextval('%[1]s_fence') ELSE $9::bigint END,
	attempt_id = $10, attempts = $11, created_at = $12, updated_at = $13, lease_expires_at = $14, expires_at = $15
WHERE tenant = $1 AND key = $2 AND fence = $3 AND updated_at = $4
RETURNING fence`, table)
	t.commitSQL = fmt.Sprintf(`UPDATE %[1]s SET status = 'committed', updated_at = $5, lease_expires_at = 0,
	remote_system = $6, remote_id = $7, committed_at = $5
WHERE tenant = $1 AND key = $2 AND fence = $3 AND fingerprint = $4 AND status = 'pending' AND expires_at > $5`, table)
	return nil
}

// Standby is a standby as its primary sees it (a row of pg_stat_replication).
type Standby struct {
	Name      string `json:"application_name"`
	State     string `json:"state"`
	SyncState string `json:"sync_state"`
}

// Replication returns the server's synchronous_standby_names and the standbys
// connected to it, by name: what makes a commit wait for more than the local flush.
func (t *Target) Replication(ctx context.Context) (string, []Standby, error) {
	var names string
	if err := t.pool.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&names); err != nil {
		return "", nil, wrap(err)
	}
	rows, err := t.pool.Query(ctx, `SELECT application_name, state, sync_state FROM pg_stat_replication ORDER BY application_name`)
	if err != nil {
		return "", nil, wrap(err)
	}
	standbys, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Standby, error) {
		var s Standby
		return s, row.Scan(&s.Name, &s.State, &s.SyncState)
	})
	if err != nil {
		return "", nil, wrap(err)
	}
	return names, standbys, nil
}

// Close implements loadgen.Target.
func (t *Target) Close() error {
	t.pool.Close()
	return nil
}

// scanRecord reads the columns of a record after the scanned prefix.
func scanRecord(tenant, key string, row pgx.Row, prefix ...any) (*idemkv.Record, error) {
	rec := &idemkv.Record{Tenant: tenant, Key: key}
	var status string
	var fence int64
	var remoteSystem, remoteID string
	var committedAt int64
	dest := append(prefix, &rec.Fingerprint, &rec.Tool, &rec.Actor, &status, &fence, &rec.AttemptID, &rec.Attempts,
		&rec.CreatedAt, &rec.UpdatedAt, &rec.LeaseExpiresAt, &rec.ExpiresAt, &remoteSystem, &remoteID, &committedAt)
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	rec.Status = idemkv.Status(status)
	rec.Fence = uint64(fence)
	if rec.Status == idemkv.StatusCommitted {
		rec.Receipt = &idemkv.StoredReceipt{RemoteSystem: remoteSystem, RemoteID: remoteID, CommittedAt: idemkv.Timestamp(committedAt)}
	}
	return rec, nil
}

// Reserve implements loadgen.Target.
func (t *Target) Reserve(ctx context.Context, r *loadgen.Reserve) (loadgen.Reservation, error) {
	req := &idemkv.ReserveRequest{Tenant: t.tenant, Key: r.Key, Tool: r.Tool, Actor: "bench",
		Fingerprint: r.Fingerprint, AttemptID: r.AttemptID, LeaseTTLMs: r.LeaseTTLMs}
	req.EnsureDefaults(idemkv.Limits{}) // as a node does before deciding: fsm.Decide owns no defaults
	for range casAttempts {
		now := idemkv.TimestampOf(time.Now())
		fresh, _ := fsm.Decide(nil, req, now, 0)
		var inserted bool
		var fence int64
		cur, err := scanRecord(t.tenant, r.Key, t.pool.QueryRow(ctx, t.reserveSQL, t.tenant, r.Key, r.Fingerprint, r.Tool,
			fresh.Actor, r.AttemptID, int64(now), int64(fresh.LeaseExpiresAt), int64(fresh.ExpiresAt)), &inserted, &fence)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return loadgen.Reservation{}, wrap(err)
		}
		if inserted {
			return loadgen.Reservation{Decision: idemkv.DecisionExecute, Fence: uint64(fence)}, nil
		}
		next, res := fsm.Decide(cur, req, now, 0)
		if next == nil {
			return loadgen.Reservation{Decision: res.Decision, Fence: res.Fence}, nil
		}
		err = t.pool.QueryRow(ctx, t.updateSQL, t.tenant, r.Key, int64(cur.Fence), int64(cur.UpdatedAt),
			next.Fingerprint, next.Tool, next.Actor, string(next.Status), int64(next.Fence), next.AttemptID,
			next.Attempts, int64(next.CreatedAt), int64(next.UpdatedAt), int64(next.LeaseExpiresAt), int64(next.ExpiresAt)).Scan(&fence)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return loadgen.Reservation{}, wrap(err)
		}
		return loadgen.Reservation{Decision: res.Decision, Fence: uint64(fence)}, nil
	}
	return loadgen.Reservation{}, fmt.Errorf("reserve %s: %w: lost %d compares in a row", r.Key, idemkv.ErrUnavailable, casAttempts)
}

// Commit implements loadgen.Target: the fenced UPDATE lands, or the row says why not.
func (t *Target) Commit(ctx context.Context, c *loadgen.Commit) error {
	now := idemkv.TimestampOf(time.Now())
	tag, err := t.pool.Exec(ctx, t.commitSQL, t.tenant, c.Key, int64(c.Reservation.Fence), c.Fingerprint,
		int64(now), c.RemoteSystem, c.RemoteID)
	if err != nil {
		return wrap(err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	cur, err := scanRecord(t.tenant, c.Key, t.pool.QueryRow(ctx, t.selectSQL, t.tenant, c.Key))
	if errors.Is(err, pgx.ErrNoRows) {
		cur, err = nil, nil
	}
	if err != nil {
		return wrap(err)
	}
	req := &idemkv.CommitRequest{Tenant: t.tenant, Key: c.Key, Fingerprint: c.Fingerprint, Fence: c.Reservation.Fence,
		RemoteSystem: c.RemoteSystem, RemoteID: c.RemoteID}
	next, _, err := fsm.DecideCommit(cur, req, now)
	if err != nil {
		return err
	}
	if next != nil {
		// The row was pending with our fence and fingerprint, yet the update missed
		// it: only an expiry between the two statements does that.
		return fmt.Errorf("commit %s: %w: the record expired", c.Key, idemkv.ErrNotFound)
	}
	return nil
}

// wrap maps PostgreSQL's errors to the root sentinels.
func wrap(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code[:2] == "22" || pgErr.Code[:2] == "42") {
		return fmt.Errorf("postgres: %w: %v", idemkv.ErrInvalidArgument, err)
	}
	return fmt.Errorf("postgres: %w: %v", idemkv.ErrUnavailable, err)
}
