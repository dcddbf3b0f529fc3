// The tool-call loop, with the semantics of the Go client's Do (docs/protocol.md, "Tool
// classes and the client loop"): reserve, then replay | conflict | wait while another
// attempt holds the key | execute under a heartbeat | recover (probe, re-run, or in
// doubt), then store the outcome. Every error it throws is one of the six kinds in
// errors.ts.
//
// The stages live in modules of their own: attempt.ts (what they share), wait.ts,
// execute.ts, lease.ts, indoubt.ts, outcome.ts; tool.ts has the types run takes.

import { Attempt } from "./attempt.js";
import { approvalAsk, checkApproval, reserveEffect, reserveEffectJSON, type ApprovalWait } from "./approval.js";
import { ConflictError, InDoubtError, messageOf, NotExecutedError, StoreUnavailableError } from "./errors.js";
import { execute, unrecorded } from "./execute.js";
import { inDoubtMessage, recover, settleInDoubt } from "./indoubt.js";
import { fingerprint as fingerprintOf, fingerprintJSON } from "./jcs.js";
import { replay } from "./outcome.js";
import { ATTR, failSpan, SPAN_KIND_INTERNAL, type Attributes, type Span } from "./telemetry.js";
import { CLASS_NAMES, classOf, type Op, type Outcome, type RunOptions, type Store, type ToolClass, type ToolFn } from "./tool.js";
import type { ReserveRequest, ReserveResult } from "./types.js";
import { abortReason } from "./util.js";
import { awaitHolder, waitForApproval } from "./wait.js";

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
  let cls: ToolClass;
  let fp = "";
  try {
    cls = classOf(op.sideEffect);
    validate(op, cls);
    if (cls !== "read_only") {
      fp = op.fingerprint ?? (op.effectJSON !== undefined ? fingerprintJSON(op.effectJSON, op.drop ?? []) : fingerprintOf(op.effect, op.drop ?? []));
    }
  } catch (err) {
    throw new NotExecutedError(`idemkv: ${JSON.stringify(op.key)} not executed: ${messageOf(err)}`, { cause: err });
  }
  if (options.signal?.aborted) {
    throw new NotExecutedError(`idemkv: ${JSON.stringify(op.key)} not executed: aborted`, { cause: abortReason(options.signal) });
  }
  if (fp !== "") span?.setAttribute(ATTR.FINGERPRINT, fp);
  const r = new Attempt(client, op, cls, fp, options.signal, span);
  if (cls === "read_only") return unrecorded(r, fn);
  return loop(r, fn);
}

function validate(op: Op, cls: string): void {
  for (const f of ["tenant", "key", "tool"] as const) {
    if (typeof op[f] !== "string" || op[f] === "") throw new TypeError(`${f} is required`);
  }
  if (cls === "read_only") return;
  if (op.effect !== undefined && op.effectJSON !== undefined) {
    throw new TypeError("give effect (a value) or effectJSON (its JSON text), not both");
  }
  if (op.effectJSON !== undefined && typeof op.effectJSON !== "string" && !(op.effectJSON instanceof Uint8Array)) {
    throw new TypeError("effectJSON is JSON text: a string, or its UTF-8 bytes");
  }
  const hasEffect = op.effect !== undefined || op.effectJSON !== undefined;
  if (op.fingerprint !== undefined && (hasEffect || op.drop !== undefined)) {
    throw new TypeError("give an effect or a fingerprint, not both");
  }
  if (op.fingerprint === undefined && !hasEffect) {
    throw new TypeError("a mutating tool call needs an effect or a fingerprint");
  }
  if (op.leaseTtl !== undefined && !(op.leaseTtl >= 1000)) throw new TypeError("leaseTtl must be at least 1000 ms");
  if (op.approval !== undefined) {
    checkApproval(op.approval, "approval");
    if ((op.approval.required ?? true) && !hasEffect) {
      throw new TypeError("a call that requires approval needs its effect, not only a fingerprint: the approver approves what they can read");
    }
  }
}

/** Rounds of probe, resolve not_executed and reserve again in one call (Go's maxSettles). */
const MAX_SETTLES = 8;

/** Reserves until the call resolves: replayed, run, recovered, or ended by one of the loop's errors. */
async function loop(a: Attempt, fn: ToolFn): Promise<Outcome> {
  const op = a.op;
  const req: ReserveRequest = {
    tenant: op.tenant, idempotency_key: op.key, tool: op.tool, effect_fingerprint: a.fp,
    attempt_id: a.attemptId, lease_ttl_ms: a.leaseTtl,
  };
  if (op.actor !== undefined) req.actor = op.actor;
  if (op.ttl !== undefined) req.ttl_ms = op.ttl;
  if (op.approval !== undefined) {
    const ask = approvalAsk(op.approval);
    if (ask !== undefined) req.approval = ask;
    // A record that waits for approval keeps the effect for the approver.
    if (op.effectJSON !== undefined) req.effect = reserveEffectJSON(op.effectJSON, op.drop ?? []);
    else if (op.effect !== undefined) req.effect = reserveEffect(op.effect, op.drop ?? []);
  }
  const seen: ApprovalWait = { ids: [] };
  let settles = 0;
  for (let waits = 0; ; waits++) {
    let res: ReserveResult;
    // A reserve the signal had ended before it was sent holds nothing: not_executed.
    const sentAborted = a.signal?.aborted === true;
    const leaseFrom = Date.now();
    try {
      res = await a.client.reserve(req, a.before());
    } catch (err) {
      if (a.signal?.aborted && !sentAborted) throw a.gaveUp(a.signal);
      const e = a.beforeError(err);
      if (e instanceof StoreUnavailableError && a.client.settings.onStoreUnavailable === "unguarded" && a.cls === "idempotent") {
        // Opt-in: an idempotent tool may run unrecorded rather than not at all.
        a.event("unguarded");
        return unrecorded(a, fn, true);
      }
      throw e;
    }
    a.decided(res);
    switch (res.decision) {
      case "replay":
        return replay(a, res);
      case "conflict":
        throw new ConflictError(
          `idemkv: conflict on ${a.q}: ${res.conflict?.reason ?? "conflict"} (existing ${res.conflict?.existing_fingerprint ?? "?"}, ` +
            `received ${res.conflict?.received_fingerprint ?? a.fp}` +
            (res.conflict?.existing_remote_id ? `, existing remote id ${res.conflict.existing_remote_id})` : ")"),
          res.conflict, { decision: "conflict", record: res.record });
      case "in_progress":
        await awaitHolder(a, res, waits);
        continue;
      case "needs_approval":
        await waitForApproval(a, res, seen);
        continue;
      case "execute":
        return execute(a, { decision: "execute", fence: res.fence ?? 0, record: res.record, leaseFrom }, fn);
      case "recover":
        if (res.fence === undefined || res.fence === 0 || res.record?.in_doubt) {
          // Bounded, should other callers keep marking the key in doubt in between.
          if (++settles > MAX_SETTLES) throw new InDoubtError(inDoubtMessage(a.q), { decision: "recover", record: res.record });
          const settled = await settleInDoubt(a, res);
          if (settled !== undefined) return settled;
          continue; // released, or settled by someone else: reserve again
        }
        return recover(a, { decision: "recover", fence: res.fence, record: res.record, leaseFrom }, fn);
      default:
        throw new NotExecutedError(`idemkv: ${a.q} not executed: unknown reserve decision ${JSON.stringify(res.decision)}`,
          { record: res.record });
    }
  }
}
