// Approvals bound to the effect (docs/protocol.md section 7) against a real node with
// tokens: the agent's client token asks, an approver token decides.

import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import {
  ApiError, approverNamed, ApprovalDeniedError, ApprovalMismatchError, ApprovalNotPendingError, ApprovalPendingError, Client, ConflictError,
  fingerprint, fingerprintJSON, idempotent, NotExecutedError, run, StoredFailureError, type Outcome, type Record as IdemkvRecord,
} from "../src/index.js";
import { eventually, idemkvBin, IdemkvNode, killAll, started, tempDir } from "./harness.js";

const TENANT = "shop";
const agentToken = `agent-${Date.now().toString(16)}`;
const approverToken = `approver-${Date.now().toString(16)}`;
let node: IdemkvNode;
let agent: Client;
let approver: Client;
let n = 0;

function hash(token: string): string {
  return String(execFileSync(idemkvBin(), ["auth", "hash-token", token])).trim();
}

before(async () => {
  const dir = tempDir("approvals");
  writeFileSync(join(dir, "tokens.json"), JSON.stringify({ tokens: [
    { name: "agent-1", hash: hash(agentToken), role: "client", tenants: [TENANT] },
    { name: "ana", hash: hash(approverToken), role: "approver", tenants: [TENANT] },
  ] }));
  node = await IdemkvNode.create("approvals", ["--auth-file", join(dir, "tokens.json")]);
  started.push(node);
  node.start();
  await node.ready();
  agent = new Client({ endpoints: [node.httpAddr], token: agentToken });
  approver = new Client({ endpoints: [node.httpAddr], token: approverToken });
});

after(async () => {
  agent?.close();
  approver?.close();
  await killAll();
});

interface RefundArgs { order: string; amount: number }

function refundTool(ran: RefundArgs[], wait = 0): (a: RefundArgs) => Promise<{ id: string }> {
  return idempotent(async (a: RefundArgs) => {
    ran.push(a);
    return { id: `re_${ran.length}` };
  }, {
    client: agent, tenant: TENANT, tool: "refund", key: "order",
    approval: { ttl: 3_600_000, wait, summary: (a) => `Refund ${a.amount} EUR to ${a.order}` },
  });
}

async function waiting(key: string): Promise<IdemkvRecord[]> {
  const out: IdemkvRecord[] = [];
  for await (const r of approver.allApprovals(TENANT)) if (r.idempotency_key === key) out.push(r);
  return out;
}

async function pendingOf(p: Promise<unknown>): Promise<ApprovalPendingError> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof ApprovalPendingError, `want ApprovalPendingError, got ${String(err)}`);
    return err;
  }
  throw new Error("the call ran: want ApprovalPendingError");
}

/** A fetch that delivers the first decision to the node and loses its answer (the decision took effect). */
function losingFirstDecision(): { fetch: typeof fetch; lost: () => number } {
  let lost = 0;
  const f = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    const res = await fetch(input, init);
    if (lost === 0 && init?.method === "POST" && new URL(String(input)).pathname.startsWith("/v1/approvals/")) {
      await res.text();
      lost++;
      throw new TypeError("fetch failed", { cause: Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" }) });
    }
    return res;
  };
  return { fetch: f as typeof fetch, lost: () => lost };
}

/** What the server records for a body naming named under token (Go's idemkv.RecordedApprover). */
function recordedApprover(named: string, token: string): string {
  const bytes = (x: string) => new TextEncoder().encode(x).length;
  if (token === "") return named;
  if (named === token || token.startsWith(named + " (")) return token;
  const room = 128 - bytes(" via ") - bytes(token);
  if (room <= 0) return clip(token, 128);
  return clip(named, room) + " via " + token;
  function clip(x: string, max: number): string {
    const cps = [...x];
    while (bytes(cps.join("")) > max) cps.pop();
    return cps.join("");
  }
}

describe("a decision whose answer was lost, under tokens", () => {
  // The node records the name the body gives with the deciding token: "ana (approver)"
  // for the token's own holder, "cfo-alice via ana (approver)" for someone else, the name
  // clipped to fit 128 bytes. The retry meets not_pending; the record is this decision.
  const long = "p".repeat(60) + "é".repeat(30); // 120 bytes: clipped to 109 beside the token
  for (const [what, named, decision] of [
    ["the token's own holder", "ana", "approve"],
    ["someone the token decides for", "cfo-alice", "deny"],
    ["a name clipped to fit beside the token", long, "approve"],
    ["a name of two-byte letters clipped mid-way", "é".repeat(60), "deny"],
  ] as const) {
    it(`is recognised as the caller's own: ${what}`, async () => {
      const order = `order-${Date.now()}-${n++}`;
      const p = await pendingOf(run(agent, { tenant: TENANT, key: `${order}:refund`, tool: "refund", effect: { order }, approval: { summary: "s" } },
        async () => ({ remoteSystem: "x", remoteId: "y" })));
      const { fetch: f, lost } = losingFirstDecision();
      const c = new Client({ endpoints: [node.httpAddr], token: approverToken, fetch: f, backoffMinMs: 5, backoffMaxMs: 20 });
      const rec = await c.decideApproval({ tenant: TENANT, idempotency_key: p.key, approval_id: p.approvalId, effect_fingerprint: p.fingerprint,
        approver: named, reason: "ok", decision });
      assert.equal(lost(), 1);
      assert.deepEqual([rec.approval?.id, rec.approval?.state, rec.approval?.approver], [p.approvalId, decision === "deny" ? "denied" : "approved",
        recordedApprover(named, "ana (approver)")]);
      // Another name, or another reason, is not this decision.
      const { fetch: g } = losingFirstDecision();
      const other = new Client({ endpoints: [node.httpAddr], token: approverToken, fetch: g, backoffMinMs: 5, backoffMaxMs: 20 });
      await assert.rejects(other.decideApproval({ tenant: TENANT, idempotency_key: p.key, approval_id: p.approvalId, effect_fingerprint: p.fingerprint,
        approver: "bob", reason: "ok", decision }), ApprovalNotPendingError);
      await assert.rejects(other.decideApproval({ tenant: TENANT, idempotency_key: p.key, approval_id: p.approvalId, effect_fingerprint: p.fingerprint,
        approver: named, reason: "another", decision }), ApprovalNotPendingError);
      c.close();
      other.close();
    });
  }

  it("a deny whose every answer is lost is outcome_unknown, not unavailable, and the record is denied", async () => {
    const order = `order-${Date.now()}-${n++}`;
    const p = await pendingOf(run(agent, { tenant: TENANT, key: `${order}:refund`, tool: "refund", effect: { order }, approval: { summary: "s" } },
      async () => ({ remoteSystem: "x", remoteId: "y" })));
    let sent = 0;
    const losing = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
      const res = await fetch(input, init);
      if (init?.method !== "POST") return res;
      sent++;
      await res.text();
      throw new TypeError("fetch failed", { cause: Object.assign(new Error("other side closed"), { code: "UND_ERR_SOCKET" }) });
    };
    const c = new Client({ endpoints: [node.httpAddr], token: approverToken, fetch: losing as typeof fetch, maxAttempts: 3, backoffMinMs: 5, backoffMaxMs: 20 });
    await assert.rejects(c.deny({ tenant: TENANT, idempotency_key: p.key, approval_id: p.approvalId, effect_fingerprint: p.fingerprint, approver: "ana", reason: "no" }),
      (err: unknown) => err instanceof ApiError && err.code === "outcome_unknown" && /may have been applied/.test(err.message));
    assert.equal(sent, 3);
    const rec = await approver.get(TENANT, p.key);
    assert.deepEqual([rec.status, rec.approval?.state, rec.approval?.approver], ["failed", "denied", "ana (approver)"]);
    c.close();
  });

  it("approverNamed is Go's ApproverNamed", () => {
    const long = "é".repeat(64);
    for (const [named, token] of [["ana", ""], ["ana", "ana (approver)"], ["cfo-alice", "ana (approver)"],
      ["alice", "approvals bot via slack (approver)"], [long, "ana (approver)"], ["bob via phone", "bot (admin)"]]) {
      const rec = recordedApprover(named, token);
      assert.ok(approverNamed(rec, named), `${named} recorded as ${rec} is not recognised`);
      for (const other of ["anabelle", "an", "bob", "ana (approver)x", "é".repeat(10) + "x"]) {
        if (other !== named && !named.startsWith(other)) assert.ok(!approverNamed(rec, other), `${named} recorded as ${rec} is taken for ${other}`);
      }
    }
    // The clipped name matches a name it is the start of only when the whole is within a rune of the limit.
    assert.ok(!approverNamed("al via bot (approver)", "alice"));
    assert.ok(approverNamed(recordedApprover("a".repeat(128), "bot (approver)"), "a".repeat(128)));
  });
});

describe("approvals", () => {
  it("a suspended call resumed twice shows one card, and the approved one runs once", async () => {
    const ran: RefundArgs[] = [];
    const refund = refundTool(ran);
    const order = `order-${Date.now()}-${n++}`;
    const key = `${order}:refund`;
    const ids = new Set<string>();
    let p: ApprovalPendingError | undefined;
    for (let i = 0; i < 3; i++) {
      p = await pendingOf(refund({ order, amount: 40 }));
      assert.equal(p.kind, "approval_pending");
      assert.deepEqual([p.tenant, p.key, p.summary], [TENANT, key, `Refund 40 EUR to ${order}`]);
      assert.match(p.approvalId, /^apr_/);
      assert.ok(p.expiresAt !== undefined && p.requestedAt !== undefined);
      assert.equal(p.fingerprint, fingerprint({ order, amount: 40 }));
      ids.add(p.approvalId);
    }
    assert.ok(p !== undefined);
    assert.equal(ids.size, 1, "a resume asked for a second approval");
    assert.deepEqual(ran, []);

    const cards = await waiting(key);
    assert.equal(cards.length, 1);
    assert.equal(cards[0].approval?.id, p.approvalId);
    assert.deepEqual(cards[0].effect, { amount: 40, order });

    await assert.rejects(refund({ order, amount: 41 }), ConflictError);
    await assert.rejects(agent.approve({ tenant: TENANT, idempotency_key: key, approval_id: p.approvalId, effect_fingerprint: p.fingerprint, approver: "agent" }),
      (err: unknown) => err instanceof ApiError && err.code === "permission_denied");
    await assert.rejects(approver.approve({ tenant: TENANT, idempotency_key: key, approval_id: "apr_1", effect_fingerprint: p.fingerprint, approver: "ana" }),
      (err: unknown) => err instanceof ApprovalMismatchError && err.code === "fingerprint_mismatch" && err.status === 409);

    const rec = await approver.approve({ tenant: TENANT, idempotency_key: key, approval_id: p.approvalId, effect_fingerprint: p.fingerprint, approver: "ana", reason: "customer called" });
    assert.deepEqual([rec.approval?.state, rec.approval?.approver], ["approved", "ana (approver)"]);
    await assert.rejects(approver.deny({ tenant: TENANT, idempotency_key: key, approval_id: p.approvalId, effect_fingerprint: p.fingerprint, approver: "bo" }),
      (err: unknown) => err instanceof ApprovalNotPendingError && err instanceof ApiError && err.code === "not_pending");
    assert.deepEqual(await waiting(key), []);

    assert.deepEqual(await refund({ order, amount: 40 }), { id: "re_1" });
    assert.deepEqual(await refund({ order, amount: 40 }), { id: "re_1" }); // a replay
    assert.equal(ran.length, 1);
    const stored = await agent.get(TENANT, key);
    assert.deepEqual([stored.status, stored.approval?.id, stored.approval?.reason], ["committed", p.approvalId, "customer called"]);
  });

  it("a denial is typed, replayed to every retry, and the tool never runs", async () => {
    const ran: RefundArgs[] = [];
    const refund = refundTool(ran);
    const order = `order-${Date.now()}-${n++}`;
    const p = await pendingOf(refund({ order, amount: 900 }));
    const rec = await approver.deny({ tenant: TENANT, idempotency_key: p.key, approval_id: p.approvalId, effect_fingerprint: p.fingerprint, approver: "ana", reason: "too much" });
    assert.equal(rec.status, "failed");
    for (let i = 0; i < 2; i++) {
      await assert.rejects(refund({ order, amount: 900 }), (err: unknown) => {
        assert.ok(err instanceof ApprovalDeniedError && err instanceof StoredFailureError, String(err));
        assert.deepEqual([err.kind, err.receipt.error?.code, err.approver, err.reason, err.approvalId, err.replayed],
          ["stored_failure", "approval_denied", "ana (approver)", "too much", p.approvalId, true]);
        return true;
      });
    }
    assert.deepEqual(ran, []);
  });

  it("the wait mode is woken by the decision", async () => {
    const order = `order-${Date.now()}-${n++}`;
    const key = `${order}:refund`;
    let ran = 0;
    const call = run(agent, {
      tenant: TENANT, key, tool: "refund", effect: { order, amount: 7 }, approval: { summary: "Refund 7", wait: 60_000 },
    }, async () => {
      ran++;
      return { remoteSystem: "payments", remoteId: "re_w" };
    });
    const card = await eventually(20_000, "the request listed", async () => {
      const [c] = await waiting(key);
      if (c === undefined) throw new Error("not listed yet");
      return c;
    });
    assert.equal(ran, 0);
    const decided = Date.now();
    await approver.approve({ tenant: TENANT, idempotency_key: key, approval_id: card.approval?.id ?? "", effect_fingerprint: card.effect_fingerprint, approver: "ana" });
    const out: Outcome = await call;
    const woke = Date.now() - decided;
    assert.deepEqual([out.decision, out.receipt.remote_id, ran], ["execute", "re_w", 1]);
    assert.ok(woke < 5000, `woke ${woke} ms after the decision`);
  });

  it("an effect given as JSON text is what the approver reads, and the approved call runs once", async () => {
    const order = `order-${Date.now()}-${n++}`;
    const key = `${order}:refund`;
    const text = `{"order": "${order}", "amount": 1e21}`; // no decoded value may hold 1e21
    let ran = 0;
    const call = () => run(agent, { tenant: TENANT, key, tool: "refund", effectJSON: text, approval: { summary: "Refund a lot" } }, async () => {
      ran++;
      return { remoteSystem: "payments", remoteId: "re_j" };
    });
    const p = await pendingOf(call());
    assert.equal(p.fingerprint, fingerprintJSON(text));
    const [card] = await waiting(key);
    assert.deepEqual(card.effect, { amount: 1e21, order });
    await approver.approve({ tenant: TENANT, idempotency_key: key, approval_id: p.approvalId, effect_fingerprint: p.fingerprint, approver: "ana" });
    assert.equal((await call()).receipt.remote_id, "re_j");
    assert.equal((await call()).replayed, true);
    assert.equal(ran, 1);
  });

  it("the wait is bounded", async () => {
    const ran: RefundArgs[] = [];
    const refund = refundTool(ran, 1000);
    const start = Date.now();
    await pendingOf(refund({ order: `order-${Date.now()}-${n++}`, amount: 5 }));
    const took = Date.now() - start;
    assert.ok(took >= 1000 && took < 6000, `took ${took} ms`);
    assert.deepEqual(ran, []);
  });

  it("bad requirements are refused before anything runs", async () => {
    const key = `order-${Date.now()}-${n++}`;
    await assert.rejects(run(agent, { tenant: TENANT, key, tool: "refund", fingerprint: fingerprint(1), approval: {} },
      async () => ({ remoteSystem: "x", remoteId: "y" })), NotExecutedError);
    for (const bad of [{ ttl: 10 }, { ttl: 31 * 86_400_000 }, { wait: -1 }, { required: "yes" }, { summry: "typo" }]) {
      assert.throws(() => idempotent(async (x: number) => x, { client: agent, tenant: TENANT, tool: "t", approval: bad as never }), TypeError);
    }
    await assert.rejects(agent.get(TENANT, key), (err: unknown) => err instanceof ApiError && err.code === "not_found");
  });

  it("lists what waits oldest first, a page at a time", async () => {
    const refund = refundTool([]);
    const base = `order-${Date.now()}-${n++}`;
    const orders = [0, 1, 2].map((i) => `${base}-${i}`);
    for (const order of orders) await pendingOf(refund({ order, amount: 1 }));
    const seen: string[] = [];
    for await (const r of approver.allApprovals(TENANT, { pageSize: 1 })) if (r.idempotency_key.startsWith(base)) seen.push(r.idempotency_key);
    assert.deepEqual(seen, orders.map((o) => `${o}:refund`));
    const page = await approver.approvals(TENANT, { limit: 1 });
    assert.equal(page.approvals.length, 1);
    assert.ok(page.next !== undefined && page.next !== "");
  });
});
