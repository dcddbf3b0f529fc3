// In-doubt records against a real idemkv node: a crashed attempt of a non-idempotent
// tool without a probe is marked in doubt, retries get InDoubtError at once without
// re-leasing the key, and a resolve (or a later caller with a probe) settles it; what
// a settling caller then stores gets a storeWait of its own.

import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { Client, InDoubtError, OutcomeUnknownError, run, type Outcome } from "../src/index.js";
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
  it("a probe's answer settles only the doubt it looked at, not one that formed anew meanwhile", async () => {
    // B probes (nothing yet) and its answer takes a while; meanwhile A settles the same
    // doubt, creates the ticket and dies, and C marks the key in doubt again. B's "not
    // found" is about the old doubt: released on it, the key ran the tool twice.
    const key = newKey("stale-probe");
    const op = { tenant: TENANT, key, tool: "create_ticket", fingerprint: "sha256:" + "d".repeat(64) };
    let tickets = 0;
    let created = false;
    const lookUp = () => (created ? { remoteSystem: "tickets", remoteId: "TCK-A" } : null);
    const died = (create: boolean) => async () => {
      if (create) {
        tickets++;
        created = true;
      }
      throw new Error("POST /tickets: timeout");
    };
    const mustNotRun = async () => {
      throw new Error("the tool ran");
    };
    assert.ok((await run(client, op, died(false)).catch((e: unknown) => e)) instanceof OutcomeUnknownError);
    assert.ok((await run(client, op, mustNotRun).catch((e: unknown) => e)) instanceof InDoubtError);

    let probes = 0;
    let probing!: () => void;
    const looked = new Promise<void>((r) => (probing = r));
    let proceed!: () => void;
    const answer = new Promise<void>((r) => (proceed = r));
    const b = run(client, {
      ...op, probe: async () => {
        const seen = lookUp();
        if (++probes === 1) {
          probing();
          await answer;
        }
        return seen;
      },
    }, async () => {
      tickets++;
      return { remoteSystem: "tickets", remoteId: "TCK-B" };
    }).catch((e: unknown) => e);
    await looked;
    assert.ok((await run(client, { ...op, probe: async () => lookUp() }, died(true)).catch((e: unknown) => e)) instanceof OutcomeUnknownError);
    assert.ok((await run(client, op, mustNotRun).catch((e: unknown) => e)) instanceof InDoubtError);
    proceed();
    const out = await b;
    assert.equal(tickets, 1, `${tickets} tickets for one operation (B: ${String(out instanceof Error ? out : JSON.stringify(out))})`);
    assert.ok(!(out instanceof Error), String(out));
    assert.equal((out as Outcome).probed, true);
    assert.equal((out as Outcome).receipt.remote_id, "TCK-A");
  });

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

  // A record left in doubt by a holder that could not learn its outcome, made at once:
  // the server marks the pending record held by the given fence.
  const leaveInDoubt = async (key: string, fingerprint: string, attempt: string) => {
    const held = await client.reserve({ tenant: TENANT, idempotency_key: key, tool: "create_ticket", effect_fingerprint: fingerprint, attempt_id: attempt, lease_ttl_ms: 30_000 });
    assert.equal(held.decision, "execute");
    const rec = await client.doubt({ tenant: TENANT, idempotency_key: key, effect_fingerprint: fingerprint, fence: held.fence ?? 0 });
    assert.equal(rec.in_doubt, true);
  };
  // A fetch that answers the first calls to a path with 503 unavailable, as a node
  // without a leader does; shed says how many, and counts down.
  const shedding = (shed: { [path: string]: number }, before?: (path: string) => Promise<void>) => (async (input: RequestInfo | URL, init?: RequestInit) => {
    const path = new URL(String(input)).pathname;
    if ((shed[path] ?? 0) > 0) {
      shed[path]--;
      return new Response(JSON.stringify({ error: { code: "unavailable", message: "no leader yet" } }), { status: 503, headers: { "Content-Type": "application/json" } });
    }
    await before?.(path);
    return fetch(input, init);
  }) as typeof fetch;

  it("a resolve that had to wait does not spend the storeWait of the receipt stored after the tool runs", async (t) => {
    // Go's underLease: storing what the tool did gets a StoreWait of its own. Here the
    // probe's resolve (not_executed) waits out 6 backoffs of 100 ms of a 1000 ms storeWait,
    // and the commit after the tool meets 5 more: within a storeWait of its own, not
    // within the 400 ms the resolve left.
    const key = newKey("indoubt-budget");
    const op = { tenant: TENANT, key, tool: "create_ticket", fingerprint: "sha256:" + "b".repeat(64) };
    await leaveInDoubt(key, op.fingerprint, "att_dead");
    let runs = 0;
    const shed = { "/v1/resolve": 6, "/v1/commit": 5 };
    const c = new Client({ endpoints: [node.httpAddr], fetch: shedding(shed), storeWait: 1000, backoffMinMs: 100, backoffMaxMs: 100 });
    const out = await run(c, { ...op, probe: async () => null }, async () => ({ remoteSystem: "tickets", remoteId: `TCK-${++runs}` }))
      .catch((e: unknown) => e);
    logOutcome(t, "after a slow resolve and a flaky commit", out);
    assert.deepEqual(shed, { "/v1/resolve": 0, "/v1/commit": 0 }, "the store did not shed the calls the test meant it to");
    assert.equal(runs, 1);
    assert.ok(!(out instanceof Error), `the tool ran but its receipt was not stored: ${String(out)}`);
    const rec = await client.get(TENANT, key);
    assert.equal(rec.status, "committed");
    assert.equal(rec.receipt?.remote_id, "TCK-1");
  });

  it("a second round of settling stores the probe's receipt within a storeWait of its own", async (t) => {
    // The first round's resolve (not_executed) waits out 6 backoffs of a 1000 ms storeWait;
    // before the call reserves again another attempt takes the key and leaves it in doubt
    // again. The second round's probe finds the effect, and its resolve (committed) meets
    // 5 more backoffs: within a storeWait of its own (Go's settleInDoubt).
    const key = newKey("indoubt-budget-again");
    const op = { tenant: TENANT, key, tool: "create_ticket", fingerprint: "sha256:" + "c".repeat(64) };
    await leaveInDoubt(key, op.fingerprint, "att_dead_1");
    const shed = { "/v1/resolve": 6 };
    let rounds = 0;
    const c = new Client({
      endpoints: [node.httpAddr], storeWait: 1000, backoffMinMs: 100, backoffMaxMs: 100,
      fetch: shedding(shed, async (path) => {
        if (path === "/v1/reserve" && rounds === 1) {
          rounds++;
          await leaveInDoubt(key, op.fingerprint, "att_dead_2");
          shed["/v1/resolve"] = 5;
        }
      }),
    });
    const probe = async () => ++rounds === 1 ? null : { remoteSystem: "tickets", remoteId: "TCK-7" };
    let runs = 0;
    const out = await run(c, { ...op, probe }, async () => ({ remoteSystem: "tickets", remoteId: `ran-${++runs}` })).catch((e: unknown) => e);
    logOutcome(t, "after two rounds of settling", out);
    assert.equal(rounds, 3, "the call did not settle twice");
    assert.equal(shed["/v1/resolve"], 0, "the store did not shed the calls the test meant it to");
    assert.equal(runs, 0);
    assert.ok(!(out instanceof Error), `the probe found the effect but it was not stored: ${String(out)}`);
    assert.equal((out as Outcome).probed, true);
    const rec = await client.get(TENANT, key);
    assert.equal(rec.status, "committed");
    assert.equal(rec.receipt?.remote_id, "TCK-7");
  });
});
