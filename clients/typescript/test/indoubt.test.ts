// In-doubt records against a real idemkv node: a crashed attempt of a non-idempotent
// tool without a probe is marked in doubt, retries get InDoubtError at once without
// re-leasing the key, and a resolve (or a later caller with a probe) settles it.

import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { Client, InDoubtError, type Outcome } from "../src/index.js";
import { killAll, startNode, type IdemkvNode } from "./harness.js";
import { crashWorker, logOutcome, Tickets, wrapTickets } from "./tickets.js";

const TENANT = "tenant_ts";
let node: IdemkvNode;
let client: Client;
let seq = 0;
const newKey = (what: string) => `ts:${what}:${Date.now()}:${++seq}`;

before(async () => {
  node = await startNode();
  client = new Client({ endpoints: [node.httpAddr], leaseTtl: 1000 });
});
after(killAll);

describe("in doubt", () => {
  it("a crash without a probe is in doubt; retries answer at once; resolve settles it", async (t) => {
    const tk = new Tickets();
    const key = newKey("indoubt");
    await crashWorker(node, TENANT, key, tk.file, "after");
    const create = wrapTickets(client, TENANT, tk);
    const first = await create({ key, title: "Outage X" }).catch((e: unknown) => e);
    assert.ok(first instanceof InDoubtError, String(first));
    assert.equal(first.record?.in_doubt, true);
    logOutcome(t, "first retry", first);
    const start = Date.now();
    const second = await create({ key, title: "Outage X" }).catch((e: unknown) => e);
    const ms = Date.now() - start;
    assert.ok(second instanceof InDoubtError, String(second));
    assert.ok(ms < 1000, `the second retry took ${ms} ms`);
    // The retry did not re-lease the key: same fence, same number of attempts.
    assert.equal(second.record?.fence, first.record?.fence);
    assert.equal(second.record?.attempts, first.record?.attempts);
    logOutcome(t, `second retry (${ms} ms)`, second);
    const listed = await client.list(TENANT, { inDoubt: true });
    assert.ok(listed.records.some((r) => r.idempotency_key === key && r.in_doubt === true));
    assert.equal(tk.calls, 0);

    const [, id] = tk.lines(key)[0].split(" ");
    const fp = (await client.get(TENANT, key)).effect_fingerprint;
    await client.resolve({ tenant: TENANT, idempotency_key: key, effect_fingerprint: fp, outcome: "committed", remote_system: "tickets", remote_id: id });
    const outs: Outcome[] = [];
    const after = wrapTickets(client, TENANT, tk, { onOutcome: (o) => outs.push(o) });
    await after({ key, title: "Outage X" });
    assert.equal(outs[0].decision, "replay");
    assert.equal(outs[0].receipt.remote_id, id);
    assert.equal(tk.calls, 0);
    assert.equal(tk.lines(key).length, 1);
    logOutcome(t, "after resolve", outs[0]);
  });

  it("an in-doubt record is settled by a caller with a probe", async (t) => {
    const tk = new Tickets();
    const key = newKey("indoubt-probe");
    await crashWorker(node, TENANT, key, tk.file, "after");
    const err = await wrapTickets(client, TENANT, tk)({ key, title: "Outage X" }).catch((e: unknown) => e);
    assert.ok(err instanceof InDoubtError, String(err));
    const outs: Outcome[] = [];
    const got = await wrapTickets(client, TENANT, tk, { probe: true, onOutcome: (o) => outs.push(o) })({ key, title: "Outage X" });
    assert.equal(outs[0].probed, true);
    assert.equal(got.id, tk.lines(key)[0].split(" ")[1]);
    assert.equal(tk.calls, 0);
    logOutcome(t, "with a probe", outs[0]);
  });

  it("an in-doubt record whose effect did not happen is released by the probe and runs", async (t) => {
    const tk = new Tickets();
    const key = newKey("indoubt-none");
    await crashWorker(node, TENANT, key, tk.file, "before");
    const err = await wrapTickets(client, TENANT, tk)({ key, title: "Outage X" }).catch((e: unknown) => e);
    assert.ok(err instanceof InDoubtError, String(err));
    const outs: Outcome[] = [];
    await wrapTickets(client, TENANT, tk, { probe: true, onOutcome: (o) => outs.push(o) })({ key, title: "Outage X" });
    assert.equal(tk.calls, 1);
    assert.equal(tk.lines(key).length, 1);
    assert.equal(outs[0].decision, "execute");
    logOutcome(t, "with a probe", outs[0]);
  });
});

