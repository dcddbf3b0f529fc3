package idemkv

import (
	"errors"
	"fmt"
	"strings"
)

// The sentinel errors of idemkv. Every error the server returns wraps exactly one of
// them; each has one wire code (docs/protocol.md section 2) and one HTTP status. The client maps a
// wire code back to the same sentinel, so errors.Is works on both sides of the wire.
var (
	ErrInvalidArgument     = errors.New("idemkv: invalid argument")
	ErrUnauthenticated     = errors.New("idemkv: unauthenticated")
	ErrPermissionDenied    = errors.New("idemkv: permission denied")
	ErrNotFound            = errors.New("idemkv: not found")
	ErrFenced              = errors.New("idemkv: fenced")
	ErrFingerprintMismatch = errors.New("idemkv: fingerprint mismatch")
	ErrNotPending          = errors.New("idemkv: not pending")
	ErrPayloadTooLarge     = errors.New("idemkv: payload too large")
	// ErrResourceExhausted: a per-node or per-token cap (for example on concurrent
	// long-polls) is reached. Nothing was done; retry later.
	ErrResourceExhausted = errors.New("idemkv: resource exhausted")
	// ErrUnavailable: the request was certainly not applied (no leader, shutting down,
	// not proposed). Safe to retry with anything.
	ErrUnavailable = errors.New("idemkv: unavailable")
	// ErrOutcomeUnknown: a write may or may not have happened (leadership lost while
	// replicating, a forward that timed out after sending). Retry with the same
	// attempt_id so that the retry is recognised as the same attempt.
	ErrOutcomeUnknown = errors.New("idemkv: outcome unknown")
	ErrInternal       = errors.New("idemkv: internal error")
	// ErrNotLeader: a write or linearizable read reached a follower. The API forwards
	// such requests to the leader; if it ever escapes, it is simply unavailable.
	ErrNotLeader = fmt.Errorf("idemkv: not the leader: %w", ErrUnavailable)
)

// Wire codes, in the order of docs/protocol.md section 2.
const (
	CodeInvalidArgument     = "invalid_argument"
	CodeUnauthenticated     = "unauthenticated"
	CodePermissionDenied    = "permission_denied"
	CodeNotFound            = "not_found"
	CodeFenced              = "fenced"
	CodeFingerprintMismatch = "fingerprint_mismatch"
	CodeNotPending          = "not_pending"
	CodePayloadTooLarge     = "payload_too_large"
	CodeResourceExhausted   = "resource_exhausted"
	CodeUnavailable         = "unavailable"
	CodeOutcomeUnknown      = "outcome_unknown"
	CodeInternal            = "internal"
)

// The statuses are written as numbers (RFC 9110 section 15) rather than net/http's
// constants: the root package is the core's vocabulary, and importing net/http for
// nine integers would pull the whole HTTP stack (about 160 packages) into fsm and
// storage. TestCoreImportsNoHTTPNorHooks keeps it out.
const statusInternal = 500 // Internal Server Error

var codes = []struct {
	code   string
	err    error
	status int
}{
	{CodeInvalidArgument, ErrInvalidArgument, 400 /* Bad Request */},
	{CodeUnauthenticated, ErrUnauthenticated, 401 /* Unauthorized */},
	{CodePermissionDenied, ErrPermissionDenied, 403 /* Forbidden */},
	{CodeNotFound, ErrNotFound, 404 /* Not Found */},
	{CodeFenced, ErrFenced, 409 /* Conflict */},
	{CodeFingerprintMismatch, ErrFingerprintMismatch, 409 /* Conflict */},
	{CodeNotPending, ErrNotPending, 409 /* Conflict */},
	{CodePayloadTooLarge, ErrPayloadTooLarge, 413 /* Content Too Large */},
	{CodeResourceExhausted, ErrResourceExhausted, 429 /* Too Many Requests */},
	{CodeUnavailable, ErrUnavailable, 503 /* Service Unavailable */},
	{CodeOutcomeUnknown, ErrOutcomeUnknown, 503 /* Service Unavailable */},
	{CodeInternal, ErrInternal, statusInternal},
}

// Error is an error with a wire code, a message for people and, for invalid
// arguments, the JSON field at fault. It unwraps to its sentinel.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
	// Details says more when the answer has more to say (ErrorDetails).
	Details *ErrorDetails `json:"details,omitempty"`
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("idemkv: %s: %s (field %s)", e.Code, e.Message, e.Field)
	}
	return fmt.Sprintf("idemkv: %s: %s", e.Code, e.Message)
}

// Unwrap returns the sentinel of e's code.
func (e *Error) Unwrap() error { return SentinelOf(e.Code) }

// Errorf returns an *Error whose code is that of sentinel.
func Errorf(sentinel error, format string, args ...any) error {
	return &Error{Code: CodeOf(sentinel), Message: fmt.Sprintf(format, args...)}
}

// Invalid returns an invalid_argument error naming field.
func Invalid(field, format string, args ...any) error {
	return &Error{Code: CodeInvalidArgument, Message: fmt.Sprintf(format, args...), Field: field}
}

// CodeOf returns the wire code of err: that of the *Error or sentinel it wraps,
// internal for anything else, and "" for nil.
func CodeOf(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return CodeInternal
}

// SentinelOf returns the sentinel error of a wire code (ErrInternal if unknown).
func SentinelOf(code string) error {
	for _, c := range codes {
		if c.code == code {
			return c.err
		}
	}
	return ErrInternal
}

// HTTPStatus is the one place where a wire code becomes an HTTP status.
func HTTPStatus(code string) int {
	for _, c := range codes {
		if c.code == code {
			return c.status
		}
	}
	return statusInternal
}

// AsError converts any error into the *Error that goes on the wire. Errors that wrap
// no sentinel become internal with a generic message, so that internals do not leak.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	code := CodeOf(err)
	if code == CodeInternal {
		return &Error{Code: code, Message: "internal error"}
	}
	// Error() puts "idemkv: <code>: " in front of the message again; an error made
	// as fmt.Errorf("%w: ...", sentinel) would read "idemkv: fenced: idemkv: fenced:
	// fence 5 is older ..." on the other side of the wire.
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, SentinelOf(code).Error()+": "); ok {
		msg = rest
	}
	return &Error{Code: code, Message: msg}
}
