package main

import (
	"context"
	"fmt"

	"github.com/idemkv/idemkv"
)

// inDoubtStory is step 5: a tool without a probe dies with its outcome unknown. The
// next worker cannot find out whether the ticket exists, so the record is marked in
// doubt; retries answer "in doubt" at once instead of taking the key over again. An
// operator lists what is in doubt, looks downstream, and settles the record by key.
//
// The operator's steps are the commands printed with "$"; the program performs each
// through the client call the command makes (List with InDoubt, Resolve), so that it
// runs without an idemkv binary on the PATH.
func (rt *runtime) inDoubtStory(ctx context.Context, tickets *ticketAPI, a approval) error {
	key := rt.key(a)
	p := rt.p
	p.printf("\n5. %s: a tool with no probe; the ticket API creates the ticket, then times out.\n", a.id)
	tickets.slowAfterCreate.Store(1)
	if err := rt.handle(ctx, a, a.args, "worker-g", "worker-h"); err != nil {
		return err
	}
	p.printf("   Another delivery: in doubt at once, and the key is not taken over again.\n")
	if err := rt.handle(ctx, a, a.args, "worker-i"); err != nil {
		return err
	}

	p.printf("\n   The operator lists what is in doubt:\n   $ idemkv ls --tenant %s --in-doubt\n", tenant)
	page, err := rt.idem.List(ctx, &idemkv.ListRequest{Tenant: tenant, Prefix: rt.conversation + ":", InDoubt: true})
	if err != nil {
		return err
	}
	for _, rec := range page.Records {
		p.printf("     %s  in doubt since %s  attempts %d\n", rec.Key, rec.InDoubtSince, rec.Attempts)
	}
	if len(page.Records) != 1 || page.Records[0].Key != key {
		return fmt.Errorf("ls --in-doubt listed %d records, want %s alone", len(page.Records), key)
	}

	// The operator searches the ticket system by external id, as the probe would.
	found, err := rt.tickets.probe(key)(ctx)
	if err != nil {
		return err
	}
	if found == nil {
		p.printf("   The ticket system has no such ticket:\n   $ idemkv resolve %s %s --not-executed\n", tenant, key)
		res, err := rt.idem.Resolve(ctx, &idemkv.ResolveRequest{Tenant: tenant, Key: key,
			Fingerprint: page.Records[0].Fingerprint, Outcome: idemkv.ResolveNotExecuted})
		if err != nil {
			return err
		}
		p.printf("     released: %v\n", res.Released)
	} else {
		p.printf("   The ticket system has it as %s:\n   $ idemkv resolve %s %s --committed --remote-system %s --remote-id %s\n",
			found.RemoteID, tenant, key, found.RemoteSystem, found.RemoteID)
		res, err := rt.idem.Resolve(ctx, &idemkv.ResolveRequest{Tenant: tenant, Key: key,
			Fingerprint: page.Records[0].Fingerprint, Outcome: idemkv.ResolveCommitted,
			RemoteSystem: found.RemoteSystem, RemoteID: found.RemoteID, RemoteURL: found.RemoteURL})
		if err != nil {
			return err
		}
		p.printf("     committed %s\n", res.Receipt.RemoteID)
	}

	p.printf("\n   The next delivery gets the settled outcome.\n")
	return rt.handle(ctx, a, a.args, "worker-j")
}
