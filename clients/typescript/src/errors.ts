// Errors, in the words the Go and Python clients use.
//
// Two families:
//   - ApiError: what one low-level call (reserve, commit, get, ...) got from idemkv, with
//     the wire code of the answer (docs/protocol.md, "Errors").
//   - IdemkvError and its seven subclasses: what the tool-call loop (idempotent, run)
//     concluded. Every error that loop throws is exactly one of them, told apart by
//     .kind (or instanceof): not_executed, stored_failure, outcome_unknown, conflict,
//     in_doubt, store_unavailable, approval_pending. A denied approval is a stored
//     failure: ApprovalDeniedError, a StoredFailureError with code approval_denied.

import type { Approval, Conflict, Decision, Receipt, Record as IdemkvRecord, Tombstone } from "./types.js";

/** The wire codes of idemkv's error answers, with their HTTP statuses. */
export const WIRE_CODES = {
  invalid_argument: 400,
  unauthenticated: 401,
  permission_denied: 403,
  not_found: 404,
  fenced: 409,
  fingerprint_mismatch: 409,
  not_pending: 409,
  payload_too_large: 413,
  resource_exhausted: 429,
  unavailable: 503,
  outcome_unknown: 503,
  internal: 500,
} as const;

export type WireCode = keyof typeof WIRE_CODES;

/** The error body's details (docs/protocol.md, "Errors"). */
export interface ApiErrorDetails {
  released?: Tombstone;
}

/**
 * An error answer of idemkv to one call, or a failure to get any answer. A transport
 * failure has code "outcome_unknown" when a write may have been sent (a reset, a timeout,
 * a closed connection, a 2xx answer cut short: it may have been applied) and
 * "unavailable" when it certainly was not applied (a refused connection, a name that does
 * not resolve, a read, a proxy's 503). A proxy's 502 or 504 (not idemkv's own error) to a
 * write is "outcome_unknown": the proxy may have forwarded it; to a read, "unavailable".
 * Both are retried: every idemkv request is
 * safe to repeat. A call one of whose attempts was outcome_unknown ends outcome_unknown.
 */
export class ApiError extends Error {
  /** The wire code ("fenced", "unavailable", ...). */
  readonly code: WireCode;
  /** The HTTP status; 0 when no answer came back. */
  readonly status: number;
  /** For invalid_argument: the JSON field at fault. */
  readonly field: string | undefined;
  /** What the answer adds for some codes: for the not_found of a history read of a released key, its tombstone. */
  readonly details: ApiErrorDetails;
  constructor(code: WireCode, message: string, options: { status?: number; field?: string; details?: ApiErrorDetails; cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "ApiError";
    this.code = code;
    this.status = options.status ?? WIRE_CODES[code];
    this.field = options.field;
    this.details = options.details ?? {};
  }
}

/**
 * Whether a call that failed this way may simply be sent again, same body, same
 * attempt_id or fence: certainly not applied (unavailable, resource_exhausted), or
 * perhaps applied (outcome_unknown), which the attempt id or fence makes safe to repeat.
 */
export function isRetryable(err: unknown): boolean {
  return err instanceof ApiError && (err.code === "unavailable" || err.code === "outcome_unknown" || err.code === "resource_exhausted");
}

/** The kinds of error of the tool-call loop; the same strings in Go and Python. */
export type ErrorKind = "not_executed" | "stored_failure" | "outcome_unknown" | "conflict" | "in_doubt" | "store_unavailable" | "approval_pending";

export interface IdemkvErrorDetails {
  decision?: Decision;
  record?: IdemkvRecord;
  cause?: unknown;
  /** The loop's attempt id (StoreUnavailableError). */
  attemptId?: string;
}

/** The base class of every error the tool-call loop throws. */
export abstract class IdemkvError extends Error {
  abstract readonly kind: ErrorKind;
  /** The reserve decision that led here, when one was made. */
  readonly decision: Decision | undefined;
  /** The record as idemkv last reported it, when known. */
  readonly record: IdemkvRecord | undefined;
  constructor(message: string, details: IdemkvErrorDetails = {}) {
    super(message, details.cause === undefined ? undefined : { cause: details.cause });
    this.decision = details.decision;
    this.record = details.record;
  }
}

/**
 * The tool certainly did not run in this call: the key was released (the tool threw a
 * notExecuted error), or the call ended before anything ran (refused arguments, the
 * caller's signal, an answer like unauthenticated).
 */
export class NotExecutedError extends IdemkvError {
  readonly kind = "not_executed" as const;
  constructor(message: string, details?: IdemkvErrorDetails) {
    super(message, details);
    this.name = "NotExecutedError";
  }
}

/**
 * The tool ran and failed for good; the failure is stored, and every retry of the key
 * gets it back without running anything. .receipt holds the stored error; .replayed
 * says whether this call only read it.
 */
export class StoredFailureError extends IdemkvError {
  readonly kind = "stored_failure" as const;
  readonly receipt: Receipt;
  readonly replayed: boolean;
  constructor(message: string, receipt: Receipt, replayed: boolean, details?: IdemkvErrorDetails) {
    super(message, details);
    this.name = "StoredFailureError";
    this.receipt = receipt;
    this.replayed = replayed;
  }
}

/**
 * The tool may have run, and its outcome is not stored: it threw an ordinary error, its
 * lease went to a newer attempt, or its receipt could not be stored in time. The record
 * stays pending; the attempt after the lease runs out recovers it (with the probe).
 */
export class OutcomeUnknownError extends IdemkvError {
  readonly kind = "outcome_unknown" as const;
  constructor(message: string, details?: IdemkvErrorDetails) {
    super(message, details);
    this.name = "OutcomeUnknownError";
  }
}

/** The key already names another effect or tool. Nothing ran. */
export class ConflictError extends IdemkvError {
  readonly kind = "conflict" as const;
  readonly conflict: Conflict | undefined;
  constructor(message: string, conflict: Conflict | undefined, details?: IdemkvErrorDetails) {
    super(message, details);
    this.name = "ConflictError";
    this.conflict = conflict;
  }
}

/**
 * An earlier attempt died and nothing can tell whether its effect happened (a
 * non-idempotent tool without a probe). The record is marked in doubt; retries get this
 * error at once, until a person or a policy settles it (client.resolve, or
 * `idemkv resolve TENANT KEY --committed ... | --not-executed`).
 */
export class InDoubtError extends IdemkvError {
  readonly kind = "in_doubt" as const;
  constructor(message: string, details?: IdemkvErrorDetails) {
    super(message, details);
    this.name = "InDoubtError";
  }
}

/**
 * idemkv could not be reached within the store-wait bound before the tool ran. Nothing ran.
 * .attemptId names the loop's attempt: its reserve may have landed with the answer lost,
 * so retry with it (Op.attemptId, or operation(id, fn, { attemptId })) and the server
 * recognises the same attempt instead of a stranger that waits out the phantom lease.
 */
export class StoreUnavailableError extends IdemkvError {
  readonly kind = "store_unavailable" as const;
  readonly attemptId: string | undefined;
  constructor(message: string, details?: IdemkvErrorDetails) {
    super(message, details);
    this.name = "StoreUnavailableError";
    this.attemptId = details?.attemptId;
  }
}

/** The error code of the failed receipt a denied approval replays (Go's idemkv.CodeApprovalDenied). */
export const APPROVAL_DENIED = "approval_denied";

/**
 * The effect waits for a person's approval; nothing ran and nothing is held. .approvalId
 * names the request to decide; .summary, .requestedAt and .expiresAt are what the approver
 * sees and when the request lapses unanswered. A runtime that suspends keeps them and calls
 * the tool again, with the same key and effect, once resumed: it gets this same request
 * (never a second card) until it is decided, then the tool runs once (approved) or the
 * denial comes back (ApprovalDeniedError). Resumed after .expiresAt with no decision, the
 * request has lapsed and the call asks anew, with a new approvalId; .lapsedIds lists the
 * requests that lapsed while this one call waited.
 */
export class ApprovalPendingError extends IdemkvError {
  readonly kind = "approval_pending" as const;
  readonly tenant: string;
  readonly key: string;
  readonly approval: Approval | undefined;
  readonly approvalId: string;
  readonly summary: string;
  readonly requestedAt: string | undefined;
  readonly expiresAt: string | undefined;
  /** The effect fingerprint the approver approves (what a decision names). */
  readonly fingerprint: string;
  readonly lapsedIds: readonly string[];
  constructor(message: string, tenant: string, key: string, approval: Approval | undefined, lapsedIds: readonly string[], details?: IdemkvErrorDetails) {
    super(message, { ...details, decision: "needs_approval" });
    this.name = "ApprovalPendingError";
    this.tenant = tenant;
    this.key = key;
    this.approval = approval;
    this.approvalId = approval?.id ?? "";
    this.summary = approval?.summary ?? "";
    this.requestedAt = approval?.requested_at;
    this.expiresAt = approval?.expires_at;
    this.fingerprint = details?.record?.effect_fingerprint ?? "";
    this.lapsedIds = lapsedIds;
  }
}

/**
 * A person denied the approval this effect asked for; the tool never ran. The record is
 * failed for good with code approval_denied and every retry gets this error back. .approver,
 * .reason and .approvalId say who denied which request and why.
 */
export class ApprovalDeniedError extends StoredFailureError {
  readonly approver: string;
  readonly reason: string;
  readonly approvalId: string;
  readonly decidedAt: string | undefined;
  constructor(message: string, receipt: Receipt, replayed: boolean, details?: IdemkvErrorDetails) {
    super(message, receipt, replayed, details);
    this.name = "ApprovalDeniedError";
    const d = (receipt.error?.details ?? {}) as { approver?: unknown; reason?: unknown };
    const a = details?.record?.approval;
    this.approver = typeof d.approver === "string" ? d.approver : a?.approver ?? "";
    this.reason = typeof d.reason === "string" ? d.reason : a?.reason ?? "";
    this.approvalId = a?.id ?? "";
    this.decidedAt = a?.decided_at;
  }
}

/** A decision on an approval that is no longer waiting (409 not_pending): decided (the message says by whom), consumed or lapsed. */
export class ApprovalNotPendingError extends ApiError {
  constructor(message: string, options: { status?: number; field?: string; cause?: unknown } = {}) {
    super("not_pending", message, options);
    this.name = "ApprovalNotPendingError";
  }
}

/**
 * A decision naming another request or effect than the one the key waits for (409
 * fingerprint_mismatch): the request the approver saw lapsed and a new one was made, or the
 * key holds another effect. Nothing was decided.
 */
export class ApprovalMismatchError extends ApiError {
  constructor(message: string, options: { status?: number; field?: string; cause?: unknown } = {}) {
    super("fingerprint_mismatch", message, options);
    this.name = "ApprovalMismatchError";
  }
}

/** The stored code of a permanent failure that names none (as in Go). */
export const DEFAULT_FAILURE_CODE = "tool_failed";

/**
 * Marks a tool error that will not go away on retry (the downstream API refused the
 * request as invalid, say). The loop stores it with fail; every retry of the key gets
 * it back as a StoredFailureError instead of running the tool.
 */
export class PermanentError extends Error {
  readonly code: string;
  readonly details: unknown;
  constructor(cause: unknown, options: { code?: string; details?: unknown } = {}) {
    super(`permanent: ${messageOf(cause)}`, { cause });
    this.name = "PermanentError";
    this.code = options.code ?? DEFAULT_FAILURE_CODE;
    this.details = options.details;
  }
}

/** Marks err as permanent (see PermanentError). */
export function permanent(err: unknown, options?: { code?: string; details?: unknown }): PermanentError {
  return new PermanentError(err, options);
}

/**
 * Marks a tool error after which the effect certainly did not happen (the request was
 * never sent, or the downstream API refused it before acting). The loop releases the
 * key, so the next attempt runs afresh, and throws a NotExecutedError.
 */
export class NotExecutedMark extends Error {
  constructor(cause: unknown) {
    super(`not executed: ${messageOf(cause)}`, { cause });
    this.name = "NotExecutedMark";
  }
}

/** Marks err as not executed (see NotExecutedMark). */
export function notExecuted(err: unknown): NotExecutedMark {
  return new NotExecutedMark(err);
}

export function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
