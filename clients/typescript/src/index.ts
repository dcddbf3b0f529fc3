// idemkv: the TypeScript client of idemkv, the idempotency store for the side-effecting
// tool calls of AI agents. Node >= 20, no runtime dependencies.
//
//   - idempotent(fn, options) and run(client, op, fn): the tool-call loop.
//   - Client: one method per endpoint of the HTTP API.
//   - canonicalize / fingerprint: RFC 8785 effect fingerprints, byte-identical to the server's.
//   - ClientOptions.tracer: OpenTelemetry spans, with no dependency on OpenTelemetry.
//   - approvals: a tool's ApprovalRequirement waits for a person's decision or throws
//     ApprovalPendingError; Client.approvals / approve / deny for approvers.
//   - operation(id, fn): keys from the run's context; MemoryStore and passthrough: unit tests without a node.

export { approverNamed, Client, MAX_WAIT_MS } from "./client.js";
export type { ClientOptions, CallOptions, Settings, StoreBudget } from "./client.js";
export { defaultEffect, idempotent } from "./idempotent.js";
export type { ErrorMatch, IdempotentOptions, ReceiptFields } from "./idempotent.js";
export { currentOperation, operation, passthrough, setPassthrough } from "./context.js";
export { MemoryStore } from "./memory.js";
export type { MemoryStoreOptions } from "./memory.js";
export type { Operation } from "./context.js";
export { run } from "./run.js";
export { LeaseExpired } from "./lease.js";
export { OMITTED_RESULT_KEY, resultOmitted } from "./outcome.js";
export { toolContext } from "./tool.js";
export type { Op, Outcome, ProbeFn, RunOptions, SideEffect, Store, ToolContext, ToolFn, ToolResult } from "./tool.js";
export type { ApprovalRequirement } from "./approval.js";
export {
  APPROVAL_DENIED, ApiError, ApprovalDeniedError, ApprovalMismatchError, ApprovalNotPendingError, ApprovalPendingError, ConflictError, DEFAULT_FAILURE_CODE, IdemkvError, InDoubtError, isRetryable, notExecuted, NotExecutedError,
  NotExecutedMark, OutcomeUnknownError, permanent, PermanentError, StoredFailureError, StoreUnavailableError, WIRE_CODES,
} from "./errors.js";
export type { ApiErrorDetails, ErrorKind, IdemkvErrorDetails, WireCode } from "./errors.js";
export { canonicalize, canonicalizeJSON, fingerprint, fingerprintJSON, keyText, sum, FingerprintError, FINGERPRINT_PREFIX, MAX_DEPTH, MAX_KEY_DIGITS } from "./jcs.js";
export type { JsonValue } from "./jcs.js";
export type { TlsOptions } from "./transport.js";
export { SCOPE_NAME } from "./telemetry.js";
export type { Attributes, AttributeValue, Span, SpanContext, SpanOptions, Tracer } from "./telemetry.js";
export type {
  Approval, ApprovalAsk, ApprovalRule, ApprovalsOptions, ApprovalsResult, ApprovalState, DecideApprovalRequest, ClockInfo, ClusterInfo, ClusterNode, CommitRequest, Conflict, Consistency, Decision, DoubtRequest, ErrorInfo, FailRequest, GetOptions,
  HeartbeatRequest, ListOptions, ListResult, Receipt, Record, ReleaseRequest, ReleaseResult, ReserveRequest, ReserveResult,
  ResolveRequest, Status, StoredReceipt, Tombstone,
} from "./types.js";
