// Package loadgen drives a store with a workload of agent operations (new, replay,
// conflict, in-progress contention) and measures it: throughput and latency quantiles
// per operation kind, with a live progress line and a JSON report.
//
// The workload talks to a Target, so the same operations run against idemkv, etcd and
// PostgreSQL. loadgen must never import the server packages: it measures them from the
// outside, over the wire, as a runtime would.
package loadgen

import (
	"context"

	"github.com/idemkv/idemkv"
)

// Target is a store that can reserve and commit idempotency keys. Every method is
// called from many workers at once. Errors wrap the root package's sentinels
// (idemkv.ErrFenced, idemkv.ErrFingerprintMismatch, idemkv.ErrUnavailable …).
type Target interface {
	// Reserve asks for the right to run the effect of r (docs/protocol.md section 1).
	Reserve(ctx context.Context, r *Reserve) (Reservation, error)
	// Commit stores the receipt of the effect that res allowed.
	Commit(ctx context.Context, c *Commit) error
	// Close releases connections.
	Close() error
}

// Reserve names one attempt at an effect. The tenant belongs to the target.
type Reserve struct {
	Key         string
	Tool        string
	Fingerprint string
	AttemptID   string
	// LeaseTTLMs is the lease the attempt asks for (0: the store's default).
	LeaseTTLMs int64
}

// Reservation is the answer to a reserve.
type Reservation struct {
	Decision idemkv.Decision
	Fence    uint64
	// Pending is the target's own handle on the pending record it granted, handed back
	// to Commit: etcd compares the stored pending value byte for byte. idemkv and
	// PostgreSQL need only the fence and leave it nil.
	Pending []byte
}

// Commit stores a receipt for the attempt that Reservation granted.
type Commit struct {
	Key          string
	Fingerprint  string
	Reservation  Reservation
	RemoteSystem string
	RemoteID     string
}
