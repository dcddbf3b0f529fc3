package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/idemkv/idemkv"
)

// Errors of Do that have no wire code: they describe what the adapter concluded, not
// what a node answered. Check them with errors.Is; the typed errors below carry the
// details. Errors from the store wrap the sentinels of the root package
// (idemkv.ErrFenced when a newer attempt took the key over, idemkv.ErrUnavailable
// when no node could be reached in time, ...).
var (
	// ErrConflict: the key was used for a different effect or tool (*ConflictError).
	ErrConflict = errors.New("idemkv: idempotency key reused with a different effect")
	// ErrFailed: the operation failed permanently and that failure is stored; every
	// retry gets it back (*FailedError).
	ErrFailed = errors.New("idemkv: operation failed permanently")
	// ErrInDoubt: an earlier attempt died and nothing can tell whether its effect
	// happened (a non-idempotent tool without a probe). The record stays pending until
	// a person or a policy commits or releases it (*InDoubtError).
	ErrInDoubt = errors.New("idemkv: outcome of an earlier attempt is in doubt")
)

// ConflictError is returned when the key already names another effect. Nothing was
// executed.
type ConflictError struct {
	Tenant   string
	Key      string
	Conflict idemkv.Conflict
	// Existing is the record that holds the key.
	Existing *idemkv.Record
}

func (e *ConflictError) Error() string {
	msg := fmt.Sprintf("idemkv: conflict on %q: %s (existing %s, received %s", e.Key, e.Conflict.Reason,
		e.Conflict.ExistingFingerprint, e.Conflict.ReceivedFingerprint)
	if e.Conflict.ExistingRemoteID != "" {
		msg += ", existing remote id " + e.Conflict.ExistingRemoteID
	}
	return msg + ")"
}

func (e *ConflictError) Unwrap() error { return ErrConflict }

// FailedError carries a stored failure. The first attempt that stored it also keeps
// the tool's own error in Cause; replays carry the stored code and message only.
type FailedError struct {
	Key      string
	Receipt  *idemkv.Receipt
	Replayed bool
	Cause    error
}

func (e *FailedError) Error() string {
	info := e.Receipt.Error
	if info == nil {
		return fmt.Sprintf("idemkv: %q failed permanently", e.Key)
	}
	return fmt.Sprintf("idemkv: %q failed permanently: %s: %s", e.Key, info.Code, info.Message)
}

func (e *FailedError) Unwrap() []error {
	if e.Cause == nil {
		return []error{ErrFailed}
	}
	return []error{ErrFailed, e.Cause}
}

// InDoubtError is returned instead of executing again when the previous attempt's
// outcome cannot be known. Record is the pending record as this attempt left it, with
// the fence a person needs to commit or release it.
type InDoubtError struct {
	Tenant string
	Key    string
	Record *idemkv.Record
}

func (e *InDoubtError) Error() string {
	fence := uint64(0)
	if e.Record != nil {
		fence = e.Record.Fence
	}
	return fmt.Sprintf("idemkv: %q is in doubt: an earlier attempt died and the tool has no probe; "+
		"commit or release it (fence %d)", e.Key, fence)
}

func (e *InDoubtError) Unwrap() error { return ErrInDoubt }

// DefaultFailureCode is the stored code of a Permanent error that names none.
const DefaultFailureCode = "tool_failed"

// PermanentError marks a tool error that will not go away on retry (a validation
// error from the downstream API, say). Do stores it with fail, and every later
// attempt with the same key gets it back as a *FailedError instead of executing.
type PermanentError struct {
	Code    string          // default DefaultFailureCode
	Details json.RawMessage // optional, any JSON
	Err     error
}

// Permanent marks err as permanent with the default code.
func Permanent(err error) error { return &PermanentError{Err: err} }

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

func (e *PermanentError) info() idemkv.ErrorInfo {
	code := printable(e.Code, idemkv.MaxErrorCodeLen)
	if code == "" {
		code = DefaultFailureCode
	}
	return idemkv.ErrorInfo{Code: code, Message: printable(e.Err.Error(), idemkv.MaxErrorMsgLen), Details: e.Details}
}

// printable makes s acceptable to the server, which stores printable UTF-8 only:
// errors often span lines (errors.Join), and that must not make the failure
// unstorable.
func printable(s string, max int) string {
	s = strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
	for len(s) > max {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
}

// NotExecuted marks an error after which the effect certainly did not happen (the
// request was never sent, or the downstream API refused it before acting). Do
// releases the key, so the next attempt executes afresh.
func NotExecuted(err error) error { return &notExecutedError{err} }

type notExecutedError struct{ err error }

func (e *notExecutedError) Error() string { return "not executed: " + e.err.Error() }
func (e *notExecutedError) Unwrap() error { return e.err }
