package api

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
)

// TestWriteJSONWritesWhatMarshalDoes: an answer's body is json.Marshal's encoding
// of it and a newline, byte for byte, however the pooled buffer was last used
// (a long answer, then a short one, must not leave the long one's tail behind); and
// a value that cannot be encoded is a clean internal error, not half a body.
func TestWriteJSONWritesWhatMarshalDoes(t *testing.T) {
	rec := &idemkv.Record{
		Tenant: "t<&>", Key: "k\u2028\"\\", Fingerprint: "sha256:00", Status: idemkv.StatusCommitted,
		Fence: 7, CreatedAt: 1764633600123, UpdatedAt: 1764633600456, ExpiresAt: 1767225600123,
		Receipt: &idemkv.StoredReceipt{RemoteSystem: "s", RemoteID: "r", Result: json.RawMessage(`{ "a" : [1, 2, "<b>"] }`), CommittedAt: 1764633600456},
	}
	values := []any{
		&idemkv.ReserveResult{Decision: idemkv.DecisionReplay, Record: rec},
		map[string]any{"long": strings.Repeat("x", 5000)},
		&idemkv.ReleaseResult{Released: true},
		rec,
		errorBody{Error: &idemkv.Error{Code: idemkv.CodeInvalidArgument, Message: "a <b> & c"}},
	}
	log := slog.New(slog.DiscardHandler)
	for i, v := range values {
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		w := httptest.NewRecorder()
		writeJSON(log, w, httptest.NewRequest(http.MethodGet, "/v1/x", nil), http.StatusOK, v)
		if got := w.Body.Bytes(); !bytes.Equal(got, append(want, '\n')) {
			t.Fatalf("value %d: wrote\n%s\nwant json.Marshal's\n%s", i, got, want)
		}
		if w.Code != http.StatusOK || w.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("value %d: status %d, content type %q", i, w.Code, w.Header().Get("Content-Type"))
		}
	}

	w := httptest.NewRecorder()
	writeJSON(log, w, httptest.NewRequest(http.MethodGet, "/v1/x", nil), http.StatusOK, map[string]any{"c": make(chan int)})
	var body errorBody
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || w.Code != http.StatusInternalServerError || body.Error == nil || body.Error.Code != idemkv.CodeInternal {
		t.Fatalf("an unencodable answer: status %d, body %q (%v), want 500 with an internal error body", w.Code, w.Body.String(), err)
	}
}
