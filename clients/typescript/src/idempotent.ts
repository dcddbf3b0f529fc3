// idempotent(fn, options): wraps a tool function so that every call runs the whole
// loop of run() and the function runs at most once per key. The wrapped function has
// exactly fn's type (optional parameters included); the call that runs the tool returns
// its value, and a replay the stored result.

import { checkApproval, type ApprovalRequirement } from "./approval.js";
import { currentOperation, isPassthrough } from "./context.js";
import { NotExecutedError } from "./errors.js";
import { keyText } from "./jcs.js";
import type { Receipt } from "./types.js";
import { resultOmitted } from "./outcome.js";
import { run } from "./run.js";
import type { Op, Outcome, SideEffect, Store, ToolContext, ToolResult } from "./tool.js";

/** What names the downstream effect in the stored receipt. */
export interface ReceiptFields {
  remoteSystem: string;
  remoteId: string;
  remoteUrl?: string;
}

/** Error classes, or a test of the error. */
export type ErrorMatch = ReadonlyArray<abstract new (...args: any[]) => unknown> | ((err: unknown) => boolean);

export interface IdempotentOptions<A extends unknown[], R> {
  client: Store;
  /** The tool's name: part of the key and the record, so the same key reserved for another tool conflicts. */
  tool: string;
  tenant: string | ((...args: A) => string);
  /**
   * Names the business operation: a function of the call's arguments
   * ("conversation_9:approval_17:create_ticket"), or the name of a member of the call's one
   * object argument (key "<that value>:<tool>"). Without one, the key is "<id>:<tool>" of
   * the operation(id, fn) the call runs in.
   */
  key?: string | ((...args: A) => string);
  /**
   * The fields that define the side effect. Default, the same in every client
   * (docs/protocol.md, "One default effect"): the call's one argument when it is a plain
   * object, else the argument list (trailing undefined arguments left out; one argument
   * that is not a plain object is the list of it). Leave out volatile fields, or name them in drop.
   */
  effect?: (...args: A) => unknown;
  /**
   * Instead of effect: the effect as JSON text, fingerprinted as written (Op.effectJSON),
   * for a runtime that has the model's arguments as the text they arrived in.
   */
  effectJSON?: (...args: A) => string | Uint8Array;
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
  /**
   * Errors of fn meaning the effect certainly did not happen: the key is released
   * (notExecuted). A function that throws releases nothing: OutcomeUnknownError.
   */
  notExecutedOn?: ErrorMatch;
  /** Errors of fn that will not go away on retry: stored and replayed (permanent); a function that throws stores nothing. */
  permanentOn?: ErrorMatch;
  /** The result as the JSON stored with the receipt. Default: the result itself (JSON.stringify's rules). */
  serialize?: (result: R) => unknown;
  /** The stored JSON back as fn's result, on a replay. Default: the JSON as stored. */
  deserialize?: (stored: unknown) => R;
  /**
   * What a replay returns when no result was stored (an operator resolved the key with a
   * receipt only, or the result was too large to store). Default: the receipt itself.
   */
  fromReceipt?: (receipt: Receipt) => R;
  /** Turns every replayed receipt into fn's result, instead of deserialize and fromReceipt. */
  replay?: (receipt: Receipt) => R;
  /** Sees every committed outcome (decision, replayed, probed ...), for logs and traces. */
  onOutcome?: (outcome: Outcome) => void;
  /**
   * A person approves the effect before it runs (docs/protocol.md section 7); the summary
   * may be a function of the call's arguments. The call waits for the decision up to wait
   * ms, or throws ApprovalPendingError; a denial is an ApprovalDeniedError, replayed to every retry.
   */
  approval?: ApprovalRequirement<A>;
}

const OPTIONS = new Set([
  "client", "tool", "tenant", "key", "effect", "effectJSON", "drop", "sideEffect", "actor", "leaseTtl", "ttl", "receipt", "probe",
  "notExecutedOn", "permanentOn", "serialize", "deserialize", "fromReceipt", "replay", "onOutcome", "approval",
]);
const SIDE_EFFECTS = new Set(["read_only", "idempotent", "non_idempotent", "idempotent_mutation", "non_idempotent_mutation"]);

/**
 * The default effect of a call with these arguments, the same JSON the Python and Go
 * clients fingerprint for the same call (testdata/effect/vectors.json): one argument that
 * is a plain object (a tool's object of arguments) is the effect; any other arguments are
 * the argument list, one argument that is not a plain object included (["Outage X"],
 * [["a", "b"]]), so that f(["a", "b"]) and f("a", "b") are two effects. Trailing
 * undefined arguments, which a function cannot tell from absent ones, are left out, and
 * no arguments is {}.
 */
export function defaultEffect(args: readonly unknown[]): unknown {
  let n = args.length;
  while (n > 0 && args[n - 1] === undefined) n--;
  if (n === 0) return {};
  if (n === 1 && isPlainObject(args[0])) return args[0];
  return args.slice(0, n);
}

/**
 * An object literal, JSON.parse's output or an object without a prototype: not an array,
 * a Date, a class instance or anything else whose JSON could be an array or a string.
 */
function isPlainObject(v: unknown): boolean {
  if (typeof v !== "object" || v === null || Array.isArray(v)) return false;
  const proto: unknown = Object.getPrototypeOf(v);
  if (proto === null || proto === Object.prototype) return true;
  // Another realm's Object.prototype (node:vm): the last prototype, whose constructor is Object.
  return Object.getPrototypeOf(proto) === null && Object.prototype.toString.call(v) === "[object Object]" &&
    typeof (proto as { constructor?: unknown }).constructor === "function" &&
    (proto as { constructor: { name?: unknown } }).constructor.name === "Object";
}

function matcher(name: string, m: ErrorMatch | undefined): ((err: unknown) => boolean) | undefined {
  if (m === undefined) return undefined;
  if (typeof m === "function") return m;
  if (!Array.isArray(m) || !m.every((c) => typeof c === "function")) {
    throw new TypeError(`idemkv: ${name} takes error classes ([TypeError, ...]) or a function of the error`);
  }
  return (err) => m.some((c) => err instanceof c);
}

/** Refuses, when idempotent() is applied, options that would fail every call. */
function check(options: IdempotentOptions<never, unknown>): void {
  const o = options as unknown as { [name: string]: unknown };
  for (const name of Object.keys(o)) {
    if (!OPTIONS.has(name)) throw new TypeError(`idemkv: idempotent has no option ${JSON.stringify(name)}; it takes ${[...OPTIONS].join(", ")}`);
  }
  if (o.client === undefined || o.client === null) throw new TypeError("idemkv: idempotent needs client (a Client, or MemoryStore.client() in unit tests)");
  if (typeof o.tool !== "string" || o.tool === "") throw new TypeError("idemkv: idempotent needs tool, a non-empty string");
  if (!((typeof o.tenant === "string" && o.tenant !== "") || typeof o.tenant === "function")) {
    throw new TypeError("idemkv: idempotent needs tenant, a non-empty string or a function of the arguments");
  }
  if (o.key !== undefined && !(typeof o.key === "function" || (typeof o.key === "string" && o.key !== ""))) {
    throw new TypeError("idemkv: key is a function of the arguments or the name of a member of the one object argument");
  }
  if (o.sideEffect !== undefined && !SIDE_EFFECTS.has(o.sideEffect as string)) {
    throw new TypeError(`idemkv: unknown sideEffect ${JSON.stringify(o.sideEffect)}; one of ${[...SIDE_EFFECTS].join(", ")}`);
  }
  if (o.drop !== undefined && !(Array.isArray(o.drop) && o.drop.every((d) => typeof d === "string"))) {
    throw new TypeError('idemkv: drop is a list of field paths, e.g. ["trace_id"]');
  }
  // The server's bounds: a lease of at least a second, a TTL of at least a minute.
  if (o.leaseTtl !== undefined && !(typeof o.leaseTtl === "number" && o.leaseTtl >= 1000)) throw new TypeError("idemkv: leaseTtl must be at least 1000 ms");
  if (o.ttl !== undefined && !(typeof o.ttl === "number" && o.ttl >= 60_000)) throw new TypeError("idemkv: ttl must be at least 60000 ms");
  if (o.effect !== undefined && o.effectJSON !== undefined) throw new TypeError("idemkv: give effect or effectJSON, not both");
  for (const f of ["effect", "effectJSON", "receipt", "probe", "serialize", "deserialize", "fromReceipt", "replay", "onOutcome"]) {
    if (o[f] !== undefined && typeof o[f] !== "function") throw new TypeError(`idemkv: ${f} must be a function`);
  }
  if (o.sideEffect === "read_only" && (o.probe !== undefined || o.effect !== undefined || o.effectJSON !== undefined || o.approval !== undefined)) {
    throw new TypeError("idemkv: a read_only tool takes no probe, effect or approval (nothing is reserved)");
  }
  if (o.approval !== undefined) checkApproval(o.approval, "approval");
}

/**
 * Wraps fn so that each call runs it at most once per key, across retries, workers and
 * crashes. A replay returns the stored result without calling fn. Errors are the six
 * kinds of errors.ts; fn's own errors are their cause. Inside fn, toolContext().signal
 * aborts when the lease is lost to a newer attempt. Options are checked here, once.
 *
 *   const createTicketOnce = idempotent(createTicket, { client, tenant: "t42", tool: "create_ticket",
 *     key: (a) => a.approvalId, receipt: (t) => ({ remoteSystem: "linear", remoteId: t.id }), probe: findTicket });
 */
// The type parameter is the whole function, inferred from fn alone, so that the wrapper
// keeps fn's exact type (optional parameters, overload-free generics) whatever the
// callbacks in options declare; inferring the parameters from key as well dropped the
// optional ones (TS2554).
export function idempotent<F extends (...args: any[]) => Promise<any>>(fn: F, options: IdempotentOptions<Parameters<F>, Awaited<ReturnType<F>>>): F {
  type A = Parameters<F>;
  type R = Awaited<ReturnType<F>>;
  if (typeof fn !== "function") throw new TypeError("idemkv: idempotent needs a function");
  if (typeof options !== "object" || options === null) throw new TypeError("idemkv: idempotent needs options");
  check(options as unknown as IdempotentOptions<never, unknown>);
  const o = options;
  const notExecutedOn = matcher("notExecutedOn", o.notExecutedOn);
  const permanentOn = matcher("permanentOn", o.permanentOn);
  const keyOf = (args: A): string => {
    const k = o.key;
    if (typeof k === "function") return k(...args);
    if (typeof k === "string") {
      const arg: unknown = args[0];
      const v = typeof arg === "object" && arg !== null ? (arg as { [name: string]: unknown })[k] : undefined;
      if (v === undefined || v === null || v === "") throw new TypeError(`the argument's ${JSON.stringify(k)}, which names the key, is missing or empty`);
      return `${keyText(v)}:${o.tool}`;
    }
    const opn = currentOperation();
    if (opn === undefined) throw new TypeError(`${o.tool} has no key: give the key option or call it inside operation(id, fn)`);
    return `${opn.id}:${o.tool}`;
  };
  const wrapped = async (...args: A): Promise<R> => {
    if (isPassthrough()) return fn(...args);
    let op: Op;
    try {
      const tenant = typeof o.tenant === "function" ? o.tenant(...args) : o.tenant;
      const key = keyOf(args);
      op = { tenant, key, tool: o.tool };
      if (o.sideEffect !== "read_only") {
        if (o.effectJSON) op.effectJSON = o.effectJSON(...args);
        else op.effect = o.effect ? o.effect(...args) : defaultEffect(args);
      }
      const a = o.approval;
      if (a !== undefined) {
        const { summary, ...rest } = a;
        const text = typeof summary === "function" ? summary(...args) : summary;
        if (text !== undefined && typeof text !== "string") throw new TypeError(`the approval summary function returned ${typeof text}, not text`);
        op.approval = text === undefined ? rest : { ...rest, summary: text };
      }
    } catch (err) {
      throw new NotExecutedError(`idemkv: the key, effect or approval summary of ${o.tool} failed: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    }
    const receiptOf = (r: R): ToolResult => {
      const f = o.receipt ? o.receipt(r, ...args) : { remoteSystem: o.tool, remoteId: op.key };
      const out: ToolResult = { remoteSystem: f.remoteSystem, remoteId: f.remoteId, result: o.serialize ? o.serialize(r) : r };
      if (f.remoteUrl !== undefined) out.remoteUrl = f.remoteUrl;
      return out;
    };
    if (o.drop !== undefined) op.drop = o.drop;
    if (o.sideEffect !== undefined) op.sideEffect = o.sideEffect;
    if (o.actor !== undefined) op.actor = o.actor;
    if (o.leaseTtl !== undefined) op.leaseTtl = o.leaseTtl;
    if (o.ttl !== undefined) op.ttl = o.ttl;
    if (notExecutedOn !== undefined) op.notExecutedOn = notExecutedOn;
    if (permanentOn !== undefined) op.permanentOn = permanentOn;
    const attemptId = currentOperation()?.attemptId;
    if (attemptId !== undefined) op.attemptId = attemptId;
    // What this call's own run of fn (or the probe) returned: the caller gets it as is.
    let own: { value: R } | undefined;
    const probe = o.probe;
    if (probe !== undefined) {
      op.probe = async () => {
        const found = await probe(...args);
        if (found === null || found === undefined) return null;
        own = { value: found };
        return receiptOf(found);
      };
    }
    const out = await run(o.client, op, async (_ctx: ToolContext) => {
      const value = await fn(...args);
      own = { value };
      return receiptOf(value);
    });
    o.onOutcome?.(out);
    if (!out.replayed && own !== undefined) return own.value;
    if (o.replay) return o.replay(out.receipt);
    const stored = out.receipt.result;
    if (stored === undefined || stored === null || resultOmitted(stored)) {
      return o.fromReceipt ? o.fromReceipt(out.receipt) : (out.receipt as unknown as R);
    }
    return o.deserialize ? o.deserialize(stored) : (stored as R);
  };
  return wrapped as unknown as F;
}
