// The tool-call loop, with the semantics of the Go client's Do (docs/protocol.md, "Tool
// classes and the client loop"): reserve, then replay | conflict | wait while another
// attempt holds the key | execute under a heartbeat | recover (probe, re-run, or in
// doubt), then store the outcome. Every error it throws is one of the six kinds in
// errors.ts.

import { AsyncLocalStorage } from "node:async_hooks";
import type { Client, CallOptions, StoreBudget } from "./client.js";
import { approvalAsk, awaitApproval, checkApproval, reserveEffect, type ApprovalRequirement, type ApprovalWait } from "./approval.js";
import {
  APPROVAL_DENIED, ApiError, ApprovalDeniedError, ConflictError, InDoubtError, isRetryable, messageOf, NotExecutedError, NotExecutedMark, OutcomeUnknownError,
  PermanentError, StoredFailureError, StoreUnavailableError, type IdemkvErrorDetails,
} from "./errors.js";
import { fingerprint as fingerprintOf } from "./jcs.js";
import { ATTR, failSpan, SPAN_KIND_INTERNAL, type Attributes, type Span } from "./telemetry.js";
import type { Decision, ErrorInfo, Receipt, Record as IdemkvRecord, ReserveRequest, ReserveResult } from "./types.js";
import { abortReason, backoff, linkedController, newAttemptId, sleep } from "./util.js";

/**
 * What a retry of a tool may do to the world. The short names are the ones the Python
 * client takes; the long ones are Go's.
 *   - read_only: no reservation; the call runs directly.
 *   - idempotent (idempotent_mutation): may run twice with the same effect (a PUT by
 *     id); a recovered attempt runs it again.
 *   - non_idempotent (non_idempotent_mutation, the default): must not run twice; a
 *     recovered attempt asks the probe, and without one the key is in doubt.
 */
export type SideEffect = "read_only" | "idempotent" | "non_idempotent" | "idempotent_mutation" | "non_idempotent_mutation";

/** What the loop needs of idemkv: a Client (in a runtime's unit tests, MemoryStore.client()). */
export type Store = Pick<Client, "reserve" | "commit" | "fail" | "release" | "heartbeat" | "doubt" | "resolve" | "get" | "settings" | "tracer">;

/** The downstream system's receipt, as a tool or a probe reports it. */
export interface ToolResult {
  remoteSystem: string;
  remoteId: string;
  remoteUrl?: string;
  /** Stored as JSON with the receipt and replayed with it. */
  result?: unknown;
}

/** What a running tool or probe may know about its call. */
export interface ToolContext {
  /** Aborts when the lease went to a newer attempt (or the caller aborted): stop soon. */
  signal: AbortSignal;
  tenant: string;
  key: string;
  tool: string;
  decision: Decision;
  /** The fence this attempt holds; 0 when it holds none (read-only, unguarded, in-doubt probe). */
  fence: number;
}

export type ToolFn = (ctx: ToolContext) => Promise<ToolResult>;
/** Looks the effect up downstream; the receipt when it happened, null when it certainly did not. */
export type ProbeFn = (ctx: ToolContext) => Promise<ToolResult | null | undefined>;

/** One tool call. */
export interface Op {
  tenant: string;
  /** Names the business operation: every retry of it, by any worker, carries the same key. */
  key: string;
  tool: string;
  /** Who runs this attempt; not part of the identity. */
  actor?: string;
  sideEffect?: SideEffect;
  /** The fields that define the side effect; fingerprinted here (RFC 8785 + SHA-256) after drop. */
  effect?: unknown;
  drop?: string[];
  /** Instead of effect: a fingerprint computed elsewhere. */
  fingerprint?: string;
  /** How long the record and its receipt are kept, in ms (server default 24 h). */
  ttl?: number;
  /** This call's lease in ms (default: the client's leaseTtl). */
  leaseTtl?: number;
  probe?: ProbeFn;
  /**
   * Names this attempt to the server (Go's Op.AttemptID); default: a fresh one. Pass
   * StoreUnavailableError.attemptId to retry a call whose reserve may have landed
   * unanswered: the server recognises the same attempt instead of a stranger that waits
   * out the phantom lease and then finds the key in doubt.
   */
  attemptId?: string;
  /**
   * Errors of the tool after which the effect certainly did not happen: the key is released
   * (as notExecuted(err)). One that throws leaves the record pending (OutcomeUnknownError,
   * what it threw the cause), as does permanentOn.
   */
  notExecutedOn?: (err: unknown) => boolean;
  /** Errors of the tool that will not go away on retry: stored and replayed (as permanent(err)). */
  permanentOn?: (err: unknown) => boolean;
  /** What this tool asks of approvals (docs/protocol.md section 7); its summary here is the text. */
  approval?: ApprovalRequirement<never[]>;
}

/**
 * The one member of the note stored in place of a result the server refused as too large
 * (payload_too_large), the Go client's OmittedResultKey: the effect happened, so its receipt
 * is stored without the result rather than not at all.
 */
export const OMITTED_RESULT_KEY = "idemkv_result_omitted";

/** Whether a stored result is the note that stands in for one too large to store. */
export function resultOmitted(result: unknown): boolean {
  return typeof result === "object" && result !== null && !Array.isArray(result) && Object.keys(result).length === 1 &&
    OMITTED_RESULT_KEY in result;
}

/** The server's bound on a request body (idemkv.MaxRequestBytes). */
const MAX_BODY_BYTES = 1 << 20;

function omittedNote(bytes: number): { [OMITTED_RESULT_KEY]: { bytes: number; message: string } } {
  return {
    [OMITTED_RESULT_KEY]: {
      bytes,
      message: `the tool's result (${bytes} bytes) was larger than idemkv stores; the call did take effect and its receipt is stored without the result`,
    },
  };
}

function encodedSize(v: unknown): number {
  const text = JSON.stringify(v);
  return text === undefined ? 0 : new TextEncoder().encode(text).length;
}

export interface RunOptions {
  /**
   * Ends the call: before the tool runs, with NotExecutedError, or StoreUnavailableError
   * naming the attempt to retry as when a reserve was in flight (it may hold the key);
   * during the wait for an approval, with ApprovalPendingError (the request still waits);
   * while the tool runs, the tool's signal aborts, but its lease is kept until it returns.
   */
  signal?: AbortSignal;
}

/** The committed outcome of a call. */
export interface Outcome {
  /** The reserve decision that led here: execute, recover or replay. */
  decision: Decision;
  /** The tool did not run; the receipt is the one stored earlier. */
  replayed: boolean;
  /** A recovered attempt found the effect through the probe and stored it, without running the tool. */
  probed: boolean;
  /** Nothing was recorded: a read-only tool, or an unguarded run while idemkv was unreachable. */
  unrecorded: boolean;
  /** The unguarded run: idemkv could not be reached and onStoreUnavailable let an idempotent tool run (Go's Outcome.Unguarded). */
  unguarded: boolean;
  /**
   * The stored receipt holds the note of OMITTED_RESULT_KEY instead of the tool's result,
   * which was too large for the server to store (Go's Outcome.ResultOmitted).
   */
  resultOmitted: boolean;
  receipt: Receipt;
  fingerprint: string;
  fence: number;
  /** How many attempts were granted ownership of the key. */
  attempts: number;
}

const storage = new AsyncLocalStorage<ToolContext>();

/** Rounds of probe, resolve not_executed and reserve again in one call (Go's maxSettles). */
const MAX_SETTLES = 8;

/** The context of the tool call running now (inside a function that idempotent wraps), or undefined. */
export function toolContext(): ToolContext | undefined {
  return storage.getStore();
}

/** The classes by their names on the wire and in spans (Go's and Python's). */
const CLASS_NAMES = { read_only: "read_only", idempotent: "idempotent_mutation", non_idempotent: "non_idempotent_mutation" } as const;

function classOf(s: SideEffect | undefined): "read_only" | "idempotent" | "non_idempotent" {
  switch (s) {
    case undefined:
    case "non_idempotent":
    case "non_idempotent_mutation":
      return "non_idempotent";
    case "idempotent":
    case "idempotent_mutation":
      return "idempotent";
    case "read_only":
      return "read_only";
  }
  throw new TypeError(`idemkv: unknown sideEffect ${JSON.stringify(s)}`);
}

/**
 * Runs fn at most once for op.key, across retries, workers and crashes. Resolves with
 * the committed outcome (run, replayed, or found by the probe); throws one of
 * NotExecutedError, StoredFailureError, OutcomeUnknownError, ConflictError,
 * InDoubtError, StoreUnavailableError, ApprovalPendingError.
 */
export async function run(client: Store, op: Op, fn: ToolFn, options: RunOptions = {}): Promise<Outcome> {
  const tracer = client.tracer;
  if (tracer === undefined) return runOp(client, op, fn, options, undefined);
  const name = typeof op.tool === "string" && op.tool !== "" ? `execute_tool ${op.tool}` : "execute_tool";
  const spanOptions = { kind: SPAN_KIND_INTERNAL, attributes: toolAttributes(op) };
  const traced = async (span: Span): Promise<Outcome> => {
    try {
      const out = await runOp(client, op, fn, options, span);
      span.setAttribute(ATTR.REPLAYED, out.replayed);
      if (out.receipt.remote_id) span.setAttribute(ATTR.RECEIPT_REMOTE_ID, out.receipt.remote_id);
      return out;
    } catch (err) {
      failSpan(span, err);
      throw err;
    } finally {
      span.end();
    }
  };
  // Current while the call runs, where the tracer can make it so: the spans of the
  // store calls, and those the tool makes itself, are then its children.
  if (typeof tracer.startActiveSpan === "function") return tracer.startActiveSpan(name, spanOptions, traced);
  return traced(tracer.startSpan(name, spanOptions));
}

/** What a tool-call span says from the start, before anything is checked (Go's Do). */
function toolAttributes(op: Op): Attributes {
  const a: Attributes = {};
  if (typeof op.tool === "string") a[ATTR.TOOL_NAME] = op.tool;
  let cls: string | undefined;
  try {
    cls = CLASS_NAMES[classOf(op.sideEffect)];
  } catch {
    // an unknown sideEffect: refused by run, with the span recording why
  }
  if (cls !== undefined) {
    a[ATTR.TOOL_SIDE_EFFECT] = cls !== CLASS_NAMES.read_only;
    a[ATTR.TOOL_CLASS] = cls;
  }
  if (typeof op.key === "string") a[ATTR.IDEMPOTENCY_KEY] = op.key;
  if (typeof op.tenant === "string") a[ATTR.TENANT] = op.tenant;
  return a;
}

async function runOp(client: Store, op: Op, fn: ToolFn, options: RunOptions, span: Span | undefined): Promise<Outcome> {
  let cls: "read_only" | "idempotent" | "non_idempotent";
  let fp = "";
  try {
    cls = classOf(op.sideEffect);
    validate(op, cls);
    if (cls !== "read_only") fp = op.fingerprint ?? fingerprintOf(op.effect, op.drop ?? []);
  } catch (err) {
    throw new NotExecutedError(`idemkv: ${JSON.stringify(op.key)} not executed: ${messageOf(err)}`, { cause: err });
  }
  if (options.signal?.aborted) {
    throw new NotExecutedError(`idemkv: ${JSON.stringify(op.key)} not executed: aborted`, { cause: abortReason(options.signal) });
  }
  if (fp !== "") span?.setAttribute(ATTR.FINGERPRINT, fp);
  const r = new Attempt(client, op, cls, fp, options.signal, span);
  if (cls === "read_only") return r.unrecorded(fn);
  return r.loop(fn);
}

function validate(op: Op, cls: string): void {
  for (const f of ["tenant", "key", "tool"] as const) {
    if (typeof op[f] !== "string" || op[f] === "") throw new TypeError(`${f} is required`);
  }
  if (cls === "read_only") return;
  if (op.fingerprint !== undefined && (op.effect !== undefined || op.drop !== undefined)) {
    throw new TypeError("give an effect or a fingerprint, not both");
  }
  if (op.fingerprint === undefined && op.effect === undefined) {
    throw new TypeError("a mutating tool call needs an effect or a fingerprint");
  }
  if (op.leaseTtl !== undefined && !(op.leaseTtl >= 1000)) throw new TypeError("leaseTtl must be at least 1000 ms");
  if (op.approval !== undefined) {
    checkApproval(op.approval, "approval");
    if ((op.approval.required ?? true) && op.effect === undefined) {
      throw new TypeError("a call that requires approval needs its effect, not only a fingerprint: the approver approves what they can read");
    }
  }
}

/** A grant of ownership from reserve. */
interface Grant {
  decision: Decision;
  fence: number;
  record: IdemkvRecord | undefined;
}

/**
 * What a function run under the lease did: its value, or what it threw. threw tells a
 * thrown undefined from a return.
 */
interface Ran<T> {
  value?: T;
  threw: boolean;
  error?: unknown;
  lost?: LeaseLost;
}

/**
 * What a tool or probe threw, as the cause to report: a thrown undefined or null carries
 * no message (and a cause of undefined is none), so it becomes a TypeError that says so.
 */
function thrownCause(who: "tool" | "probe", thrown: unknown): unknown {
  if (thrown === undefined || thrown === null) return new TypeError(`the ${who} threw a non-Error value (${String(thrown)})`);
  return thrown;
}

class LeaseLost extends Error {
  constructor(key: string, cause: unknown) {
    super(`idemkv: lease on ${JSON.stringify(key)} lost to a newer attempt, the tool was stopped: ${messageOf(cause)}`, { cause });
    this.name = "LeaseLost";
  }
}

class Attempt {
  private readonly leaseTtl: number;
  private readonly q: string;
  private readonly attemptId: string;
  /** What this call may spend waiting for the store before the tool runs (Go's StoreWait), and after. */
  private readonly beforeBudget: StoreBudget;
  private readonly afterBudget: StoreBudget;

  constructor(
    private readonly client: Store,
    private readonly op: Op,
    private readonly cls: "read_only" | "idempotent" | "non_idempotent",
    private readonly fp: string,
    private readonly signal: AbortSignal | undefined,
    /** The tool call's span, when the client has a tracer. */
    private readonly span: Span | undefined,
  ) {
    this.leaseTtl = op.leaseTtl ?? client.settings.leaseTtl;
    this.q = JSON.stringify(op.key);
    this.attemptId = op.attemptId ?? newAttemptId();
    // Before the tool runs, a cluster nobody listens at is reported within connectWait.
    this.beforeBudget = { limitMs: client.settings.storeWait, spentMs: 0, connectWaitMs: client.settings.connectWait };
    this.afterBudget = { limitMs: client.settings.storeWait, spentMs: 0 };
  }

  /** Call options for a store call made before the tool runs: the caller's signal, the store-wait budget. */
  private before(): CallOptions {
    const o: CallOptions = { budget: this.beforeBudget };
    if (this.signal !== undefined) o.signal = this.signal;
    return o;
  }

  /**
   * Call options for storing an outcome: a store-wait budget of its own, and no signal:
   * the tool ran, so the caller giving up must not keep its outcome from being stored.
   */
  private after(): CallOptions {
    return { budget: this.afterBudget };
  }

  private event(name: string, attributes?: Attributes): void {
    this.span?.addEvent?.(name, attributes);
  }

  /** The record stays pending, and the span says so. */
  private unknown(message: string, details: IdemkvErrorDetails): OutcomeUnknownError {
    this.event("left_pending");
    return new OutcomeUnknownError(message, details);
  }

  /** Puts the reserve answer on the span, as attributes (the last answer wins) and as an event. */
  private decided(res: ReserveResult): void {
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
  private beforeError(err: unknown, decision?: Decision): Error {
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
  private gaveUp(signal: AbortSignal): StoreUnavailableError {
    this.event("store_unavailable");
    const reason = abortReason(signal);
    return new StoreUnavailableError(
      `idemkv: store unavailable for ${this.q}: the caller gave up with a reserve in flight, which may hold the key; ` +
        `the tool did not run; retry as attempt ${this.attemptId}: ${messageOf(reason)}`,
      { cause: reason, attemptId: this.attemptId });
  }

  /**
   * Runs a read-only tool, or an idempotent one unguarded: nothing is recorded, so from
   * idemkv's side the call never happened, and its error is a NotExecutedError.
   */
  async unrecorded(fn: ToolFn, unguarded = false): Promise<Outcome> {
    const ctx: ToolContext = { signal: this.signal ?? new AbortController().signal, tenant: this.op.tenant, key: this.op.key, tool: this.op.tool, decision: "execute", fence: 0 };
    let res: ToolResult;
    try {
      res = await storage.run(ctx, () => fn(ctx));
    } catch (err) {
      const cause = thrownCause("tool", err);
      throw new NotExecutedError(`idemkv: ${this.q} not executed: ${messageOf(cause)}`, { cause });
    }
    return {
      decision: "execute", replayed: false, probed: false, unrecorded: true, unguarded, resultOmitted: false, fingerprint: this.fp, fence: 0, attempts: 0,
      receipt: {
        idempotency_key: this.op.key, effect_fingerprint: this.fp, status: "committed",
        remote_system: res.remoteSystem, remote_id: res.remoteId, remote_url: res.remoteUrl, result: res.result,
      },
    };
  }

  async loop(fn: ToolFn): Promise<Outcome> {
    const op = this.op;
    const req: ReserveRequest = {
      tenant: op.tenant, idempotency_key: op.key, tool: op.tool, effect_fingerprint: this.fp,
      attempt_id: this.attemptId, lease_ttl_ms: this.leaseTtl,
    };
    if (op.actor !== undefined) req.actor = op.actor;
    if (op.ttl !== undefined) req.ttl_ms = op.ttl;
    if (op.approval !== undefined) {
      const ask = approvalAsk(op.approval);
      if (ask !== undefined) req.approval = ask;
      // A record that waits for approval keeps the effect for the approver.
      if (op.effect !== undefined) req.effect = reserveEffect(op.effect, op.drop ?? []);
    }
    const seen: ApprovalWait = { ids: [] };
    let settles = 0;
    for (let waits = 0; ; waits++) {
      let res: ReserveResult;
      // A reserve the signal had ended before it was sent holds nothing: not_executed.
      const sentAborted = this.signal?.aborted === true;
      try {
        res = await this.client.reserve(req, this.before());
      } catch (err) {
        if (this.signal?.aborted && !sentAborted) throw this.gaveUp(this.signal);
        const e = this.beforeError(err);
        if (e instanceof StoreUnavailableError && this.client.settings.onStoreUnavailable === "unguarded" && this.cls === "idempotent") {
          // Opt-in: an idempotent tool may run unrecorded rather than not at all.
          this.event("unguarded");
          return this.unrecorded(fn, true);
        }
        throw e;
      }
      this.decided(res);
      switch (res.decision) {
        case "replay":
          return this.replay(res);
        case "conflict":
          throw new ConflictError(
            `idemkv: conflict on ${this.q}: ${res.conflict?.reason ?? "conflict"} (existing ${res.conflict?.existing_fingerprint ?? "?"}, ` +
              `received ${res.conflict?.received_fingerprint ?? this.fp}` +
              (res.conflict?.existing_remote_id ? `, existing remote id ${res.conflict.existing_remote_id})` : ")"),
            res.conflict, { decision: "conflict", record: res.record });
        case "in_progress":
          await this.await(res, waits);
          continue;
        case "needs_approval":
          await awaitApproval({
            tenant: op.tenant, key: op.key, requirement: op.approval, callOptions: this.before(),
            get: (waitMs) => this.approvalGet(waitMs),
            backoffMaxMs: this.client.settings.backoffMaxMs, event: (name, a) => this.event(name, a),
            failed: (err) => this.beforeError(err, "needs_approval"),
          }, res, seen);
          continue;
        case "execute":
          return this.execute({ decision: "execute", fence: res.fence ?? 0, record: res.record }, fn);
        case "recover":
          if (res.fence === undefined || res.fence === 0 || res.record?.in_doubt) {
            // Bounded, should other callers keep marking the key in doubt in between.
            if (++settles > MAX_SETTLES) throw new InDoubtError(inDoubtMessage(this.q), { decision: "recover", record: res.record });
            const settled = await this.settleInDoubt(res);
            if (settled !== undefined) return settled;
            continue; // released, or settled by someone else: reserve again
          }
          return this.recover({ decision: "recover", fence: res.fence, record: res.record }, fn);
        default:
          throw new NotExecutedError(`idemkv: ${this.q} not executed: unknown reserve decision ${JSON.stringify(res.decision)}`,
            { record: res.record });
      }
    }
  }

  /**
   * The long-poll of the approval wait. A store that sheds it (resource_exhausted) or
   * does not answer is retried with backoff within storeWait, and for no longer than
   * this long-poll's wait (Go's awaitApproval): then undefined, the loop reserves again,
   * and the caller past its approval wait gets ApprovalPendingError, not a wait of the
   * whole storeWait.
   */
  private async approvalGet(waitMs: number): Promise<IdemkvRecord | undefined> {
    const shared = this.beforeBudget;
    const budget: StoreBudget = { ...shared, limitMs: Math.min(shared.limitMs, shared.spentMs + waitMs) };
    try {
      return await this.client.get(this.op.tenant, this.op.key, { ...this.before(), budget, waitMs });
    } catch (err) {
      if (isRetryable(err) && !this.signal?.aborted && budget.spentMs < shared.limitMs) return undefined;
      throw err;
    } finally {
      shared.spentMs = budget.spentMs;
      if (budget.answered === true) shared.answered = true;
    }
  }

  private replay(res: ReserveResult): Outcome {
    const rec = res.receipt ?? receiptOf(res.record);
    if (rec === undefined) {
      throw new NotExecutedError(`idemkv: replay of ${this.q} without a receipt`, { decision: "replay", record: res.record });
    }
    if (rec.status === "failed" && rec.error?.code === APPROVAL_DENIED) {
      throw new ApprovalDeniedError(`idemkv: ${this.q} was not run: its approval was ${rec.error.message}`, rec, true,
        { decision: "replay", record: res.record });
    }
    if (rec.status === "failed") {
      throw new StoredFailureError(failMessage(this.q, rec.error), rec, true, { decision: "replay", record: res.record });
    }
    return {
      decision: "replay", replayed: true, probed: false, unrecorded: false, unguarded: false, resultOmitted: resultOmitted(rec.result), receipt: rec, fingerprint: this.fp,
      fence: res.record?.fence ?? 0, attempts: res.record?.attempts ?? 0,
    };
  }

  /**
   * Long-polls the record another attempt holds until it settles or that attempt's
   * lease runs out; the caller then reserves again and learns which.
   */
  private async await(res: ReserveResult, waits: number): Promise<void> {
    let wait = this.client.settings.pollWait;
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
      rec = await this.client.get(this.op.tenant, this.op.key, { ...this.before(), waitMs: wait });
    } catch (err) {
      if (err instanceof ApiError && err.code === "not_found" && !this.signal?.aborted) return;
      throw this.beforeError(err, "in_progress");
    }
    if (rec.status === "pending" && Date.now() - start < wait / 2) {
      // Still held and the wait ended early: do not spin on a server whose clock and
      // ours disagree about the lease.
      await this.pause(waits + 1, "in_progress");
    }
  }

  private async pause(n: number, decision: Decision): Promise<void> {
    try {
      await sleep(backoff(n, this.client.settings.backoffMinMs, this.client.settings.backoffMaxMs), this.signal);
    } catch (err) {
      throw new NotExecutedError(`idemkv: ${this.q} not executed: aborted`, { decision, cause: err });
    }
  }

  private async recover(g: Grant, fn: ToolFn): Promise<Outcome> {
    if (this.cls === "idempotent") return this.execute(g, fn, true);
    const probe = this.op.probe;
    if (probe === undefined) return this.markInDoubt(g);
    const { value, threw, error, lost } = await this.underLease(g, probe);
    if (lost !== undefined) {
      throw this.unknown(`idemkv: outcome of ${this.q} unknown, a newer attempt owns the key: ${lost.message}`,
        { decision: g.decision, record: g.record, cause: lost });
    }
    if (threw) {
      // A probe that threw undefined said nothing either: it is no "not found", which
      // would run the tool again.
      const cause = thrownCause("probe", error);
      throw this.unknown(`idemkv: outcome of ${this.q} unknown, the record stays pending: the probe failed: ${messageOf(cause)}`,
        { decision: g.decision, record: g.record, cause });
    }
    this.event("probe", { found: value !== null && value !== undefined });
    if (value === null || value === undefined) return this.execute(g, fn);
    const out = await this.commit(g, value);
    return { ...out, probed: true };
  }

  /** A recovered attempt that cannot learn the outcome marks the record in doubt for a person or policy. */
  private async markInDoubt(g: Grant): Promise<never> {
    this.event("in_doubt");
    let record = g.record;
    let cause: unknown;
    try {
      record = await this.client.doubt(
        { tenant: this.op.tenant, idempotency_key: this.op.key, effect_fingerprint: this.fp, fence: g.fence }, this.after());
    } catch (err) {
      // The record stays pending under our fence; the next attempt after the lease
      // runs out gets recover again and marks it.
      cause = err;
    }
    const d: IdemkvErrorDetails = { decision: g.decision };
    if (record !== undefined) d.record = record;
    if (cause !== undefined) d.cause = cause;
    throw new InDoubtError(inDoubtMessage(this.q), d);
  }

  /**
   * A reserve of an in-doubt record answers recover without a fence. With a probe the
   * loop settles it (resolve committed with what the probe found, or not_executed and
   * reserve again); without one the caller gets InDoubtError at once.
   */
  private async settleInDoubt(res: ReserveResult): Promise<Outcome | undefined> {
    const probe = this.op.probe;
    if (probe === undefined) {
      this.event("in_doubt");
      throw new InDoubtError(inDoubtMessage(this.q), { decision: "recover", record: res.record });
    }
    const ctx = this.context({ decision: "recover", fence: 0, record: res.record }, this.signal ?? new AbortController().signal);
    let found: ToolResult | null | undefined;
    try {
      found = await storage.run(ctx, () => probe(ctx));
    } catch (err) {
      this.event("in_doubt");
      const cause = thrownCause("probe", err);
      throw new InDoubtError(`${inDoubtMessage(this.q)}; the probe failed: ${messageOf(cause)}`, { decision: "recover", record: res.record, cause });
    }
    this.event("probe", { found: found !== null && found !== undefined });
    const base = { tenant: this.op.tenant, idempotency_key: this.op.key, effect_fingerprint: this.fp };
    try {
      if (found === null || found === undefined) {
        await this.client.resolve({ ...base, outcome: "not_executed" }, this.after());
        this.event("released");
        return undefined;
      }
      const req = { ...base, outcome: "committed" as const, remote_system: found.remoteSystem, remote_id: found.remoteId };
      const url = found.remoteUrl;
      const answer = await this.fitted(found.result, (result) => this.client.resolve(
        url === undefined && result === undefined ? req : { ...req, remote_url: url, result }, this.after()));
      const receipt = answer as Receipt;
      return {
        decision: "recover", replayed: false, probed: true, unrecorded: false, unguarded: false, resultOmitted: resultOmitted(receipt.result), receipt, fingerprint: this.fp,
        fence: res.record?.fence ?? 0, attempts: res.record?.attempts ?? 0,
      };
    } catch (err) {
      // Someone settled it first: reserving again shows how.
      if (err instanceof ApiError && (err.code === "not_pending" || err.code === "not_found")) return undefined;
      this.event("in_doubt");
      throw new InDoubtError(`${inDoubtMessage(this.q)}; resolving it failed: ${messageOf(err)}`,
        { decision: "recover", record: res.record, cause: err });
    }
  }

  private context(g: Grant, signal: AbortSignal): ToolContext {
    return { signal, tenant: this.op.tenant, key: this.op.key, tool: this.op.tool, decision: g.decision, fence: g.fence };
  }

  /**
   * Runs the tool under g. earlier says that an attempt before this one may have run it
   * (an idempotent re-execution on recover): a "not executed" from this call then says
   * nothing about that attempt, so the key stays pending (outcome unknown) instead of
   * being released, which would say the effect certainly did not happen and free the
   * key for other arguments.
   */
  private async execute(g: Grant, fn: ToolFn, earlier = false): Promise<Outcome> {
    const ran = await this.underLease(g, fn);
    const { value, threw, lost } = ran;
    const d = (cause: unknown): IdemkvErrorDetails => ({ decision: g.decision, record: g.record, cause });
    if (threw && (ran.error === undefined || ran.error === null)) {
      // Nothing to classify, as Go's tool that returns neither a result nor an error.
      const cause = thrownCause("tool", ran.error);
      if (lost !== undefined) {
        throw this.unknown(`idemkv: outcome of ${this.q} unknown, a newer attempt owns the key: ${lost.message}`, d(cause));
      }
      throw this.unknown(`idemkv: outcome of ${this.q} unknown, the record stays pending: ${messageOf(cause)}`, d(cause));
    }
    let error = ran.error;
    if (threw && !(error instanceof NotExecutedMark) && !(error instanceof PermanentError)) {
      // The classes the call declared, with Go's semantics. A classifier that throws says
      // nothing of the tool's error: the record stays pending, as when Go's classifying
      // of the tool's error panics, and the key is never released for a tool that may
      // have run.
      let classifier = "notExecutedOn";
      try {
        if (this.op.notExecutedOn?.(error)) {
          error = new NotExecutedMark(error);
        } else {
          classifier = "permanentOn";
          if (this.op.permanentOn?.(error)) error = new PermanentError(error);
        }
      } catch (thrown) {
        const why = lost !== undefined ? `a newer attempt owns the key: ${lost.message}; ` : "the record stays pending: ";
        throw this.unknown(`idemkv: outcome of ${this.q} unknown, ${why}the tool threw (${messageOf(error)}) and its ` +
          `${classifier} threw: ${messageOf(thrown)}`, d(thrown));
      }
    }
    if (lost !== undefined) {
      // A newer attempt owns the key; it decides the outcome (and probes for ours).
      throw this.unknown(`idemkv: outcome of ${this.q} unknown, a newer attempt owns the key: ${lost.message}`, d(threw ? error : lost));
    }
    if (error instanceof NotExecutedMark && earlier) {
      throw this.unknown(
        `idemkv: outcome of ${this.q} unknown, the record stays pending: an earlier attempt may have run the tool; ` +
          `this one did not: ${messageOf(error.cause)}`, d(error.cause));
    }
    if (error instanceof NotExecutedMark) return this.release(g, error);
    if (error instanceof PermanentError) return this.fail(g, error);
    if (threw) {
      throw this.unknown(`idemkv: outcome of ${this.q} unknown, the record stays pending: ${messageOf(error)}`, d(error));
    }
    if (value === null || value === undefined || typeof value.remoteSystem !== "string" || typeof value.remoteId !== "string" ||
      value.remoteSystem === "" || value.remoteId === "") {
      throw this.unknown(
        `idemkv: outcome of ${this.q} unknown, the record stays pending: the tool returned no receipt (remoteSystem and remoteId)`,
        d(new TypeError("the tool returned no receipt")));
    }
    return this.commit(g, value);
  }

  /**
   * Runs f while a heartbeat keeps the lease alive. lost is set when the lease went to
   * a newer attempt; f's signal was then aborted.
   *
   * The heartbeat lasts exactly as long as f (Go's underLease): not less when the
   * caller's signal aborts (a tool that does not watch its signal goes on, and without a
   * lease a second worker would recover the key and run it again), so it stops on a
   * controller of its own; and not more when f throws, so it stops in finally.
   */
  private async underLease<T>(g: Grant, f: (ctx: ToolContext) => Promise<T>): Promise<Ran<T>> {
    const tool = linkedController([this.signal]);
    const stop = new AbortController();
    let lost: LeaseLost | undefined;
    const every = this.leaseTtl / 3;
    const beat = (async () => {
      let next = every;
      for (;;) {
        try {
          await sleep(next, stop.signal);
        } catch {
          return;
        }
        try {
          await this.client.heartbeat(
            { tenant: this.op.tenant, idempotency_key: this.op.key, fence: g.fence, lease_ttl_ms: this.leaseTtl },
            { signal: stop.signal, budget: { limitMs: every, spentMs: 0 } });
          next = every;
        } catch (err) {
          if (stop.signal.aborted) return;
          if (err instanceof ApiError && (err.code === "fenced" || err.code === "not_pending" || err.code === "not_found")) {
            lost = new LeaseLost(this.op.key, err);
            this.event("lease_lost");
            tool.controller.abort(lost);
            return;
          }
          // The lease still has two thirds to run: try again soon.
          next = Math.max(every / 6, 50);
        }
      }
    })();
    const ctx = this.context(g, tool.signal);
    const out: Ran<T> = { threw: false };
    try {
      out.value = await storage.run(ctx, () => f(ctx));
    } catch (err) {
      out.threw = true;
      out.error = err;
    } finally {
      stop.abort();
      await beat;
      tool.dispose();
    }
    if (lost !== undefined) out.lost = lost;
    return out;
  }

  private async commit(g: Grant, res: ToolResult): Promise<Outcome> {
    let receipt: Receipt;
    try {
      const req = {
        tenant: this.op.tenant, idempotency_key: this.op.key, effect_fingerprint: this.fp, fence: g.fence,
        remote_system: res.remoteSystem, remote_id: res.remoteId,
      };
      receipt = await this.fitted(res.result, (result) => this.client.commit(
        res.remoteUrl === undefined && result === undefined ? req : { ...req, remote_url: res.remoteUrl, result }, this.after()));
    } catch (err) {
      throw this.unknown(
        `idemkv: outcome of ${this.q} unknown, the record stays pending: the tool ran but its receipt (remote id ` +
          `${JSON.stringify(res.remoteId)}) was not stored: ${messageOf(err)}`,
        { decision: g.decision, record: g.record, cause: err });
    }
    if (receipt.status === "failed") {
      // The first stored outcome wins, and it was a failure.
      throw new StoredFailureError(failMessage(this.q, receipt.error), receipt, true, { decision: g.decision, record: g.record });
    }
    return {
      decision: g.decision, replayed: false, probed: false, unrecorded: false, unguarded: false, resultOmitted: resultOmitted(receipt.result), receipt, fingerprint: this.fp,
      fence: g.fence, attempts: g.record?.attempts ?? 0,
    };
  }

  /**
   * Stores with send(result); a result the server refuses as too large (payload_too_large)
   * is sent again as the note of OMITTED_RESULT_KEY.
   */
  private async fitted<T>(result: unknown, send: (result: unknown) => Promise<T>): Promise<T> {
    if (result === undefined) return send(undefined);
    const size = encodedSize(result);
    // Over the body limit every server has: no need to ask.
    if (size > MAX_BODY_BYTES) return send(omittedNote(size));
    try {
      return await send(result);
    } catch (err) {
      if (!(err instanceof ApiError && err.code === "payload_too_large")) throw err;
    }
    this.event("result_omitted", { bytes: size });
    return send(omittedNote(size));
  }

  private async fail(g: Grant, perm: PermanentError): Promise<Outcome> {
    const info: ErrorInfo = { code: printable(perm.code, 128) || "tool_failed", message: printable(messageOf(perm.cause), 4096) };
    if (perm.details !== undefined) info.details = perm.details;
    let rec: IdemkvRecord;
    try {
      rec = await this.client.fail(
        { tenant: this.op.tenant, idempotency_key: this.op.key, effect_fingerprint: this.fp, fence: g.fence, error: info }, this.after());
    } catch (err) {
      throw this.unknown(
        `idemkv: outcome of ${this.q} unknown, the record stays pending: the tool failed for good but the failure was not stored: ${messageOf(err)}`,
        { decision: g.decision, record: g.record, cause: perm });
    }
    const stored = receiptOf(rec);
    if (stored !== undefined && stored.status === "committed") {
      return {
        decision: g.decision, replayed: false, probed: false, unrecorded: false, unguarded: false, resultOmitted: resultOmitted(stored.result), receipt: stored, fingerprint: this.fp,
        fence: g.fence, attempts: rec.attempts,
      };
    }
    const receipt = stored ?? { idempotency_key: this.op.key, effect_fingerprint: this.fp, status: "failed", error: info };
    throw new StoredFailureError(failMessage(this.q, receipt.error), receipt, false, { decision: g.decision, record: rec, cause: perm.cause });
  }

  private async release(g: Grant, mark: NotExecutedMark): Promise<never> {
    const d: IdemkvErrorDetails = { decision: g.decision, cause: mark.cause };
    try {
      await this.client.release(
        { tenant: this.op.tenant, idempotency_key: this.op.key, effect_fingerprint: this.fp, fence: g.fence }, this.after());
    } catch (err) {
      // Gone already, or a newer attempt owns the key: not ours to free either way.
      if (!(err instanceof ApiError && (err.code === "not_found" || err.code === "fenced"))) {
        throw new NotExecutedError(
          `idemkv: ${this.q} not executed (${messageOf(mark.cause)}), but releasing the key failed; it frees when the lease ` +
            `runs out: ${messageOf(err)}`, { ...d, record: g.record });
      }
    }
    this.event("released");
    throw new NotExecutedError(`idemkv: ${this.q} not executed, the key is released: ${messageOf(mark.cause)}`, d);
  }
}

function receiptOf(rec: IdemkvRecord | undefined): Receipt | undefined {
  if (rec === undefined) return undefined;
  if (rec.status === "committed" && rec.receipt !== undefined) {
    const r: Receipt = {
      idempotency_key: rec.idempotency_key, effect_fingerprint: rec.effect_fingerprint, status: "committed",
      remote_system: rec.receipt.remote_system, remote_id: rec.receipt.remote_id, committed_at: rec.receipt.committed_at,
    };
    if (rec.receipt.remote_url !== undefined) r.remote_url = rec.receipt.remote_url;
    if (rec.receipt.result !== undefined) r.result = rec.receipt.result;
    return r;
  }
  if (rec.status === "failed") {
    const r: Receipt = { idempotency_key: rec.idempotency_key, effect_fingerprint: rec.effect_fingerprint, status: "failed" };
    if (rec.error !== undefined) r.error = rec.error;
    return r;
  }
  return undefined;
}

function failMessage(q: string, info: ErrorInfo | undefined): string {
  return info === undefined ? `idemkv: ${q} failed permanently` : `idemkv: ${q} failed permanently: ${info.code}: ${info.message}`;
}

function inDoubtMessage(q: string): string {
  return `idemkv: ${q} is in doubt: an earlier attempt died and the tool has no way to learn whether its effect happened; ` +
    "settle it with client.resolve or `idemkv resolve`";
}

/**
 * The server stores printable UTF-8 only (Go's unicode.IsPrint: letters, marks,
 * numbers, punctuation, symbols and the ASCII space), at most max bytes; tool errors
 * often span lines, and that must not make the failure unstorable.
 */
function printable(s: string, max: number): string {
  const clean = s.replace(/[^\p{L}\p{M}\p{N}\p{P}\p{S} ]/gu, " ");
  let out = "";
  let bytes = 0;
  for (const ch of clean) {
    const cp = ch.codePointAt(0) as number;
    bytes += cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (bytes > max) break;
    out += ch;
  }
  return out;
}
