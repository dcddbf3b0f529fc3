package api_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idemkv/idemkv"
)

func TestSentinelsMapToCodeAndStatus(t *testing.T) {
	cases := []struct {
		err    error
		code   string
		status int
	}{
		{idemkv.ErrInvalidArgument, "invalid_argument", 400},
		{idemkv.ErrUnauthenticated, "unauthenticated", 401},
		{idemkv.ErrPermissionDenied, "permission_denied", 403},
		{idemkv.ErrNotFound, "not_found", 404},
		{idemkv.ErrFenced, "fenced", 409},
		{idemkv.ErrFingerprintMismatch, "fingerprint_mismatch", 409},
		{idemkv.ErrNotPending, "not_pending", 409},
		{idemkv.ErrPayloadTooLarge, "payload_too_large", 413},
		{idemkv.ErrUnavailable, "unavailable", 503},
		{idemkv.ErrInternal, "internal", 500},
	}
	var next error
	fake := &FakeStore{CommitFunc: func(context.Context, *idemkv.CommitRequest) (*idemkv.Receipt, error) { return nil, next }}
	n := startNode(t, fake, nil)
	for _, c := range cases {
		t.Run(c.code, func(t *testing.T) {
			// Wrapped as a node would wrap it, and as an *Error built from the sentinel.
			for _, err := range []error{fmt.Errorf("node: commit: %w", c.err), idemkv.Errorf(c.err, "because %s", c.code)} {
				next = err
				do(t, "POST", n.url+"/v1/commit", validCommit(), nil).wantError(t, c.status, c.code, "")
			}
		})
	}
}

func TestErrorFieldTravels(t *testing.T) {
	fake := &FakeStore{CommitFunc: func(context.Context, *idemkv.CommitRequest) (*idemkv.Receipt, error) {
		return nil, fmt.Errorf("fsm: %w", idemkv.Invalid("remote_url", "remote_url must be absolute"))
	}}
	n := startNode(t, fake, nil)
	e := do(t, "POST", n.url+"/v1/commit", validCommit(), nil).wantError(t, 400, idemkv.CodeInvalidArgument, "remote_url")
	if e["message"] != "remote_url must be absolute" {
		t.Errorf("message %v", e["message"])
	}
}

func TestInternalErrorsAreLoggedNotLeaked(t *testing.T) {
	fake := &FakeStore{ReserveFunc: func(context.Context, *idemkv.ReserveRequest) (*idemkv.ReserveResult, error) {
		return nil, errors.New("pebble: open /var/lib/idemkv/secret-dir: disk on fire")
	}}
	n := startNode(t, fake, nil)
	r := do(t, "POST", n.url+"/v1/reserve", validReserve(), nil)
	e := r.wantError(t, http.StatusInternalServerError, idemkv.CodeInternal, "")
	if e["message"] != "internal error" || strings.Contains(string(r.body), "secret-dir") {
		t.Errorf("internal details leaked: %s", r.body)
	}
	if !strings.Contains(n.logs.String(), "secret-dir: disk on fire") {
		t.Errorf("the internal error was not logged; logs:\n%s", n.logs.String())
	}
}

func TestStoreAnsweringNothingIsInternal(t *testing.T) {
	fake := &FakeStore{
		HeartbeatFunc: func(context.Context, *idemkv.HeartbeatRequest) (*idemkv.Record, error) { return nil, nil },
		GetFunc:       func(context.Context, *idemkv.GetRequest) (*idemkv.Record, error) { return nil, nil },
	}
	n := startNode(t, fake, nil)
	do(t, "POST", n.url+"/v1/heartbeat", validHeartbeat(), nil).wantError(t, 500, idemkv.CodeInternal, "")
	do(t, "GET", n.url+"/v1/records/acme/k", nil, nil).wantError(t, 500, idemkv.CodeInternal, "")
}

// A store that returns a bare context error has not said whether a write was applied:
// only a read cut short is certainly unavailable.
func TestCutShortRequestsSayWhatIsKnown(t *testing.T) {
	fake := &FakeStore{
		CommitFunc: func(context.Context, *idemkv.CommitRequest) (*idemkv.Receipt, error) {
			return nil, fmt.Errorf("raft apply: %w", context.DeadlineExceeded)
		},
		GetFunc: func(context.Context, *idemkv.GetRequest) (*idemkv.Record, error) {
			return nil, fmt.Errorf("read index: %w", context.Canceled)
		},
	}
	n := startNode(t, fake, nil)
	do(t, "POST", n.url+"/v1/commit", validCommit(), nil).wantError(t, 503, idemkv.CodeOutcomeUnknown, "")
	do(t, "GET", n.url+"/v1/records/acme/k", nil, nil).wantError(t, 503, idemkv.CodeUnavailable, "")
}

func TestNotLeaderEscapingIsUnavailable(t *testing.T) {
	// The store says "not the leader" and no leader is known: nothing to forward to.
	fake := &FakeStore{
		LeaderFunc: func() (string, bool) { return "", true },
		ReleaseFunc: func(context.Context, *idemkv.ReleaseRequest) (*idemkv.ReleaseResult, error) {
			return nil, fmt.Errorf("node: %w", idemkv.ErrNotLeader)
		},
	}
	n := startNode(t, fake, nil)
	do(t, "POST", n.url+"/v1/release", validRelease(), nil).wantError(t, 503, idemkv.CodeUnavailable, "")
	if n.fake.Calls() != 1 {
		t.Errorf("store called %d times, want 1", n.fake.Calls())
	}
}
