package loadgen

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkv/idemkv"
)

// memStore is the part of the decision table the workload exercises, in memory. It
// serves as a Target directly and, through fakeAPI, as an idemkv node over HTTP.
type memStore struct {
	mu      sync.Mutex
	fence   uint64
	records map[string]*memRecord
	// reserves counts reserves per key class (the part of the key after the run id).
	reserves map[string]int
	commits  atomic.Int64
}

type memRecord struct {
	fp, tool, attempt string
	status            idemkv.Status
	fence             uint64
}

var _ Target = (*memStore)(nil)

func newMemStore() *memStore {
	return &memStore{records: make(map[string]*memRecord), reserves: make(map[string]int)}
}

// class returns "seed", "hot" or "new" for keys of the shape runID/class/….
func class(key string) string {
	parts := strings.SplitN(key, "/", 3)
	if len(parts) < 3 {
		return key
	}
	return parts[1]
}

func (m *memStore) Reserve(_ context.Context, r *Reserve) (Reservation, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reserves[class(r.Key)]++
	rec, ok := m.records[r.Key]
	switch {
	case !ok:
		m.fence++
		m.records[r.Key] = &memRecord{fp: r.Fingerprint, tool: r.Tool, attempt: r.AttemptID, status: idemkv.StatusPending, fence: m.fence}
		return Reservation{Decision: idemkv.DecisionExecute, Fence: m.fence}, nil
	case rec.fp != r.Fingerprint || rec.tool != r.Tool:
		return Reservation{Decision: idemkv.DecisionConflict}, nil
	case rec.status.Terminal():
		return Reservation{Decision: idemkv.DecisionReplay}, nil
	case rec.attempt == r.AttemptID:
		return Reservation{Decision: idemkv.DecisionExecute, Fence: rec.fence}, nil
	default:
		return Reservation{Decision: idemkv.DecisionInProgress}, nil
	}
}

func (m *memStore) Commit(_ context.Context, c *Commit) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.commits.Add(1)
	rec, ok := m.records[c.Key]
	switch {
	case !ok:
		return idemkv.Errorf(idemkv.ErrNotFound, "no record %s", c.Key)
	case c.Reservation.Fence < rec.fence:
		return idemkv.Errorf(idemkv.ErrFenced, "fence %d < %d", c.Reservation.Fence, rec.fence)
	case c.Fingerprint != rec.fp:
		return idemkv.Errorf(idemkv.ErrFingerprintMismatch, "fingerprint differs")
	}
	rec.status = idemkv.StatusCommitted
	return nil
}

func (m *memStore) Close() error { return nil }

// fakeAPI serves memStore as the reserve, commit and cluster endpoints of docs/protocol.md
// section 2, naming leader as the leader (itself when empty).
type fakeAPI struct {
	store  *memStore
	srv    *httptest.Server
	leader atomic.Pointer[string]
	// conns counts TCP connections opened to the server.
	conns atomic.Int64
	// requests counts requests served, by path.
	mu       sync.Mutex
	requests map[string]int
	// seen keeps the last reserve body, to check what goes on the wire.
	lastReserve atomic.Pointer[idemkv.ReserveRequest]
	// attempts keeps the attempt IDs of the reserves served.
	attempts []string
}

func newFakeAPI(t *testing.T, store *memStore) *fakeAPI {
	t.Helper()
	f := &fakeAPI{store: store, requests: make(map[string]int)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/cluster", func(w http.ResponseWriter, r *http.Request) {
		f.count(r)
		writeJSON(w, http.StatusOK, idemkv.ClusterInfo{Leader: idemkv.LeaderInfo{ID: "n1", APIAddr: f.leaderAddr()}})
	})
	mux.HandleFunc("POST /v1/reserve", func(w http.ResponseWriter, r *http.Request) {
		f.count(r)
		var req idemkv.ReserveRequest
		if err := decodeStrict(r, &req); err != nil {
			writeErr(w, err)
			return
		}
		f.lastReserve.Store(&req)
		f.mu.Lock()
		f.attempts = append(f.attempts, req.AttemptID)
		f.mu.Unlock()
		res, err := store.Reserve(r.Context(), &Reserve{Key: req.Key, Tool: req.Tool, Fingerprint: req.Fingerprint, AttemptID: req.AttemptID})
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, idemkv.ReserveResult{Decision: res.Decision, Fence: res.Fence,
			Record: &idemkv.Record{Tenant: req.Tenant, Key: req.Key, Fence: res.Fence}})
	})
	mux.HandleFunc("POST /v1/commit", func(w http.ResponseWriter, r *http.Request) {
		f.count(r)
		var req idemkv.CommitRequest
		if err := decodeStrict(r, &req); err != nil {
			writeErr(w, err)
			return
		}
		err := store.Commit(r.Context(), &Commit{Key: req.Key, Fingerprint: req.Fingerprint,
			Reservation: Reservation{Fence: req.Fence}, RemoteSystem: req.RemoteSystem, RemoteID: req.RemoteID})
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, idemkv.Receipt{Key: req.Key, Fingerprint: req.Fingerprint,
			Status: idemkv.StatusCommitted, RemoteSystem: req.RemoteSystem, RemoteID: req.RemoteID})
	})
	// Every answer names the leader, as the real API's do.
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(idemkv.HeaderLeader, f.leaderAddr())
		mux.ServeHTTP(w, r)
	}))
	f.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			f.conns.Add(1)
		}
	}
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPI) addr() string { return strings.TrimPrefix(f.srv.URL, "http://") }

func (f *fakeAPI) leaderAddr() string {
	if l := f.leader.Load(); l != nil {
		return *l
	}
	return f.addr()
}

func (f *fakeAPI) count(r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests[r.URL.Path]++
}

func (f *fakeAPI) reserveAttempts() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.attempts...)
}

func (f *fakeAPI) served(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests[path]
}

func decodeStrict(r *http.Request, into any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		return idemkv.Invalid("body", "%v", err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, err error) {
	e := idemkv.AsError(err)
	writeJSON(w, idemkv.HTTPStatus(e.Code), map[string]any{"error": e})
}
