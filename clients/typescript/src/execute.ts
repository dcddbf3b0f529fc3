// Running the tool, and classifying how it ended: a receipt is committed; an error the
// call declares not executed (notExecuted, notExecutedOn) releases the key, one it
// declares permanent (permanent, permanentOn) is stored and replayed; anything else, or
// a lease lost meanwhile, leaves the record pending (OutcomeUnknownError).

import type { Attempt, Grant } from "./attempt.js";
import { messageOf, NotExecutedError, NotExecutedMark, PermanentError, type IdemkvErrorDetails } from "./errors.js";
import { underLease } from "./lease.js";
import { commit, fail, release } from "./outcome.js";
import { withToolContext, type Outcome, type ToolContext, type ToolFn, type ToolResult } from "./tool.js";
import { abortReason } from "./util.js";

/**
 * What a tool or probe threw, as the cause to report: a thrown undefined or null carries
 * no message (and a cause of undefined is none), so it becomes a TypeError that says so.
 */
export function thrownCause(who: "tool" | "probe", thrown: unknown): unknown {
  if (thrown === undefined || thrown === null) return new TypeError(`the ${who} threw a non-Error value (${String(thrown)})`);
  return thrown;
}

/**
 * Runs a read-only tool, or an idempotent one unguarded: nothing is recorded, so from
 * idemkv's side the call never happened, and its error is a NotExecutedError.
 */
export async function unrecorded(a: Attempt, fn: ToolFn, unguarded = false): Promise<Outcome> {
  const ctx: ToolContext = { signal: a.signal ?? new AbortController().signal, tenant: a.op.tenant, key: a.op.key, tool: a.op.tool, decision: "execute", fence: 0 };
  let res: ToolResult;
  try {
    res = await withToolContext(ctx, () => fn(ctx));
  } catch (err) {
    const cause = thrownCause("tool", err);
    throw new NotExecutedError(`idemkv: ${a.q} not executed: ${messageOf(cause)}`, { cause });
  }
  return {
    decision: "execute", replayed: false, probed: false, unrecorded: true, unguarded, resultOmitted: false, fingerprint: a.fp, fence: 0, attempts: 0,
    receipt: {
      idempotency_key: a.op.key, effect_fingerprint: a.fp, status: "committed",
      remote_system: res.remoteSystem, remote_id: res.remoteId, remote_url: res.remoteUrl, result: res.result,
    },
  };
}

/**
 * Runs the tool under g. earlier says that an attempt before this one may have run it
 * (an idempotent re-execution on recover): a "not executed" from this call then says
 * nothing about that attempt, so the key stays pending (outcome unknown) instead of
 * being released, which would say the effect certainly did not happen and free the
 * key for other arguments.
 */
export async function execute(a: Attempt, g: Grant, fn: ToolFn, earlier = false): Promise<Outcome> {
  if (a.signal?.aborted && g.record?.approval?.state !== "approved") {
    // The caller gave up after the grant and before the tool ran (Go's executeAfter):
    // this call did nothing, so the key is released (it would otherwise wait out the
    // lease and then be in doubt), unless an earlier attempt may have had the effect. A
    // grant that consumed an approval is not released (that would delete the record and
    // the person's approval with it): the tool gets the aborted signal and decides.
    const cause = abortReason(a.signal);
    if (earlier) {
      throw a.unknown(`idemkv: outcome of ${a.q} unknown, the record stays pending: the caller gave up before the tool ` +
        `ran again, and an earlier attempt may have run it: ${messageOf(cause)}`, { decision: g.decision, record: g.record, cause });
    }
    return release(a, g, new NotExecutedMark(cause));
  }
  const ran = await underLease(a, g, fn);
  const { value, threw, lost } = ran;
  const d = (cause: unknown): IdemkvErrorDetails => ({ decision: g.decision, record: g.record, cause });
  if (threw && (ran.error === undefined || ran.error === null)) {
    // Nothing to classify, as Go's tool that returns neither a result nor an error.
    const cause = thrownCause("tool", ran.error);
    if (lost !== undefined) {
      throw a.unknown(`idemkv: outcome of ${a.q} unknown, a newer attempt owns the key: ${lost.message}`, d(cause));
    }
    throw a.unknown(`idemkv: outcome of ${a.q} unknown, the record stays pending: ${messageOf(cause)}`, d(cause));
  }
  let error = ran.error;
  if (threw && !(error instanceof NotExecutedMark) && !(error instanceof PermanentError)) {
    // The classes the call declared, with Go's semantics. A classifier that throws says
    // nothing of the tool's error: the record stays pending, as when Go's classifying
    // of the tool's error panics, and the key is never released for a tool that may
    // have run.
    let classifier = "notExecutedOn";
    try {
      if (a.op.notExecutedOn?.(error)) {
        error = new NotExecutedMark(error);
      } else {
        classifier = "permanentOn";
        if (a.op.permanentOn?.(error)) error = new PermanentError(error);
      }
    } catch (thrown) {
      const why = lost !== undefined ? `a newer attempt owns the key: ${lost.message}; ` : "the record stays pending: ";
      throw a.unknown(`idemkv: outcome of ${a.q} unknown, ${why}the tool threw (${messageOf(error)}) and its ` +
        `${classifier} threw: ${messageOf(thrown)}`, d(thrown));
    }
  }
  if (lost !== undefined) {
    // A newer attempt owns the key; it decides the outcome (and probes for ours).
    throw a.unknown(`idemkv: outcome of ${a.q} unknown, a newer attempt owns the key: ${lost.message}`, d(threw ? error : lost));
  }
  if (error instanceof NotExecutedMark && earlier) {
    throw a.unknown(
      `idemkv: outcome of ${a.q} unknown, the record stays pending: an earlier attempt may have run the tool; ` +
        `this one did not: ${messageOf(error.cause)}`, d(error.cause));
  }
  if (error instanceof NotExecutedMark) return release(a, g, error);
  if (error instanceof PermanentError) return fail(a, g, error);
  if (threw) {
    throw a.unknown(`idemkv: outcome of ${a.q} unknown, the record stays pending: ${messageOf(error)}`, d(error));
  }
  if (value === null || value === undefined || typeof value.remoteSystem !== "string" || typeof value.remoteId !== "string" ||
    value.remoteSystem === "" || value.remoteId === "") {
    throw a.unknown(
      `idemkv: outcome of ${a.q} unknown, the record stays pending: the tool returned no receipt (remoteSystem and remoteId)`,
      d(new TypeError("the tool returned no receipt")));
  }
  return commit(a, g, value);
}
