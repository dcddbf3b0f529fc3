// A worker process for the crash tests: it runs create_ticket through idempotent() and
// is SIGKILLed by the test while the tool is running.
//
//   node worker.js ENDPOINT TENANT KEY TICKETS_FILE after|before
//
// "after": the tool creates the ticket (a line in TICKETS_FILE), prints EFFECT, hangs.
// "before": the tool prints STARTED and hangs without creating anything.

import { appendFileSync } from "node:fs";
import { Client, idempotent } from "../src/index.js";

const [endpoint, tenant, key, tickets, mode] = process.argv.slice(2);
const client = new Client({ endpoints: [endpoint], leaseTtl: 1000 });

async function createTicket(args: { title: string }): Promise<{ id: string }> {
  if (mode === "after") {
    appendFileSync(tickets, `${key} TCK-${process.pid} ${args.title}\n`);
    process.stdout.write("EFFECT\n");
  } else {
    process.stdout.write("STARTED\n");
  }
  return new Promise(() => {}); // hangs until killed; the heartbeat keeps the lease
}

const create = idempotent(createTicket, {
  client, tenant, tool: "create_ticket", key: () => key, receipt: (t) => ({ remoteSystem: "tickets", remoteId: t.id }),
});
await create({ title: "Outage X" });
