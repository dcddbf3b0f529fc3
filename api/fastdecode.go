package api

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/internal/jsonscan"
)

// fastDecode decodes the bodies that reserves and commits almost always are, and
// reports whether it did; anything else is left to decodeJSON's general path, which
// alone describes what is wrong. It takes a body only when encoding/json, after the
// checks of scanBody, would decode it to exactly the same request:
//
//   - valid UTF-8 with no backslash anywhere, so no escape needs reading and no name
//     or string can mean something other than its bytes;
//   - one object, each member named exactly (in lower case) as the request's field,
//     once; no unknown, repeated or differently cased name;
//   - strings without control characters, integers written plainly (no sign on
//     unsigned fields, no fraction, exponent or leading zero) within their type,
//     true or false for booleans, any valid JSON for a raw effect or result; no null;
//   - members that need more (expires_at, approval) sent to the general path;
//   - nothing but whitespace after the object.
//
// FuzzFastDecode holds it to encoding/json on random bodies. On the path of every
// write, it costs a fifth of the general path (BenchmarkDecodeReserve).
func fastDecode(body []byte, v any) bool {
	if bytes.IndexByte(body, '\\') >= 0 || !utf8.Valid(body) {
		return false
	}
	switch q := v.(type) {
	case *idemkv.ReserveRequest:
		var r idemkv.ReserveRequest
		if !fastObject(body, func(name []byte, val []byte) bool {
			switch string(name) {
			case "tenant":
				return fastString(val, &r.Tenant)
			case "idempotency_key":
				return fastString(val, &r.Key)
			case "tool":
				return fastString(val, &r.Tool)
			case "actor":
				return fastString(val, &r.Actor)
			case "effect_fingerprint":
				return fastString(val, &r.Fingerprint)
			case "effect":
				return fastRaw(val, &r.Effect)
			case "attempt_id":
				return fastString(val, &r.AttemptID)
			case "lease_ttl_ms":
				return fastInt(val, &r.LeaseTTLMs)
			case "ttl_ms":
				return fastInt(val, &r.TTLMs)
			case "side_effect":
				return fastString(val, &r.SideEffect)
			case "store_effect":
				return fastBool(val, &r.StoreEffect)
			}
			return false
		}) {
			return false
		}
		*q = r
		return true
	case *idemkv.CommitRequest:
		var c idemkv.CommitRequest
		if !fastObject(body, func(name []byte, val []byte) bool {
			switch string(name) {
			case "tenant":
				return fastString(val, &c.Tenant)
			case "idempotency_key":
				return fastString(val, &c.Key)
			case "effect_fingerprint":
				return fastString(val, &c.Fingerprint)
			case "fence":
				return fastUint(val, &c.Fence)
			case "remote_system":
				return fastString(val, &c.RemoteSystem)
			case "remote_id":
				return fastString(val, &c.RemoteID)
			case "remote_url":
				return fastString(val, &c.RemoteURL)
			case "result":
				return fastRaw(val, &c.Result)
			}
			return false
		}) {
			return false
		}
		*q = c
		return true
	}
	return false
}

// fastMaxMembers bounds the members fastObject takes (a request has at most a dozen):
// repeats are found by comparing every name with those before it.
const fastMaxMembers = 16

// fastObject walks the object that is the whole of body (but for whitespace) and calls
// member with each member's name and raw value, in order; it fails on anything but
// one well-formed object of at most fastMaxMembers distinct names, or when member
// fails.
func fastObject(body []byte, member func(name, value []byte) bool) bool {
	var names [fastMaxMembers][]byte
	n := 0
	return jsonscan.Object(body, func(name, value []byte) bool {
		if n == fastMaxMembers {
			return false
		}
		for _, seen := range names[:n] {
			if bytes.Equal(seen, name) {
				return false
			}
		}
		names[n] = name
		n++
		return member(name, value)
	})
}

func fastString(val []byte, into *string) bool {
	if len(val) < 2 || val[0] != '"' {
		return false
	}
	*into = string(val[1 : len(val)-1])
	return true
}

// fastDigits says whether val is an integer as JSON writes one and encoding/json
// accepts into an integer field: no fraction, no exponent, no leading zero.
func fastDigits(val []byte) bool {
	if len(val) == 0 || len(val) > 20 || (val[0] == '0' && len(val) > 1) {
		return false
	}
	for _, c := range val {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func fastInt(val []byte, into *int64) bool {
	digits := val
	if len(val) > 0 && val[0] == '-' {
		digits = val[1:]
	}
	if !fastDigits(digits) {
		return false
	}
	n, err := strconv.ParseInt(string(val), 10, 64)
	*into = n
	return err == nil
}

func fastUint(val []byte, into *uint64) bool {
	if !fastDigits(val) {
		return false
	}
	n, err := strconv.ParseUint(string(val), 10, 64)
	*into = n
	return err == nil
}

func fastBool(val []byte, into *bool) bool {
	switch string(val) {
	case "true":
		*into = true
	case "false":
		*into = false
	default:
		return false
	}
	return true
}

// fastRaw takes a raw member (an effect, a result) that is valid JSON and not null, as
// encoding/json would copy it: jsonscan found only its extent.
func fastRaw(val []byte, into *json.RawMessage) bool {
	if string(val) == "null" || !json.Valid(val) {
		return false
	}
	*into = json.RawMessage(bytes.Clone(val))
	return true
}
