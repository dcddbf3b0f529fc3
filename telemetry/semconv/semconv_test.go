package semconv

import (
	"testing"

	"go.opentelemetry.io/otel/attribute"

	"github.com/idemkv/idemkv"
)

func asMap(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestReserveAttributes(t *testing.T) {
	req := &idemkv.ReserveRequest{Tenant: "t", Key: "k", Tool: "create_ticket", Fingerprint: "sha256:bb"}

	before := asMap(ReserveAttributes(req, nil))
	if len(before) != 4 || before[Fingerprint].AsString() != "sha256:bb" || before[Decision].Type() != attribute.EMPTY {
		t.Fatalf("before the answer: %v", before)
	}

	conflict := asMap(ReserveAttributes(req, &idemkv.ReserveResult{
		Decision: idemkv.DecisionConflict,
		Conflict: &idemkv.Conflict{Reason: idemkv.ReasonDifferentEffect, ExistingFingerprint: "sha256:aa",
			ReceivedFingerprint: "sha256:bb", ExistingRemoteID: "LIN-1"},
		Record: &idemkv.Record{Fingerprint: "sha256:aa", Fence: 9},
	}))
	// The span describes this call: its fingerprint, not the stored one; no fence was
	// granted to it, so the fence is the record's, the attempt whose outcome it hit.
	if conflict[Fingerprint].AsString() != "sha256:bb" || conflict[ConflictExistingFingerprint].AsString() != "sha256:aa" ||
		conflict[ConflictExistingRemoteID].AsString() != "LIN-1" || conflict[Decision].AsString() != "conflict" {
		t.Fatalf("conflict: %v", conflict)
	}
	if conflict[Fence].AsInt64() != 9 {
		t.Fatalf("a conflict's fence %v, want the record's 9", conflict[Fence])
	}

	// An effect sent instead of a fingerprint: the record tells what the server computed.
	byEffect := &idemkv.ReserveRequest{Tenant: "t", Key: "k", Tool: "create_ticket"}
	replay := asMap(ReserveAttributes(byEffect, &idemkv.ReserveResult{
		Decision: idemkv.DecisionReplay,
		Receipt:  &idemkv.Receipt{RemoteID: "LIN-2"},
		Record:   &idemkv.Record{Fingerprint: "sha256:cc", Fence: 4},
	}))
	if replay[Fingerprint].AsString() != "sha256:cc" || replay[ReceiptRemoteID].AsString() != "LIN-2" || replay[Fence].AsInt64() != 4 {
		t.Fatalf("replay: %v", replay)
	}
	if v := asMap([]attribute.KeyValue{FenceValue(1 << 40)})[Fence]; v.AsInt64() != 1<<40 {
		t.Fatalf("fence %v", v)
	}
}
