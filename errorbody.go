package idemkv

import (
	"encoding/json"
	"fmt"
)

// ErrorBody is the wire shape of every error answer:
// {"error":{"code","message","field","details"}}, field and details only when set.
// The server writes it (api) and every reader parses it with ParseErrorBody, so the
// shape has one owner.
type ErrorBody struct {
	Error *Error `json:"error"`
}

// ParseErrorBody returns the *Error in an error answer's body, or nil when data is not
// idemkv's error shape (a proxy's page, say) or names no code.
func ParseErrorBody(data []byte) *Error {
	var b ErrorBody
	if json.Unmarshal(data, &b) != nil || b.Error == nil || b.Error.Code == "" {
		return nil
	}
	return b.Error
}

// ErrorDetails is what an error answer carries beyond its code and message, when there
// is more to say. Each member belongs to one answer, named beside it.
type ErrorDetails struct {
	// Released: the not_found of GET /v1/records/{tenant}/{key}?history=true for a key
	// whose record was released (or resolved not executed): the tombstone it left.
	Released *Tombstone `json:"released,omitempty"`
}

// ReleasedNotFound is the not_found answer of a read asking for the history of a key
// whose record was released and left t.
func ReleasedNotFound(t *Tombstone) *Error {
	how := EventRelease
	if len(t.History) > 0 {
		how = t.History[len(t.History)-1].Event
	}
	return &Error{Code: CodeNotFound,
		Message: fmt.Sprintf("%s/%s: no record; it was given back (%s) at %s, its history is in details.released", t.Tenant, t.Key, how, t.ReleasedAt),
		Details: &ErrorDetails{Released: t}}
}
