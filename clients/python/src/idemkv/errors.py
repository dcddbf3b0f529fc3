"""The error vocabulary of idemkv's clients, the same words in Go, Python and TypeScript.

Every error the tool-call loop (:meth:`Client.do`, ``@idempotent``) raises is exactly
one of seven kinds, each an :class:`IdemkvError` subclass carrying ``.kind``:

==================== ============================ ====================================
kind                 class                        meaning
==================== ============================ ====================================
``not_executed``     :class:`NotExecutedError`    the effect certainly did not happen
``stored_failure``   :class:`StoredFailureError`  the tool failed for good; the failure
                                                  is stored and every retry gets it back
``outcome_unknown``  :class:`OutcomeUnknownError` the tool may have run; the record
                                                  stays pending for the next attempt
``conflict``         :class:`ConflictError`       the key names another effect
``in_doubt``         :class:`InDoubtError`        an earlier attempt died and nothing
                                                  can tell whether its effect happened
``store_unavailable`` :class:`StoreUnavailableError` idemkv could not be reached within
                                                  the store-wait bound
``approval_pending`` :class:`ApprovalPendingError` the effect waits for a person's
                                                  approval; nothing ran
==================== ============================ ====================================

A denied approval is a stored failure: :class:`ApprovalDeniedError`, a
:class:`StoredFailureError` whose code is ``approval_denied``.

The low-level calls raise :class:`APIError` for an answer with a wire code (its
``.code`` is the server's: ``fenced``, ``not_pending``, ...), and
:class:`StoreUnavailableError` when no node answered within the bound: the request
certainly was not applied. A write that was sent whole and whose answer never came back
(on any attempt, even if later ones reached nobody) raises :class:`APIError` with code
``outcome_unknown`` instead: it may have been applied, and sending it again is safe. A decision on an
approval that is no longer waiting raises :class:`ApprovalNotPendingError`, one naming
another request or effect :class:`ApprovalMismatchError` (both APIErrors).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, TypeVar

__all__ = [
    "IdemkvError",
    "NotExecutedError",
    "StoredFailureError",
    "OutcomeUnknownError",
    "ConflictError",
    "InDoubtError",
    "StoreUnavailableError",
    "ApprovalPendingError",
    "ApprovalPending",
    "ApprovalDeniedError",
    "ApprovalDenied",
    "APIError",
    "ApprovalNotPendingError",
    "ApprovalMismatchError",
    "APPROVAL_DENIED",
    "KINDS",
    "Permanent",
    "NotExecuted",
    "DEFAULT_FAILURE_CODE",
    "find_cause",
]


class IdemkvError(Exception):
    """Base of every error the loop raises. ``.kind`` is the vocabulary word."""

    kind: str = ""

    def __init__(
        self,
        message: str,
        *,
        decision: Optional[str] = None,
        record: Optional[Mapping[str, Any]] = None,
        cause: Optional[BaseException] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.decision = decision
        self.record = record
        self.cause = cause
        if cause is not None:
            self.__cause__ = cause


class NotExecutedError(IdemkvError):
    """The effect certainly did not happen; the key was released (or never taken)."""

    kind = "not_executed"


class StoredFailureError(IdemkvError):
    """The tool failed permanently and the failure is stored; retries get it back.

    ``.receipt`` is the stored failure (``status: "failed"`` with ``error``);
    ``.replayed`` says whether this call only read it back. The attempt that stored it
    keeps the tool's own exception in ``.cause``.
    """

    kind = "stored_failure"

    def __init__(self, message: str, *, receipt: Mapping[str, Any], replayed: bool, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.receipt = receipt
        self.replayed = replayed

    @property
    def code(self) -> str:
        err = self.receipt.get("error") or {}
        return str(err.get("code", ""))


class OutcomeUnknownError(IdemkvError):
    """The tool may have run; the record stays pending and the next attempt recovers."""

    kind = "outcome_unknown"


class ConflictError(IdemkvError):
    """The key already names a different effect or tool. Nothing ran.

    ``.conflict`` is the server's conflict body (reason, existing and received
    fingerprints, existing remote id).
    """

    kind = "conflict"

    def __init__(self, message: str, *, conflict: Mapping[str, Any], **kw: Any) -> None:
        super().__init__(message, **kw)
        self.conflict = conflict


class InDoubtError(IdemkvError):
    """An earlier attempt died and no probe can tell whether its effect happened.

    The record is marked in doubt and stays pending until a person or a policy
    resolves it (``idemkv resolve TENANT KEY --committed ... | --not-executed``).
    """

    kind = "in_doubt"


class StoreUnavailableError(IdemkvError):
    """No idemkv node answered within the store-wait bound. Nothing ran.

    ``.attempt_id`` names the attempt of the tool-call loop that gave up (None from a
    low-level call). Its reserve may have landed with the answer lost: retry with it
    (``attempt_id=`` on ``client.do``, or ``idemkv.operation(..., attempt_id=...)``)
    and the server recognises the same attempt, instead of a stranger that has to wait
    out the phantom lease and then finds the key in doubt."""

    kind = "store_unavailable"

    def __init__(self, message: str, *, attempt_id: Optional[str] = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.attempt_id = attempt_id


# The error code of the failed receipt a denied approval replays (idemkv.CodeApprovalDenied).
APPROVAL_DENIED = "approval_denied"


class ApprovalPendingError(IdemkvError):
    """The effect waits for a person's approval; nothing ran and nothing is held.

    ``.approval_id`` names the request to decide (``idemkv approvals approve --tenant T
    --key K --id ...``); ``.summary``, ``.requested_at`` and ``.expires_at`` (RFC 3339)
    are what the approver sees and when the request lapses unanswered; ``.approval`` is
    the server's whole approval object and ``.record`` the record. A runtime that
    suspends stores them and calls the tool again, with the same key and effect, once
    resumed: it gets this same request (never a second card) until it is decided, then
    the tool runs once (approved) or the denial comes back (:class:`ApprovalDeniedError`).
    Resumed after ``.expires_at`` with no decision, the request has lapsed: the call asks
    anew, with a new ``approval_id``. ``.lapsed_ids`` lists the requests that lapsed
    while this one call waited.
    """

    kind = "approval_pending"

    def __init__(self, message: str, *, tenant: str, key: str, approval: Mapping[str, Any],
                 lapsed_ids: tuple[str, ...] = (), **kw: Any) -> None:
        super().__init__(message, decision="needs_approval", **kw)
        self.tenant = tenant
        self.key = key
        self.approval = dict(approval)
        self.approval_id = str(approval.get("id", ""))
        self.summary = str(approval.get("summary", ""))
        self.requested_at = approval.get("requested_at")
        self.expires_at = approval.get("expires_at")
        self.lapsed_ids = lapsed_ids

    @property
    def fingerprint(self) -> str:
        """The effect fingerprint the approver approves (what a decision names)."""
        return str((self.record or {}).get("effect_fingerprint", ""))


class ApprovalDeniedError(StoredFailureError):
    """A person denied the approval this effect asked for; the tool never ran.

    The record is failed for good with the code ``approval_denied``, and every retry of
    the key gets this error back. ``.approver``, ``.reason`` and ``.approval_id`` say
    who denied which request and why; ``.decided_at`` when (where the record says)."""

    def __init__(self, message: str, *, receipt: Mapping[str, Any], replayed: bool, **kw: Any) -> None:
        super().__init__(message, receipt=receipt, replayed=replayed, **kw)
        details = (receipt.get("error") or {}).get("details") or {}
        approval = (self.record or {}).get("approval") or {}
        self.approver = str(details.get("approver") or approval.get("approver") or "")
        self.reason = str(details.get("reason") or approval.get("reason") or "")
        self.approval_id = str(approval.get("id", ""))
        self.decided_at = approval.get("decided_at")


E = TypeVar("E", bound=BaseException)


def find_cause(exc: BaseException, kind: type[E]) -> Optional[E]:
    """The first exception of ``kind`` in exc's chain (exc, its ``__cause__`` or
    ``__context__``, and so on), or None: Go's ``errors.As`` for Python's chains.

    A call cancelled (asyncio) or interrupted (KeyboardInterrupt) while its reserve was
    in flight raises that cancellation or interrupt, as asyncio and Python require, with
    the loop's answer as its cause: ``find_cause(e, idemkv.StoreUnavailableError)`` finds
    it, and its ``attempt_id``, also behind the TimeoutError of ``asyncio.timeout`` or
    ``asyncio.wait_for``."""
    seen: set[int] = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, kind):
            return e
        seen.add(id(e))
        e = e.__cause__ if e.__cause__ is not None else e.__context__
    return None


# The names of the task's vocabulary, for who prefers them.
ApprovalPending = ApprovalPendingError
ApprovalDenied = ApprovalDeniedError

# The seven kinds, in the order of the Go client's KindOf.
KINDS: tuple[str, ...] = (
    NotExecutedError.kind,
    StoredFailureError.kind,
    OutcomeUnknownError.kind,
    ConflictError.kind,
    InDoubtError.kind,
    StoreUnavailableError.kind,
    ApprovalPendingError.kind,
)


class APIError(Exception):
    """An answer of the server with a wire code (docs/protocol.md, "Errors")."""

    def __init__(self, code: str, message: str, *, status: int = 0, field: str = "",
                 details: Optional[dict[str, Any]] = None) -> None:
        text = f"idemkv: {code}: {message}" + (f" (field {field})" if field else "")
        super().__init__(text)
        self.code = code
        self.message = message
        self.status = status
        self.field = field
        # What the answer adds for some codes: for the not_found of a history read of a
        # released key, {"released": the tombstone} (docs/protocol.md, "Released keys").
        self.details = details or {}

    @property
    def retryable(self) -> bool:
        """unavailable: certainly not applied; outcome_unknown: retry with the same attempt."""
        return self.code in ("unavailable", "outcome_unknown")


class ApprovalNotPendingError(APIError):
    """A decision on an approval that is no longer waiting (409 not_pending): it was
    decided already (the message says by whom and when), consumed, or it lapsed."""


class ApprovalMismatchError(APIError):
    """A decision naming another request or effect than the one the key waits for (409
    fingerprint_mismatch): the request the approver saw lapsed and a new one was made,
    or the key now holds another effect. Nothing was decided."""


# The stored code of a Permanent error that names none (the Go client's
# DefaultFailureCode).
DEFAULT_FAILURE_CODE = "tool_failed"


class Permanent(Exception):
    """Raise from a tool for a failure that will not go away on retry.

    The loop stores it with ``fail`` and every later attempt with the same key gets
    it back as a :class:`StoredFailureError` instead of running the tool::

        raise idemkv.Permanent("project OPS is archived", code="project_archived") from err
    """

    def __init__(self, message: str, *, code: str = DEFAULT_FAILURE_CODE, details: Any = None) -> None:
        super().__init__(message)
        self.code = code or DEFAULT_FAILURE_CODE
        self.details = details


class NotExecuted(Exception):
    """Raise from a tool when the effect certainly did not happen (the request was
    never sent, or the downstream API refused it before acting). The loop releases the
    key, so the next attempt runs afresh, and raises :class:`NotExecutedError`."""
