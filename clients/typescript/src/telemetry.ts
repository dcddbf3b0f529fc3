// OpenTelemetry spans without a dependency on OpenTelemetry. The client takes a tracer
// typed by the few methods it calls, a structural subset of @opentelemetry/api's Tracer
// and Span, so that `trace.getTracer(SCOPE_NAME)` from the program's own OpenTelemetry
// install fits as it is. Without a tracer nothing here runs.
//
// The attribute keys are the Go client's (telemetry/semconv) and the Python client's,
// so that a trace crossing services in all three languages reads the same.

/** The instrumentation scope to name the tracer by, as the Go and Python clients name theirs. */
export const SCOPE_NAME = "github.com/idemkv/idemkv/clients/typescript";

/** Attribute keys of docs/protocol.md section 6 (Go: telemetry/semconv). */
export const ATTR = {
  TOOL_NAME: "agent.tool.name",
  TOOL_SIDE_EFFECT: "agent.tool.side_effect",
  TOOL_CLASS: "agent.tool.class",
  IDEMPOTENCY_KEY: "agent.idempotency.key",
  FINGERPRINT: "agent.idempotency.fingerprint",
  DECISION: "agent.idempotency.decision",
  RECEIPT_REMOTE_ID: "agent.idempotency.receipt.remote_id",
  REPLAYED: "agent.idempotency.replayed",
  CONFLICT_REASON: "agent.idempotency.conflict.reason",
  CONFLICT_EXISTING_FINGERPRINT: "agent.idempotency.conflict.existing_fingerprint",
  CONFLICT_EXISTING_REMOTE_ID: "agent.idempotency.conflict.existing_remote_id",
  TENANT: "idemkv.tenant",
  FENCE: "idemkv.fence",
  ATTEMPTS: "idemkv.attempts",
  ATTEMPT_ID: "idemkv.attempt_id",
} as const;

/** OpenTelemetry's SpanKind values the client uses. */
export const SPAN_KIND_INTERNAL = 0;
export const SPAN_KIND_CLIENT = 2;
/** OpenTelemetry's SpanStatusCode.ERROR. */
export const STATUS_ERROR = 2;

export type AttributeValue = string | number | boolean;
export interface Attributes {
  [key: string]: AttributeValue;
}

export interface SpanOptions {
  kind?: number;
  attributes?: Attributes;
}

/** What a W3C traceparent is made of (OpenTelemetry's SpanContext). */
export interface SpanContext {
  /** 32 lowercase hex digits. */
  traceId: string;
  /** 16 lowercase hex digits. */
  spanId: string;
  /** 1: sampled. */
  traceFlags: number;
  traceState?: { serialize(): string };
}

/** The part of OpenTelemetry's Span the client uses; addEvent and spanContext are optional. */
export interface Span {
  setAttribute(key: string, value: AttributeValue): unknown;
  setAttributes(attributes: Attributes): unknown;
  setStatus(status: { code: number; message?: string }): unknown;
  recordException(exception: Error | string): unknown;
  end(): void;
  /** Span events: the reserve answer, probe, released, left_pending ... */
  addEvent?(name: string, attributes?: Attributes): unknown;
  /** Present, the requests of this span carry its context in traceparent. */
  spanContext?(): SpanContext;
}

/**
 * The part of OpenTelemetry's Tracer the client uses. With startActiveSpan the span of a
 * tool call is current while it runs, so that the spans of its store calls, and the
 * tool's own spans, are its children (given a context manager, as the Node SDK
 * registers); with startSpan alone they are not linked to it.
 */
export interface Tracer {
  startSpan(name: string, options?: SpanOptions): Span;
  startActiveSpan?<F extends (span: Span) => unknown>(name: string, options: SpanOptions, fn: F): ReturnType<F>;
}

/** Records err on span as its error (status ERROR with the message, and the exception event). */
export function failSpan(span: Span, err: unknown): void {
  const message = err instanceof Error ? err.message : String(err);
  span.recordException(err instanceof Error ? err : message);
  span.setStatus({ code: STATUS_ERROR, message });
}

const TRACE_ID = /^[0-9a-f]{32}$/;
const SPAN_ID = /^[0-9a-f]{16}$/;
const ZEROS = /^0+$/;

/**
 * The W3C trace context headers of span (traceparent, and tracestate when it has
 * one), or none: no spanContext, or an invalid one, as a non-recording span has
 * (all-zero ids). Version 00, as OpenTelemetry's W3CTraceContextPropagator writes it.
 */
export function traceHeaders(span: Span): { traceparent?: string; tracestate?: string } {
  if (typeof span.spanContext !== "function") return {};
  const sc = span.spanContext();
  if (sc === undefined || sc === null) return {};
  const { traceId, spanId } = sc;
  if (typeof traceId !== "string" || typeof spanId !== "string" || !TRACE_ID.test(traceId) || !SPAN_ID.test(spanId) ||
    ZEROS.test(traceId) || ZEROS.test(spanId)) {
    return {};
  }
  const flags = (Number.isInteger(sc.traceFlags) ? sc.traceFlags : 0) & 0xff;
  const out: { traceparent?: string; tracestate?: string } = {
    traceparent: `00-${traceId}-${spanId}-${flags.toString(16).padStart(2, "0")}`,
  };
  const state = typeof sc.traceState?.serialize === "function" ? sc.traceState.serialize() : "";
  if (state !== "") out.tracestate = state;
  return out;
}
