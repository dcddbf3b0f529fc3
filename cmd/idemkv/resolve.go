package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
)

// newResolveCommand settles an in-doubt record by key: no fence, no fingerprint to copy
// by hand. It reads the record first, for its fingerprint and to refuse anything that
// is not in doubt with a message a person can act on.
func newResolveCommand(cf *clientFlags) *cobra.Command {
	var (
		committed, notExecuted bool
		req                    idemkv.ResolveRequest
		result                 string
	)
	cmd := &cobra.Command{
		Use:   "resolve TENANT KEY (--committed --remote-system S --remote-id ID | --not-executed)",
		Short: "Settle an in-doubt record: the effect happened (commit its receipt) or did not (release the key)",
		Long: `An in-doubt record is a pending record whose attempt died and whose tool has no probe:
nobody can tell whether its effect happened, so every retry answers "in doubt" until a
person looks downstream and settles it. List them with idemkv ls --tenant T --in-doubt.

--committed stores the receipt you found (every retry then replays it); --not-executed
releases the key (the next retry executes afresh). Only an in-doubt record can be
resolved: a record whose attempt may still be running, or that is settled already, is
refused with not_pending.`,
		Example: `  idemkv resolve acme conversation_9:approval_17:create_ticket --committed --remote-system linear --remote-id LIN-1842
  idemkv resolve acme conversation_9:approval_17:create_ticket --not-executed`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case committed == notExecuted:
				return errors.New("give exactly one of --committed and --not-executed")
			case notExecuted && (req.RemoteSystem != "" || req.RemoteID != "" || req.RemoteURL != "" || result != ""):
				return errors.New("--not-executed takes no receipt flags")
			case committed && (req.RemoteSystem == "" || req.RemoteID == ""):
				return errors.New("--committed needs --remote-system and --remote-id: the receipt every retry will replay")
			}
			res, err := jsonFlag("result", result)
			if err != nil {
				return err
			}
			req.Tenant, req.Key, req.Result = args[0], args[1], res
			req.Outcome = idemkv.ResolveNotExecuted
			if committed {
				req.Outcome = idemkv.ResolveCommitted
			}
			return cf.run(cmd, func(ctx context.Context, c *client.Client) (any, error) {
				rec, err := c.Get(ctx, &idemkv.GetRequest{Tenant: req.Tenant, Key: req.Key})
				if err != nil {
					return nil, err
				}
				if !rec.InDoubt || rec.Status != idemkv.StatusPending {
					return nil, fmt.Errorf("%q is %s and not in doubt; only an in-doubt record can be resolved: %w",
						req.Key, rec.Status, idemkv.ErrNotPending)
				}
				req.Fingerprint = rec.Fingerprint
				out, err := c.Resolve(ctx, &req)
				if err != nil {
					return nil, err
				}
				return out, nil
			})
		},
	}
	f := cmd.Flags()
	f.BoolVar(&committed, "committed", false, "the effect happened: store the receipt below")
	f.BoolVar(&notExecuted, "not-executed", false, "the effect certainly did not happen: release the key")
	f.StringVar(&req.RemoteSystem, "remote-system", "", "downstream system (with --committed)")
	f.StringVar(&req.RemoteID, "remote-id", "", "the effect's id downstream (with --committed)")
	f.StringVar(&req.RemoteURL, "remote-url", "", "link to the effect")
	f.StringVar(&result, "result", "", "result as JSON, or @file (with --committed)")
	return cmd
}
