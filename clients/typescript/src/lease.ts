// Keeping the lease while a tool or probe runs: a heartbeat every third of the lease,
// and, should the lease go to a newer attempt, the running function's signal aborted.
// Go's underLease.

import type { Attempt, Grant } from "./attempt.js";
import { ApiError, messageOf } from "./errors.js";
import { withToolContext, type ToolContext } from "./tool.js";
import { linkedController, sleep } from "./util.js";

/**
 * What a function run under the lease did: its value, or what it threw. threw tells a
 * thrown undefined from a return.
 */
export interface Ran<T> {
  value?: T;
  threw: boolean;
  error?: unknown;
  lost?: LeaseLost;
}

export class LeaseLost extends Error {
  constructor(key: string, cause: unknown) {
    super(`idemkv: lease on ${JSON.stringify(key)} lost to a newer attempt, the tool was stopped: ${messageOf(cause)}`, { cause });
    this.name = "LeaseLost";
  }
}

/**
 * The reason a tool's signal is aborted when its lease is running out by this worker's
 * clock because no heartbeat could renew it (idemkv unreachable, say): a sixth of the
 * lease before its end, from which a newer attempt may own the key and run the tool
 * itself, so this one should stop before any step it cannot undo (Go's
 * client.ErrLeaseExpired). What the tool returns is still committed: if nobody took the
 * key over, the commit lands.
 */
export class LeaseExpired extends Error {
  constructor(key: string, tellMs: number, ttlMs: number) {
    super(`idemkv: lease on ${JSON.stringify(key)} running out without a renewal: no heartbeat renewed it within ${tellMs} ms of its ${ttlMs} ms`);
    this.name = "LeaseExpired";
  }
}

/**
 * Runs f while a heartbeat keeps the lease alive. lost is set when the lease went to
 * a newer attempt; f's signal was then aborted.
 *
 * The heartbeat lasts exactly as long as f (Go's underLease): not less when the
 * caller's signal aborts (a tool that does not watch its signal goes on, and without a
 * lease a second worker would recover the key and run it again), so it stops on a
 * controller of its own; and not more when f throws, so it stops in finally. What f
 * did is then stored within a store-wait budget of its own (Attempt.storeAfresh).
 */
export async function underLease<T>(a: Attempt, g: Grant, f: (ctx: ToolContext) => Promise<T>): Promise<Ran<T>> {
  const tool = linkedController([a.signal]);
  const stop = new AbortController();
  let lost: LeaseLost | undefined;
  const ttl = a.leaseTtl;
  const every = ttl / 3;
  // The lease runs out by this worker's clock leaseTtl after the start of the call that
  // last granted or renewed it (earlier than the leader's stamp, so never later than the
  // lease itself); once a heartbeat has failed to renew it, the tool is told a sixth of
  // the lease before that (tell), so that it hears it in time to stop (Go's heartbeat).
  const tell = ttl - ttl / 6;
  let from = g.leaseFrom ?? Date.now();
  const beat = (async () => {
    // A grant that took long to arrive (retries inside the reserve) is renewed at once.
    let next = from + tell - Date.now() < every ? 0 : every;
    let expired = false;
    let tried = false;
    for (;;) {
      let wait = next;
      if (!expired && tried) wait = Math.max(Math.min(wait, from + tell - Date.now()), 0);
      try {
        await sleep(wait, stop.signal);
      } catch {
        return;
      }
      const left = from + tell - Date.now();
      if (!expired && tried && left <= 0) {
        expired = true;
        a.event("lease_expired");
        tool.controller.abort(new LeaseExpired(a.op.key, tell, ttl));
      }
      // A renewal still in flight when the tool is to be told is cut short there.
      const limitMs = !expired && left > 0 && left < every ? left : every;
      const sent = Date.now();
      tried = true;
      try {
        await a.client.heartbeat(
          { tenant: a.op.tenant, idempotency_key: a.op.key, fence: g.fence, lease_ttl_ms: ttl },
          { signal: stop.signal, budget: { limitMs, spentMs: 0 } });
        from = sent;
        g.leaseFrom = sent;
        next = every;
      } catch (err) {
        if (stop.signal.aborted) return;
        if (err instanceof ApiError && (err.code === "fenced" || err.code === "not_pending" || err.code === "not_found")) {
          lost = new LeaseLost(a.op.key, err);
          a.event("lease_lost");
          tool.controller.abort(lost);
          return;
        }
        // Try again soon: the lease may still have time to run.
        next = Math.max(every / 6, 50);
      }
    }
  })();
  const ctx = a.context(g, tool.signal);
  const out: Ran<T> = { threw: false };
  try {
    out.value = await withToolContext(ctx, () => f(ctx));
  } catch (err) {
    out.threw = true;
    out.error = err;
  } finally {
    stop.abort();
    await beat;
    tool.dispose();
  }
  a.storeAfresh();
  if (lost !== undefined) out.lost = lost;
  return out;
}
