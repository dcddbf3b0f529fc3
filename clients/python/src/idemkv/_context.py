"""What a run puts around its tool calls: the operation they belong to (the key's
source when a tool names none) and the switch that turns ``@idempotent`` into a
pass-through for unit tests. Both are contextvars, so that they follow a thread's
``with`` block and an asyncio task alike, and never leak between concurrent runs."""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Iterator, Optional

__all__ = ["Operation", "operation", "current_operation", "passthrough", "set_passthrough", "is_passthrough"]


@dataclass(frozen=True)
class Operation:
    """The business operation tool calls run for (a run's approval, a tool-call id)."""

    id: str  # "run_9:approval_17"; a tool's key is "<id>:<tool>"
    attempt_id: Optional[str] = None  # StoreUnavailableError.attempt_id, to retry as the same attempt


_operation: contextvars.ContextVar[Optional[Operation]] = contextvars.ContextVar("idemkv_operation", default=None)
_passthrough: contextvars.ContextVar[Optional[bool]] = contextvars.ContextVar("idemkv_passthrough", default=None)
_passthrough_default = False


@contextlib.contextmanager
def operation(id: str, *, attempt_id: Optional[str] = None) -> Iterator[Operation]:
    """Runs the block's tool calls for one operation::

        with idemkv.operation(f"{run_id}:{tool_call_id}"):
            create_ticket(title="Outage X")     # key "run_9:call_3:create_ticket"

    A wrapped tool that names no ``key=`` takes ``"<id>:<tool>"`` as its key; one that
    does keeps its own. Retrying after a StoreUnavailableError, pass its
    ``attempt_id`` so that a reserve that landed unanswered is recognised."""
    if not isinstance(id, str) or not id:
        raise ValueError("idemkv: operation needs a non-empty id (a run, approval or tool-call id)")
    token = _operation.set(Operation(id, attempt_id))
    try:
        yield _operation.get()  # type: ignore[misc]
    finally:
        _operation.reset(token)


def current_operation() -> Optional[Operation]:
    """The operation the calling code runs in, or None."""
    return _operation.get()


@contextlib.contextmanager
def passthrough(on: bool = True) -> Iterator[None]:
    """Within the block, ``@idempotent`` functions run directly: no store, no key, no
    fingerprint (a runtime's unit tests of its own logic)."""
    token = _passthrough.set(on)
    try:
        yield
    finally:
        _passthrough.reset(token)


def set_passthrough(on: bool) -> None:
    """Turns the pass-through on or off for every context that did not choose."""
    global _passthrough_default
    _passthrough_default = bool(on)


def is_passthrough() -> bool:
    v = _passthrough.get()
    return _passthrough_default if v is None else v
