// A recover decision: an earlier attempt held the key and died, so its effect may or
// may not have happened. An idempotent tool runs again; a non-idempotent one asks its
// probe, and without one the key is marked in doubt for a person or policy. A record
// already in doubt is settled through the probe (resolve), or left to them.

import type { Attempt, Grant } from "./attempt.js";
import { ApiError, InDoubtError, messageOf, type IdemkvErrorDetails } from "./errors.js";
import { execute, thrownCause } from "./execute.js";
import { underLease } from "./lease.js";
import { commit, fitted, resultOmitted } from "./outcome.js";
import { withToolContext, type Outcome, type ToolFn, type ToolResult } from "./tool.js";
import type { Receipt, Record, ReserveResult } from "./types.js";

/** Recovers the key under g, a grant with a fence (the record is not in doubt yet). */
export async function recover(a: Attempt, g: Grant, fn: ToolFn): Promise<Outcome> {
  if (a.cls === "idempotent") return execute(a, g, fn, true);
  const probe = a.op.probe;
  if (probe === undefined) return markInDoubt(a, g);
  const { value, threw, error, lost } = await underLease(a, g, probe);
  if (lost !== undefined) {
    throw a.unknown(`idemkv: outcome of ${a.q} unknown, a newer attempt owns the key: ${lost.message}`,
      { decision: g.decision, record: g.record, cause: lost });
  }
  if (threw) {
    // A probe that threw undefined said nothing either: it is no "not found", which
    // would run the tool again.
    const cause = thrownCause("probe", error);
    throw a.unknown(`idemkv: outcome of ${a.q} unknown, the record stays pending: the probe failed: ${messageOf(cause)}`,
      { decision: g.decision, record: g.record, cause });
  }
  a.event("probe", { found: value !== null && value !== undefined });
  if (value === null || value === undefined) return execute(a, g, fn);
  const out = await commit(a, g, value);
  return { ...out, probed: true };
}

/** A recovered attempt that cannot learn the outcome marks the record in doubt for a person or policy. */
async function markInDoubt(a: Attempt, g: Grant): Promise<never> {
  a.event("in_doubt");
  let record = g.record;
  let cause: unknown;
  try {
    record = await a.client.doubt(
      { tenant: a.op.tenant, idempotency_key: a.op.key, effect_fingerprint: a.fp, fence: g.fence }, a.after());
  } catch (err) {
    // The record stays pending under our fence; the next attempt after the lease
    // runs out gets recover again and marks it.
    cause = err;
  }
  const d: IdemkvErrorDetails = { decision: g.decision };
  if (record !== undefined) d.record = record;
  if (cause !== undefined) d.cause = cause;
  throw new InDoubtError(inDoubtMessage(a.q), d);
}

/**
 * A reserve of an in-doubt record answers recover without a fence. With a probe the
 * loop settles it (resolve committed with what the probe found, or not_executed and
 * reserve again); without one the caller gets InDoubtError at once.
 */
export async function settleInDoubt(a: Attempt, res: ReserveResult): Promise<Outcome | undefined> {
  const probe = a.op.probe;
  if (probe === undefined) {
    a.event("in_doubt");
    throw new InDoubtError(inDoubtMessage(a.q), { decision: "recover", record: res.record });
  }
  const ctx = a.context({ decision: "recover", fence: 0, record: res.record }, a.signal ?? new AbortController().signal);
  let found: ToolResult | null | undefined;
  try {
    found = await withToolContext(ctx, () => probe(ctx));
  } catch (err) {
    a.event("in_doubt");
    const cause = thrownCause("probe", err);
    throw new InDoubtError(`${inDoubtMessage(a.q)}; the probe failed: ${messageOf(cause)}`, { decision: "recover", record: res.record, cause });
  }
  a.event("probe", { found: found !== null && found !== undefined });
  a.storeAfresh();
  const seen = res.record;
  if (seen !== undefined) {
    // The probe answers for the doubt it looked at (Go's settleInDoubt). Should the key
    // have been settled and marked in doubt anew while it looked (another caller
    // released it, ran the tool and died), its "not found" says nothing of that run, and
    // a resolve by key would release the key after an effect: reserve and look again.
    let cur: Record;
    try {
      cur = await a.client.get(a.op.tenant, a.op.key, a.after());
    } catch (err) {
      if (err instanceof ApiError && err.code === "not_found") return undefined;
      a.event("in_doubt");
      throw new InDoubtError(`${inDoubtMessage(a.q)}; reading it again after the probe failed: ${messageOf(err)}`,
        { decision: "recover", record: seen, cause: err });
    }
    if (cur.status !== "pending" || cur.in_doubt !== true || cur.fence !== seen.fence) {
      a.event("doubt_changed");
      return undefined;
    }
  }
  const base = { tenant: a.op.tenant, idempotency_key: a.op.key, effect_fingerprint: a.fp };
  try {
    if (found === null || found === undefined) {
      await a.client.resolve({ ...base, outcome: "not_executed" }, a.after());
      a.event("released");
      return undefined;
    }
    const req = { ...base, outcome: "committed" as const, remote_system: found.remoteSystem, remote_id: found.remoteId };
    const url = found.remoteUrl;
    const answer = await fitted(a, found.result, (result) => a.client.resolve(
      url === undefined && result === undefined ? req : { ...req, remote_url: url, result }, a.after()));
    const receipt = answer as Receipt;
    return {
      decision: "recover", replayed: false, probed: true, unrecorded: false, unguarded: false, resultOmitted: resultOmitted(receipt.result), receipt, fingerprint: a.fp,
      fence: res.record?.fence ?? 0, attempts: res.record?.attempts ?? 0,
    };
  } catch (err) {
    // Someone settled it first: reserving again shows how.
    if (err instanceof ApiError && (err.code === "not_pending" || err.code === "not_found")) return undefined;
    a.event("in_doubt");
    throw new InDoubtError(`${inDoubtMessage(a.q)}; resolving it failed: ${messageOf(err)}`,
      { decision: "recover", record: res.record, cause: err });
  }
}

/** The message of an InDoubtError for the key q. */
export function inDoubtMessage(q: string): string {
  return `idemkv: ${q} is in doubt: an earlier attempt died and the tool has no way to learn whether its effect happened; ` +
    "settle it with client.resolve or `idemkv resolve`";
}
