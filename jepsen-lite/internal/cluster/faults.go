package cluster

import (
	"context"
	"io"
	"net/http"

	"github.com/idemkv/idemkv/internal/testhooks"
)

// TransferLeadership asks node i to hand leadership to another voter (a no-op on a
// follower).
func (c *Cluster) TransferLeadership(ctx context.Context, i int) error {
	return c.call(ctx, i, http.MethodPost, testhooks.PathTransfer, struct{}{}, nil)
}

// SetFaults replaces the storage faults in force on node i.
func (c *Cluster) SetFaults(ctx context.Context, i int, faults []string) (*testhooks.FaultState, error) {
	if faults == nil {
		faults = []string{}
	}
	// A fault may end the process (a full disk under Pebble's background work): it is
	// expected from the moment the fault may be set until it is known to be off.
	if len(faults) > 0 {
		c.setFaulted(i, true)
	}
	var s testhooks.FaultState
	if err := c.call(ctx, i, http.MethodPost, testhooks.PathFaults, testhooks.FaultUpdate{Faults: faults}, &s); err != nil {
		return nil, err
	}
	if len(faults) == 0 {
		c.setFaulted(i, false)
	}
	return &s, nil
}

// Faults reports the storage faults in force on node i and what each has failed.
func (c *Cluster) Faults(ctx context.Context, i int) (*testhooks.FaultState, error) {
	var s testhooks.FaultState
	if err := c.call(ctx, i, http.MethodGet, testhooks.PathFaults, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Call does one request against node i and decodes a 200 answer into out (an error
// answer is an error naming its code).
func (c *Cluster) Call(ctx context.Context, i int, method, path string, body, out any) error {
	return c.call(ctx, i, method, path, body, out)
}

// Status does a GET against node i and returns the status code.
func (c *Cluster) Status(ctx context.Context, i int, path string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.nodes[i].APIAddr+path, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp.StatusCode, nil
}

func (c *Cluster) setFaulted(i int, on bool) {
	c.mu.Lock()
	c.nodes[i].faulted = on
	c.mu.Unlock()
}
