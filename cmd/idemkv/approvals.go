package main

import (
	"context"
	"encoding/json"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
)

// newApprovalsCommand is idemkv approvals: what waits for a person, and their decision
// (docs/protocol.md "Approvals").
func newApprovalsCommand(cf *clientFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "approvals",
		Short: "List the effects that wait for approval, approve or deny them, and set the rules that require them",
		Example: `  idemkv approvals ls --tenant shop --token "$APPROVER"
  idemkv approvals approve --tenant shop --key order-17:refund --id apr_42 --fingerprint sha256:… --approver ana --reason "customer called"
  idemkv approvals deny --tenant shop --key order-17:refund --id apr_42 --fingerprint sha256:… --approver ana --reason "duplicate"
  idemkv approvals rule set --tenant shop --tool refund --ttl 4h --token "$ADMIN"`,
	}
	cmd.AddCommand(newApprovalsListCommand(cf),
		newDecideCommand(cf, idemkv.VerdictApprove, "Approve the effect a record waits for: its next reserve runs it, once"),
		newDecideCommand(cf, idemkv.VerdictDeny, "Deny it: the record fails with approval_denied, which every retry replays"),
		newRuleCommand(cf))
	return cmd
}

// approvalEntry is what approvals ls shows of a waiting approval: what to decide, and
// what approve and deny need to name it.
type approvalEntry struct {
	Key         string           `json:"idempotency_key"`
	Tool        string           `json:"tool"`
	ApprovalID  string           `json:"approval_id"`
	Summary     string           `json:"summary,omitempty"`
	Effect      json.RawMessage  `json:"effect,omitempty"`
	Fingerprint string           `json:"effect_fingerprint"`
	Actor       string           `json:"actor,omitempty"`
	ByRule      bool             `json:"by_rule,omitempty"`
	Age         string           `json:"age"`
	RequestedAt idemkv.Timestamp `json:"requested_at"`
	ExpiresAt   idemkv.Timestamp `json:"expires_at"`
}

type approvalPage struct {
	Approvals []approvalEntry `json:"approvals"`
	Next      string          `json:"next,omitempty"`
}

func newApprovalsListCommand(cf *clientFlags) *cobra.Command {
	var req idemkv.ApprovalsRequest
	var all, stale bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List a tenant's waiting approvals, oldest first, with the summary and the effect",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if stale {
				req.Consistency = idemkv.Stale
			}
			return cf.run(cmd, func(ctx context.Context, c *client.Client) (any, error) {
				return listApprovals(ctx, c, &req, all, time.Now())
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Tenant, "tenant", "", "tenant (required)")
	f.IntVar(&req.Limit, "limit", 0, "approvals per page (default 100, max 1000)")
	f.StringVar(&req.After, "after", "", "start after this cursor (the next of a previous page)")
	f.BoolVar(&all, "all", false, "follow next until the last page")
	f.BoolVar(&stale, "stale", false, "read the node's local replica")
	_ = cmd.MarkFlagRequired("tenant")
	return cmd
}

// listApprovals reads one page of waiting approvals, or with all every page, and
// shows each one's age at now (this machine's clock).
func listApprovals(ctx context.Context, c *client.Client, req *idemkv.ApprovalsRequest, all bool, now time.Time) (*approvalPage, error) {
	out := &approvalPage{Approvals: []approvalEntry{}}
	for {
		page, err := c.Approvals(ctx, req)
		if err != nil {
			return nil, err
		}
		for _, rec := range page.Approvals {
			a := rec.Approval
			out.Approvals = append(out.Approvals, approvalEntry{Key: rec.Key, Tool: rec.Tool, ApprovalID: a.ID, Summary: a.Summary,
				Effect: rec.Effect, Fingerprint: rec.Fingerprint, Actor: rec.Actor, ByRule: a.ByRule,
				Age: max(now.Sub(a.RequestedAt.Time()), 0).Truncate(time.Second).String(), RequestedAt: a.RequestedAt, ExpiresAt: a.ExpiresAt})
		}
		out.Next = page.Next
		if !all || page.Next == "" {
			return out, nil
		}
		req.After = page.Next
	}
}

func newDecideCommand(cf *clientFlags, verdict idemkv.ApprovalVerdict, short string) *cobra.Command {
	var req idemkv.DecideApprovalRequest
	cmd := &cobra.Command{
		Use:   string(verdict),
		Short: short,
		Long: short + ".\n\nThe decision names the approval id and the fingerprint you saw (idemkv approvals ls shows both): " +
			"another request under the key, or another effect, is refused with fingerprint_mismatch, and an approval " +
			"already decided or lapsed with not_pending. It takes an approver token of the tenant, or an admin's.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Decision = verdict
			return cf.run(cmd, func(ctx context.Context, c *client.Client) (any, error) { return c.DecideApproval(ctx, &req) })
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Tenant, "tenant", "", "tenant (required)")
	f.StringVar(&req.Key, "key", "", "idempotency key (required)")
	f.StringVar(&req.ApprovalID, "id", "", "the approval id you decide (required)")
	f.StringVar(&req.Fingerprint, "fingerprint", "", "the effect fingerprint you saw (required)")
	f.StringVar(&req.Approver, "approver", "", "who decides, as the record will keep it (required)")
	f.StringVar(&req.Reason, "reason", "", "why, as the record will keep it")
	for _, n := range []string{"tenant", "key", "id", "fingerprint", "approver"} {
		_ = cmd.MarkFlagRequired(n)
	}
	return cmd
}

func newRuleCommand(cf *clientFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rule",
		Short: "Rules that make every reserve of a tenant's tool wait for approval, whatever the client asks (admin)",
	}
	var tenant, tool string
	var ttl time.Duration
	var noApproval, storeEffect bool
	var masks []string
	set := &cobra.Command{
		Use:   "set",
		Short: "Require approval of every reserve of --tool in --tenant (or, with --no-approval, only store or mask its effects)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			rule := idemkv.ApprovalRule{Tenant: tenant, Tool: tool, TTLMs: ttl.Milliseconds(), StoreEffect: storeEffect, Mask: masks}
			if noApproval {
				no := false
				rule.RequireApproval = &no
			}
			req := idemkv.SetApprovalRuleRequest{ApprovalRule: rule}
			return cf.run(cmd, func(ctx context.Context, c *client.Client) (any, error) { return c.SetApprovalRule(ctx, &req) })
		},
	}
	rm := &cobra.Command{
		Use:   "rm",
		Short: "Remove the rule of --tool in --tenant (records already waiting still wait)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			req := idemkv.SetApprovalRuleRequest{ApprovalRule: idemkv.ApprovalRule{Tenant: tenant, Tool: tool}, Remove: true}
			return cf.run(cmd, func(ctx context.Context, c *client.Client) (any, error) { return c.SetApprovalRule(ctx, &req) })
		},
	}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the rules of --tenant",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return cf.run(cmd, func(ctx context.Context, c *client.Client) (any, error) { return c.ApprovalRules(ctx, tenant) })
		},
	}
	for _, c := range []*cobra.Command{set, rm, ls} {
		c.Flags().StringVar(&tenant, "tenant", "", "tenant (required)")
		_ = c.MarkFlagRequired("tenant")
		if c != ls {
			c.Flags().StringVar(&tool, "tool", "", "tool (required)")
			_ = c.MarkFlagRequired("tool")
		}
	}
	set.Flags().DurationVar(&ttl, "ttl", 0, "how long a request waits for a decision before it lapses (default 24h; 1m-720h)")
	set.Flags().BoolVar(&storeEffect, "store-effect", false, "keep the effect of every reserve of the tool, so that conflicts carry a diff")
	set.Flags().StringSliceVar(&masks, "mask", nil, `JSON Pointer whose value a stored effect keeps as "***" (repeatable; "*" matches any member or element)`)
	set.Flags().BoolVar(&noApproval, "no-approval", false, "the rule requires no approval (with --store-effect or --mask)")
	cmd.AddCommand(set, rm, ls)
	return cmd
}
