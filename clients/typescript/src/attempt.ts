// One attempt at a tool call: what every stage of the loop (wait, lease, execute, indoubt,
// outcome) shares. Its budgets split the call in two: store calls before the tool runs
// answer to the caller's signal and one store-wait budget; those that store an outcome
// have a budget of their own and no signal, since the tool ran whatever the caller does
// now. It also maps a failed store call before the tool ran onto the loop's error kinds,
// and puts what happens on the tool call's span.

import type { CallOptions, StoreBudget } from "./client.js";
import { isRetryable, messageOf, NotExecutedError, OutcomeUnknownError, StoreUnavailableError, type IdemkvErrorDetails } from "./errors.js";
import { ATTR, type Attributes, type Span } from "./telemetry.js";
import type { Op, Store, ToolClass, ToolContext } from "./tool.js";
import type { Decision, Record as IdemkvRecord, ReserveResult } from "./types.js";
import { abortReason, newAttemptId } from "./util.js";

/** A grant of ownership from reserve. */
export interface Grant {
  decision: Decision;
  fence: number;
  record: IdemkvRecord | undefined;
  /**
   * When the store call that last granted or renewed the lease was started (Date.now()):
   * the lease runs at least leaseTtl from then and, without a renewal, may be gone then.
   */
  leaseFrom?: number;
}

export class Attempt {
  readonly leaseTtl: number;
  /** The key, quoted, as the loop's messages name it. */
  readonly q: string;
  readonly attemptId: string;
  /** What this call may spend waiting for the store before the tool runs (Go's StoreWait). */
  readonly beforeBudget: StoreBudget;
  /** The same for storing an outcome; storeAfresh renews it for each. */
  afterBudget: StoreBudget;

  constructor(
    readonly client: Store,
    readonly op: Op,
    readonly cls: ToolClass,
    readonly fp: string,
    readonly signal: AbortSignal | undefined,
    /** The tool call's span, when the client has a tracer. */
    readonly span: Span | undefined,
  ) {
    this.leaseTtl = op.leaseTtl ?? client.settings.leaseTtl;
    this.q = JSON.stringify(op.key);
    this.attemptId = op.attemptId ?? newAttemptId();
    // Before the tool runs, a cluster nobody listens at is reported within connectWait.
    this.beforeBudget = { limitMs: client.settings.storeWait, spentMs: 0, connectWaitMs: client.settings.connectWait };
    this.afterBudget = { limitMs: client.settings.storeWait, spentMs: 0 };
  }

  /** Call options for a store call made before the tool runs: the caller's signal, the store-wait budget. */
  before(): CallOptions {
    const o: CallOptions = { budget: this.beforeBudget };
    if (this.signal !== undefined) o.signal = this.signal;
    return o;
  }

  /**
   * Call options for storing an outcome: a store-wait budget of its own, and no signal:
   * the tool ran, so the caller giving up must not keep its outcome from being stored.
   */
  after(): CallOptions {
    return { budget: this.afterBudget };
  }

  /**
   * Gives storing what a tool or probe did a store-wait budget of its own (Go's underLease
   * and settleInDoubt): a call may store more than once (a settling resolve, then the
   * tool's receipt), and an effect that happened must not go unrecorded because an
   * earlier store call had to wait.
   */
  storeAfresh(): void {
    this.afterBudget = { limitMs: this.client.settings.storeWait, spentMs: 0 };
  }

  event(name: string, attributes?: Attributes): void {
    this.span?.addEvent?.(name, attributes);
  }

  /** The record stays pending, and the span says so. */
  unknown(message: string, details: IdemkvErrorDetails): OutcomeUnknownError {
    this.event("left_pending");
    return new OutcomeUnknownError(message, details);
  }

  /** The context a tool or probe runs with under g. */
  context(g: Grant, signal: AbortSignal): ToolContext {
    return { signal, tenant: this.op.tenant, key: this.op.key, tool: this.op.tool, decision: g.decision, fence: g.fence };
  }

  /** Puts the reserve answer on the span, as attributes (the last answer wins) and as an event. */
  decided(res: ReserveResult): void {
    const span = this.span;
    if (span === undefined) return;
    const a: Attributes = { [ATTR.DECISION]: res.decision };
    if (res.fence) a[ATTR.FENCE] = res.fence;
    if (typeof res.record?.attempts === "number") a[ATTR.ATTEMPTS] = res.record.attempts;
    const c = res.conflict;
    if (c !== undefined) {
      a[ATTR.CONFLICT_REASON] = c.reason;
      a[ATTR.CONFLICT_EXISTING_FINGERPRINT] = c.existing_fingerprint;
      if (c.existing_remote_id) a[ATTR.CONFLICT_EXISTING_REMOTE_ID] = c.existing_remote_id;
    }
    span.setAttributes(a);
    span.addEvent?.("reserve", a);
  }

  /** Maps a failed store call made before the tool ran onto the loop's kinds. */
  beforeError(err: unknown, decision?: Decision): Error {
    const d: IdemkvErrorDetails = { cause: err };
    if (decision !== undefined) d.decision = decision;
    if (this.signal?.aborted) {
      return new NotExecutedError(`idemkv: ${this.q} not executed: aborted`, { ...d, cause: abortReason(this.signal) });
    }
    if (isRetryable(err)) {
      this.event("store_unavailable");
      // The caller may retry as this same attempt (docs/protocol.md section 4).
      return new StoreUnavailableError(
        `idemkv: store unavailable for ${this.q} after waiting ${Math.round(this.beforeBudget.spentMs)} ms, the tool did not run: ${messageOf(err)}`,
        { ...d, attemptId: this.attemptId });
    }
    return new NotExecutedError(`idemkv: ${this.q} not executed: ${messageOf(err)}`, d);
  }

  /**
   * The caller gave up with a reserve in flight. That reserve may have landed, and then
   * this attempt holds the key until its lease runs out: the answer names the attempt to
   * retry as (Go's Do: store_unavailable), not not_executed, whose retry as a new attempt
   * waited out the lease and, for a tool without a probe, found the key in doubt though
   * nothing had run. Never unguarded: the caller is gone.
   */
  gaveUp(signal: AbortSignal): StoreUnavailableError {
    this.event("store_unavailable");
    const reason = abortReason(signal);
    return new StoreUnavailableError(
      `idemkv: store unavailable for ${this.q}: the caller gave up with a reserve in flight, which may hold the key; ` +
        `the tool did not run; retry as attempt ${this.attemptId}: ${messageOf(reason)}`,
      { cause: reason, attemptId: this.attemptId });
  }
}
