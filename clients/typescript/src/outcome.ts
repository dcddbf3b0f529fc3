// Storing and replaying outcomes: the tool's receipt committed (a result too large to
// store stands in as a note), a permanent failure stored, a key released after a tool
// that certainly did not run, and a stored receipt replayed. Once the tool ran, its
// outcome is stored with the attempt's after() options, which no caller's signal ends.

import type { Attempt, Grant } from "./attempt.js";
import { APPROVAL_DENIED, ApiError, ApprovalDeniedError, messageOf, NotExecutedError, NotExecutedMark, PermanentError, StoredFailureError, type IdemkvErrorDetails } from "./errors.js";
import type { Outcome, ToolResult } from "./tool.js";
import type { ErrorInfo, Receipt, Record as IdemkvRecord, ReserveResult } from "./types.js";

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

/**
 * Stores with send(result); a result the server refuses as too large (payload_too_large)
 * is sent again as the note of OMITTED_RESULT_KEY.
 */
export async function fitted<T>(a: Attempt, result: unknown, send: (result: unknown) => Promise<T>): Promise<T> {
  if (result === undefined) return send(undefined);
  const size = encodedSize(result);
  // Over the body limit every server has: no need to ask.
  if (size > MAX_BODY_BYTES) return send(omittedNote(size));
  try {
    return await send(result);
  } catch (err) {
    if (!(err instanceof ApiError && err.code === "payload_too_large")) throw err;
  }
  a.event("result_omitted", { bytes: size });
  return send(omittedNote(size));
}

/** A replay answer as the call's outcome, or the stored failure or denial it replays. */
export function replay(a: Attempt, res: ReserveResult): Outcome {
  const rec = res.receipt ?? receiptOf(res.record);
  if (rec === undefined) {
    throw new NotExecutedError(`idemkv: replay of ${a.q} without a receipt`, { decision: "replay", record: res.record });
  }
  if (rec.status === "failed" && rec.error?.code === APPROVAL_DENIED) {
    throw new ApprovalDeniedError(`idemkv: ${a.q} was not run: its approval was ${rec.error.message}`, rec, true,
      { decision: "replay", record: res.record });
  }
  if (rec.status === "failed") {
    throw new StoredFailureError(failMessage(a.q, rec.error), rec, true, { decision: "replay", record: res.record });
  }
  return {
    decision: "replay", replayed: true, probed: false, unrecorded: false, unguarded: false, resultOmitted: resultOmitted(rec.result), receipt: rec, fingerprint: a.fp,
    fence: res.record?.fence ?? 0, attempts: res.record?.attempts ?? 0,
  };
}

/** Stores the receipt of a tool that ran (or that the probe found) under g. */
export async function commit(a: Attempt, g: Grant, res: ToolResult): Promise<Outcome> {
  let receipt: Receipt;
  try {
    const req = {
      tenant: a.op.tenant, idempotency_key: a.op.key, effect_fingerprint: a.fp, fence: g.fence,
      remote_system: res.remoteSystem, remote_id: res.remoteId,
    };
    receipt = await fitted(a, res.result, (result) => a.client.commit(
      res.remoteUrl === undefined && result === undefined ? req : { ...req, remote_url: res.remoteUrl, result }, a.after()));
  } catch (err) {
    throw a.unknown(
      `idemkv: outcome of ${a.q} unknown, the record stays pending: the tool ran but its receipt (remote id ` +
        `${JSON.stringify(res.remoteId)}) was not stored: ${messageOf(err)}`,
      { decision: g.decision, record: g.record, cause: err });
  }
  if (receipt.status === "failed") {
    // The first stored outcome wins, and it was a failure.
    throw new StoredFailureError(failMessage(a.q, receipt.error), receipt, true, { decision: g.decision, record: g.record });
  }
  return {
    decision: g.decision, replayed: false, probed: false, unrecorded: false, unguarded: false, resultOmitted: resultOmitted(receipt.result), receipt, fingerprint: a.fp,
    fence: g.fence, attempts: g.record?.attempts ?? 0,
  };
}

/** Stores a permanent failure of the tool under g; a receipt stored first wins. */
export async function fail(a: Attempt, g: Grant, perm: PermanentError): Promise<Outcome> {
  const info: ErrorInfo = { code: printable(perm.code, 128) || "tool_failed", message: printable(messageOf(perm.cause), 4096) };
  if (perm.details !== undefined) info.details = perm.details;
  let rec: IdemkvRecord;
  try {
    rec = await a.client.fail(
      { tenant: a.op.tenant, idempotency_key: a.op.key, effect_fingerprint: a.fp, fence: g.fence, error: info }, a.after());
  } catch (err) {
    throw a.unknown(
      `idemkv: outcome of ${a.q} unknown, the record stays pending: the tool failed for good but the failure was not stored: ${messageOf(err)}`,
      { decision: g.decision, record: g.record, cause: perm });
  }
  const stored = receiptOf(rec);
  if (stored !== undefined && stored.status === "committed") {
    return {
      decision: g.decision, replayed: false, probed: false, unrecorded: false, unguarded: false, resultOmitted: resultOmitted(stored.result), receipt: stored, fingerprint: a.fp,
      fence: g.fence, attempts: rec.attempts,
    };
  }
  const receipt = stored ?? { idempotency_key: a.op.key, effect_fingerprint: a.fp, status: "failed", error: info };
  throw new StoredFailureError(failMessage(a.q, receipt.error), receipt, false, { decision: g.decision, record: rec, cause: perm.cause });
}

/** Frees the key after a tool that certainly did not run, and says so. */
export async function release(a: Attempt, g: Grant, mark: NotExecutedMark): Promise<never> {
  const d: IdemkvErrorDetails = { decision: g.decision, cause: mark.cause };
  try {
    await a.client.release(
      { tenant: a.op.tenant, idempotency_key: a.op.key, effect_fingerprint: a.fp, fence: g.fence }, a.after());
  } catch (err) {
    // Gone already, or a newer attempt owns the key: not ours to free either way.
    if (!(err instanceof ApiError && (err.code === "not_found" || err.code === "fenced"))) {
      throw new NotExecutedError(
        `idemkv: ${a.q} not executed (${messageOf(mark.cause)}), but releasing the key failed; it frees when the lease ` +
          `runs out: ${messageOf(err)}`, { ...d, record: g.record });
    }
  }
  a.event("released");
  throw new NotExecutedError(`idemkv: ${a.q} not executed, the key is released: ${messageOf(mark.cause)}`, d);
}

/** The receipt a settled record holds (committed or failed); undefined while it is pending. */
export function receiptOf(rec: IdemkvRecord | undefined): Receipt | undefined {
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

/** The message of a StoredFailureError for the key q. */
export function failMessage(q: string, info: ErrorInfo | undefined): string {
  return info === undefined ? `idemkv: ${q} failed permanently` : `idemkv: ${q} failed permanently: ${info.code}: ${info.message}`;
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
