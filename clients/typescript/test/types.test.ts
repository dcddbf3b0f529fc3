// The wrapper keeps the wrapped function's exact type (issue 24, point 4): this file is
// the test, by compiling. With the old signature, whose parameter types were inferred
// from key as well, once("Outage X", "sev1") was TS2554 (expected 1 argument) and the
// wrapper's type lost severity?.

import { after, before, it } from "node:test";
import assert from "node:assert/strict";
import { Client, idempotent } from "../src/index.js";
import { killAll, startNode } from "./harness.js";

let client: Client;
before(async () => {
  client = new Client({ endpoints: [(await startNode()).httpAddr] });
});
after(killAll);

async function createTicket(title: string, severity?: string): Promise<{ id: string; severity: string }> {
  return { id: `LIN-${title.length}`, severity: severity ?? "sev3" };
}

/** True only when A and B are the same type. */
type Same<A, B> = (<T>() => T extends A ? 1 : 2) extends (<T>() => T extends B ? 1 : 2) ? true : false;

it("optional parameters survive a key that takes fewer", async () => {
  const key = `types:${Date.now()}`;
  const once = idempotent(createTicket, { client, tenant: "tenant_types", tool: "create_ticket", key: (title) => `${key}:${title}` });
  const exact: Same<typeof once, typeof createTicket> = true;
  assert.equal(exact, true);
  const withSeverity = await once("Outage X", "sev1");
  const without = await once("Outage Y");
  assert.equal(withSeverity.severity, "sev1");
  assert.equal(without.severity, "sev3");
});
