//lint:file-ignore SA1019 MCP 2026-07-28 deprecates sampling and roots (SEP-2577) but keeps them working for at least a year; an upstream may still ask for them, and the gateway relays what the agent declared it takes.

package mcpgw

import (
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// An upstream of 2026-07-28 may answer a tools/call with resultType input_required:
// it needs its user's input (elicitation, sampling, roots) before it completes the
// call (SEP-2322). The gateway has no user of its own, so it relays the request to
// the agent's: a 2026-07-28 agent gets the same input_required result, and its
// client re-issues the call with the answers and the upstream's request state, which
// the gateway passes upstream; for an agent of 2025-11-25 the go-sdk under the
// gateway asks the client on its session (elicitation/create, sampling/createMessage,
// roots/list) and calls the gateway's handler again with the answers. Nothing
// completed, so a mutating call's key was released: the re-issue reserves afresh.

// sealedPrefix starts the request state of the gateway's own approval questions
// (approval.go), which is never the upstream's to see.
const sealedPrefix = "idemkv1."

// relayInput is the answer that relays an upstream's input request to the agent, or
// nil when its client cannot take it: it did not declare the capability a request
// needs, the upstream named a request in the gateway's namespace, the upstream asks
// nothing (no requests: it is shedding load), or, in 2025-11-25, it was asked once in
// this call already (the go-sdk asks a client of that era one round).
//
// An input_required with no request cannot be relayed in either era: the go-sdk
// sends a result without input requests as resultType "complete", and a 2026-07-28
// agent got an empty result, no error, for a call that did not complete (its key
// released, nothing done).
func relayInput(req *mcp.CallToolRequest, in *inputNeeded) *mcp.CallToolResult {
	modern := modernRequest(req)
	if len(in.requests) == 0 || (!modern && len(req.Params.InputResponses) > 0) {
		return nil
	}
	caps := req.ClientCapabilities()
	for id, ir := range in.requests {
		if strings.HasPrefix(id, MetaPrefix) {
			// The gateway's own (its approval question's): an upstream's request
			// under that name would be taken for the gateway's, and never reach it.
			return nil
		}
		ok := false
		// Each request reaches the agent without the gateway's _meta keys (hostile.go).
		switch p := ir.(type) {
		case *mcp.ElicitParams:
			ok = caps != nil && caps.Elicitation != nil
			p.Meta = withoutOwnMeta(p.Meta)
		case *mcp.CreateMessageParams:
			ok = caps != nil && caps.Sampling != nil
			p.Meta = withoutOwnMeta(p.Meta)
		case *mcp.CreateMessageWithToolsParams:
			ok = caps != nil && caps.Sampling != nil
			p.Meta = withoutOwnMeta(p.Meta)
		case *mcp.ListRootsParams:
			ok = caps != nil && caps.RootsV2 != nil
			p.Meta = withoutOwnMeta(p.Meta)
		}
		if !ok {
			return nil
		}
	}
	return &mcp.CallToolResult{InputRequests: in.requests, RequestState: in.state}
}

// withInput puts on p the answers and the request state a re-issued call carries for
// the upstream: all but the gateway's own (its approval question's).
func withInput(p *mcp.CallToolParams, req *mcp.CallToolRequest) *mcp.CallToolParams {
	for id, resp := range req.Params.InputResponses {
		if id == approvalInput {
			continue
		}
		if p.InputResponses == nil {
			p.InputResponses = mcp.InputResponseMap{}
		}
		p.InputResponses[id] = resp
	}
	if s := req.Params.RequestState; s != "" && !strings.HasPrefix(s, sealedPrefix) {
		p.RequestState = s
	}
	return p
}
