// What a runtime developer needs from the wrapper (issue 24), against a real node:
// oversized results, retrying as the same attempt, the one default effect, exact types
// and undefined, replays rebuilt, keys from the run's context, error classes, checks when
// idempotent() is applied, and the pass-through.

import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import {
  ApiError, Client, ConflictError, defaultEffect, fingerprint, fingerprintJSON, idempotent, MemoryStore, notExecuted, NotExecutedError, operation, OutcomeUnknownError, passthrough,
  resultOmitted, run, StoredFailureError, StoreUnavailableError, type Outcome, type Receipt, type Store,
} from "../src/index.js";
import { freePort, killAll, repoRoot, startNode, type IdemkvNode } from "./harness.js";

const TENANT = "tenant_rt";
let node: IdemkvNode;
let client: Client;
let seq = 0;
const newKey = (what: string) => `rt:${what}:${Date.now()}:${++seq}`;

before(async () => {
  node = await startNode();
  client = new Client({ endpoints: [node.httpAddr], leaseTtl: 30_000 });
});
after(killAll);

interface EffectCase {
  name: string;
  typescript?: { args: unknown[] };
  effect: unknown;
  fingerprint: string;
}

/** {"$undefined": true} in the vectors stands for undefined, which JSON cannot write. */
function revive(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(revive);
  if (typeof v === "object" && v !== null) {
    if ((v as { $undefined?: boolean }).$undefined === true) return undefined;
    const o: { [k: string]: unknown } = {};
    for (const [k, x] of Object.entries(v)) o[k] = revive(x);
    return o;
  }
  return v;
}

describe("the one default effect (point 3)", () => {
  it("agrees with testdata/effect/vectors.json", (t) => {
    const cases: EffectCase[] = JSON.parse(readFileSync(join(repoRoot, "testdata", "effect", "vectors.json"), "utf8")).cases;
    let n = 0;
    for (const c of cases) {
      if (c.typescript === undefined) continue;
      const effect = defaultEffect(revive(c.typescript.args) as unknown[]);
      assert.deepEqual(JSON.parse(JSON.stringify(effect)), c.effect, c.name);
      assert.equal(fingerprint(effect), c.fingerprint, c.name);
      n++;
    }
    assert.ok(n >= 7, `only ${n} TypeScript vectors`);
    t.diagnostic(`default effect: ${n} TypeScript vectors agree`);
  });
});

describe("the default effect tells calls apart", () => {
  // One array argument and the same values as several arguments were one effect: the
  // second call replayed the first's receipt, and its own effect never happened.
  it("one array argument and several arguments are two effects: the second conflicts, not replays", async () => {
    const store = new MemoryStore();
    const sent: string[][] = [];
    const notify = idempotent(async (...to: unknown[]) => { sent.push(to.flat() as string[]); return { n: sent.length }; },
      { client: store.client(), tenant: "acme", tool: "notify", key: () => "k1" });
    assert.deepEqual(await notify(["a", "b"]), { n: 1 });
    await assert.rejects(notify("a", "b"), ConflictError);
    assert.equal(sent.length, 1);
  });

  it("a plain object is the effect; any other single argument is the list of it", () => {
    const bare = Object.assign(Object.create(null) as object, { title: "X" });
    assert.deepEqual(defaultEffect([{ title: "X" }]), { title: "X" });
    assert.equal(defaultEffect([bare]), bare);
    assert.deepEqual(defaultEffect([["a", "b"]]), [["a", "b"]]);
    assert.deepEqual(defaultEffect(["a"]), ["a"]);
    assert.deepEqual(defaultEffect([null]), [null]);
    assert.deepEqual(defaultEffect([7, undefined]), [7]);
    class Args { constructor(readonly title: string) {} }
    const inst = new Args("X");
    assert.deepEqual(defaultEffect([inst]), [inst]);
    const when = new Date(0);
    assert.deepEqual(defaultEffect([when]), [when]);
    // No two of these shapes share a fingerprint any more.
    const fps = [[["a", "b"]], ["a", "b"], ["a"], [["a"]], [[]], [], [{}]].map((args) => fingerprint(defaultEffect(args)));
    assert.equal(new Set(fps).size, fps.length - 1, "only f() and f({}) are one effect (no arguments is the empty object)");
  });
});

describe("the effect as JSON text (Op.effectJSON)", () => {
  const tool = async () => ({ remoteSystem: "pay", remoteId: "p1" });

  it("is fingerprinted as written: numbers a decoded value may not hold are kept, and the server agrees", async () => {
    const text = '{"amount": 1e21, "account": 9007199254740992, "memo": "x"}';
    const key = newKey("json");
    // Decoded first, the same effect is refused: such doubles may already be rounded.
    await assert.rejects(run(client, { tenant: TENANT, key, tool: "pay", effect: JSON.parse(text) }, tool),
      (err: unknown) => err instanceof NotExecutedError && /2\^53/.test(err.message));
    const out = await run(client, { tenant: TENANT, key, tool: "pay", effectJSON: text }, tool);
    assert.equal(out.fingerprint, fingerprintJSON(text));
    assert.equal(out.fingerprint, fingerprintJSON(new TextEncoder().encode('{"memo":"x","account":9007199254740992,"amount":1E+21}')));
    // The same text as bytes replays; another number conflicts.
    const again = await run(client, { tenant: TENANT, key, tool: "pay", effectJSON: new TextEncoder().encode(text) }, tool);
    assert.equal(again.replayed, true);
    await assert.rejects(run(client, { tenant: TENANT, key, tool: "pay", effectJSON: '{"amount": 1e21, "account": 9007199254740994, "memo": "x"}' }, tool),
      ConflictError);
    assert.equal((await client.get(TENANT, key)).effect_fingerprint, fingerprintJSON(text));
  });

  it("refuses what JSON.parse would turn into another effect silently", async () => {
    let runs = 0;
    const counted = async () => { runs++; return { remoteSystem: "pay", remoteId: "p2" }; };
    for (const [text, why] of [
      ['{"to": "bob", "to": "eve"}', /duplicate member name/], // JSON.parse keeps "eve" alone
      ['{"account": 9007199254740993}', /send it as a string/], // JSON.parse reads ...992
      ['{"to": "bob"} x', /text after the value/],
    ] as const) {
      await assert.rejects(run(client, { tenant: TENANT, key: newKey("json-bad"), tool: "pay", effectJSON: text }, counted),
        (err: unknown) => err instanceof NotExecutedError && why.test(err.message), text);
    }
    assert.equal(runs, 0);
  });

  it("is one effect with the same value given as effect, and exclusive with effect and fingerprint", async () => {
    const key = newKey("json-same");
    await run(client, { tenant: TENANT, key, tool: "pay", effect: { a: "x", b: [1, 2.5] } }, tool);
    const r = await run(client, { tenant: TENANT, key, tool: "pay", effectJSON: '{ "b": [1, 2.50], "a": "x" }' }, tool);
    assert.equal(r.replayed, true);
    for (const op of [
      { effect: { a: 1 }, effectJSON: '{"a":1}' },
      { effectJSON: '{"a":1}', fingerprint: fingerprintJSON('{"a":1}') },
      { effectJSON: { a: 1 } as unknown as string },
    ]) {
      await assert.rejects(run(client, { tenant: TENANT, key: newKey("json-both"), tool: "pay", ...op }, tool), NotExecutedError);
    }
    // drop applies to the text as to a value.
    const d = await run(client, { tenant: TENANT, key: newKey("json-drop"), tool: "pay", effectJSON: '{"a":1,"trace":"t9"}', drop: ["trace"] }, tool);
    assert.equal(d.fingerprint, fingerprint({ a: 1 }));
  });

  it("idempotent takes it as a function of the arguments", async () => {
    let runs = 0;
    const pay = idempotent(async (argsText: string) => { runs++; return JSON.parse(argsText) as { amount: number }; },
      { client, tenant: TENANT, tool: "pay", key: () => key, effectJSON: (argsText) => argsText });
    const key = newKey("json-idem");
    await pay('{"amount": 1e21}');
    await pay('{"amount":1000000000000000000000}');
    assert.equal(runs, 1);
    assert.equal((await client.get(TENANT, key)).effect_fingerprint, fingerprintJSON('{"amount":1e21}'));
    assert.throws(() => idempotent(async (x: string) => x, { client, tenant: TENANT, tool: "pay", effect: (x) => x, effectJSON: (x) => x }), TypeError);
    assert.throws(() => idempotent(async (x: string) => x, { client, tenant: TENANT, tool: "pay", sideEffect: "read_only", effectJSON: (x) => x }), TypeError);
  });
});

describe("writes whose answers were lost (outcome_unknown)", () => {
  it("the loop retries them as before: the tool runs once and the receipt is stored", async () => {
    // The first answer of every write path is lost after the node applied the write.
    const lostOnce = new Set<string>();
    const f = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
      const res = await fetch(input, init);
      const path = new URL(String(input)).pathname;
      if (init?.method === "POST" && !lostOnce.has(path)) {
        lostOnce.add(path);
        await res.text();
        throw new TypeError("fetch failed", { cause: Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" }) });
      }
      return res;
    };
    const c = new Client({ endpoints: [node.httpAddr], fetch: f as typeof fetch, backoffMinMs: 5, backoffMaxMs: 20 });
    const key = newKey("lost");
    let runs = 0;
    const out = await run(c, { tenant: TENANT, key, tool: "send", effect: { n: 1 } }, async () => {
      runs++;
      return { remoteSystem: "mail", remoteId: "m1" };
    });
    assert.deepEqual([runs, out.replayed, out.receipt.remote_id], [1, false, "m1"]);
    assert.deepEqual([...lostOnce].sort(), ["/v1/commit", "/v1/reserve"]);
    const rec = await client.get(TENANT, key);
    assert.deepEqual([rec.status, rec.receipt?.remote_id], ["committed", "m1"]);
    // A notExecuted tool's release, its answer lost, still releases.
    lostOnce.clear();
    const key2 = newKey("lost-release");
    await assert.rejects(run(c, { tenant: TENANT, key: key2, tool: "send", effect: { n: 2 } }, async () => { throw notExecuted(new Error("refused downstream")); }),
      NotExecutedError);
    assert.ok(lostOnce.has("/v1/release"));
    await assert.rejects(client.get(TENANT, key2), (err: unknown) => err instanceof ApiError && err.code === "not_found");
  });
});

describe("undefined, as frameworks pass it (point 4)", () => {
  it("an omitted field and an undefined one are the same effect, and the call runs", async () => {
    let runs = 0;
    const create = idempotent(async (a: { title: string; severity?: string; tags?: (string | undefined)[] }) => {
      runs++;
      return { id: "LIN-4", title: a.title };
    }, { client, tenant: TENANT, tool: "create_ticket", key: () => key });
    const key = newKey("undef");
    await create({ title: "Outage X", severity: undefined, tags: ["a", undefined] });
    await create({ title: "Outage X", tags: ["a", null as unknown as undefined] });
    assert.equal(runs, 1);
  });
});

describe("oversized results (point 1)", () => {
  it("are stored as a note beside the receipt, and replays get the receipt", async () => {
    let runs = 0;
    const key = newKey("big");
    const outs: Outcome[] = [];
    const exportReport = idempotent(async (_a: { report: string }) => {
      runs++;
      return { id: "RPT-7", body: "x".repeat(100 << 10) };
    }, {
      client, tenant: TENANT, tool: "export_report", key: () => key, onOutcome: (o) => outs.push(o),
      receipt: (r) => ({ remoteSystem: "reports", remoteId: r.id }),
    });
    const first = await exportReport({ report: "q3" });
    assert.equal(first.body.length, 100 << 10, "the call that ran gets the tool's own value");
    const replay = (await exportReport({ report: "q3" })) as unknown as Receipt;
    assert.equal(runs, 1);
    assert.equal(replay.remote_id, "RPT-7");
    assert.ok(resultOmitted(replay.result));
    assert.deepEqual(outs.map((o) => [o.replayed, o.resultOmitted]), [[false, true], [true, true]]);
    assert.equal((await client.get(TENANT, key)).status, "committed");
  });
});

describe("retrying as the same attempt (point 2)", () => {
  it("StoreUnavailableError carries the attempt id, and a retry with it runs at once", async () => {
    const key = newKey("lost");
    let landed = 0;
    // The reserve reaches the real node; its answer is lost on the way back.
    const lossy: Store = Object.assign(Object.create(client) as Client, {
      reserve: async (...a: Parameters<Client["reserve"]>) => {
        await client.reserve(...a);
        landed++;
        throw new ApiError("unavailable", "the answer was lost");
      },
    });
    let runs = 0;
    const create = async (_a: { title: string }) => {
      runs++;
      return { id: "LIN-9" };
    };
    const lossyTool = idempotent(create, { client: lossy, tenant: TENANT, tool: "create_ticket" });
    const tool = idempotent(create, { client, tenant: TENANT, tool: "create_ticket" });
    const err = await operation(key, () => lossyTool({ title: "Outage X" })).then(() => undefined, (e: unknown) => e);
    assert.ok(err instanceof StoreUnavailableError, `got ${String(err)}`);
    assert.equal(landed, 1);
    assert.ok(err.attemptId !== undefined && err.attemptId !== "", "the error carries no attempt id");
    const start = Date.now();
    assert.deepEqual(await operation(key, () => tool({ title: "Outage X" }), { attemptId: err.attemptId }), { id: "LIN-9" });
    assert.equal(runs, 1);
    assert.ok(Date.now() - start < 5000, "the retry waited out the 30 s phantom lease: it was not recognised");
  });
});

describe("replays rebuilt (point 5)", () => {
  class Ticket {
    constructor(readonly id: string, readonly title: string) {}
  }
  it("deserialize and serialize", async () => {
    const key = newKey("cls");
    const create = idempotent(async (title: string) => new Ticket("LIN-5", title), {
      client, tenant: TENANT, tool: "create_ticket", key: () => key,
      serialize: (t) => ({ id: t.id, title: t.title }),
      deserialize: (s) => new Ticket((s as Ticket).id, (s as Ticket).title),
    });
    const first = await create("Outage X");
    const again = await create("Outage X");
    assert.ok(again instanceof Ticket);
    assert.deepEqual(again, first);
  });
  it("no stored result: fromReceipt, else the receipt", async () => {
    const key = newKey("resolved");
    const fp = fingerprint({ title: "Outage X" });
    const r = await client.reserve({ tenant: TENANT, idempotency_key: key, tool: "create_ticket", effect_fingerprint: fp, lease_ttl_ms: 1000 });
    await client.doubt({ tenant: TENANT, idempotency_key: key, effect_fingerprint: fp, fence: r.fence ?? 0 });
    await client.resolve({ tenant: TENANT, idempotency_key: key, effect_fingerprint: fp, outcome: "committed", remote_system: "linear", remote_id: "LIN-77" });
    const never = async (_a: { title: string }): Promise<Ticket> => {
      throw new Error("ran although resolved");
    };
    const plain = idempotent(never, { client, tenant: TENANT, tool: "create_ticket", key: () => key });
    assert.equal(((await plain({ title: "Outage X" })) as unknown as Receipt).remote_id, "LIN-77");
    const built = idempotent(never, { client, tenant: TENANT, tool: "create_ticket", key: () => key, fromReceipt: (rc) => new Ticket(rc.remote_id ?? "", "?") });
    assert.deepEqual(await built({ title: "Outage X" }), new Ticket("LIN-77", "?"));
  });
});

describe("keys from the run's context (point 6)", () => {
  it("operation(id, fn), one per concurrent run", async () => {
    const keys: string[] = [];
    const create = idempotent(async (a: { title: string }) => ({ id: a.title }), {
      client, tenant: TENANT, tool: "create_ticket", onOutcome: (o) => keys.push(o.receipt.idempotency_key),
    });
    const base = newKey("op");
    await Promise.all([0, 1, 2].map((i) => operation(`${base}:${i}`, async () => {
      await new Promise((r) => setTimeout(r, 10 * (3 - i)));
      return create({ title: `t${i}` });
    })));
    assert.deepEqual(keys.sort(), [0, 1, 2].map((i) => `${base}:${i}:create_ticket`));
    await assert.rejects(create({ title: "x" }), (e: unknown) => e instanceof NotExecutedError && /operation\(id, fn\)/.test(e.message));
  });
  it("a key from a named member of the argument", async () => {
    const outs: Outcome[] = [];
    const refund = idempotent(async (_a: { orderId: string; cents: number }) => ({ id: "RF-1" }), {
      client, tenant: TENANT, tool: "refund", key: "orderId", onOutcome: (o) => outs.push(o),
    });
    const id = newKey("order");
    await refund({ orderId: id, cents: 500 });
    await refund({ orderId: id, cents: 500 });
    assert.deepEqual(outs.map((o) => [o.receipt.idempotency_key, o.replayed]), [[`${id}:refund`, false], [`${id}:refund`, true]]);
  });
});

describe("error classes (point 7)", () => {
  class ConnectionRefused extends Error {}
  it("notExecutedOn releases the key; permanentOn is stored and replayed; others stay pending", async () => {
    let calls = 0;
    const key = newKey("cls-ne");
    const create = idempotent(async (_a: { title: string }) => {
      if (++calls === 1) throw new ConnectionRefused("downstream refused the connection");
      return { id: "LIN-3" };
    }, { client, tenant: TENANT, tool: "create_ticket", key: () => key, notExecutedOn: [ConnectionRefused] });
    await assert.rejects(create({ title: "x" }), NotExecutedError);
    // What the release left: the key's history, ended by the release.
    const tomb = await client.released(TENANT, key);
    assert.deepEqual(tomb?.history.map((e) => e.event), ["execute", "release"]);
    assert.equal(tomb?.tool, "create_ticket");
    const start = Date.now();
    assert.deepEqual(await create({ title: "x" }), { id: "LIN-3" });
    assert.ok(Date.now() - start < 5000, "the retry waited out the 30 s lease: the key was not released");
    assert.equal(await client.released(TENANT, key), undefined, "a key that holds a record again has no tombstone");

    const pkey = newKey("cls-perm");
    let pcalls = 0;
    const archived = idempotent(async (_a: { title: string }): Promise<{ id: string }> => {
      pcalls++;
      throw new RangeError("project OPS is archived");
    }, { client, tenant: TENANT, tool: "create_ticket", key: () => pkey, permanentOn: (e) => e instanceof RangeError });
    for (const replayed of [false, true]) {
      await assert.rejects(archived({ title: "x" }), (e: unknown) => e instanceof StoredFailureError && e.replayed === replayed);
    }
    assert.equal(pcalls, 1);

    const okey = newKey("cls-other");
    const boom = idempotent(async (_a: { title: string }): Promise<{ id: string }> => {
      throw new Error("boom after the effect");
    }, { client, tenant: TENANT, tool: "create_ticket", key: () => okey, notExecutedOn: [ConnectionRefused] });
    await assert.rejects(boom({ title: "x" }), OutcomeUnknownError);
    assert.equal((await client.get(TENANT, okey)).status, "pending");
  });
});

describe("checks when idempotent() is applied (point 8)", () => {
  it("refuses options that would fail every call", () => {
    const fn = async (_a: { title: string }) => ({ id: "x" });
    const base = { client, tenant: TENANT, tool: "create_ticket" };
    const bad: Array<[string, object]> = [
      ["sideEffect", { sideEffect: "non-idempotent" }],
      ["a typo", { kee: () => "k" }],
      ["leaseTtl in seconds", { leaseTtl: 30 }],
      ["drop as a string", { drop: "trace_id" }],
      ["no tool", { tool: "" }],
      ["notExecutedOn of strings", { notExecutedOn: ["TypeError"] }],
    ];
    for (const [name, extra] of bad) {
      assert.throws(() => idempotent(fn, { ...base, ...extra } as never), TypeError, name);
    }
  });
});

describe("pass-through (point 9)", () => {
  it("runs the function directly, without a store", async () => {
    const unreachable = new Client({ endpoints: ["127.0.0.1:1"], storeWait: 200 });
    const create = idempotent(async (a: { title: string }) => `made ${a.title}`, { client: unreachable, tenant: TENANT, tool: "create_ticket" });
    assert.equal(await passthrough(() => create({ title: "x" })), "made x");
    await assert.rejects(create({ title: "x" }), NotExecutedError);
  });
});

describe("fail fast when nobody listens (point 10)", () => {
  it("every endpoint refusing connections is StoreUnavailableError within connectWait; an election gets storeWait", async (t) => {
    const dead = new Client({ endpoints: [`127.0.0.1:${await freePort()}`, `127.0.0.1:${await freePort()}`] });
    let runs = 0;
    const tool = (c: Client) => idempotent(async (_a: { title: string }) => {
      runs++;
      return { id: "x" };
    }, { client: c, tenant: TENANT, tool: "create_ticket", key: "title" });
    let start = Date.now();
    await assert.rejects(tool(dead)({ title: "Outage X" }), (e: unknown) => e instanceof StoreUnavailableError && /nobody listens/.test(e.message));
    const took = Date.now() - start;
    assert.ok(took >= 2500 && took < 8000, `took ${took} ms; the default connectWait is 3000`);
    t.diagnostic(`nobody listens: StoreUnavailableError after ${took} ms`);

    const electing = new Client({
      endpoints: ["127.0.0.1:7420"], storeWait: 4000, connectWait: 1000, backoffMaxMs: 200,
      fetch: async () => new Response('{"error":{"code":"unavailable","message":"no leader"}}', { status: 503, headers: { "content-type": "application/json" } }),
    });
    start = Date.now();
    await assert.rejects(tool(electing)({ title: "Outage X" }), (e: unknown) => e instanceof StoreUnavailableError && !/nobody listens/.test(e.message));
    assert.ok(Date.now() - start >= 3500, "an answering node was given up on as if nobody listened");
    assert.equal(runs, 0);
  });
});
