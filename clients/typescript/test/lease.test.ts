// The lease and the caller giving up, against a real single idemkv node (the Go client's
// lease_test.go): the heartbeat lasts exactly as long as the tool, a caller that gives
// up with its first reserve in flight is told which attempt to retry as, and the
// approval wait backs off on a store that sheds its long-polls.

import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import {
  ApiError, ApprovalPendingError, Client, IdemkvError, LeaseExpired, NotExecutedError, OutcomeUnknownError, run, StoreUnavailableError, type ToolFn,
} from "../src/index.js";
import { eventually, killAll, startNode, type IdemkvNode } from "./harness.js";
import { logOutcome as log } from "./tickets.js";

const TENANT = "tenant_lease";
let node: IdemkvNode;
let client: Client;
let seq = 0;
const newKey = (what: string) => `lease:${what}:${Date.now()}:${++seq}`;
const FP = "sha256:" + "e".repeat(64);
const delay = (ms: number) => new Promise((r) => setTimeout(r, ms));

before(async () => {
  node = await startNode();
  client = new Client({ endpoints: [node.httpAddr] });
});
after(killAll);

/**
 * A fetch to the node that counts requests by path ("/v1/heartbeat", "/v1/reserve",
 * "/v1/records") and lets a test answer some of them itself.
 */
function watched(answer?: (path: string, init: RequestInit | undefined) => Promise<Response> | undefined) {
  const counts = new Map<string, number>();
  const f = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    const path = new URL(String(input)).pathname.split("/").slice(0, 3).join("/");
    counts.set(path, (counts.get(path) ?? 0) + 1);
    return answer?.(path, init) ?? fetch(input, init);
  };
  return { fetch: f as typeof fetch, count: (path: string) => counts.get(path) ?? 0 };
}

function errorAnswer(status: number, code: string, message: string): Response {
  return new Response(JSON.stringify({ error: { code, message } }), { status, headers: { "Content-Type": "application/json" } });
}

describe("the lease lasts as long as the tool", () => {
  it("a caller that gives up does not end the lease of a tool still running", async (t) => {
    const leaseTtl = 2000;
    const key = newKey("gave-up");
    let runs = 0;
    let created = false;
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    const op = {
      tenant: TENANT, key, tool: "create_ticket", fingerprint: FP, leaseTtl,
      probe: async () => (created ? { remoteSystem: "tickets", remoteId: "TCK-1" } : null),
    };
    const caller = new AbortController();
    // A tool that does not watch its signal (an SDK call that takes none).
    const first = run(client, op, async () => {
      runs++;
      await released;
      created = true;
      return { remoteSystem: "tickets", remoteId: "TCK-1" };
    }, { signal: caller.signal }).catch((e: unknown) => e);
    await eventually(10_000, "the tool runs", () => assert.equal(runs, 1));
    const held = await client.get(TENANT, key);
    caller.abort(new Error("the user gave up"));
    // Past the lease the first worker held when its caller gave up.
    const end = Date.parse(held.lease_expires_at ?? "") + 300;
    while (Date.now() < end) await delay(50);
    const rec = await client.get(TENANT, key);
    assert.equal(rec.status, "pending");
    assert.ok(Date.parse(rec.lease_expires_at ?? "") > Date.now(), `the lease ran out while the tool ran: ${rec.lease_expires_at}`);

    const impatient = new AbortController();
    setTimeout(() => impatient.abort(new Error("the second worker's deadline")), 500);
    const second = await run(client, { ...op, actor: "worker-2" }, async () => {
      runs++;
      created = true;
      return { remoteSystem: "tickets", remoteId: "TCK-2" };
    }, { signal: impatient.signal }).catch((e: unknown) => e);
    assert.ok(second instanceof NotExecutedError && second.decision === "in_progress",
      `a second worker while the first tool still ran: ${String(second)}, want not_executed after waiting in_progress`);

    release();
    const out = await first;
    log(t, "the first worker", out);
    assert.equal(runs, 1, "the tool ran twice");
    assert.equal((await client.get(TENANT, key)).receipt?.remote_id, "TCK-1");
  });

  it("a tool that throws stops its heartbeat: the lease runs out and the next attempt recovers", async (t) => {
    const w = watched();
    const c = new Client({ endpoints: [node.httpAddr], fetch: w.fetch, leaseTtl: 1000 });
    for (const how of ["async", "sync"] as const) {
      const key = newKey(`throws-${how}`);
      const op = { tenant: TENANT, key, tool: "create_ticket", fingerprint: FP };
      // Long enough for heartbeats to run; then the tool throws, the closest to Go's panic
      // being a function that throws before it returns a promise.
      const boom = (async () => {
        await delay(600);
        throw new Error("boom");
      }) as ToolFn;
      const syncBoom: ToolFn = () => {
        throw new Error("boom");
      };
      const err = await run(c, op, how === "async" ? boom : syncBoom).catch((e: unknown) => e);
      assert.ok(err instanceof OutcomeUnknownError, `${how}: ${String(err)}`);
      const beats = w.count("/v1/heartbeat");
      await eventually(5000, "the lease runs out", async () => {
        const rec = await client.get(TENANT, key);
        assert.ok(Date.parse(rec.lease_expires_at ?? "") < Date.now(), `${how}: the lease is live: ${rec.lease_expires_at}`);
      });
      await delay(400); // more than a heartbeat's interval (333 ms)
      assert.equal(w.count("/v1/heartbeat") - beats, 0, `${how}: heartbeats after the tool threw`);
      const next = await run(client, { ...op, probe: async () => null }, async () => ({ remoteSystem: "tickets", remoteId: "TCK-next" }));
      assert.equal(next.decision, "recover");
      log(t, `${how}: the next attempt`, next);
    }
  });
});

describe("heartbeats that fail for a whole lease", () => {
  it("stop the tool: a worker that recovered the key meanwhile runs alone", async (t) => {
    // The first worker's heartbeats all fail (unavailable, not fenced); past its lease a
    // second worker recovers, probes (nothing yet) and creates the ticket. The first
    // tool checks its signal before its step that cannot be undone.
    const key = newKey("heartbeats-fail");
    let tickets = 0;
    const probe = async () => (tickets > 0 ? { remoteSystem: "tickets", remoteId: "TCK-1" } : null);
    const cut = watched((path) => path === "/v1/heartbeat" ? Promise.resolve(errorAnswer(503, "unavailable", "partitioned")) : undefined);
    const c = new Client({ endpoints: [node.httpAddr], fetch: cut.fetch, backoffMinMs: 5, backoffMaxMs: 50 });
    const op = { tenant: TENANT, key, tool: "create_ticket", fingerprint: FP, leaseTtl: 1000, probe };
    let started!: () => void;
    const running = new Promise<void>((r) => (started = r));
    let proceed!: () => void;
    const go = new Promise<void>((r) => (proceed = r));
    let reason: unknown;
    const first = run(c, op, async (ctx) => {
      started();
      await Promise.race([go, new Promise<void>((r) => ctx.signal.addEventListener("abort", () => r(), { once: true }))]);
      if (ctx.signal.aborted) {
        reason = ctx.signal.reason;
        throw ctx.signal.reason;
      }
      tickets++;
      return { remoteSystem: "tickets", remoteId: `TCK-${tickets}` };
    }).catch((e: unknown) => e);
    await running;
    const second = await run(client, op, async () => {
      tickets++;
      return { remoteSystem: "tickets", remoteId: `TCK-${tickets}` };
    });
    assert.equal(second.decision, "recover");
    proceed();
    const err = await first;
    log(t, "the first worker", err);
    assert.equal(tickets, 1, `${tickets} tickets for one operation: the first tool ran on after its lease ran out (${String(reason)})`);
    assert.ok(err instanceof OutcomeUnknownError, String(err));
    assert.ok(reason instanceof LeaseExpired, String(reason));
    assert.ok(cut.count("/v1/heartbeat") > 0);
  });
});

describe("a caller that gives up", () => {
  it("after the grant and before the tool runs gets not_executed, and the key is released", async () => {
    // Left pending, the key would wait out the lease and then be in doubt for a tool
    // that never ran (the Go client's TestCallerGivingUpBeforeTheToolRunsReleasesTheKey).
    const key = newKey("gave-up-granted");
    const caller = new AbortController();
    const store = new Proxy(client, {
      get(target, prop) {
        if (prop === "reserve") {
          return async (...args: Parameters<Client["reserve"]>) => {
            const res = await target.reserve(...args);
            caller.abort(new Error("the user gave up"));
            return res;
          };
        }
        const v = Reflect.get(target, prop, target) as unknown;
        return typeof v === "function" ? (v as (...a: unknown[]) => unknown).bind(target) : v;
      },
    });
    let runs = 0;
    const op = { tenant: TENANT, key, tool: "create_ticket", fingerprint: FP };
    const err = await run(store, op, async (ctx) => {
      if (ctx.signal.aborted) throw ctx.signal.reason;
      runs++;
      return { remoteSystem: "tickets", remoteId: "TCK-1" };
    }, { signal: caller.signal }).catch((e: unknown) => e);
    assert.equal(runs, 0);
    assert.ok(err instanceof NotExecutedError, `want not_executed, got ${String(err)} (kind ${(err as IdemkvError).kind})`);
    const gone = await client.get(TENANT, key).then(() => undefined, (e: unknown) => e);
    assert.ok(gone instanceof ApiError && gone.code === "not_found", `the key is still held: ${String(gone)}`);
    const out = await run(client, op, async () => ({ remoteSystem: "tickets", remoteId: "TCK-1" }));
    assert.equal(out.decision, "execute");
  });

  it("during its first reserve gets store_unavailable naming the attempt, and the retry as that attempt runs at once", async (t) => {
    const key = newKey("first-reserve");
    const caller = new AbortController();
    // The reserve lands on the node; the caller gives up before its answer is read.
    const w = watched((path, init) => {
      if (path !== "/v1/reserve" || caller.signal.aborted) return undefined;
      return (async () => {
        const { signal: _ignored, ...rest } = init ?? {};
        await fetch(`http://${node.httpAddr}/v1/reserve`, rest);
        caller.abort(new Error("the user gave up"));
        throw init?.signal?.reason ?? new Error("aborted");
      })();
    });
    const c = new Client({ endpoints: [node.httpAddr], fetch: w.fetch, leaseTtl: 30_000 });
    let runs = 0;
    const tool = async () => {
      runs++;
      return { remoteSystem: "tickets", remoteId: "TCK-1" };
    };
    const op = { tenant: TENANT, key, tool: "create_ticket", fingerprint: FP };
    const err = await run(c, op, tool, { signal: caller.signal }).catch((e: unknown) => e);
    assert.equal(w.count("/v1/reserve"), 1);
    assert.ok(err instanceof StoreUnavailableError && err.attemptId !== undefined && err.attemptId !== "",
      `want store_unavailable naming the attempt, got ${String(err)} (kind ${(err as IdemkvError).kind})`);
    assert.equal(runs, 0);
    const rec = await client.get(TENANT, key);
    assert.equal(rec.attempt_id, err.attemptId, "the record is held by another attempt than the error names");
    log(t, "the caller that gave up", err);

    const start = Date.now();
    const out = await run(client, { ...op, attemptId: err.attemptId }, tool);
    assert.equal(out.replayed, false);
    assert.equal(out.decision, "execute");
    assert.equal(runs, 1);
    assert.ok(Date.now() - start < 5000, "the retry waited out the 30 s lease: it was not recognised");
  });
});

describe("the approval wait", () => {
  const approved = async () => ({ remoteSystem: "refunds", remoteId: "re_1" });
  const shedding = () => watched((path) => path === "/v1/records" ? Promise.resolve(errorAnswer(429, "resource_exhausted", "too many long-polls")) : undefined);

  it("backs off on a store that sheds its long-polls, and ends with the approval's wait", async (t) => {
    const shed = shedding();
    const c = new Client({ endpoints: [node.httpAddr], fetch: shed.fetch }); // storeWait 30 s
    const start = Date.now();
    const err = await run(c, { tenant: TENANT, key: newKey("shed"), tool: "refund", effect: { order: "17" }, approval: { required: true, wait: 1000 } },
      approved).catch((e: unknown) => e);
    const ms = Date.now() - start;
    log(t, `shed long-polls, after ${ms} ms, ${shed.count("/v1/reserve")} reserves and ${shed.count("/v1/records")} gets`, err);
    assert.ok(err instanceof ApprovalPendingError, `want approval_pending past the wait of 1 s, got ${String(err)}`);
    assert.ok(ms < 4000, `the call took ${ms} ms for an approval wait of 1000 ms`);
    assert.ok(shed.count("/v1/records") >= 2, "the long-poll was not retried");
    assert.ok(shed.count("/v1/reserve") + shed.count("/v1/records") < 40, "no backoff");
  });

  it("on a store that sheds for longer than storeWait is store_unavailable", async (t) => {
    const shed = shedding();
    const c = new Client({ endpoints: [node.httpAddr], fetch: shed.fetch, storeWait: 1000 });
    const start = Date.now();
    const err = await run(c, { tenant: TENANT, key: newKey("shed-long"), tool: "refund", effect: { order: "17" }, approval: { required: true, wait: 20_000 } },
      approved).catch((e: unknown) => e);
    const ms = Date.now() - start;
    log(t, `shed long-polls, after ${ms} ms, ${shed.count("/v1/reserve")} reserves and ${shed.count("/v1/records")} gets`, err);
    assert.ok(err instanceof StoreUnavailableError, `want store_unavailable, got ${String(err)}`);
    assert.ok(ms < 4000, `the call took ${ms} ms for a storeWait of 1000 ms`);
    assert.ok(shed.count("/v1/reserve") + shed.count("/v1/records") < 40, "no backoff");
  });

  it("a caller that aborts during the wait gets approval_pending with the abort as cause; the request stays", async (t) => {
    // The wait's three places to be aborted in: a long-poll, the backoff between long-polls a
    // store sheds, and the pause after a long-poll that ended early (Go's awaitApproval).
    const early = (input: RequestInfo | URL, init?: RequestInit) => {
      const u = new URL(String(input));
      u.searchParams.delete("wait_ms");
      return fetch(u, init);
    };
    const cases: Array<[string, typeof fetch]> = [
      ["long-poll", fetch],
      ["shed long-polls", shedding().fetch],
      ["early long-poll", early as typeof fetch],
    ];
    for (const [name, f] of cases) {
      const c = new Client({ endpoints: [node.httpAddr], backoffMaxMs: 5000, fetch: f });
      const key = newKey("abort-wait");
      const op = { tenant: TENANT, key, tool: "refund", effect: { order: "17" }, approval: { required: true, wait: 20_000 } };
      let ran = 0;
      const tool = async () => {
        ran++;
        return { remoteSystem: "refunds", remoteId: "re_1" };
      };
      const gone = new Error("the caller went away");
      const caller = new AbortController();
      setTimeout(() => caller.abort(gone), 500);
      const start = Date.now();
      const err = await run(c, op, tool, { signal: caller.signal }).catch((e: unknown) => e);
      const ms = Date.now() - start;
      log(t, `${name}: aborted after ${ms} ms`, err);
      assert.ok(err instanceof ApprovalPendingError, `${name}: want approval_pending, got ${String(err)} (kind ${(err as IdemkvError).kind})`);
      assert.equal(err.cause, gone, `${name}: the abort is not the cause`);
      assert.ok(err.approvalId !== "", `${name}: no approval id`);
      assert.ok(ms < 3000, `${name}: the abort took ${ms} ms to end the call`);
      // A later call with the same key finds the same request, never a second one.
      const again = await run(client, { ...op, approval: { required: true } }, tool).catch((e: unknown) => e);
      assert.ok(again instanceof ApprovalPendingError && again.approvalId === err.approvalId,
        `${name}: a later call: ${String(again)}, want the request ${err.approvalId}`);
      assert.equal(ran, 0);
    }
  });

  it("a refused long-poll is not_executed", async () => {
    const refuse = watched((path) => path === "/v1/records" ? Promise.resolve(errorAnswer(403, "permission_denied", "token may not read")) : undefined);
    const c = new Client({ endpoints: [node.httpAddr], fetch: refuse.fetch });
    const err = await run(c, { tenant: TENANT, key: newKey("refused"), tool: "refund", effect: { order: "17" }, approval: { required: true, wait: 1000 } },
      approved).catch((e: unknown) => e);
    assert.ok(err instanceof NotExecutedError && err.decision === "needs_approval", `a refused long-poll: ${String(err)}, want not_executed`);
    assert.equal(refuse.count("/v1/records"), 1);
  });
});
