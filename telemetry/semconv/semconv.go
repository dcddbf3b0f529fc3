// Package semconv names the span attributes of docs/protocol.md section 6, so that the client's
// tool-call spans and the server's request spans speak the same vocabulary.
//
// It depends on the OpenTelemetry API only (never the SDK or an exporter): the light
// client imports it.
package semconv

import (
	"go.opentelemetry.io/otel/attribute"

	"github.com/idemkv/idemkv"
)

// Attribute keys of docs/protocol.md section 6.
const (
	ToolName        = attribute.Key("agent.tool.name")
	ToolSideEffect  = attribute.Key("agent.tool.side_effect")
	IdempotencyKey  = attribute.Key("agent.idempotency.key")
	Fingerprint     = attribute.Key("agent.idempotency.fingerprint")
	Decision        = attribute.Key("agent.idempotency.decision")
	ReceiptRemoteID = attribute.Key("agent.idempotency.receipt.remote_id")
	Tenant          = attribute.Key("idemkv.tenant")
	Fence           = attribute.Key("idemkv.fence")
)

// Attributes beyond docs/protocol.md section 6 that make a span self-explaining: a conflict
// names the receipt it collided with, a replay says so.
const (
	ToolClass                   = attribute.Key("agent.tool.class")
	Replayed                    = attribute.Key("agent.idempotency.replayed")
	ConflictReason              = attribute.Key("agent.idempotency.conflict.reason")
	ConflictExistingFingerprint = attribute.Key("agent.idempotency.conflict.existing_fingerprint")
	ConflictExistingRemoteID    = attribute.Key("agent.idempotency.conflict.existing_remote_id")
	AttemptID                   = attribute.Key("idemkv.attempt_id")
	Attempts                    = attribute.Key("idemkv.attempts")
	// AnsweredLocally marks a reserve the node answered from its own state, with no
	// read index and no leader (docs/protocol.md "Followers").
	AnsweredLocally = attribute.Key("idemkv.answered_locally")
)

// FenceValue is the fence attribute. Fences are Raft indexes, far below 2^63.
func FenceValue(fence uint64) attribute.KeyValue {
	return Fence.Int64(int64(fence))
}

// ReserveAttributes describes a reserve and, when res is not nil, its answer.
func ReserveAttributes(req *idemkv.ReserveRequest, res *idemkv.ReserveResult) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		Tenant.String(req.Tenant),
		IdempotencyKey.String(req.Key),
		ToolName.String(req.Tool),
	}
	if req.SideEffect != "" {
		attrs = append(attrs, ToolSideEffect.String(req.SideEffect))
	}
	if res == nil {
		if req.Fingerprint != "" {
			attrs = append(attrs, Fingerprint.String(req.Fingerprint))
		}
		return attrs
	}
	attrs = append(attrs, Decision.String(string(res.Decision)))
	fp := req.Fingerprint
	if res.Record != nil {
		fp = res.Record.Fingerprint
	}
	if res.Conflict != nil {
		fp = res.Conflict.ReceivedFingerprint
		attrs = append(attrs,
			ConflictReason.String(res.Conflict.Reason),
			ConflictExistingFingerprint.String(res.Conflict.ExistingFingerprint))
		if res.Conflict.ExistingRemoteID != "" {
			attrs = append(attrs, ConflictExistingRemoteID.String(res.Conflict.ExistingRemoteID))
		}
	}
	if fp != "" {
		attrs = append(attrs, Fingerprint.String(fp))
	}
	switch {
	case res.Fence != 0:
		attrs = append(attrs, FenceValue(res.Fence))
	case res.Record != nil && res.Record.Fence != 0:
		// replay, conflict, in_progress: no fence is granted, but the record's fence
		// says which attempt's outcome the caller hears about.
		attrs = append(attrs, FenceValue(res.Record.Fence))
	}
	if res.Receipt != nil && res.Receipt.RemoteID != "" {
		attrs = append(attrs, ReceiptRemoteID.String(res.Receipt.RemoteID))
	}
	return attrs
}

// RequestAttributes describes any request of the API by what it names, before it is
// validated or decided: a request refused with a 4xx still says which tenant, key and
// effect it was about. Unknown types give nothing.
func RequestAttributes(req any) []attribute.KeyValue {
	switch r := req.(type) {
	case *idemkv.ReserveRequest:
		return ReserveAttributes(r, nil)
	case *idemkv.CommitRequest:
		return namedAttributes(r.Tenant, r.Key, r.Fingerprint, r.Fence)
	case *idemkv.FailRequest:
		return namedAttributes(r.Tenant, r.Key, r.Fingerprint, r.Fence)
	case *idemkv.ReleaseRequest:
		return namedAttributes(r.Tenant, r.Key, r.Fingerprint, r.Fence)
	case *idemkv.HeartbeatRequest:
		return namedAttributes(r.Tenant, r.Key, "", r.Fence)
	case *idemkv.GetRequest:
		return namedAttributes(r.Tenant, r.Key, "", 0)
	}
	return nil
}

// namedAttributes are the attributes of what a request names; empty values and a
// zero fence are left out.
func namedAttributes(tenant, key, fingerprint string, fence uint64) []attribute.KeyValue {
	var attrs []attribute.KeyValue
	for _, kv := range []attribute.KeyValue{Tenant.String(tenant), IdempotencyKey.String(key), Fingerprint.String(fingerprint)} {
		if kv.Value.AsString() != "" {
			attrs = append(attrs, kv)
		}
	}
	if fence != 0 {
		attrs = append(attrs, FenceValue(fence))
	}
	return attrs
}
