package mcpgw

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.yaml.in/yaml/v3"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
)

// ErrPolicy is wrapped by every error about a policy file.
var ErrPolicy = errors.New("mcpgw: invalid policy")

// MissingKey says what happens to a mutating call that carries no idempotency key and
// for which the policy has no key template (or the template cannot be filled).
type MissingKey string

const (
	// Refuse answers with a tool error and does not call the upstream (the default).
	Refuse MissingKey = "refuse"
	// PassThrough forwards the call unprotected, as if the gateway were not there.
	PassThrough MissingKey = "pass_through"
)

// NotExecuted says what happens to the key when the upstream answers in a way that
// means the tool did not run: its input validation refused the arguments (an isError
// result such as "input schema validation failed: ...", see validationError), or the
// request itself was refused as invalid params or an unknown tool.
type NotExecuted string

const (
	// Release frees the key, so that the model's corrected retry under the same key
	// runs (the default): nothing happened, so there is nothing to replay.
	Release NotExecuted = "release"
	// Store keeps a validation isError as a stored failure, replayed to every retry,
	// like any other tool error (the behaviour before the default changed).
	Store NotExecuted = "store"
)

// DefaultTenant is the tenant of calls when neither the policy nor the call names one.
const DefaultTenant = "default"

// DefaultToolTimeout bounds an upstream tool call when the policy does not: a hung
// upstream would otherwise hold its key for ever (the gateway heartbeats the lease
// while the call runs). Agents' own SDKs commonly give up after 60 s (the
// TypeScript SDK's default request timeout), so a call past it has no one waiting.
const DefaultToolTimeout = 60 * time.Second

// KeyDerive as a tool's key derives keys for calls that carry none (see deriveKey).
const KeyDerive = "derive"

// DefaultDeriveWindow is derive_window when the policy names none: longer than an
// agent's retries of one call usually take (its SDK's timeout and a few retries),
// short enough that a person asking for the same thing again an hour later gets it.
const DefaultDeriveWindow = 10 * time.Minute

// MaxDeriveWindow bounds derive_window: a derived key is only as good as the
// record behind it, which idemkv keeps for its TTL (default 24 h).
const MaxDeriveWindow = 24 * time.Hour

// The bounds of a policy's timeout.
const (
	MinToolTimeout = 100 * time.Millisecond
	MaxToolTimeout = 24 * time.Hour
)

// Policy is the gateway's policy file. Every field is optional: without a policy the
// gateway classifies tools by their annotations, takes keys only from _meta, refuses
// mutating calls without one, and records everything under DefaultTenant.
//
//	tenant: acme
//	tools:
//	  create_ticket:
//	    key: "{tenant}:{incident_id}:create_ticket"
//	    effect: [incident_id, title, severity]
//	    remote_id: ticket_id
//	    probe:
//	      tool: find_ticket
//	      arguments: {incident_id: "{incident_id}", title: "{title}"}
//	      found: found
//	      result: ticket
type Policy struct {
	// Tenant records calls whose _meta names no tenant.
	Tenant string `yaml:"tenant"`
	// Tenants are the tenants a call may pick with _meta["io.idemkv/tenant"]
	// besides Tenant; "*" lets it pick any. None by default: the gateway's idemkv
	// token may act for many tenants, and any agent that reaches the gateway
	// could otherwise replay or probe another tenant's receipts.
	Tenants []string `yaml:"tenants"`
	// MissingKey is the default for tools that do not set their own.
	MissingKey MissingKey `yaml:"missing_key"`
	// LeaseTTL and TTL are the defaults for tools that do not set their own; zero:
	// idemkv's defaults (30 s and 24 h).
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	TTL      time.Duration `yaml:"ttl"`
	// ValidationErrors is the default for tools that do not set their own: release
	// (the default) or store.
	ValidationErrors NotExecuted `yaml:"validation_errors"`
	// Timeout bounds every upstream call of tools that do not set their own;
	// zero: DefaultToolTimeout.
	Timeout time.Duration `yaml:"timeout"`
	// RemoteSystem names the upstream in receipts; default: the upstream server's
	// name from its initialize answer.
	RemoteSystem string `yaml:"remote_system"`
	// ApprovalInBand is the default for tools that do not set their own (false).
	ApprovalInBand *bool `yaml:"approval_in_band"`
	// Tools holds the per-tool rules, by tool name.
	Tools map[string]*ToolPolicy `yaml:"tools"`
}

// ToolPolicy is the rule for one tool.
type ToolPolicy struct {
	// Class overrides what the tool's annotations say (read_only,
	// idempotent_mutation, non_idempotent_mutation).
	Class client.Class `yaml:"class"`
	// Key is the key template used when the call carries no key, or KeyDerive:
	// the key is derived from the tenant, the caller, the tool, the canonical
	// effect and the DeriveWindow the call falls in.
	Key string `yaml:"key"`
	// DeriveWindow is how long calls with Key: derive that are the same effect by
	// the same caller are one operation (default DefaultDeriveWindow).
	DeriveWindow time.Duration `yaml:"derive_window"`
	// Effect lists the argument paths that define the side effect; empty: every
	// argument except Volatile.
	Effect []string `yaml:"effect"`
	// Volatile lists argument paths that never count (trace ids, timestamps, model
	// wording); "*" matches any member ("items.*.note"). See
	// fingerprint.CanonicalizeWithout.
	Volatile []string `yaml:"volatile"`
	// Probe looks an effect up after an attempt died with an unknown outcome; only
	// non-idempotent tools use it.
	Probe *ProbePolicy `yaml:"probe"`
	// RemoteID and RemoteURL are paths into the result's structured content that
	// name the downstream object ("ticket_id"); without RemoteID the receipt's remote
	// id is the idempotency key.
	RemoteID  string `yaml:"remote_id"`
	RemoteURL string `yaml:"remote_url"`
	// RetryableErrors: an isError answer means the effect did not happen and a retry
	// may succeed, so the key is released instead of the failure being stored.
	RetryableErrors bool `yaml:"retryable_errors"`
	// Timeout bounds the tool's upstream call (and its probe's): past it the call
	// is cancelled upstream and, for a mutating tool, its outcome is unknown (the
	// record stays pending; a retry recovers it). Zero: the policy's Timeout.
	Timeout time.Duration `yaml:"timeout"`
	// Approval is ApprovalRequired to ask a person's approval of each call's
	// effect before it runs (docs/protocol.md "Approvals"); "" or ApprovalNone: the
	// policy asks for none (an admin's rule on the server may still).
	Approval ApprovalMode `yaml:"approval"`
	// ApprovalTTL is how long a request for approval waits for a decision
	// (idemkv's default, 24 h, when zero).
	ApprovalTTL time.Duration `yaml:"approval_ttl"`
	// ApprovalSummary is the template of what the approver reads beside the
	// effect ("Refund {amount} {currency} to order {order_id}"); each argument it
	// names is quoted and clipped (approval.go). Default: the tool and its effect.
	ApprovalSummary string `yaml:"approval_summary"`
	// ApprovalInBand lets the agent's MCP client ask its user to decide, in band
	// (approval.go); default false: approvals are decided out of band.
	ApprovalInBand *bool `yaml:"approval_in_band"`
	// ValidationErrors, MissingKey, LeaseTTL and TTL override the policy-wide
	// defaults.
	ValidationErrors NotExecuted   `yaml:"validation_errors"`
	MissingKey       MissingKey    `yaml:"missing_key"`
	LeaseTTL         time.Duration `yaml:"lease_ttl"`
	TTL              time.Duration `yaml:"ttl"`
}

// ProbePolicy names an upstream tool that finds an effect by arguments.
type ProbePolicy struct {
	// Tool is the upstream tool to call.
	Tool string `yaml:"tool"`
	// Arguments maps each probe argument to a template over the original call
	// (see Template); a template that is one placeholder keeps the argument's JSON
	// type. Empty: the probe gets the original call's arguments.
	Arguments map[string]string `yaml:"arguments"`
	// Found is a path into the probe's structured result whose value says whether
	// the effect exists (true, a non-empty string, a non-zero number, a non-empty
	// object). Empty: any non-empty structured result counts as found.
	Found string `yaml:"found"`
	// Result is the path of the effect's own result inside the probe's answer; it
	// becomes the structured content of the recovered call. Empty: the whole answer.
	Result string `yaml:"result"`
}

// LoadPolicy reads and validates a policy file.
func LoadPolicy(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	p, err := ParsePolicy(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// ParsePolicy decodes and validates a policy. Unknown fields are errors: a typo in a
// policy must not silently turn protection off.
func ParsePolicy(data []byte) (*Policy, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var p Policy
	if err := dec.Decode(&p); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// Validate reports the first thing in p that cannot work.
func (p *Policy) Validate() error {
	if p.Tenant != "" {
		if err := idemkv.ValidTenant(p.Tenant); err != nil {
			return fmt.Errorf("%w: tenant: %w", ErrPolicy, err)
		}
	}
	for _, t := range p.Tenants {
		if t == AnyTenant {
			continue
		}
		if err := idemkv.ValidTenant(t); err != nil {
			return fmt.Errorf("%w: tenants: %w", ErrPolicy, err)
		}
	}
	if err := validMissingKey(p.MissingKey); err != nil {
		return fmt.Errorf("%w: missing_key: %w", ErrPolicy, err)
	}
	if err := validNotExecuted(p.ValidationErrors); err != nil {
		return fmt.Errorf("%w: validation_errors: %w", ErrPolicy, err)
	}
	if err := validDurations(p.LeaseTTL, p.TTL); err != nil {
		return fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	if err := validTimeout(p.Timeout); err != nil {
		return fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	names := make([]string, 0, len(p.Tools))
	for name := range p.Tools {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		tp := p.Tools[name]
		if tp == nil {
			continue
		}
		if _, err := compile(tp); err != nil {
			return fmt.Errorf("%w: tools.%s: %w", ErrPolicy, name, err)
		}
	}
	return nil
}

func validMissingKey(m MissingKey) error {
	switch m {
	case "", Refuse, PassThrough:
		return nil
	}
	return fmt.Errorf("%q is neither %s nor %s", m, Refuse, PassThrough)
}

func validNotExecuted(n NotExecuted) error {
	switch n {
	case "", Release, Store:
		return nil
	}
	return fmt.Errorf("%q is neither %s nor %s", n, Release, Store)
}

func validTimeout(d time.Duration) error {
	if d != 0 && (d < MinToolTimeout || d > MaxToolTimeout) {
		return fmt.Errorf("timeout %s outside [%s, %s]", d, MinToolTimeout, MaxToolTimeout)
	}
	return nil
}

func validDurations(lease, ttl time.Duration) error {
	l := idemkv.DefaultLimits()
	if lease != 0 && (lease < l.MinLeaseTTL || lease > l.MaxLeaseTTL) {
		return fmt.Errorf("lease_ttl %s outside [%s, %s]", lease, l.MinLeaseTTL, l.MaxLeaseTTL)
	}
	if ttl != 0 && (ttl < l.MinTTL || ttl > l.MaxTTL) {
		return fmt.Errorf("ttl %s outside [%s, %s]", ttl, l.MinTTL, l.MaxTTL)
	}
	return nil
}

// compiled is a ToolPolicy with its templates parsed.
type compiled struct {
	*ToolPolicy
	key       *Template
	derive    time.Duration // the window of key: derive; zero: no derived keys
	probeArgs map[string]*Template
	summary   *Template // of approval_summary; nil: the default summary
}

func compile(tp *ToolPolicy) (*compiled, error) {
	c := &compiled{ToolPolicy: tp}
	switch tp.Class {
	case "", client.ReadOnly, client.IdempotentMutation, client.NonIdempotentMutation:
	default:
		return nil, fmt.Errorf("class %q is not %s, %s or %s", tp.Class,
			client.ReadOnly, client.IdempotentMutation, client.NonIdempotentMutation)
	}
	if err := validMissingKey(tp.MissingKey); err != nil {
		return nil, fmt.Errorf("missing_key: %w", err)
	}
	if err := validNotExecuted(tp.ValidationErrors); err != nil {
		return nil, fmt.Errorf("validation_errors: %w", err)
	}
	if err := validDurations(tp.LeaseTTL, tp.TTL); err != nil {
		return nil, err
	}
	if err := validTimeout(tp.Timeout); err != nil {
		return nil, err
	}
	if err := compileApproval(c); err != nil {
		return nil, err
	}
	if tp.DeriveWindow != 0 && tp.Key != KeyDerive {
		return nil, fmt.Errorf("derive_window is only for key: %s", KeyDerive)
	}
	if tp.DeriveWindow < 0 || tp.DeriveWindow > MaxDeriveWindow || (tp.DeriveWindow != 0 && tp.DeriveWindow < time.Second) {
		return nil, fmt.Errorf("derive_window %s outside [1s, %s]", tp.DeriveWindow, MaxDeriveWindow)
	}
	if tp.Key == KeyDerive {
		c.derive = tp.DeriveWindow
		if c.derive == 0 {
			c.derive = DefaultDeriveWindow
		}
	} else if tp.Key != "" {
		t, err := ParseTemplate(tp.Key)
		if err != nil {
			return nil, fmt.Errorf("key: %w", err)
		}
		c.key = t
	}
	for _, paths := range [][]string{tp.Effect, tp.Volatile} {
		for _, p := range paths {
			if err := validPath(p); err != nil {
				return nil, err
			}
		}
	}
	for _, p := range []string{tp.RemoteID, tp.RemoteURL} {
		if p != "" {
			if err := validPath(p); err != nil {
				return nil, err
			}
		}
	}
	if c.key != nil {
		if name, v, ok := readsVolatile(c.key, tp.Volatile); ok {
			// A retry that changes it would get another key, and run again.
			return nil, fmt.Errorf("key: {%s} reads what volatile drops (%s), which may differ between retries of one operation: "+
				"a retry that changed it would get another key and run again; name only arguments that stay the same", name, v)
		}
	}
	if pr := tp.Probe; pr != nil {
		if pr.Tool == "" {
			return nil, errors.New("probe.tool is required")
		}
		for _, p := range []string{pr.Found, pr.Result} {
			if p != "" {
				if err := validPath(p); err != nil {
					return nil, fmt.Errorf("probe: %w", err)
				}
			}
		}
		c.probeArgs = make(map[string]*Template, len(pr.Arguments))
		for arg, src := range pr.Arguments {
			t, err := ParseTemplate(src)
			if err != nil {
				return nil, fmt.Errorf("probe.arguments.%s: %w", arg, err)
			}
			if name, v, ok := readsVolatile(t, tp.Volatile); ok {
				// The probe would look for the effect of the retry's value, not of the
				// dead attempt's, find nothing and let the tool run again.
				return nil, fmt.Errorf("probe.arguments.%s: {%s} reads what volatile drops (%s), which may differ between retries of one "+
					"operation: the probe of a retry that changed it would look for another effect than the dead attempt's, find none, "+
					"and run the tool again; name only arguments that stay the same", arg, name, v)
			}
			c.probeArgs[arg] = t
		}
	}
	return c, nil
}

// Classify returns the tool class (docs/protocol.md, section 4) for tool: the policy's class
// when it names one, else the annotations' verdict. readOnlyHint makes a tool read
// only; idempotentHint makes it an idempotent mutation; anything else, including no
// annotations at all, is a non-idempotent mutation, which is MCP's own default.
func Classify(tool *mcp.Tool, tp *ToolPolicy) client.Class {
	if tp != nil && tp.Class != "" {
		return tp.Class
	}
	a := tool.Annotations
	switch {
	case a == nil:
		return client.NonIdempotentMutation
	case a.ReadOnlyHint:
		return client.ReadOnly
	case a.IdempotentHint:
		return client.IdempotentMutation
	}
	return client.NonIdempotentMutation
}

// rule is everything the gateway decided about one tool.
type rule struct {
	tool       *mcp.Tool
	class      client.Class
	policy     *compiled
	missingKey MissingKey
	notExec    NotExecuted
	leaseTTL   time.Duration
	ttl        time.Duration
	timeout    time.Duration // of each upstream call
	inBand     bool          // approvals may be asked of the agent's user (approval.go)
}

func (p *Policy) rule(tool *mcp.Tool) (*rule, error) {
	tp := p.Tools[tool.Name]
	if tp == nil {
		tp = &ToolPolicy{}
	}
	c, err := compile(tp)
	if err != nil {
		return nil, err
	}
	r := &rule{tool: tool, class: Classify(tool, tp), policy: c,
		missingKey: tp.MissingKey, notExec: tp.ValidationErrors, leaseTTL: tp.LeaseTTL, ttl: tp.TTL, timeout: tp.Timeout}
	switch {
	case tp.ApprovalInBand != nil:
		r.inBand = *tp.ApprovalInBand
	case p.ApprovalInBand != nil:
		r.inBand = *p.ApprovalInBand
	}
	if r.timeout == 0 {
		r.timeout = p.Timeout
	}
	if r.timeout == 0 {
		r.timeout = DefaultToolTimeout
	}
	if r.notExec == "" {
		r.notExec = p.ValidationErrors
	}
	if r.notExec == "" {
		r.notExec = Release
	}
	if r.missingKey == "" {
		r.missingKey = p.MissingKey
	}
	if r.missingKey == "" {
		r.missingKey = Refuse
	}
	if c.Approval == ApprovalRequired {
		// A tool that needs a person's approval never runs without it: not as read only
		// (an upstream's readOnlyHint, which it may change at any list_changed, does not
		// switch approvals off), and not unkeyed (pass_through would forward it before
		// anything is reserved). The tool's own policy cannot say either
		// (compileApproval); the policy-wide missing_key gives way.
		if r.class == client.ReadOnly {
			r.class = client.NonIdempotentMutation
		}
		r.missingKey = Refuse
	}
	if r.leaseTTL == 0 {
		r.leaseTTL = p.LeaseTTL
	}
	if r.ttl == 0 {
		r.ttl = p.TTL
	}
	return r, nil
}

// AnyTenant in Policy.Tenants lets a call pick any tenant.
const AnyTenant = "*"

// mayPick reports whether a call may name tenant in its _meta.
func (p *Policy) mayPick(tenant string) bool {
	if tenant == p.tenant() {
		return true
	}
	for _, t := range p.Tenants {
		if t == AnyTenant || t == tenant {
			return true
		}
	}
	return false
}

func (p *Policy) tenant() string {
	if p.Tenant != "" {
		return p.Tenant
	}
	return DefaultTenant
}

// String describes the rule for logs.
func (r *rule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", r.tool.Name, r.class)
	if r.class == client.ReadOnly {
		return b.String()
	}
	if r.policy.key != nil {
		fmt.Fprintf(&b, ", key %s", r.policy.key)
	}
	if r.policy.derive != 0 {
		fmt.Fprintf(&b, ", key derived within %s", r.policy.derive)
	}
	if r.policy.Probe != nil {
		fmt.Fprintf(&b, ", probe %s", r.policy.Probe.Tool)
	}
	if r.policy.Approval == ApprovalRequired {
		fmt.Fprintf(&b, ", approval required (in band: %t)", r.inBand)
	}
	fmt.Fprintf(&b, ", without a key: %s", r.missingKey)
	return b.String()
}

// readsVolatile reports a placeholder of t that reads an argument at, under or above a
// volatile path (overlaps), and that path.
func readsVolatile(t *Template, volatile []string) (name, path string, ok bool) {
	for _, p := range t.parts {
		if p.name == "" || p.name == "tenant" || p.name == "tool" {
			continue
		}
		for _, v := range volatile {
			if overlaps(strings.TrimPrefix(p.name, "arguments."), v) {
				return p.name, v, true
			}
		}
	}
	return "", "", false
}
