package mcpgw

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"time"

	"github.com/idemkv/idemkv/fingerprint"
)

// Where a call's idempotency key comes from, first found first: the gateway's own
// _meta key (MetaIdempotencyKey); the idempotencyKey of the closed SEP-3182, the name
// clients try (a member of tools/call's params, or of its _meta); the tool's key
// template; a key derived from the call (key: derive). A 2026-07-28 client whose
// response stream broke must re-issue the request (there is no resumption), usually
// with the same arguments and no key of ours: a template or a derived key makes the
// re-issue the same operation.

// MetaSEP3182Key is the key of SEP-3182 ("Request Idempotency", closed), which put it
// in tools/call's params; the gateway reads it there and in _meta.
const MetaSEP3182Key = "idempotencyKey"

// liftSEP3182Key returns a tools/call request whose params carry idempotencyKey with
// that key copied into params._meta (unless _meta has one), where the gateway's tool
// handler can read it: the go-sdk decodes params into a type without the member.
// Anything else comes back as it was.
func liftSEP3182Key(msg []byte) []byte {
	trimmed := bytes.TrimSpace(msg)
	if !bytes.Contains(trimmed, []byte(`"`+MetaSEP3182Key+`"`)) || !isObject(trimmed) {
		return msg
	}
	ms, err := members(trimmed)
	if err != nil {
		return msg
	}
	method, params := -1, -1
	for i, m := range ms {
		switch m.name {
		case "method":
			var s string
			if json.Unmarshal(m.value, &s) == nil && s == "tools/call" {
				method = i
			}
		case "params":
			params = i
		}
	}
	if method < 0 || params < 0 || !isObject(ms[params].value) {
		return msg
	}
	ps, err := members(ms[params].value)
	if err != nil {
		return msg
	}
	var key json.RawMessage
	meta := -1
	for i, p := range ps {
		switch p.name {
		case MetaSEP3182Key:
			key = p.value
		case "_meta":
			meta = i
		}
	}
	if key == nil {
		return msg
	}
	if meta < 0 {
		ps = append(ps, member{"_meta", writeObject([]member{{MetaSEP3182Key, key}})})
	} else {
		if !isObject(ps[meta].value) {
			return msg
		}
		mm, err := members(ps[meta].value)
		if err != nil {
			return msg
		}
		for _, m := range mm {
			if m.name == MetaSEP3182Key {
				return msg
			}
		}
		ps[meta].value = writeObject(append(mm, member{MetaSEP3182Key, key}))
	}
	ms[params].value = writeObject(ps)
	out := writeObject(ms)
	if bytes.HasSuffix(msg, []byte("\n")) {
		out = append(out, '\n')
	}
	return out
}

// deriveKey is the key of a call whose tool has key: derive: a digest of the tenant,
// the caller (actor), the tool, the canonical effect (the policy's effect fields, or
// every argument but the volatile ones, in canonical JSON) and the window of length
// window that now falls in. Two calls that agree on all of them are one operation: a
// re-issued call inside the window replays, the same call made in a later window runs
// again. The trade-off: two deliberate identical calls inside one window are one, and
// a re-issue that crosses a window's end runs again.
func deriveKey(tenant, actor, tool string, effect json.RawMessage, volatile []string, window time.Duration, now time.Time) (string, error) {
	canonical, err := fingerprint.CanonicalizeWithout(effect, volatile...)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, part := range [][]byte{[]byte(tenant), []byte(actor), []byte(tool), canonical,
		[]byte(strconv.FormatInt(now.UnixNano()/int64(window), 10))} {
		h.Write([]byte(strconv.Itoa(len(part)))) // lengths keep the parts apart
		h.Write([]byte{':'})
		h.Write(part)
	}
	return "derived:" + hex.EncodeToString(h.Sum(nil)[:16]), nil
}
