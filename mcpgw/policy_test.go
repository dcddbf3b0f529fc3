package mcpgw

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/fingerprint"
)

func decodeArgs(t *testing.T, s string) any {
	t.Helper()
	c := &call{raw: json.RawMessage(s)}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	if err := dec.Decode(&c.args); err != nil {
		t.Fatal(err)
	}
	return c.args
}

func TestTemplateExpand(t *testing.T) {
	args := `{"incident_id":"INC-1","n":42,"big":12345678901234567890,"ok":true,"customer":{"id":"c_9"},
		"tenant":"from-args","obj":{},"nothing":null,"f":17.0,"e":1.7e1,"half":5e-1,"huge":1e41}`
	for _, tc := range []struct {
		tmpl, want, err string
	}{
		{tmpl: "{tenant}:{incident_id}:create_ticket", want: "acme:INC-1:create_ticket"},
		{tmpl: "{tool}/{customer.id}", want: "create_ticket/c_9"},
		{tmpl: "{ n }-{ok}", want: "42-true"},
		{tmpl: "{big}", want: "12345678901234567890"},
		// Equal numbers are one key, whatever their spelling.
		{tmpl: "o:{f}", want: "o:17"},
		{tmpl: "o:{e}", want: "o:17"},
		{tmpl: "{half}", want: "0.5"},
		{tmpl: "{huge}", err: "more than 40 digits"},
		{tmpl: "{arguments.tenant}", want: "from-args"},
		{tmpl: "{{literal}} {incident_id}", want: "{literal} INC-1"},
		{tmpl: "{missing}", err: `no argument "missing"`},
		{tmpl: "{customer.name}", err: `no argument "customer.name"`},
		{tmpl: "{obj}", err: "not a string, number or boolean"},
		{tmpl: "{nothing}", err: "is null"},
	} {
		tm, err := ParseTemplate(tc.tmpl)
		if err != nil {
			t.Fatalf("%s: %v", tc.tmpl, err)
		}
		got, err := tm.expand(scope{tenant: "acme", tool: "create_ticket", args: decodeArgs(t, args)})
		switch {
		case tc.err != "":
			if err == nil || !errors.Is(err, ErrTemplate) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want ErrTemplate with %q", tc.tmpl, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.tmpl, err)
		case got != tc.want:
			t.Errorf("%s = %q, want %q", tc.tmpl, got, tc.want)
		}
	}
}

func TestTemplateParseErrors(t *testing.T) {
	for _, src := range []string{"{open", "close}", "{}", "{a..b}", "{.a}"} {
		if _, err := ParseTemplate(src); !errors.Is(err, ErrTemplate) {
			t.Errorf("ParseTemplate(%q) = %v, want ErrTemplate", src, err)
		}
	}
}

func TestTemplateValueKeepsType(t *testing.T) {
	s := scope{tenant: "acme", args: decodeArgs(t, `{"n":7,"tags":["a"]}`)}
	lone, _ := ParseTemplate("{n}")
	if v, err := lone.value(s); err != nil || v != json.Number("7") {
		t.Errorf("{n} = %#v, %v; want the number 7", v, err)
	}
	list, _ := ParseTemplate("{tags}")
	if v, err := list.value(s); err != nil || !reflect.DeepEqual(v, []any{"a"}) {
		t.Errorf("{tags} = %#v, %v; want the array", v, err)
	}
	mixed, _ := ParseTemplate("n={n}")
	if v, err := mixed.value(s); err != nil || v != "n=7" {
		t.Errorf("n={n} = %#v, %v; want a string", v, err)
	}
}

func TestClassify(t *testing.T) {
	tool := func(a *mcp.ToolAnnotations) *mcp.Tool { return &mcp.Tool{Name: "x", Annotations: a} }
	yes := true
	for _, tc := range []struct {
		name string
		tool *mcp.Tool
		tp   *ToolPolicy
		want client.Class
	}{
		{"no annotations", tool(nil), nil, client.NonIdempotentMutation},
		{"read only", tool(&mcp.ToolAnnotations{ReadOnlyHint: true}), nil, client.ReadOnly},
		{"read only wins over idempotent", tool(&mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true}), nil, client.ReadOnly},
		{"idempotent", tool(&mcp.ToolAnnotations{IdempotentHint: true}), nil, client.IdempotentMutation},
		{"destructive only", tool(&mcp.ToolAnnotations{DestructiveHint: &yes}), nil, client.NonIdempotentMutation},
		{"policy overrides read only", tool(&mcp.ToolAnnotations{ReadOnlyHint: true}), &ToolPolicy{Class: client.NonIdempotentMutation}, client.NonIdempotentMutation},
		{"policy overrides mutation", tool(nil), &ToolPolicy{Class: client.ReadOnly}, client.ReadOnly},
		{"policy without class", tool(&mcp.ToolAnnotations{IdempotentHint: true}), &ToolPolicy{Key: "k"}, client.IdempotentMutation},
	} {
		if got := Classify(tc.tool, tc.tp); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	p, err := ParsePolicy([]byte(`
tenant: acme
missing_key: pass_through
lease_ttl: 5s
ttl: 48h
tools:
  create_ticket:
    class: non_idempotent_mutation
    key: "{tenant}:{incident_id}:create_ticket"
    effect: [incident_id, title]
    volatile: [trace_id]
    missing_key: refuse
    lease_ttl: 2s
    probe: {tool: find_ticket, found: found, result: ticket}
  list_tickets:
`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := p.rule(&mcp.Tool{Name: "create_ticket"})
	if err != nil {
		t.Fatal(err)
	}
	if r.class != client.NonIdempotentMutation || r.missingKey != Refuse || r.leaseTTL != 2*time.Second || r.ttl != 48*time.Hour ||
		r.policy.key.String() != "{tenant}:{incident_id}:create_ticket" || r.policy.Probe.Tool != "find_ticket" {
		t.Fatalf("create_ticket rule %+v", r)
	}
	other, err := p.rule(&mcp.Tool{Name: "other", Annotations: &mcp.ToolAnnotations{IdempotentHint: true}})
	if err != nil {
		t.Fatal(err)
	}
	if other.class != client.IdempotentMutation || other.missingKey != PassThrough || other.leaseTTL != 5*time.Second {
		t.Fatalf("defaults not inherited: %+v", other)
	}
	empty, err := ParsePolicy(nil)
	if err != nil || empty.tenant() != DefaultTenant {
		t.Fatalf("empty policy: %+v, %v", empty, err)
	}
}

func TestParsePolicyRejects(t *testing.T) {
	for name, src := range map[string]string{
		"unknown field":      "tenant: a\ntoolz: {}\n",
		"unknown tool field": "tools:\n  t:\n    keys: x\n",
		"bad tenant":         "tenant: 'a b'\n",
		"bad class":          "tools:\n  t:\n    class: maybe\n",
		"bad missing_key":    "missing_key: sometimes\n",
		"bad template":       "tools:\n  t:\n    key: '{unclosed'\n",
		"probe without tool": "tools:\n  t:\n    probe: {found: x}\n",
		"bad probe argument": "tools:\n  t:\n    probe: {tool: p, arguments: {a: '{'}}\n",
		"lease too short":    "lease_ttl: 10ms\n",
		"ttl too long":       "tools:\n  t:\n    ttl: 9000h\n",
		"bad effect path":    "tools:\n  t:\n    effect: ['a..b']\n",
		"not yaml":           "tenant: [\n",
		// A retry that changes a volatile argument is the same operation: it must
		// neither get another key nor probe for another effect.
		"key reads volatile":              "tools:\n  t:\n    key: '{order_id}:{trace_id}'\n    volatile: [trace_id]\n",
		"key reads under volatile":        "tools:\n  t:\n    key: '{ctx.session}'\n    volatile: [ctx]\n",
		"key reads volatile wildcard":     "tools:\n  t:\n    key: '{items.0.note}'\n    volatile: ['items.*.note']\n",
		"key reads volatile by arguments": "tools:\n  t:\n    key: '{arguments.trace_id}'\n    volatile: [trace_id]\n",
		"probe reads volatile":            "tools:\n  t:\n    volatile: [title]\n    probe: {tool: p, arguments: {title: '{title}'}}\n",
		"probe reads above volatile":      "tools:\n  t:\n    volatile: [customer.session]\n    probe: {tool: p, arguments: {c: '{customer}'}}\n",
	} {
		if _, err := ParsePolicy([]byte(src)); !errors.Is(err, ErrPolicy) {
			t.Errorf("%s: %v, want ErrPolicy", name, err)
		}
	}
}

func TestEffectOf(t *testing.T) {
	raw := `{"incident_id":"INC-1","title":"t","severity":"high","trace_id":"x","customer":{"id":"c","note":"n"}}`
	c := &call{raw: json.RawMessage(raw), args: decodeArgs(t, raw)}
	fp := func(r *rule) string {
		t.Helper()
		e, err := effectOf(r, c)
		if err != nil {
			t.Fatal(err)
		}
		s, err := fingerprint.OfValue(json.RawMessage(e), r.policy.Volatile...)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	whole := &rule{policy: &compiled{ToolPolicy: &ToolPolicy{}}}
	volatile := &rule{policy: &compiled{ToolPolicy: &ToolPolicy{Volatile: []string{"trace_id", "customer.note"}}}}
	picked := &rule{policy: &compiled{ToolPolicy: &ToolPolicy{Effect: []string{"incident_id", "customer.id", "absent"}}}}
	want, _ := fingerprint.Of([]byte(`{"incident_id":"INC-1","title":"t","severity":"high","customer":{"id":"c"}}`))
	if got := fp(volatile); got != want {
		t.Errorf("without volatile fields: %s, want %s", got, want)
	}
	if fp(whole) == want {
		t.Error("the volatile fields must count when the policy does not name them")
	}
	wantPicked, _ := fingerprint.Of([]byte(`{"incident_id":"INC-1","customer.id":"c"}`))
	if got := fp(picked); got != wantPicked {
		t.Errorf("picked effect: %s, want %s", got, wantPicked)
	}
}

func TestEncodeResultFitsTheLimit(t *testing.T) {
	big := strings.Repeat("x", 5000)
	res := &mcp.CallToolResult{
		Meta:              mcp.Meta{MetaDecision: "execute", "upstream/meta": "kept"},
		Content:           []mcp.Content{&mcp.TextContent{Text: big}},
		StructuredContent: map[string]any{"id": "T-1"},
	}
	raw, truncated, err := encodeResult(res, nil, 1<<20)
	if err != nil || truncated {
		t.Fatalf("encode: %v truncated=%v", err, truncated)
	}
	back := decodeResult(&idemkv.Receipt{Status: idemkv.StatusCommitted, Result: raw}, false)
	if back.Content[0].(*mcp.TextContent).Text != big || back.Meta["upstream/meta"] != "kept" || back.Meta[MetaDecision] != nil {
		t.Fatalf("round trip lost something or kept the gateway's meta: %+v", back)
	}

	raw, truncated, err = encodeResult(res, nil, 1000)
	if err != nil || !truncated || len(raw) > 1000 {
		t.Fatalf("limit 1000: %d bytes truncated=%v err=%v", len(raw), truncated, err)
	}
	back = decodeResult(&idemkv.Receipt{Status: idemkv.StatusCommitted, Result: raw}, false)
	if !reflect.DeepEqual(back.StructuredContent, map[string]any{"id": "T-1"}) {
		t.Fatalf("the structured content must survive: %+v", back)
	}

	res.StructuredContent = map[string]any{"blob": big}
	raw, truncated, err = encodeResult(res, nil, 1000)
	if err != nil || !truncated || len(raw) > 1000 {
		t.Fatalf("nothing fits: %d bytes truncated=%v err=%v", len(raw), truncated, err)
	}
	if back := decodeResult(&idemkv.Receipt{Result: raw}, false); !strings.Contains(back.Content[0].(*mcp.TextContent).Text, "did take effect") {
		t.Fatalf("want a note, got %+v", back)
	}
}

func TestDecodeReceiptsNotWrittenByTheGateway(t *testing.T) {
	// An operator resolved an in-doubt call with `idemkv commit` and no result.
	res := decodeResult(&idemkv.Receipt{Status: idemkv.StatusCommitted, RemoteSystem: "linear", RemoteID: "LIN-1"}, false)
	m := res.StructuredContent.(map[string]any)
	if res.IsError || m["remote_id"] != "LIN-1" || m["remote_system"] != "linear" {
		t.Fatalf("manual receipt: %+v", res)
	}
	fail := decodeFailure(&idemkv.Receipt{Status: idemkv.StatusFailed, Error: &idemkv.ErrorInfo{Code: "rejected", Message: "no"}})
	if !fail.IsError || fail.Content[0].(*mcp.TextContent).Text != "rejected: no" {
		t.Fatalf("manual failure: %+v", fail)
	}
}

func TestTruthy(t *testing.T) {
	for _, v := range []any{true, "x", json.Number("1"), 1.5, []any{1}, map[string]any{"a": 1}} {
		if !truthy(v) {
			t.Errorf("truthy(%#v) = false", v)
		}
	}
	for _, v := range []any{nil, false, "", json.Number("0"), 0.0, []any{}, map[string]any{}} {
		if truthy(v) {
			t.Errorf("truthy(%#v) = true", v)
		}
	}
}

// A key template writes an argument as every client writes a key argument
// (testdata/keytext, which the Python and TypeScript tests read too).
func TestTemplateKeyTextVectors(t *testing.T) {
	var file struct {
		Cases []struct {
			JSON string  `json:"json"`
			Key  *string `json:"key"`
		} `json:"cases"`
	}
	b, err := os.ReadFile(filepath.Join("..", "testdata", "keytext", "vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	tm, err := ParseTemplate("{v}")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range file.Cases {
		got, err := tm.expand(scope{args: decodeArgs(t, `{"v":`+c.JSON+`}`)})
		switch {
		case c.Key == nil && err == nil:
			t.Errorf("%s: key %q, want a refusal", c.JSON, got)
		case c.Key != nil && (err != nil || got != *c.Key):
			t.Errorf("%s: key %q, %v; want %q", c.JSON, got, err, *c.Key)
		}
	}
	if len(file.Cases) < 15 {
		t.Fatalf("%d cases", len(file.Cases))
	}
}

// A tool that needs approval is always reserved: an upstream's readOnlyHint and the
// policy-wide missing_key: pass_through would each run it unapproved.
func TestApprovalToolIsNeverPassedThrough(t *testing.T) {
	p, err := ParsePolicy([]byte("missing_key: pass_through\ntools: {wipe: {approval: required}, list: {}}"))
	if err != nil {
		t.Fatal(err)
	}
	readOnly := &mcp.ToolAnnotations{ReadOnlyHint: true}
	r, err := p.rule(&mcp.Tool{Name: "wipe", Annotations: readOnly})
	if err != nil {
		t.Fatal(err)
	}
	if r.class == client.ReadOnly || r.missingKey != Refuse {
		t.Errorf("wipe: class %s, missing_key %s; want a mutation that refuses a call without a key", r.class, r.missingKey)
	}
	r, err = p.rule(&mcp.Tool{Name: "list", Annotations: readOnly})
	if err != nil {
		t.Fatal(err)
	}
	if r.class != client.ReadOnly || r.missingKey != PassThrough {
		t.Errorf("list: class %s, missing_key %s; the policy's own", r.class, r.missingKey)
	}
}
