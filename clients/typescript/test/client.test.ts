// The low-level client against a scripted fetch: which node each attempt goes to, what
// is retried and with which body. (Everything else runs against real nodes.)

import { describe, it } from "node:test";
import assert from "node:assert/strict";
import { ApiError, Client } from "../src/index.js";

interface Sent {
  url: string;
  method: string;
  body: unknown;
  headers: Record<string, string>;
}

type Answer = { status: number; body: unknown; leader?: string } | "refused" | "reset" | "dns";

/** A fetch that records each request and answers from a script. */
function scripted(answers: Answer[]): { fetch: typeof fetch; sent: Sent[] } {
  const sent: Sent[] = [];
  const f = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    const headers = (init?.headers ?? {}) as Record<string, string>;
    sent.push({ url: String(input), method: init?.method ?? "GET", body: init?.body ? JSON.parse(String(init.body)) : undefined, headers });
    const a = answers.shift();
    if (a === undefined) throw new Error("no more scripted answers");
    if (a === "refused") throw new TypeError("fetch failed", { cause: Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" }) });
    // Sent (or perhaps sent), and the connection died before the answer.
    if (a === "reset") throw new TypeError("fetch failed", { cause: Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" }) });
    if (a === "dns") throw new TypeError("fetch failed", { cause: Object.assign(new Error("getaddrinfo ENOTFOUND a"), { code: "ENOTFOUND" }) });
    const h = new Headers({ "Content-Type": "application/json" });
    if (a.leader) h.set("Idemkv-Leader", a.leader);
    return new Response(typeof a.body === "string" ? a.body : JSON.stringify(a.body), { status: a.status, headers: h });
  };
  return { fetch: f as typeof fetch, sent };
}

const reserveReq = { tenant: "t", idempotency_key: "k", tool: "create_ticket", effect_fingerprint: "sha256:" + "0".repeat(64) };
const executed = { decision: "execute", fence: 7, record: { fence: 7 } };
const err = (code: string, status: number) => ({ status, body: { error: { code, message: code } } });

describe("client", () => {
  it("retries outcome_unknown with the same attempt id, and unavailable on the next endpoint", async () => {
    const { fetch, sent } = scripted([err("outcome_unknown", 503), "refused", err("unavailable", 503), { status: 200, body: executed }]);
    const c = new Client({ endpoints: ["a:1", "b:2"], fetch, backoffMinMs: 1, backoffMaxMs: 2, token: "tok" });
    const res = await c.reserve(reserveReq);
    assert.equal(res.fence, 7);
    assert.equal(sent.length, 4);
    const ids = sent.map((s) => (s.body as { attempt_id: string }).attempt_id);
    assert.match(ids[0], /^att_[0-9a-f]{24}$/);
    assert.deepEqual(new Set(ids).size, 1, "every retry carries the first attempt id");
    // a, then b after a failed, then a after b failed, ...
    assert.deepEqual(sent.map((s) => new URL(s.url).host), ["a:1", "b:2", "a:1", "b:2"]);
    assert.equal(sent[0].headers.Authorization, "Bearer tok");
  });

  it("goes to the leader a node names, and leaves it when it fails", async () => {
    const { fetch, sent } = scripted([
      { status: 200, body: { records: [] }, leader: "c:3" },
      { status: 200, body: { records: [] } },
      "refused",
      { status: 200, body: { records: [] } },
      // A node bound to a wildcard address names nothing a client can dial.
      { status: 200, body: { records: [] }, leader: "0.0.0.0:7420" },
      { status: 200, body: { records: [] } },
    ]);
    const c = new Client({ endpoints: ["a:1", "b:2"], fetch, backoffMinMs: 1, backoffMaxMs: 2 });
    await c.list("t");
    assert.equal(c.leader, "http://c:3");
    await c.list("t");
    await c.list("t"); // c:3 refuses: forgotten, the next endpoint answers
    await c.list("t");
    await c.list("t");
    assert.deepEqual(sent.map((s) => new URL(s.url).host), ["a:1", "c:3", "c:3", "a:1", "a:1", "a:1"]);
    assert.equal(c.leader, "");
  });

  it("does not read an endless answer to its end", async () => {
    // A node (or anything posing as one) that answers without end does not make the
    // client read until it runs out of memory: past the bound the answer is one cut short.
    const bound = 64 << 20;
    let pulled = 0;
    const chunk = new Uint8Array(1 << 20).fill(0x61);
    const endless: typeof fetch = async () => new Response(new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(new TextEncoder().encode('{"tenant":"'));
      },
      pull(controller) {
        if (pulled >= 3 * bound) {
          controller.close();
          return;
        }
        pulled += chunk.length;
        controller.enqueue(chunk);
      },
    }), { status: 200, headers: { "Content-Type": "application/json" } });
    const c = new Client({ endpoints: ["a:1"], fetch: endless, maxAttempts: 1 });
    await assert.rejects(c.get("t", "k"), (e: unknown) => e instanceof ApiError && e.code === "unavailable" && /larger than/.test(e.message));
    assert.ok(pulled < bound + (4 << 20), `the client read ${pulled >> 20} MiB of one answer`);
  });

  it("does not follow again, for a while, a leader that gave no answer at all", async () => {
    // A node behind a load balancer names its in-cluster address, which this client
    // cannot reach: followed on every answer, every call paid a failed attempt first.
    const { fetch, sent } = scripted([
      { status: 200, body: { records: [] }, leader: "c:3" },
      "refused",
      { status: 200, body: { records: [] }, leader: "c:3" },
      { status: 200, body: { records: [] }, leader: "c:3" },
      { status: 200, body: { records: [] } },
    ]);
    const c = new Client({ endpoints: ["a:1"], fetch, backoffMinMs: 1, backoffMaxMs: 2 });
    await c.list("t");
    await c.list("t"); // c:3 refuses; a:1 answers, naming c:3 again
    await c.list("t");
    await c.list("t");
    assert.deepEqual(sent.map((s) => new URL(s.url).host), ["a:1", "c:3", "a:1", "a:1", "a:1"]);
    assert.equal(c.leader, "");
  });

  it("follows again a leader that answered an error (a 503 during an election)", async () => {
    const { fetch, sent } = scripted([
      { status: 200, body: { records: [] }, leader: "c:3" },
      err("unavailable", 503),
      { status: 200, body: { records: [] }, leader: "c:3" },
      { status: 200, body: { records: [] } },
    ]);
    const c = new Client({ endpoints: ["a:1"], fetch, backoffMinMs: 1, backoffMaxMs: 2 });
    await c.list("t");
    await c.list("t"); // c:3 answers 503; a:1 answers, naming c:3 again
    await c.list("t");
    assert.deepEqual(sent.map((s) => new URL(s.url).host), ["a:1", "c:3", "a:1", "c:3"]);
  });

  it("does not follow a leader of another scheme than the endpoints'", async () => {
    // From https to http it would send the token and every request in plain text.
    const { fetch, sent } = scripted([
      { status: 200, body: { records: [] }, leader: "http://c:3" },
      { status: 200, body: { records: [] } },
    ]);
    const c = new Client({ endpoints: ["https://a:1"], fetch, token: "tok", backoffMinMs: 1, backoffMaxMs: 2 });
    await c.list("t");
    await c.list("t");
    assert.equal(c.leader, "");
    assert.deepEqual(sent.map((s) => new URL(s.url).origin), ["https://a:1", "https://a:1"]);
  });

  it("does not retry an answer that is not about availability", async () => {
    const { fetch, sent } = scripted([err("fenced", 409)]);
    const c = new Client({ endpoints: ["a:1"], fetch });
    await assert.rejects(c.commit({ ...reserveReq, fence: 3, remote_system: "x", remote_id: "y" }),
      (e: unknown) => e instanceof ApiError && e.code === "fenced" && e.status === 409);
    assert.equal(sent.length, 1);
  });

  it("a proxy's 502 page is unavailable and retried; maxAttempts bounds the retries", async () => {
    const { fetch, sent } = scripted([{ status: 502, body: "<html>bad gateway</html>" }, { status: 502, body: "<html>bad gateway</html>" }, { status: 502, body: "x" }]);
    const c = new Client({ endpoints: ["a:1"], fetch, maxAttempts: 3, backoffMinMs: 1, backoffMaxMs: 2 });
    await assert.rejects(c.cluster(), (e: unknown) => e instanceof ApiError && e.code === "unavailable" && e.status === 502);
    assert.equal(sent.length, 3);
  });

  it("a proxy's 502 or 504 to a write is outcome_unknown and retried; a 503, a read's, or idemkv's own body is not", async () => {
    const code = async (answers: Answer[], call: (c: Client) => Promise<unknown>) => {
      const n = answers.length;
      const { fetch, sent } = scripted(answers);
      const c = new Client({ endpoints: ["a:1"], fetch, maxAttempts: n, backoffMinMs: 1, backoffMaxMs: 2 });
      const e = await call(c).then(() => undefined, (x: unknown) => x);
      assert.ok(e instanceof ApiError, String(e));
      assert.equal(sent.length, n);
      return [e.code, e.status];
    };
    const commit = (c: Client) => c.commit({ ...reserveReq, fence: 3, remote_system: "x", remote_id: "y" });
    for (const status of [502, 504]) {
      // The proxy may have forwarded the write, which the node may have applied.
      assert.deepEqual(await code([{ status, body: "<html>gateway</html>" }, { status, body: "x" }], commit), ["outcome_unknown", status]);
      assert.deepEqual(await code([{ status, body: "<html>gateway</html>" }], (c) => c.cluster()), ["unavailable", status]);
      assert.deepEqual(await code([err("unavailable", status)], commit), ["unavailable", status]);
    }
    assert.deepEqual(await code([{ status: 503, body: "busy" }], commit), ["unavailable", 503]);
    // Retried as before, with the same attempt.
    const { fetch, sent } = scripted([{ status: 504, body: "timeout" }, { status: 502, body: "x" }, { status: 200, body: executed }]);
    const c = new Client({ endpoints: ["a:1"], fetch, backoffMinMs: 1, backoffMaxMs: 2 });
    assert.equal((await c.reserve(reserveReq)).fence, 7);
    assert.equal(new Set(sent.map((s) => JSON.stringify(s.body))).size, 1);
  });

  it("a write sent whose answer never came back is outcome_unknown; a refused connection, or a read, unavailable", async () => {
    const code = async (answers: Answer[], call: (c: Client) => Promise<unknown>) => {
      const maxAttempts = answers.length;
      const { fetch, sent } = scripted(answers);
      const c = new Client({ endpoints: ["a:1"], fetch, maxAttempts, backoffMinMs: 1, backoffMaxMs: 2 });
      const e = await call(c).then(() => undefined, (x: unknown) => x);
      assert.ok(e instanceof ApiError, String(e));
      assert.equal(sent.length, maxAttempts);
      return [e.code, e.status];
    };
    const commit = (c: Client) => c.commit({ ...reserveReq, fence: 3, remote_system: "x", remote_id: "y" });
    assert.deepEqual(await code(["reset"], commit), ["outcome_unknown", 0]);
    assert.deepEqual(await code(["refused"], commit), ["unavailable", 0]);
    assert.deepEqual(await code(["dns"], commit), ["unavailable", 0]);
    assert.deepEqual(await code(["reset"], (c) => c.cluster()), ["unavailable", 0]);
    // A 2xx whose body was cut short: the write took effect.
    assert.deepEqual(await code([{ status: 200, body: '{"remote_id": "y"' }], commit), ["outcome_unknown", 200]);
    assert.deepEqual(await code([{ status: 200, body: '{"records": [' }], (c) => c.list("t")), ["unavailable", 200]);
    // One attempt that may have been applied makes the call's end outcome_unknown, however the last failed.
    assert.deepEqual(await code(["reset", "refused", "refused"], commit), ["outcome_unknown", 0]);
    assert.deepEqual(await code([err("outcome_unknown", 503), err("unavailable", 503)], commit), ["outcome_unknown", 503]);
    assert.deepEqual(await code(["refused", err("unavailable", 503), "refused"], commit), ["unavailable", 0]);
    // Retried all the same, with the same body.
    const { fetch, sent } = scripted(["reset", "reset", { status: 200, body: executed }]);
    const c = new Client({ endpoints: ["a:1"], fetch, backoffMinMs: 1, backoffMaxMs: 2 });
    assert.equal((await c.reserve(reserveReq)).fence, 7);
    assert.equal(new Set(sent.map((s) => JSON.stringify(s.body))).size, 1);
  });

  it("a release whose first answer was lost reads not_found as released", async () => {
    const { fetch } = scripted(["refused", err("not_found", 404)]);
    const c = new Client({ endpoints: ["a:1"], fetch, backoffMinMs: 1, backoffMaxMs: 2 });
    assert.deepEqual(await c.release({ ...reserveReq, fence: 3 }), { released: true });
    const once = scripted([err("not_found", 404)]);
    const c2 = new Client({ endpoints: ["a:1"], fetch: once.fetch });
    await assert.rejects(c2.release({ ...reserveReq, fence: 3 }), (e: unknown) => e instanceof ApiError && e.code === "not_found");
  });

  it("escapes keys in paths", async () => {
    const { fetch, sent } = scripted([{ status: 200, body: {} }]);
    const c = new Client({ endpoints: ["http://a:1"], fetch });
    await c.get("t", "conv/9:approval 17", { waitMs: 250, consistency: "stale" });
    assert.equal(new URL(sent[0].url).pathname, "/v1/records/t/conv%2F9%3Aapproval%2017");
    assert.equal(new URL(sent[0].url).search, "?wait_ms=250&consistency=stale");
    // fetch would read %2E%2E as ".." and drop the segment; such keys go through
    // node:http (tested against a real node in loop.test).
  });

  it("an aborted signal ends the call with its reason", async () => {
    const { fetch } = scripted(["refused", "refused", "refused"]);
    const c = new Client({ endpoints: ["a:1"], fetch, backoffMinMs: 200, backoffMaxMs: 200 });
    const ac = new AbortController();
    setTimeout(() => ac.abort(new Error("stop")), 50);
    await assert.rejects(c.cluster({ signal: ac.signal }), /stop/);
  });

  it("refuses endpoints and options that cannot work", () => {
    assert.throws(() => new Client({ endpoints: [] }), /at least one/);
    assert.throws(() => new Client({ endpoints: ["ftp://a:1"] }), /host:port/);
    assert.throws(() => new Client({ endpoints: ["http://a:1/path"] }), /host:port/);
    assert.throws(() => new Client({ leaseTtl: 500 }), /leaseTtl/);
    assert.throws(() => new Client({ backoffMinMs: 10, backoffMaxMs: 5 }), /backoffMinMs <= backoffMaxMs/);
  });
});
