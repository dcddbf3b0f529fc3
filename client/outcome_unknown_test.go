package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/testlog"
)

// TestDoRetriesOutcomeUnknownAsTheSameAttempt: the store answers outcome_unknown
// after it applied a reserve and a commit (leadership lost while replicating). Do sends
// each again with the same attempt id and fence: the reserve is recognised as the
// same attempt (execute, one attempt, not in_progress) and the commit gets the stored
// receipt. Before, outcome_unknown was not retried and Do failed.
func TestDoRetriesOutcomeUnknownAsTheSameAttempt(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	var attemptIDs []string
	var fences []uint64
	e.store.faults(nil, func(op string, n int) error {
		if (op == "reserve" || op == "commit") && n == 1 {
			return idemkv.Errorf(idemkv.ErrOutcomeUnknown, "leadership lost while replicating")
		}
		return nil
	})
	spy := &spyStore{Store: e.store, reserve: func(r *idemkv.ReserveRequest) {
		mu.Lock()
		attemptIDs = append(attemptIDs, r.AttemptID)
		mu.Unlock()
	}, commit: func(r *idemkv.CommitRequest) {
		mu.Lock()
		fences = append(fences, r.Fence)
		mu.Unlock()
	}}
	runner, err := NewRunner(spy, RunConfig{Logger: testlog.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	op := ticketOp("k-outcome-unknown", "Outage X")
	out, err := runner.Do(ctxT(t), op, e.createFn(op.Key))
	if err != nil {
		t.Fatal(err)
	}
	if out.Decision != idemkv.DecisionExecute || out.Attempts != 1 || e.tickets.created.Load() != 1 {
		t.Fatalf("outcome %+v, %d tickets", out, e.tickets.created.Load())
	}
	if len(attemptIDs) != 2 || attemptIDs[0] != attemptIDs[1] || len(fences) != 2 || fences[0] != fences[1] {
		t.Fatalf("retries changed the attempt: attempt ids %q, fences %v", attemptIDs, fences)
	}
}

type spyStore struct {
	Store
	reserve func(*idemkv.ReserveRequest)
	commit  func(*idemkv.CommitRequest)
}

func (s *spyStore) Reserve(ctx context.Context, r *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
	s.reserve(r)
	return s.Store.Reserve(ctx, r)
}

func (s *spyStore) Commit(ctx context.Context, r *idemkv.CommitRequest) (*idemkv.Receipt, error) {
	s.commit(r)
	return s.Store.Commit(ctx, r)
}

// TestClientRetriesOutcomeUnknownWithTheSameBody: a node applies a reserve, then
// answers 503 outcome_unknown. The HTTP client sends the very same body again (same
// attempt id), which the server recognises as the same attempt.
func TestClientRetriesOutcomeUnknownWithTheSameBody(t *testing.T) {
	n := startNode(t, newMemStore())
	var mu sync.Mutex
	var bodies [][]byte
	n.setHook(func(w http.ResponseWriter, r *http.Request, next http.Handler) bool {
		if r.URL.Path != "/v1/reserve" {
			return false
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		mu.Lock()
		bodies = append(bodies, body)
		first := len(bodies) == 1
		mu.Unlock()
		if !first {
			return false
		}
		next.ServeHTTP(httptest.NewRecorder(), r.Clone(context.Background()))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(idemkv.HTTPStatus(idemkv.CodeOutcomeUnknown))
		_ = json.NewEncoder(w).Encode(map[string]any{"error": idemkv.Error{Code: idemkv.CodeOutcomeUnknown, Message: "leadership lost"}})
		return true
	})
	c := newClient(t, Config{Endpoints: []string{n.addr()}})
	res, err := c.Reserve(ctxT(t), &idemkv.ReserveRequest{Tenant: "t1", Key: "k", Tool: "x", Fingerprint: "sha256:aa"})
	if err != nil {
		t.Fatal(err)
	}
	if len(bodies) != 2 || !bytes.Equal(bodies[0], bodies[1]) {
		t.Fatalf("bodies %q", bodies)
	}
	if res.Decision != idemkv.DecisionExecute || res.Record.Attempts != 1 {
		t.Fatalf("the retry was not the same attempt: %+v", res)
	}
}

// TestDoStoreUnavailableKeepsTheAttempt: every reserve lands but its answer is lost
// until StoreWait is spent. The caller retries the Do with the attempt id the error
// names and is recognised as the same attempt: it executes at once with one attempt,
// instead of waiting out its own lease and recovering (which, with no probe, would
// end in doubt for a tool that never ran).
func TestDoStoreUnavailableKeepsTheAttempt(t *testing.T) {
	e := newEnv(t)
	lost := true
	e.store.faults(nil, func(op string, n int) error {
		if op == "reserve" && lost {
			return idemkv.Errorf(idemkv.ErrOutcomeUnknown, "answer lost")
		}
		return nil
	})
	r, err := NewRunner(e.store, RunConfig{Logger: testlog.New(t), StoreWait: 200 * time.Millisecond,
		BackoffMin: time.Millisecond, BackoffMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	op := ticketOp("k-store-unavailable", "Outage X")
	op.LeaseTTL = time.Minute
	_, err = r.Do(ctxT(t), op, mustNotRunFn(t))
	var se *StoreUnavailableError
	if !errors.As(err, &se) || se.AttemptID == "" {
		t.Fatalf("%v", err)
	}
	lost = false
	op.AttemptID = se.AttemptID
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := r.Do(ctx, op, e.createFn(op.Key))
	if err != nil || out.Decision != idemkv.DecisionExecute || out.Attempts != 1 || e.tickets.created.Load() != 1 {
		t.Fatalf("the retry with the same attempt id: %+v, %v", out, err)
	}
}
