"""OpenTelemetry spans when the opentelemetry API is importable; nothing otherwise.

The attribute names are the Go client's (telemetry/semconv), so that a trace that
crosses a Go service and a Python agent reads the same.
"""

from __future__ import annotations

import contextvars
from typing import Any, Mapping, Optional

try:  # the optional extra: pip install 'idemkv[otel]'
    from opentelemetry import context as _otel_context  # noqa: F401
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
    from opentelemetry.trace import Status, StatusCode

    ENABLED = True
except ImportError:  # pragma: no cover - exercised where opentelemetry is absent
    ENABLED = False

# The instrumentation scope, as the Go client names its own.
SCOPE_NAME = "github.com/idemkv/idemkv/clients/python"

# Attribute keys of docs/protocol.md, "Telemetry" (the Go package semconv).
TOOL_NAME = "agent.tool.name"
TOOL_SIDE_EFFECT = "agent.tool.side_effect"
TOOL_CLASS = "agent.tool.class"
IDEMPOTENCY_KEY = "agent.idempotency.key"
FINGERPRINT = "agent.idempotency.fingerprint"
DECISION = "agent.idempotency.decision"
RECEIPT_REMOTE_ID = "agent.idempotency.receipt.remote_id"
REPLAYED = "agent.idempotency.replayed"
CONFLICT_REASON = "agent.idempotency.conflict.reason"
CONFLICT_EXISTING_FINGERPRINT = "agent.idempotency.conflict.existing_fingerprint"
CONFLICT_EXISTING_REMOTE_ID = "agent.idempotency.conflict.existing_remote_id"
TENANT = "idemkv.tenant"
FENCE = "idemkv.fence"
ATTEMPTS = "idemkv.attempts"
ATTEMPT_ID = "idemkv.attempt_id"


class _NoSpan:
    """The span of a process without OpenTelemetry: every call does nothing."""

    def set_attributes(self, attrs: Mapping[str, Any]) -> None:
        pass

    def add_event(self, name: str, attrs: Optional[Mapping[str, Any]] = None) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        pass

    def end(self) -> None:
        pass


# The tool-call span of a provider given without the opentelemetry package (any object
# with get_tracer): requests carry its traceparent, as the TypeScript client's do.
_current: contextvars.ContextVar[Any] = contextvars.ContextVar("idemkv_span", default=None)


class _Span(_NoSpan):
    def __init__(self, span: Any, token: Any, own: Any = None) -> None:
        self._span = span
        self._token = token
        self._own = own

    def set_attributes(self, attrs: Mapping[str, Any]) -> None:
        self._span.set_attributes(dict(attrs))

    def add_event(self, name: str, attrs: Optional[Mapping[str, Any]] = None) -> None:
        self._span.add_event(name, dict(attrs or {}))

    def fail(self, exc: BaseException) -> None:
        self._span.record_exception(exc)
        if ENABLED:
            self._span.set_status(Status(StatusCode.ERROR, str(exc)))

    def end(self) -> None:
        self._span.end()
        if self._own is not None:
            try:
                _current.reset(self._own)
            except ValueError:  # ended in another context (a task): nothing to undo
                pass
        if self._token is not None and ENABLED:
            try:
                _otel_context.detach(self._token)
            except Exception:  # a span ended in another context (a task): nothing to undo
                pass


def tracer(provider: Any = None) -> Any:
    """The tracer of the client's spans: from provider when one is given (anything
    with OpenTelemetry's get_tracer), else from the global provider when the package
    is importable, else None (no spans)."""
    if provider is not None:
        return provider.get_tracer(SCOPE_NAME)
    if not ENABLED:
        return None
    return _trace.get_tracer(SCOPE_NAME)


def start(tracer: Any, name: str, attrs: Mapping[str, Any]) -> _NoSpan:
    """A span for one tool call, made current so that the requests it sends carry it
    (W3C traceparent)."""
    if tracer is None:
        return _NoSpan()
    if not ENABLED:
        span = tracer.start_span(name, attributes=dict(attrs))
        return _Span(span, None, _current.set(span))
    span = tracer.start_span(name, kind=_trace.SpanKind.INTERNAL, attributes=dict(attrs))
    token = _otel_context.attach(_trace.set_span_in_context(span))
    return _Span(span, token)


def inject() -> dict[str, str]:
    """W3C traceparent (and whatever the global propagator adds) for one request: from
    the current context with the opentelemetry package, else from the tool-call span of
    the provider given (its get_span_context(), as OpenTelemetry's spans have it)."""
    if ENABLED:
        carrier: dict[str, str] = {}
        _propagate.inject(carrier)
        return carrier
    get = getattr(_current.get(), "get_span_context", None)
    if get is None:
        return {}
    c = get()
    trace_id, span_id = int(getattr(c, "trace_id", 0) or 0), int(getattr(c, "span_id", 0) or 0)
    if trace_id == 0 or span_id == 0:
        return {}
    return {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-{int(getattr(c, 'trace_flags', 1)) & 0xFF:02x}"}
