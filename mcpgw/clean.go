package mcpgw

import (
	"bytes"
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/idemkv/idemkv/fingerprint"
)

// The go-sdk decodes every message with encoding/json, which reads some JSON silently
// otherwise than the text says: it turns invalid UTF-8 and escaped lone surrogates
// into U+FFFD, so that the idempotency keys "k\xff" and "k\xfe" in _meta would name
// one operation, and the second call would replay the first's receipt; and it keeps the
// last of two members of one name, where a proxy, a log or liftSEP3182Key may read the
// first. The gateway refuses such a message before anything decodes it, on every
// transport (uncleanAnswer), and the arguments of a call again before it reads them
// (prepare), for a server served without the gateway's transports.

// uncleanAnswer returns the answer to msg, a JSON-RPC message as it came, when msg is
// JSON that encoding/json would read but not as it is written (fingerprint.Check); nil
// when msg is clean, or not JSON at all (the go-sdk answers that itself).
func uncleanAnswer(msg []byte) []byte {
	msg = bytes.TrimSpace(msg)
	err := fingerprint.Check(msg)
	if err == nil || !json.Valid(msg) {
		return nil
	}
	res := &jsonrpc.Response{Error: &jsonrpc.Error{Code: jsonrpc.CodeParseError,
		Message: "idemkv gateway: the message is not JSON that every reader reads alike, so it was not read: " + err.Error() +
			" (send text as valid UTF-8 and name each member once)"}}
	if m, derr := jsonrpc.DecodeMessage(msg); derr == nil {
		if req, ok := m.(*jsonrpc.Request); ok {
			res.ID = req.ID
		}
	}
	b, err := jsonrpc.EncodeMessage(res)
	if err != nil {
		return nil
	}
	return b
}
