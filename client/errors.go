package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idemkv/idemkv"
)

// The kinds of error Do returns. Every error from Do answers errors.Is for exactly one
// of the seven sentinels below, and KindOf names it; Python and TypeScript clients use
// the same kind strings. The typed errors carry the details (the key, the decision,
// the record where known, and the cause). Errors from the store inside them wrap the
// sentinels of the root package (idemkv.ErrFenced, idemkv.ErrUnavailable, ...).
//
//	kind               sentinel             typed error            the tool ran?   the key
//	not_executed       ErrNotExecuted       *NotExecutedError      no              free or released
//	stored_failure     ErrStoredFailure     *StoredFailureError    yes, failed     failed, replayed
//	outcome_unknown    ErrOutcomeUnknown    *OutcomeUnknownError   maybe           pending
//	conflict           ErrConflict          *ConflictError         no              names another effect
//	in_doubt           ErrInDoubt           *InDoubtError          maybe, earlier  pending, in doubt
//	store_unavailable  ErrStoreUnavailable  *StoreUnavailableError no              untouched
//	approval_pending   ErrApprovalPending   *ApprovalPendingError  no              awaits approval (approval.go)
const (
	KindNotExecuted      = "not_executed"
	KindStoredFailure    = "stored_failure"
	KindOutcomeUnknown   = "outcome_unknown"
	KindConflict         = "conflict"
	KindInDoubt          = "in_doubt"
	KindStoreUnavailable = "store_unavailable"
)

var (
	// ErrNotExecuted: the tool did not run in this call and holds nothing, or it
	// reported NotExecuted and the key was released; retrying is safe
	// (*NotExecutedError). Invalid ops and a context that ended before the tool ran
	// are of this kind too.
	ErrNotExecuted = errors.New("idemkv: not executed")
	// ErrStoredFailure: the tool ran and failed for good (Permanent); the failure is
	// stored and every retry gets it back (*StoredFailureError).
	ErrStoredFailure = errors.New("idemkv: failed permanently")
	// ErrOutcomeUnknown: the tool may have run and its outcome is not stored (its
	// error was neither Permanent nor NotExecuted, the lease was lost, or the
	// receipt could not be stored). The record stays pending: a later Do recovers it
	// once the lease runs out (*OutcomeUnknownError). Not to be confused with the
	// wire code idemkv.ErrOutcomeUnknown, which Do retries with the same attempt id
	// or fence and never returns as such.
	ErrOutcomeUnknown = errors.New("idemkv: tool outcome unknown")
	// ErrConflict: the key was used for a different effect or tool; nothing ran
	// (*ConflictError).
	ErrConflict = errors.New("idemkv: idempotency key reused with a different effect")
	// ErrInDoubt: an earlier attempt died and nothing can tell whether its effect
	// happened (a non-idempotent tool without a probe). The record is marked in doubt
	// and stays pending until someone settles it with Client.Resolve or
	// "idemkv resolve" (*InDoubtError).
	ErrInDoubt = errors.New("idemkv: outcome of an earlier attempt is in doubt")
	// ErrStoreUnavailable: idemkv could not be reached within Config.StoreWait (or
	// before the caller's context ended) and the policy is FailClosed; the tool did
	// not run (*StoreUnavailableError).
	ErrStoreUnavailable = errors.New("idemkv: store unavailable")

	// ErrFailed is the old name of ErrStoredFailure.
	//
	// Deprecated: use ErrStoredFailure.
	ErrFailed = ErrStoredFailure
)

// kinds lists the six kinds in the order KindOf tries them.
var kinds = []struct {
	kind string
	err  error
}{
	{KindNotExecuted, ErrNotExecuted},
	{KindStoredFailure, ErrStoredFailure},
	{KindOutcomeUnknown, ErrOutcomeUnknown},
	{KindConflict, ErrConflict},
	{KindInDoubt, ErrInDoubt},
	{KindStoreUnavailable, ErrStoreUnavailable},
	{KindApprovalPending, ErrApprovalPending},
}

// KindOf returns the kind of an error from Do ("not_executed", "stored_failure",
// "outcome_unknown", "conflict", "in_doubt" or "store_unavailable"), and "" for nil or
// an error that did not come from Do.
func KindOf(err error) string {
	if err == nil {
		return ""
	}
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			return k.kind
		}
	}
	return ""
}

// unwrapKind is the Unwrap of every typed error: its sentinel, then its cause.
func unwrapKind(sentinel, cause error) []error {
	if cause == nil {
		return []error{sentinel}
	}
	return []error{sentinel, cause}
}

// suffix formats a cause after a colon, or nothing.
func suffix(cause error) string {
	if cause == nil {
		return ""
	}
	return ": " + cause.Error()
}

// NotExecutedError: the tool did not run in this call (or reported NotExecuted and
// the key was released). Cause says why: an invalid op, the tool's own error, a
// context that ended while waiting for another attempt.
type NotExecutedError struct {
	Tenant string
	Key    string
	// Decision is the reserve decision this call acted on, "" if none was made.
	Decision idemkv.Decision
	Cause    error
}

func (e *NotExecutedError) Error() string {
	return fmt.Sprintf("idemkv: %q not executed%s", e.Key, suffix(e.Cause))
}

func (e *NotExecutedError) Unwrap() []error { return unwrapKind(ErrNotExecuted, e.Cause) }

// OutcomeUnknownError: the tool may have run and no outcome is stored. Record, when
// known, is the pending record this attempt held; the record stays pending, and a Do
// after its lease runs out recovers it (probe, re-execute or in doubt, by class).
type OutcomeUnknownError struct {
	Tenant   string
	Key      string
	Decision idemkv.Decision
	Fence    uint64
	Record   *idemkv.Record
	// Cause is the tool's error, or what stopped the outcome from being stored.
	Cause error
}

func (e *OutcomeUnknownError) Error() string {
	return fmt.Sprintf("idemkv: outcome of %q unknown, the record stays pending%s", e.Key, suffix(e.Cause))
}

func (e *OutcomeUnknownError) Unwrap() []error { return unwrapKind(ErrOutcomeUnknown, e.Cause) }

// StoreUnavailableError: idemkv did not answer within the store-wait bound, or the
// caller's context ended with a call to it in flight, so the tool did not run (policy
// FailClosed). Waited is the time spent waiting for the store; Cause is the last error
// from it.
type StoreUnavailableError struct {
	Tenant string
	Key    string
	// AttemptID is the attempt id this Do reserved with. A reserve may have landed
	// with its answer lost (outcome_unknown, a cut connection); a later Do with
	// Op.AttemptID set to it is then the same attempt, not one that must wait out the
	// lease and recover.
	AttemptID string
	Waited    time.Duration
	Cause     error
}

func (e *StoreUnavailableError) Error() string {
	return fmt.Sprintf("idemkv: store unavailable for %q after waiting %s, the tool did not run%s",
		e.Key, e.Waited.Round(time.Millisecond), suffix(e.Cause))
}

func (e *StoreUnavailableError) Unwrap() []error { return unwrapKind(ErrStoreUnavailable, e.Cause) }

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

// StoredFailureError carries a stored failure. The attempt that stored it also keeps
// the tool's own error in Cause; replays carry the stored code and message only.
type StoredFailureError struct {
	Key      string
	Receipt  *idemkv.Receipt
	Replayed bool
	Cause    error
}

// FailedError is the old name of StoredFailureError.
//
// Deprecated: use StoredFailureError.
type FailedError = StoredFailureError

func (e *StoredFailureError) Error() string {
	info := e.Receipt.Error
	if info == nil {
		return fmt.Sprintf("idemkv: %q failed permanently", e.Key)
	}
	return fmt.Sprintf("idemkv: %q failed permanently: %s: %s", e.Key, info.Code, info.Message)
}

func (e *StoredFailureError) Unwrap() []error { return unwrapKind(ErrStoredFailure, e.Cause) }

// InDoubtError is returned instead of executing again when an earlier attempt's
// outcome cannot be known. Record is the in-doubt record as the store holds it
// (InDoubt set); settle it by key, with no fence: Client.Resolve, or
// "idemkv resolve TENANT KEY --committed --remote-system S --remote-id ID | --not-executed".
// Every Do of the key answers this at once until then; none re-leases it.
type InDoubtError struct {
	Tenant string
	Key    string
	Record *idemkv.Record
	// Cause is set when marking the record in doubt failed; the record then stays
	// pending with its lease, and the next attempt marks it.
	Cause error
}

func (e *InDoubtError) Error() string {
	msg := fmt.Sprintf("idemkv: %q (tenant %q) is in doubt: an earlier attempt died and the tool has no probe; "+
		"settle it with idemkv resolve --committed or --not-executed", e.Key, e.Tenant)
	if e.Record != nil && e.Record.InDoubtSince != 0 {
		msg += " (in doubt since " + e.Record.InDoubtSince.String() + ")"
	}
	return msg + suffix(e.Cause)
}

func (e *InDoubtError) Unwrap() []error { return unwrapKind(ErrInDoubt, e.Cause) }

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

// Info is the failure as Do stores it: the code (DefaultFailureCode when empty) and
// the message clipped to what the server stores, with the details. The server bounds
// the details and the message together (--max-payload-bytes); a caller that sizes
// its details sizes them against this message.
func (e *PermanentError) Info() idemkv.ErrorInfo {
	code := idemkv.ClipText(e.Code, idemkv.MaxErrorCodeLen)
	if code == "" {
		code = DefaultFailureCode
	}
	return idemkv.ErrorInfo{Code: code, Message: idemkv.ClipText(e.Err.Error(), idemkv.MaxErrorMsgLen), Details: e.Details}
}

// NotExecuted marks an error after which the effect certainly did not happen (the
// request was never sent, or the downstream API refused it before acting). Do
// releases the key, so the next attempt executes afresh.
func NotExecuted(err error) error { return &notExecutedMark{err} }

// notExecutedMark is the tool's marker; *NotExecutedError is what Do returns.
type notExecutedMark struct{ err error }

func (e *notExecutedMark) Error() string { return "not executed: " + e.err.Error() }
func (e *notExecutedMark) Unwrap() error { return e.err }
