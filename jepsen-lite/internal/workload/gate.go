package workload

import (
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
	"time"
)

// writeGate holds back every write (every POST) of every workload while closed, so a
// nemesis can run a read-only phase: the leader-churn family needs elections with no
// write in between, which is what wedged reads after about 32 of them (issue 12,
// defect 1). A write held back is refused as a dial that failed, so each workload
// records it as certainly not applied and backs off as it does for a dead node.
type writeGate struct {
	base   http.RoundTripper
	closed atomic.Bool
}

// gateWait is how long a write waits for the gate to open before it is refused: long
// enough that the workloads do not spin while it is closed, short against the op
// timeout.
const gateWait = 500 * time.Millisecond

func (g *writeGate) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPost && g.closed.Load() {
		deadline := time.Now().Add(gateWait)
		for g.closed.Load() && time.Now().Before(deadline) && req.Context().Err() == nil {
			time.Sleep(20 * time.Millisecond)
		}
		if g.closed.Load() {
			return nil, &net.OpError{Op: "dial", Net: "tcp",
				Err: fmt.Errorf("jepsen-lite: writes held back for a read-only phase: %w", syscall.ECONNREFUSED)}
		}
	}
	return g.base.RoundTrip(req)
}

// CloseIdleConnections lets API.Close reach the transport below.
func (g *writeGate) CloseIdleConnections() {
	if c, ok := g.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// PauseWrites holds back every workload write until ResumeWrites.
func (a *API) PauseWrites() { a.gate.closed.Store(true) }

// ResumeWrites lets writes through again.
func (a *API) ResumeWrites() { a.gate.closed.Store(false) }
