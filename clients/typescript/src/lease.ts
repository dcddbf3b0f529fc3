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
  const every = a.leaseTtl / 3;
  const beat = (async () => {
    let next = every;
    for (;;) {
      try {
        await sleep(next, stop.signal);
      } catch {
        return;
      }
      try {
        await a.client.heartbeat(
          { tenant: a.op.tenant, idempotency_key: a.op.key, fence: g.fence, lease_ttl_ms: a.leaseTtl },
          { signal: stop.signal, budget: { limitMs: every, spentMs: 0 } });
        next = every;
      } catch (err) {
        if (stop.signal.aborted) return;
        if (err instanceof ApiError && (err.code === "fenced" || err.code === "not_pending" || err.code === "not_found")) {
          lost = new LeaseLost(a.op.key, err);
          a.event("lease_lost");
          tool.controller.abort(lost);
          return;
        }
        // The lease still has two thirds to run: try again soon.
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
