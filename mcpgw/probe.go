package mcpgw

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkv/idemkv/client"
)

// probeError is a probe that could not tell whether the effect happened.
type probeError struct{ err error }

func (e *probeError) Error() string { return "probe: " + e.err.Error() }
func (e *probeError) Unwrap() error { return e.err }

// probe calls the policy's probe tool for c, and reads its answer: found means the
// effect happened, and its result becomes the receipt.
func (g *Gateway) probe(r *rule, c *call, meta mcp.Meta) client.ProbeFunc {
	pp := r.policy.Probe
	return func(ctx context.Context) (*client.Result, error) {
		args := c.raw
		if len(r.policy.probeArgs) > 0 {
			s := scope{tenant: c.tenant, tool: r.tool.Name, args: c.args}
			obj := make(map[string]any, len(r.policy.probeArgs))
			for name, t := range r.policy.probeArgs {
				v, err := t.value(s)
				if err != nil {
					return nil, &probeError{err}
				}
				obj[name] = v
			}
			b, err := json.Marshal(obj)
			if err != nil {
				return nil, &probeError{err}
			}
			args = b
		}
		res, raw, err := g.upCall(ctx, r, g.forward(ctx, pp.Tool, args, meta), nil)
		if err != nil {
			return nil, &probeError{err}
		}
		if res.IsError {
			return nil, &probeError{&toolError{res: res}}
		}
		sc := structured(res, raw)
		if pp.Found != "" {
			v, _ := lookupPath(sc, pp.Found)
			if !truthy(v) {
				return nil, nil
			}
		} else if !truthy(sc) {
			return nil, nil
		}
		found, ok := lookupPath(sc, pp.Result)
		if !ok || found == nil {
			// Found, but not where the policy says the result is: running the tool
			// again would be the duplicate this exists to prevent.
			return nil, &probeError{fmt.Errorf("%s found the effect but its answer has no %q", pp.Tool, pp.Result)}
		}
		trace.SpanFromContext(ctx).AddEvent("probe_found", trace.WithAttributes(attribute.String("probe.tool", pp.Tool)))
		return g.receipt(r, c.key, structuredResult(found, false), nil)
	}
}
