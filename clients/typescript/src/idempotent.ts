// idempotent(fn, options): wraps a tool function so that every call runs the whole
// loop of run() and the function runs at most once per key. The wrapped function has
// fn's signature; its result is stored as the receipt's result and a replay returns it.

import type { Client } from "./client.js";
import type { Receipt } from "./types.js";
import { run, type Outcome, type SideEffect, type ToolContext } from "./run.js";

/** What names the downstream effect in the stored receipt. */
export interface ReceiptFields {
  remoteSystem: string;
  remoteId: string;
  remoteUrl?: string;
}

export interface IdempotentOptions<A extends unknown[], R> {
  client: Client;
  /** The tool's name: part of the effect, so the same key reserved for another tool conflicts. */
  tool: string;
  tenant: string | ((...args: A) => string);
  /** Names the business operation from the call's arguments ("conversation_9:approval_17:create_ticket"). */
  key: (...args: A) => string;
  /**
   * The fields that define the side effect. Default: the argument (one argument) or the
   * argument list. Leave out volatile fields, or name them in drop.
   */
  effect?: (...args: A) => unknown;
  drop?: string[];
  /** Default "non_idempotent". */
  sideEffect?: SideEffect;
  actor?: string;
  /** Lease and record retention, in ms (defaults: the client's lease, the server's 24 h). */
  leaseTtl?: number;
  ttl?: number;
  /**
   * The receipt of a result: which downstream system and id it created. Default: the
   * tool's name and the key.
   */
  receipt?: (result: R, ...args: A) => ReceiptFields;
  /**
   * Looks the effect up downstream after an attempt died with an unknown outcome: the
   * result when it happened (stored as if the tool had returned it), null when it
   * certainly did not. Without one, a non-idempotent tool's crashed attempt is in doubt.
   */
  probe?: (...args: A) => Promise<R | null | undefined>;
  /** Turns a stored receipt back into fn's result on replay. Default: the stored result. */
  replay?: (receipt: Receipt) => R;
  /** Sees every committed outcome (decision, replayed, probed ...), for logs and traces. */
  onOutcome?: (outcome: Outcome) => void;
}

/**
 * Wraps fn so that each call runs it at most once per key, across retries, workers and
 * crashes. A replay returns the stored result without calling fn. Errors are the six
 * kinds of errors.ts; fn's own errors are their cause. Inside fn, toolContext().signal
 * aborts when the lease is lost to a newer attempt.
 *
 *   const createTicketOnce = idempotent(createTicket, { client, tenant: "t42", tool: "create_ticket",
 *     key: (a) => a.approvalId, receipt: (t) => ({ remoteSystem: "linear", remoteId: t.id }), probe: findTicket });
 */
export function idempotent<A extends unknown[], R>(fn: (...args: A) => Promise<R>, options: IdempotentOptions<A, R>): (...args: A) => Promise<R> {
  if (typeof fn !== "function") throw new TypeError("idemkv: idempotent needs a function");
  if (options.client === undefined || typeof options.key !== "function" || typeof options.tool !== "string") {
    throw new TypeError("idemkv: idempotent needs client, tool and key");
  }
  const o = options;
  return async (...args: A): Promise<R> => {
    const tenant = typeof o.tenant === "function" ? o.tenant(...args) : o.tenant;
    const key = o.key(...args);
    const receiptOf = (r: R) => {
      const f = o.receipt ? o.receipt(r, ...args) : { remoteSystem: o.tool, remoteId: key };
      const out: { remoteSystem: string; remoteId: string; remoteUrl?: string; result?: unknown } = {
        remoteSystem: f.remoteSystem, remoteId: f.remoteId, result: r,
      };
      if (f.remoteUrl !== undefined) out.remoteUrl = f.remoteUrl;
      return out;
    };
    const op: Parameters<typeof run>[1] = {
      tenant, key, tool: o.tool,
      effect: o.effect ? o.effect(...args) : args.length === 1 ? args[0] : args,
    };
    if (o.drop !== undefined) op.drop = o.drop;
    if (o.sideEffect !== undefined) op.sideEffect = o.sideEffect;
    if (o.actor !== undefined) op.actor = o.actor;
    if (o.leaseTtl !== undefined) op.leaseTtl = o.leaseTtl;
    if (o.ttl !== undefined) op.ttl = o.ttl;
    const probe = o.probe;
    if (probe !== undefined) {
      op.probe = async () => {
        const found = await probe(...args);
        return found === null || found === undefined ? null : receiptOf(found);
      };
    }
    const out = await run(o.client, op, async (_ctx: ToolContext) => receiptOf(await fn(...args)));
    o.onOutcome?.(out);
    return o.replay ? o.replay(out.receipt) : (out.receipt.result as R);
  };
}
