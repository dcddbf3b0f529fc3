// The in-memory store decides as the server does: the scenarios of testdata/decisions,
// which the Go tests hold to the server's own decision functions, and the tool-call loop
// over it (issue 24, point 9). No node here.

import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ApiError, ConflictError, NotExecutedError, fingerprint, idempotent, MemoryStore, type Outcome, type ReserveResult } from "../src/index.js";
import { repoRoot } from "./harness.js";

interface Step {
  at: number;
  call: string;
  attempt?: string;
  fp?: "A" | "B";
  tool?: string;
  lease_ms?: number;
  ttl_ms?: number;
  fence?: "current" | "previous" | "never";
  remote_id?: string;
  code?: string;
  outcome?: "committed" | "not_executed";
  want: { decision?: string; fence?: "new" | "same"; error?: string; status?: string; in_doubt?: boolean; remote_id?: string; attempts?: number };
}

const FPS = { A: "sha256:" + "a0".repeat(32), B: "sha256:" + "b1".repeat(32) };
const START = 1_800_000_000_000;

describe("the in-memory store", () => {
  it("refuses a tool that requires approval rather than run it unapproved", async () => {
    const store = new MemoryStore();
    let ran = 0;
    const refund = idempotent(async (o: { order: number }) => { ran++; return o; },
      { client: store.client(), tenant: "acme", tool: "refund", key: "order", approval: { summary: "Refund" } });
    await assert.rejects(refund({ order: 1 }), (err: unknown) => err instanceof NotExecutedError && /does not model approvals/.test(err.message));
    assert.equal(ran, 0);
  });

  it("answers testdata/decisions as the server decides them", async (t) => {
    const scenarios: Array<{ name: string; steps: Step[] }> = JSON.parse(readFileSync(join(repoRoot, "testdata", "decisions", "vectors.json"), "utf8")).scenarios;
    let steps = 0;
    for (const sc of scenarios) {
      let at = 0;
      const store = new MemoryStore({ clock: () => START + at });
      const c = store.client();
      const fences: number[] = [];
      for (const [i, s] of sc.steps.entries()) {
        at = s.at;
        const where = `${sc.name}, step ${i}`;
        const fp = FPS[s.fp ?? "A"];
        let fence = fences.length > 0 ? fences[fences.length - 1] : 1;
        if (s.fence === "previous" && fences.length > 1) fence = fences[fences.length - 2];
        if (s.fence === "never") fence += 1000;
        const base = { tenant: "acme", idempotency_key: "k", effect_fingerprint: fp, fence };
        let res: ReserveResult | undefined;
        let err = "";
        try {
          switch (s.call) {
            case "reserve":
              res = await c.reserve({ tenant: "acme", idempotency_key: "k", tool: s.tool ?? "create_ticket", effect_fingerprint: fp,
                attempt_id: s.attempt, lease_ttl_ms: s.lease_ms ?? 30000, ttl_ms: s.ttl_ms ?? 86400000 });
              break;
            case "commit":
              await c.commit({ ...base, remote_system: "tickets", remote_id: s.remote_id ?? "" });
              break;
            case "fail":
              await c.fail({ ...base, error: { code: s.code ?? "", message: "failed" } });
              break;
            case "release":
              await c.release(base);
              break;
            case "heartbeat":
              await c.heartbeat({ tenant: "acme", idempotency_key: "k", fence, lease_ttl_ms: s.lease_ms ?? 30000 });
              break;
            case "doubt":
              await c.doubt(base);
              break;
            case "resolve":
              await c.resolve(s.outcome === "committed"
                ? { tenant: "acme", idempotency_key: "k", effect_fingerprint: fp, outcome: "committed", remote_system: "tickets", remote_id: s.remote_id ?? "" }
                : { tenant: "acme", idempotency_key: "k", effect_fingerprint: fp, outcome: "not_executed" });
              break;
            case "get":
              await c.get("acme", "k").catch((e: unknown) => {
                if (!(e instanceof ApiError && e.code === "not_found")) throw e;
              });
              break;
          }
        } catch (e) {
          if (!(e instanceof ApiError)) throw e;
          err = e.code;
        }
        assert.equal(err, s.want.error ?? "", where);
        if (res !== undefined) {
          assert.equal(res.decision, s.want.decision, where);
          if (s.want.fence === "new") {
            assert.ok((res.fence ?? 0) > (fences.length > 0 ? fences[fences.length - 1] : 0), where);
            fences.push(res.fence ?? 0);
          } else if (s.want.fence === "same") {
            assert.equal(res.fence, fences[fences.length - 1], where);
          }
        }
        const live = store.list()[0] as { status: string; in_doubt?: boolean; receipt?: { remote_id: string }; attempts: number } | undefined;
        if (s.want.status !== undefined) assert.equal(live?.status ?? "absent", s.want.status, where);
        if (s.want.in_doubt !== undefined) assert.equal(live?.in_doubt === true, s.want.in_doubt, where);
        if (s.want.remote_id !== undefined) assert.equal(live?.receipt?.remote_id, s.want.remote_id, where);
        if (s.want.attempts !== undefined) assert.equal(live?.attempts, s.want.attempts, where);
        steps++;
      }
    }
    assert.ok(steps >= 40);
    t.diagnostic(`in-memory store: ${scenarios.length} decision scenarios, ${steps} steps, as the server decides them`);
  });

  it("names one operation by equal key values, and refuses an object as a key", async () => {
    const store = new MemoryStore();
    const client = store.client({ leaseTtl: 5000 });
    const runs: unknown[] = [];
    const refund = idempotent(async (a: { order: unknown }) => { runs.push(a.order); return { id: "RF-1" }; },
      { client, tenant: "acme", tool: "refund", key: "order" });
    await refund({ order: 17 });
    await refund({ order: 17.0 });
    assert.deepEqual(runs, [17]);
    // String() of any object is "[object Object]": two orders would be one key.
    await assert.rejects(refund({ order: { id: 1 } }), NotExecutedError);
    await assert.rejects(refund({ order: { id: 2 } }), NotExecutedError);
    assert.deepEqual(runs, [17]);
  });

  it("runs the loop: replay, racing calls, recovery through the probe, conflict", async () => {
    const store = new MemoryStore();
    const client = store.client({ leaseTtl: 5000 });
    const made: string[] = [];
    const outs: Outcome[] = [];
    const create = async (a: { title: string }) => {
      made.push(a.title);
      return { id: `LIN-${made.length}` };
    };
    const find = async (a: { title: string }) => (made.includes(a.title) ? { id: "LIN-found" } : null);
    const once = idempotent(create, { client, tenant: "acme", tool: "create_ticket", key: "title", probe: find, onOutcome: (o) => outs.push(o) });
    const results = await Promise.all([1, 2, 3].map(() => once({ title: "Outage X" })));
    assert.deepEqual(results, [{ id: "LIN-1" }, { id: "LIN-1" }, { id: "LIN-1" }]);
    assert.deepEqual(made, ["Outage X"]);
    // A worker that died after its effect: once its lease ran out, the probe finds it.
    const res = await client.reserve({ tenant: "acme", idempotency_key: "Outage Y:create_ticket", tool: "create_ticket",
      effect_fingerprint: fingerprint({ title: "Outage Y" }), lease_ttl_ms: 5000 });
    assert.equal(res.decision, "execute");
    made.push("Outage Y");
    store.advance(6000);
    assert.deepEqual(await once({ title: "Outage Y" }), { id: "LIN-found" });
    assert.equal(outs[outs.length - 1].probed, true);
    assert.deepEqual(made, ["Outage X", "Outage Y"]);
    const other = idempotent(async (_a: { title: string; severity: string }) => ({ id: "x" }), { client, tenant: "acme", tool: "create_ticket", key: "title" });
    await assert.rejects(other({ title: "Outage X", severity: "sev1" }), ConflictError);
  });
});
