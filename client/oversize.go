package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkv/idemkv"
)

// OmittedResultKey is the one member of the note stored in place of a tool's result
// that the server refused as too large (payload_too_large: over --max-payload-bytes,
// 64 KiB by default, or over the 1 MiB body limit). The effect happened and its receipt
// (remote system, id and URL) is what matters to a retry, so the receipt is stored
// without the result rather than not at all: an unstored receipt would leave the key
// pending, and every later attempt would probe, find the effect and be refused again.
// The Python and TypeScript clients store and recognise the same note
// (docs/protocol.md, "Results too large to store").
const OmittedResultKey = "idemkv_result_omitted"

// omittedResult is the note that stands in for a result of size bytes.
func omittedResult(size int) json.RawMessage {
	note, _ := json.Marshal(map[string]any{OmittedResultKey: map[string]any{
		"bytes": size,
		"message": fmt.Sprintf("the tool's result (%d bytes) was larger than idemkv stores; "+
			"the call did take effect and its receipt is stored without the result", size),
	}})
	return note
}

// ResultOmitted reports whether a stored result is the note that stands in for one
// too large to store: a replay then has the receipt but not the tool's result.
func ResultOmitted(result json.RawMessage) bool {
	var note map[string]json.RawMessage
	if json.Unmarshal(result, &note) != nil || len(note) != 1 {
		return false
	}
	_, ok := note[OmittedResultKey]
	return ok
}

// tooLarge reports an error that a smaller result would not have had.
func tooLarge(err error) bool { return errors.Is(err, idemkv.ErrPayloadTooLarge) }

// omittedIn says whether a receipt's stored result is the note.
func omittedIn(r *idemkv.Receipt) bool { return r != nil && ResultOmitted(r.Result) }

// fitCommit checks req before any call; a result over the body limit, which no server
// takes whatever its --max-payload-bytes, is replaced by the note at once.
func fitCommit(req *idemkv.CommitRequest) error {
	limits := idemkv.Limits{MaxPayloadBytes: idemkv.MaxRequestBytes}
	err := req.Validate(limits)
	if tooLarge(err) {
		req.Result = omittedResult(len(req.Result))
		err = req.Validate(limits)
	}
	return err
}

// storeCommit commits req, retrying as retry does; a result over this server's
// --max-payload-bytes is committed again as the note, so that the receipt is stored.
func (x *run) storeCommit(ctx context.Context, req *idemkv.CommitRequest) (*idemkv.Receipt, error) {
	commit := func(ctx context.Context) (*idemkv.Receipt, error) { return x.store.Commit(ctx, req) }
	receipt, err := retry(ctx, x, "commit", commit)
	if tooLarge(err) && !ResultOmitted(req.Result) {
		x.span.AddEvent("result_omitted", trace.WithAttributes(attribute.Int("bytes", len(req.Result))))
		req.Result = omittedResult(len(req.Result))
		receipt, err = retry(ctx, x, "commit", commit)
	}
	return receipt, err
}
