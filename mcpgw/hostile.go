package mcpgw

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The keys under MetaPrefix are the gateway's alone (SPEC section 10): an agent reads
// io.idemkv/decision "replay" as "this did not run again", so an upstream that could
// put one there could make a first execution look like a replay, and a forged
// io.idemkv/error or warning beside the gateway's decision would say the opposite of
// what happened. Everything an upstream sends passes through here before the gateway
// reads it: tools/call results (read-only, mutating and probe calls alike), the tools
// it lists, and its progress and log notifications.
//
// A JSON object with two members of one name is read differently by different
// decoders (encoding/json and the go-sdk keep the last, others the first), so such a
// result could say one thing to the gateway and another to the agent or to whoever
// reads the stored receipt. The gateway normalises the result's own members, its
// _meta's and each content block's to one member per name, the last, which is the
// one the gateway itself decided on.

// scrubbed is an upstream's JSON object without the gateway's keys: raw with one
// member per name in the object, its _meta and (for a tools/call result) the _meta of
// each content block and of an embedded resource's resource, and nothing under
// MetaPrefix in any of those _meta. changed
// reports whether anything was removed; otherwise raw comes back as it was.
func scrubbed(raw json.RawMessage, contentBlocks bool) (out json.RawMessage, changed bool, err error) {
	ms, err := members(raw)
	if err != nil {
		return nil, false, err
	}
	ms, changed = lastOfEach(ms)
	for i := range ms {
		switch {
		case ms[i].name == "_meta":
			v, c, err := scrubbedMeta(ms[i].value)
			if err != nil {
				return nil, false, fmt.Errorf("_meta: %w", err)
			}
			ms[i].value, changed = v, changed || c
		case ms[i].name == "content" && contentBlocks:
			v, c, err := scrubbedBlocks(ms[i].value)
			if err != nil {
				return nil, false, fmt.Errorf("content: %w", err)
			}
			ms[i].value, changed = v, changed || c
		case ms[i].name == "resource" && !contentBlocks && isObject(ms[i].value):
			// An embedded resource block carries a resource with a _meta of its own.
			v, c, err := scrubbed(ms[i].value, false)
			if err != nil {
				return nil, false, fmt.Errorf("resource: %w", err)
			}
			ms[i].value, changed = v, changed || c
		}
	}
	if !changed {
		return raw, false, nil
	}
	return writeObject(ms), true, nil
}

// scrubbedMeta is a _meta object with one member per name and none under MetaPrefix.
// A _meta that is not an object (null) is left to the decoder that reads it.
func scrubbedMeta(raw json.RawMessage) (json.RawMessage, bool, error) {
	if !isObject(raw) {
		return raw, false, nil
	}
	ms, err := members(raw)
	if err != nil {
		return nil, false, err
	}
	ms, changed := lastOfEach(ms)
	kept := ms[:0]
	for _, m := range ms {
		if strings.HasPrefix(m.name, MetaPrefix) {
			changed = true
			continue
		}
		kept = append(kept, m)
	}
	if !changed {
		return raw, false, nil
	}
	return writeObject(kept), true, nil
}

// scrubbedBlocks scrubs each content block of a result's content array.
func scrubbedBlocks(raw json.RawMessage) (json.RawMessage, bool, error) {
	if !bytes.HasPrefix(bytes.TrimSpace(raw), []byte("[")) {
		return raw, false, nil
	}
	var blocks []json.RawMessage
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return nil, false, err
	}
	changed := false
	for i, b := range blocks {
		if !isObject(b) {
			continue
		}
		v, c, err := scrubbed(b, false)
		if err != nil {
			return nil, false, err
		}
		blocks[i], changed = v, changed || c
	}
	if !changed {
		return raw, false, nil
	}
	var out bytes.Buffer
	out.WriteByte('[')
	for i, b := range blocks {
		if i > 0 {
			out.WriteByte(',')
		}
		out.Write(b)
	}
	out.WriteByte(']')
	return out.Bytes(), true, nil
}

// lastOfEach keeps one member per name, the last, where the last one stood.
func lastOfEach(ms []member) ([]member, bool) {
	last := make(map[string]int, len(ms))
	for i, m := range ms {
		last[m.name] = i
	}
	if len(last) == len(ms) {
		return ms, false
	}
	out := make([]member, 0, len(last))
	for i, m := range ms {
		if last[m.name] == i {
			out = append(out, m)
		}
	}
	return out, true
}

// scrubResult is an upstream's tools/call answer as the gateway may use it: raw (nil
// when the transport could not be tapped) and res scrubbed of the gateway's keys, res
// decoded again from the scrubbed bytes so that both say the same. A result the
// gateway cannot read as an object is refused.
func scrubResult(res *mcp.CallToolResult, raw json.RawMessage) (*mcp.CallToolResult, json.RawMessage, error) {
	src := raw
	if src == nil {
		b, err := json.Marshal(res)
		if err != nil {
			return nil, nil, fmt.Errorf("encoding the upstream's result: %w", err)
		}
		src = b
	}
	clean, changed, err := scrubbed(src, true)
	if err != nil {
		return nil, nil, fmt.Errorf("the upstream's result is not a JSON object the gateway can read: %w", err)
	}
	if !changed {
		return res, raw, nil
	}
	var out mcp.CallToolResult
	if err := json.Unmarshal(clean, &out); err != nil {
		return nil, nil, fmt.Errorf("the upstream's result without the gateway's keys: %w", err)
	}
	if raw == nil {
		return &out, nil, nil
	}
	return &out, clean, nil
}

// scrubTool is a listed tool without the gateway's keys in its _meta; nil when it
// cannot be read, and then the gateway lists the tool as the go-sdk decoded it.
func scrubTool(raw json.RawMessage) json.RawMessage {
	clean, _, err := scrubbed(raw, false)
	if err != nil {
		return nil
	}
	return clean
}
