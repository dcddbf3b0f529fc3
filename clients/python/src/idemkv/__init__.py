"""idemkv for Python: the idempotency store AI agents run on.

A sync :class:`Client` and an :class:`AsyncClient` with the low-level calls of the
HTTP API, the tool-call loop (``client.do``, ``@idempotent``) with the same semantics
as the Go client's ``Do``, and RFC 8785 fingerprints byte-identical to the server's.
Standard library only; OpenTelemetry spans when ``opentelemetry`` is importable.
"""

from ._core import Config, new_attempt_id
from .aio import AsyncClient
from .client import Client
from .decorator import idempotent, set_default_client
from .errors import (
    KINDS,
    APIError,
    ConflictError,
    IdemkvError,
    InDoubtError,
    NotExecuted,
    NotExecutedError,
    OutcomeUnknownError,
    Permanent,
    StoredFailureError,
    StoreUnavailableError,
)
from .jcs import FingerprintError, RawJSON, canonicalize, fingerprint
from .loop import Lease, Op, Outcome, Result, current_lease

__all__ = [
    "AsyncClient",
    "APIError",
    "Client",
    "Config",
    "ConflictError",
    "FingerprintError",
    "IdemkvError",
    "InDoubtError",
    "KINDS",
    "Lease",
    "NotExecuted",
    "NotExecutedError",
    "Op",
    "Outcome",
    "OutcomeUnknownError",
    "Permanent",
    "RawJSON",
    "Result",
    "StoreUnavailableError",
    "StoredFailureError",
    "canonicalize",
    "current_lease",
    "fingerprint",
    "idempotent",
    "new_attempt_id",
    "set_default_client",
]

__version__ = "0.1.0"
