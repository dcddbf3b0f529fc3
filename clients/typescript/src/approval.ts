// Approvals bound to the effect (docs/protocol.md section 7), as the tool-call loop sees
// them: what a tool asks of approvals, and the wait for a decision. The approval belongs
// to the key, the tool and the effect's fingerprint and lives in the record, so however
// often a suspended runtime resumes, a call with the same key and effect sees the same
// request (one card); an approved one runs the tool once, another effect is a conflict.

import type { CallOptions } from "./client.js";
import { ApiError, ApprovalPendingError, messageOf } from "./errors.js";
import { canonicalize, canonicalizeJSON } from "./jcs.js";
import type { Attributes } from "./telemetry.js";
import type { ApprovalAsk, Record as IdemkvRecord, ReserveResult } from "./types.js";
import { abortReason, sleep } from "./util.js";
import { MAX_WAIT_MS } from "./client.js";

/** The server's bounds of an approval's wait (Go's idemkv.MinApprovalTTL, MaxApprovalTTL). */
const MIN_TTL_MS = 60_000;
const MAX_TTL_MS = 30 * 24 * 3600_000;

/**
 * What a tool asks of approvals (Go's ApprovalRequirement).
 *   - required (default true): a person approves the effect before it runs. Give a
 *     requirement with required false for a tool an admin's rule may hold: the reserve then
 *     carries the effect such a record keeps for the approver.
 *   - ttl: ms the request waits for a decision before it lapses (1 minute to 30 days;
 *     default the server's, 24 h).
 *   - summary: what the approver reads beside the effect (at most 1 KiB); for idempotent()
 *     it may be a function of the tool's arguments.
 *   - wait: ms the call waits for the decision (long-polls that wake on it), then runs the
 *     tool (approved) or throws the denial; 0, the default, throws ApprovalPendingError at
 *     once, for runtimes that suspend and call again, same key and effect, once resumed.
 */
export interface ApprovalRequirement<A extends unknown[] = unknown[]> {
  required?: boolean;
  ttl?: number;
  summary?: string | ((...args: A) => string);
  wait?: number;
}

/** Refuses a requirement that would fail every call; where: the option's name in the message. */
export function checkApproval(a: unknown, where: string): void {
  if (typeof a !== "object" || a === null) throw new TypeError(`idemkv: ${where} is { required?, ttl?, summary?, wait? }`);
  const r = a as { [name: string]: unknown };
  for (const name of Object.keys(r)) {
    if (!["required", "ttl", "summary", "wait"].includes(name)) throw new TypeError(`idemkv: ${where} has no member ${JSON.stringify(name)}; it takes required, ttl, summary, wait`);
  }
  if (r.required !== undefined && typeof r.required !== "boolean") throw new TypeError(`idemkv: ${where}.required is true or false`);
  if (r.ttl !== undefined && !(typeof r.ttl === "number" && r.ttl >= MIN_TTL_MS && r.ttl <= MAX_TTL_MS)) {
    throw new TypeError(`idemkv: ${where}.ttl is ms from ${MIN_TTL_MS} to ${MAX_TTL_MS} (30 days)`);
  }
  if (r.wait !== undefined && !(typeof r.wait === "number" && r.wait >= 0)) throw new TypeError(`idemkv: ${where}.wait is ms, 0 or more`);
  if (r.summary !== undefined && typeof r.summary !== "string" && typeof r.summary !== "function") {
    throw new TypeError(`idemkv: ${where}.summary is text or a function of the tool's arguments`);
  }
}

/** The reserve's "approval" member, or undefined when the requirement asks nothing. */
export function approvalAsk(a: ApprovalRequirement<never[]>): ApprovalAsk | undefined {
  const required = a.required ?? true;
  if (typeof a.summary === "function") throw new TypeError("a summary function is for idempotent(), which calls it with the tool's arguments; give run the text");
  if (!required && a.ttl === undefined && (a.summary ?? "") === "") return undefined;
  const out: ApprovalAsk = { required };
  if (a.ttl !== undefined) out.ttl_ms = Math.round(a.ttl);
  if (a.summary !== undefined && a.summary !== "") out.summary = a.summary;
  return out;
}

/** The effect as a reserve that asks for approval carries it: its canonical JSON, drop paths removed. */
export function reserveEffect(effect: unknown, drop: readonly string[]): unknown {
  return JSON.parse(canonicalize(effect, drop));
}

/**
 * The same of an effect given as JSON text: its canonical form holds only numbers that a
 * double keeps exactly, in the shortest form JSON.stringify writes back, and no duplicate
 * members, so parsing it loses nothing.
 */
export function reserveEffectJSON(text: string | Uint8Array, drop: readonly string[]): unknown {
  return JSON.parse(canonicalizeJSON(text, drop));
}

/** What one call has seen of its approval: the end of its wait, the requests. */
export interface ApprovalWait {
  deadline?: number;
  ids: string[];
}

/** What the wait needs of the loop's attempt. */
export interface ApprovalWaiter {
  tenant: string;
  key: string;
  requirement: ApprovalRequirement<never[]> | undefined;
  /** The record, long-polled; undefined when the store gave no answer within the wait (reserve again). */
  get(waitMs: number): Promise<IdemkvRecord | undefined>;
  callOptions: CallOptions;
  backoffMaxMs: number;
  event(name: string, attributes?: Attributes): void;
  /** A failed store call before the tool ran, as the loop's kind. */
  failed(err: unknown): Error;
}

/**
 * After a needs_approval answer: long-polls the record until the decision (or the request
 * lapses, or the wait ends); the caller then reserves again and gets execute (approved), the
 * denial's replay, or a new request (lapsed). Without a wait, or once it is spent, throws
 * ApprovalPendingError; so does a caller's signal that aborts during the wait, with the abort
 * as cause (Go's awaitApproval): the request still waits, and a later call with the same key
 * finds it, never a second one.
 */
export async function awaitApproval(w: ApprovalWaiter, res: ReserveResult, seen: ApprovalWait): Promise<void> {
  const approval = res.approval ?? res.record?.approval;
  const id = approval?.id ?? "";
  const last = seen.ids[seen.ids.length - 1];
  if (last !== undefined && last !== id) {
    // The request this call waited on lapsed unanswered; the server asked anew.
    w.event("approval_lapsed", { "idemkv.approval.id": last });
  }
  if (last !== id) seen.ids.push(id);
  w.event("approval_pending", { "idemkv.approval.id": id });
  const lapsed = seen.ids.slice(0, -1);
  let msg = `idemkv: ${JSON.stringify(w.key)} (tenant ${JSON.stringify(w.tenant)}) waits for approval ${id} ` +
    `(requested ${approval?.requested_at ?? "?"}, lapses ${approval?.expires_at ?? "?"}); nothing ran`;
  if (lapsed.length > 0) msg += `; earlier requests lapsed unanswered: ${lapsed.join(", ")}`;
  const pending = (cause?: unknown) => new ApprovalPendingError(
    cause === undefined ? msg : `${msg}; the caller stopped waiting: ${messageOf(cause)}`,
    w.tenant, w.key, approval, lapsed, cause === undefined ? { record: res.record } : { record: res.record, cause });
  const waitFor = w.requirement?.wait ?? 0;
  if (waitFor <= 0) throw pending();
  seen.deadline ??= Date.now() + waitFor;
  const wait = Math.min(seen.deadline - Date.now(), MAX_WAIT_MS);
  if (wait <= 0) throw pending();
  const signal = w.callOptions.signal;
  const start = Date.now();
  let rec: IdemkvRecord | undefined;
  try {
    rec = await w.get(wait);
  } catch (err) {
    // Whatever the long-poll got, a caller that gave up meanwhile is answered as Go answers
    // it: nothing ran, and the request is still there to be decided.
    if (signal?.aborted) throw pending(abortReason(signal));
    if (err instanceof ApiError && err.code === "not_found") return;
    // The loop's kind: store_unavailable once storeWait is spent, not_executed for a
    // refusal (a token that may not read the key): nothing ran either way.
    throw w.failed(err);
  }
  if (signal?.aborted) throw pending(abortReason(signal));
  if (rec === undefined) return;
  if (rec.status === "awaiting_approval" && rec.approval?.state === "waiting" && Date.now() - start < wait / 2) {
    // Still waiting, and the long-poll ended early: do not spin.
    try {
      await sleep(w.backoffMaxMs, signal);
    } catch (err) {
      throw pending(err);
    }
  }
}
