package mcpgw

import (
	"bytes"
	"encoding/json"
	"fmt"

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
//
// A batch (a JSON array of messages, which the go-sdk takes from a 2025-era client)
// that is not clean is refused whole when it holds a tools/call: each request in it
// gets the error (a ping or a tools/list beside it too, or its client would wait for
// an answer that never comes), as nothing in the batch runs; a clean call beside an
// unclean one is not picked out to run alone.
func uncleanAnswer(msg []byte) []byte {
	msg = bytes.TrimSpace(msg)
	cerr := fingerprint.Check(msg)
	if cerr == nil {
		return nil // the common case: decoded once, by the go-sdk
	}
	if len(msg) > 0 && msg[0] == '[' {
		return uncleanBatchAnswer(msg, cerr)
	}
	req := toolsCallOf(msg)
	if req == nil {
		return nil
	}
	b, err := jsonrpc.EncodeMessage(uncleanError(req.ID, cerr))
	if err != nil {
		return nil
	}
	return b
}

// toolsCallOf returns msg as a tools/call request, or nil.
func toolsCallOf(msg []byte) *jsonrpc.Request {
	if req := requestOf(msg); req != nil && req.Method == "tools/call" {
		return req
	}
	return nil
}

// requestOf returns msg as a request that expects an answer, or nil.
func requestOf(msg []byte) *jsonrpc.Request {
	m, err := jsonrpc.DecodeMessage(msg)
	if err != nil {
		return nil // not one JSON-RPC message: the go-sdk answers it
	}
	req, ok := m.(*jsonrpc.Request)
	if !ok || !req.IsCall() {
		return nil
	}
	return req
}

func uncleanError(id jsonrpc.ID, cerr error) *jsonrpc.Response {
	return &jsonrpc.Response{ID: id, Error: &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams,
		Message: "idemkv gateway: the call is not JSON that every reader reads alike, so it was not run: " + cerr.Error() +
			" (send text as valid UTF-8, without lone surrogates, and name each member once)"}}
}

// uncleanBatchAnswer answers a batch that is not clean: an array of the error for
// every tools/call in it, or nil when it holds none (or is no batch of messages).
func uncleanBatchAnswer(msg []byte, cerr error) []byte {
	var elems []json.RawMessage // each element's own bytes, as written
	if json.Unmarshal(msg, &elems) != nil {
		return nil
	}
	calls := false
	for _, e := range elems {
		calls = calls || toolsCallOf(e) != nil
	}
	if !calls {
		return nil
	}
	var answers []json.RawMessage
	for _, e := range elems {
		req := requestOf(e)
		if req == nil {
			continue
		}
		why := cerr
		if err := fingerprint.Check(e); err != nil {
			why = err
		} else {
			why = fmt.Errorf("another message of its batch is not: %w", cerr)
		}
		b, err := jsonrpc.EncodeMessage(uncleanError(req.ID, why))
		if err != nil {
			return nil
		}
		answers = append(answers, b)
	}
	if len(answers) == 0 {
		return nil
	}
	b, err := json.Marshal(answers)
	if err != nil {
		return nil
	}
	return b
}
