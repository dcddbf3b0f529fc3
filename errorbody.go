package idemkv

import "encoding/json"

// ErrorBody is the wire shape of every error answer: {"error":{"code","message","field"}}.
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
