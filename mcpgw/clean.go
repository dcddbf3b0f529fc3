package mcpgw

import (
	"bytes"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/idemkv/idemkv/fingerprint"
)

// The go-sdk decodes every message with encoding/json, which reads some JSON silently
// otherwise than the text says: it turns invalid UTF-8 and escaped lone surrogates
// into U+FFFD, so that the idempotency keys "k\xff" and "k\xfe" in _meta would name
// one operation, and the second call would replay the first's receipt; and it keeps the
// last of two members of one name, where a proxy, a log or liftSEP3182Key may read the
// first. The gateway refuses such a tools/call before anything decodes it, on every
// transport (uncleanAnswer), and a call's arguments again before it reads them
// (prepare), for a server served without the gateway's transports. Other messages
// pass as they are: a notification or a response has nobody to refuse it to, and
// nothing in them names an operation.

// uncleanAnswer returns the answer to msg, a JSON-RPC message as it came, when msg is a
// tools/call request that encoding/json would read but not as it is written
// (fingerprint.Check): an invalid-params error with the request's id. nil otherwise.
func uncleanAnswer(msg []byte) []byte {
	msg = bytes.TrimSpace(msg)
	cerr := fingerprint.Check(msg)
	if cerr == nil {
		return nil // the common case: decoded once, by the go-sdk
	}
	m, err := jsonrpc.DecodeMessage(msg)
	if err != nil {
		return nil // not one JSON-RPC message: the go-sdk answers it
	}
	req, ok := m.(*jsonrpc.Request)
	if !ok || !req.IsCall() || req.Method != "tools/call" {
		return nil
	}
	b, err := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams,
		Message: "idemkv gateway: the call is not JSON that every reader reads alike, so it was not run: " + cerr.Error() +
			" (send text as valid UTF-8, without lone surrogates, and name each member once)"}})
	if err != nil {
		return nil
	}
	return b
}
