// The TypeScript worker of the cross-language test: one create_ticket call, as a
// runtime would make it (one object of arguments, key from the operation), printing what
// came back.
//
//   node worker.js ENDPOINT OPERATION TICKETS_FILE

import { Client, idempotent, operation, type Outcome } from "../typescript/src/index.js";

declare const process: { argv: string[]; stdout: { write(s: string): boolean } };

async function main(): Promise<void> {
  const [endpoint, op, tickets] = process.argv.slice(2);
  const { appendFileSync } = (await import("node:fs" as string)) as { appendFileSync(f: string, s: string): void };
  const client = new Client({ endpoints: [endpoint] });
  let outcome: Outcome | undefined;
  const createTicket = idempotent(async (_args: { title: string; severity: string }) => {
    appendFileSync(tickets, `${op} typescript\n`);
    return { id: `TCK-${op}` };
  }, {
    client, tenant: "acme", tool: "create_ticket",
    receipt: (t) => ({ remoteSystem: "tickets", remoteId: t.id }),
    onOutcome: (o) => (outcome = o),
  });
  await operation(op, () => createTicket({ title: "Outage X", severity: "sev1" }));
  process.stdout.write(JSON.stringify({ worker: "typescript", replayed: outcome?.replayed, remote_id: outcome?.receipt.remote_id,
    fingerprint: outcome?.fingerprint }) + "\n");
}

void main();
