"""idemkv for Python: the idempotency store AI agents run on.

A sync :class:`Client` and an :class:`AsyncClient` with the low-level calls of the
HTTP API, the tool-call loop (``client.do``, ``@idempotent``) with the same semantics
as the Go client's ``Do``, and RFC 8785 fingerprints byte-identical to the server's.
Keys from the run's context (:func:`operation`), an in-memory store for a runtime's unit
tests (:mod:`idemkv.testing`) and a pass-through (:func:`passthrough`). Tools that need a
person's approval (:class:`ApprovalRequirement`) wait for it or raise
:class:`ApprovalPendingError` for a runtime to suspend on. Standard library
only; OpenTelemetry spans when ``opentelemetry`` is importable (or a provider is given).
"""

from ._context import Operation, current_operation, operation, passthrough, set_passthrough
from ._core import Config, new_attempt_id
from .aio import AsyncClient
from .approval import ApprovalRequirement
from .client import Client
from .decorator import default_effect, idempotent, set_default_client
from .errors import (
    APPROVAL_DENIED,
    KINDS,
    APIError,
    ApprovalDenied,
    ApprovalDeniedError,
    ApprovalMismatchError,
    ApprovalNotPendingError,
    ApprovalPending,
    ApprovalPendingError,
    ConflictError,
    IdemkvError,
    InDoubtError,
    NotExecuted,
    NotExecutedError,
    OutcomeUnknownError,
    Permanent,
    StoredFailureError,
    StoreUnavailableError,
    find_cause,
)
from .jcs import FingerprintError, RawJSON, canonicalize, fingerprint
from .loop import OMITTED_RESULT_KEY, Lease, LeaseExpired, Op, Outcome, Result, current_lease, result_omitted

__all__ = [
    "APPROVAL_DENIED",
    "AsyncClient",
    "APIError",
    "ApprovalDenied",
    "ApprovalDeniedError",
    "ApprovalMismatchError",
    "ApprovalNotPendingError",
    "ApprovalPending",
    "ApprovalPendingError",
    "ApprovalRequirement",
    "Client",
    "Config",
    "ConflictError",
    "FingerprintError",
    "IdemkvError",
    "InDoubtError",
    "KINDS",
    "Lease",
    "LeaseExpired",
    "NotExecuted",
    "NotExecutedError",
    "OMITTED_RESULT_KEY",
    "Op",
    "Operation",
    "Outcome",
    "OutcomeUnknownError",
    "Permanent",
    "RawJSON",
    "Result",
    "StoreUnavailableError",
    "StoredFailureError",
    "canonicalize",
    "current_lease",
    "current_operation",
    "default_effect",
    "find_cause",
    "fingerprint",
    "idempotent",
    "new_attempt_id",
    "operation",
    "passthrough",
    "result_omitted",
    "set_default_client",
    "set_passthrough",
]

__version__ = "0.1.0"
