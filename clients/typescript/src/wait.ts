// The loop's waits before the tool runs, each followed by another reserve: behind
// another attempt that holds the key, and for an approval's decision (approval.ts has
// the wait itself; here is its long-poll, within this attempt's store-wait budget).
// Every wait ends with the caller's signal.

import type { Attempt } from "./attempt.js";
import { awaitApproval, type ApprovalWait } from "./approval.js";
import type { StoreBudget } from "./client.js";
import { ApiError, isRetryable, NotExecutedError } from "./errors.js";
import type { Decision, Record as IdemkvRecord, ReserveResult } from "./types.js";
import { backoff, sleep } from "./util.js";

/**
 * Long-polls the record another attempt holds until it settles or that attempt's
 * lease runs out; the caller then reserves again and learns which.
 */
export async function awaitHolder(a: Attempt, res: ReserveResult, waits: number): Promise<void> {
  let wait = a.client.settings.pollWait;
  if (res.lease_expires_at !== undefined) {
    // The server ends the wait at lease expiry itself; the margin covers a server
    // that only wakes on a change.
    const until = Date.parse(res.lease_expires_at) - Date.now() + 250;
    if (Number.isFinite(until) && until < wait) wait = until;
  }
  wait = Math.max(wait, 100);
  const start = Date.now();
  let rec: IdemkvRecord;
  try {
    rec = await a.client.get(a.op.tenant, a.op.key, { ...a.before(), waitMs: wait });
  } catch (err) {
    if (err instanceof ApiError && err.code === "not_found" && !a.signal?.aborted) return;
    throw a.beforeError(err, "in_progress");
  }
  if (rec.status === "pending" && Date.now() - start < wait / 2) {
    // Still held and the wait ended early: do not spin on a server whose clock and
    // ours disagree about the lease.
    await pause(a, waits + 1, "in_progress");
  }
}

/** Backs off before the n-th reserve again; the caller's signal ends it, and the call (not_executed). */
async function pause(a: Attempt, n: number, decision: Decision): Promise<void> {
  try {
    await sleep(backoff(n, a.client.settings.backoffMinMs, a.client.settings.backoffMaxMs), a.signal);
  } catch (err) {
    throw new NotExecutedError(`idemkv: ${a.q} not executed: aborted`, { decision, cause: err });
  }
}

/** After a needs_approval answer: waits for the decision (awaitApproval) on this attempt's store calls. */
export async function waitForApproval(a: Attempt, res: ReserveResult, seen: ApprovalWait): Promise<void> {
  await awaitApproval({
    tenant: a.op.tenant, key: a.op.key, requirement: a.op.approval, callOptions: a.before(),
    get: (waitMs) => approvalGet(a, waitMs),
    backoffMaxMs: a.client.settings.backoffMaxMs, event: (name, attributes) => a.event(name, attributes),
    failed: (err) => a.beforeError(err, "needs_approval"),
  }, res, seen);
}

/**
 * The long-poll of the approval wait. A store that sheds it (resource_exhausted) or
 * does not answer is retried with backoff within storeWait, and for no longer than
 * this long-poll's wait (Go's awaitApproval): then undefined, the loop reserves again,
 * and the caller past its approval wait gets ApprovalPendingError, not a wait of the
 * whole storeWait.
 */
async function approvalGet(a: Attempt, waitMs: number): Promise<IdemkvRecord | undefined> {
  const shared = a.beforeBudget;
  const budget: StoreBudget = { ...shared, limitMs: Math.min(shared.limitMs, shared.spentMs + waitMs) };
  try {
    return await a.client.get(a.op.tenant, a.op.key, { ...a.before(), budget, waitMs });
  } catch (err) {
    if (isRetryable(err) && !a.signal?.aborted && budget.spentMs < shared.limitMs) return undefined;
    throw err;
  } finally {
    shared.spentMs = budget.spentMs;
    if (budget.answered === true) shared.answered = true;
  }
}
