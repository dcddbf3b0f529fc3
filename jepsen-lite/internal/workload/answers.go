package workload

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/idemkv/idemkv"
)

// BadAnswer is an answer that broke docs/protocol.md section 2 (a 500, an undecodable body),
// whichever workload got it.
type BadAnswer struct {
	Kind   string `json:"kind"`
	Node   string `json:"node"`
	Method string `json:"method"`
	Path   string `json:"path"`
	Detail string `json:"detail"`
}

// checkTransport reads every answer whole and notes those that no correct node gives:
// a 500 (internal) or an error code the API never answers, and a body that is not the
// JSON docs/protocol.md section 2 promises. It hands the caller the same bytes, so the client on
// top decides as it always does; the checker counts the note as an anomaly. Timeouts
// and broken connections are transport failures, not answers: they pass unnoted.
type checkTransport struct {
	base http.RoundTripper

	mu   sync.Mutex
	seen []BadAnswer
}

// expectedCodes are the error codes a correct node may answer a record request with.
var expectedCodes = map[string]bool{
	idemkv.CodeInvalidArgument:     true,
	idemkv.CodeNotFound:            true,
	idemkv.CodeFenced:              true,
	idemkv.CodeFingerprintMismatch: true,
	idemkv.CodeNotPending:          true,
	idemkv.CodePayloadTooLarge:     true,
	idemkv.CodeResourceExhausted:   true,
	idemkv.CodeUnavailable:         true,
	idemkv.CodeOutcomeUnknown:      true,
}

func (t *checkTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body, rerr := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if rerr != nil {
		// Cut off mid-answer: hand the caller what came and the same failure.
		resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{rerr}))
		return resp, nil
	}
	if kind, detail := judge(resp.StatusCode, body); kind != "" {
		t.note(BadAnswer{Kind: kind, Node: req.URL.Host, Method: req.Method, Path: req.URL.Path,
			Detail: fmt.Sprintf("%s: %s", resp.Status, detail)})
	}
	return resp, nil
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// judge names the anomaly of a complete answer, or returns "".
func judge(status int, body []byte) (kind, detail string) {
	if status == http.StatusOK {
		if !json.Valid(body) {
			return AnomalyUndecodable, fmt.Sprintf("%.200q", body)
		}
		return "", ""
	}
	e := idemkv.ParseErrorBody(body)
	if e == nil {
		return AnomalyUndecodable, fmt.Sprintf("%.200q", body)
	}
	if !expectedCodes[e.Code] {
		return AnomalyServerError, e.Code + ": " + e.Message
	}
	return "", ""
}

func (t *checkTransport) note(b BadAnswer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen = append(t.seen, b)
}

func (t *checkTransport) list() []BadAnswer {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]BadAnswer(nil), t.seen...)
}

// CloseIdleConnections lets API.Close drop the base transport's idle connections.
func (t *checkTransport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
