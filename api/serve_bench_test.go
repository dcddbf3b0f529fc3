package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/api"
)

// discardWriter is a ResponseWriter that keeps nothing: the benchmark below times the
// API's own work on a request, not net/http's connection.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(int)             {}

// BenchmarkServeLocalReplay: what a follower's API does for a replay it answers from
// its own state, from the request as net/http hands it over to the answer's bytes,
// with the store's answer given (a committed record, as a node's look-up reads it).
func BenchmarkServeLocalReplay(b *testing.B) {
	rec := &idemkv.Record{Tenant: "acme", Key: "conv-81723:approval-55:create_ticket", Tool: "create_ticket",
		Fingerprint: "sha256:6f1ed002ab5595859014ebf0951522d9f1a2f2a3b6c1d7e8f90a1b2c3d4e5f60", Actor: "agent-7",
		Status: idemkv.StatusCommitted, Fence: 17, AttemptID: "att_0123456789abcdef01234567", Attempts: 1,
		CreatedAt: 1_800_000_000_000, UpdatedAt: 1_800_000_000_850, ExpiresAt: 1_800_086_400_000,
		Receipt: &idemkv.StoredReceipt{RemoteSystem: "linear", RemoteID: "LIN-1842", RemoteURL: "https://linear.example/issue/LIN-1842",
			Result: json.RawMessage(`{"id":"LIN-1842"}`), CommittedAt: 1_800_000_000_850}}
	res := &idemkv.ReserveResult{Decision: idemkv.DecisionReplay, Record: rec, Receipt: rec.Outcome()}
	fake := &FakeStore{
		LeaderFunc:       func() (string, bool) { return "10.0.0.1:7420", false },
		ReserveLocalFunc: func(*idemkv.ReserveRequest) (*idemkv.ReserveResult, bool) { return res, true },
	}
	h := api.New(api.Config{Store: fake}).Handler()
	body := []byte(`{"tenant":"acme","idempotency_key":"conv-81723:approval-55:create_ticket","tool":"create_ticket",` +
		`"effect_fingerprint":"sha256:6f1ed002ab5595859014ebf0951522d9f1a2f2a3b6c1d7e8f90a1b2c3d4e5f60",` +
		`"attempt_id":"att_0123456789abcdef01234567","lease_ttl_ms":30000,"ttl_ms":86400000}`)
	req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1:7420/v1/reserve", nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = int64(len(body))
	rd := bytes.NewReader(body)
	w := &discardWriter{}
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(body)
		r := *req
		r.Body = readCloser{rd}
		w.h = http.Header{}
		h.ServeHTTP(w, &r)
	}
	if fake.LocalCalls() == 0 {
		b.Fatal("the replay was not answered locally")
	}
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }
