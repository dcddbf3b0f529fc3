"""Approvals bound to the effect (docs/protocol.md section 7), as the tool-call loop
sees them: what a tool asks of approvals, and the wait for a decision.

An approval belongs to the key, the tool and the effect's fingerprint, and the server
keeps it in the record: however often a suspended runtime resumes, a call with the same
key and effect sees the same request (one card), an approved one runs the tool once, and
another effect under the key is a conflict.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generator, Optional, Union

from . import _core
from .errors import APIError, ApprovalPendingError, NotExecutedError
from .jcs import canonicalize

if TYPE_CHECKING:
    from .loop import _Loop

__all__ = ["ApprovalRequirement"]

# The server's bounds of an approval's wait (idemkv.MinApprovalTTL, MaxApprovalTTL).
_MIN_TTL = 60.0
_MAX_TTL = 30 * 24 * 3600.0


@dataclass(frozen=True)
class ApprovalRequirement:
    """What a tool asks of approvals (the Go client's ApprovalRequirement).

    ``required``: a person approves the effect before it runs. Give a requirement with
    ``required=False`` for a tool an admin's rule may hold: the reserve then carries the
    effect that such a record keeps for the approver.

    ``ttl``: seconds the request waits for a decision before it lapses (1 minute to 30
    days; default: the server's, 24 h). ``summary``: what the approver reads beside the
    effect (at most 1 KiB); for ``@idempotent`` it may be a function of the tool's
    arguments. ``wait``: seconds the call waits for the decision (long-polls that wake on
    it), then runs the tool (approved) or raises the denial; 0, the default, raises
    :class:`~idemkv.ApprovalPendingError` at once, for runtimes that suspend and call
    again, with the same key and effect, once resumed.
    """

    required: bool = True
    ttl: Optional[float] = None
    summary: Union[str, Callable[..., str], None] = None
    wait: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.required, bool):
            raise TypeError("idemkv: ApprovalRequirement.required is True or False")
        t = self.ttl
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not _MIN_TTL <= t <= _MAX_TTL):
            raise ValueError(f"idemkv: ApprovalRequirement.ttl is seconds from {_MIN_TTL:g} to {_MAX_TTL:g} (30 days)")
        w = self.wait
        if isinstance(w, bool) or not isinstance(w, (int, float)) or w < 0:
            raise ValueError("idemkv: ApprovalRequirement.wait is a number of seconds, 0 or more")
        if self.summary is not None and not isinstance(self.summary, str) and not callable(self.summary):
            raise TypeError("idemkv: ApprovalRequirement.summary is text or a function of the tool's arguments")

    def ask(self) -> Optional[dict[str, Any]]:
        """The reserve's "approval" member, or None when it asks nothing."""
        if not self.required and self.ttl is None and not self.summary:
            return None
        if callable(self.summary):
            raise TypeError("idemkv: the summary function is called with the tool's arguments by @idempotent; "
                            "client.do takes the summary as text")
        out: dict[str, Any] = {"required": self.required}
        if self.ttl is not None:
            out["ttl_ms"] = _core.ms(self.ttl)
        if self.summary:
            out["summary"] = self.summary
        return out


def reserve_effect(effect: Any, drop: Any) -> Any:
    """The effect as a reserve that asks for approval carries it: its canonical JSON,
    drop paths removed, so the server fingerprints exactly what the client did."""
    return json.loads(canonicalize(effect, drop))


@dataclass
class ApprovalWait:
    """What one call has seen of its approval: the bound of its wait, the requests."""

    deadline: Optional[float] = None
    ids: tuple[str, ...] = ()


def await_approval(loop: "_Loop", res: dict[str, Any], seen: ApprovalWait,
                   call_deadline: Optional[float]) -> Generator[Any, Any, None]:
    """After a needs_approval answer: long-polls the record until the decision (or the
    request lapses, or the wait ends); the caller then reserves again and gets execute
    (approved), the denial's replay, or a new request (lapsed). Without a wait, or once
    it is spent, raises ApprovalPendingError."""
    from .loop import _Sleep

    op = loop.op
    record = res.get("record") or {}
    approval = res.get("approval") or record.get("approval") or {}
    aid = str(approval.get("id", ""))
    if seen.ids and seen.ids[-1] != aid:
        # The request this call waited on lapsed unanswered; the server asked anew.
        loop.span.add_event("approval_lapsed", {"idemkv.approval.id": seen.ids[-1]})
    if not seen.ids or seen.ids[-1] != aid:
        seen.ids += (aid,)
    loop.span.add_event("approval_pending", {"idemkv.approval.id": aid})
    req = op.approval
    lapsed = seen.ids[:-1]
    msg = (f"idemkv: {op.key!r} (tenant {op.tenant!r}) waits for approval {aid} "
           f"(requested {approval.get('requested_at')}, lapses {approval.get('expires_at')}); nothing ran")
    if lapsed:
        msg += f"; earlier requests lapsed unanswered: {', '.join(lapsed)}"
    pending = ApprovalPendingError(msg, tenant=op.tenant, key=op.key, approval=approval, lapsed_ids=lapsed,
                                   record=record)
    if req is None or req.wait <= 0:
        raise pending
    now = time.monotonic()
    if seen.deadline is None:
        seen.deadline = now + req.wait
    wait = min(seen.deadline - now, _core.MAX_WAIT)
    # cut: the call's deadline ends this long-poll, and with it the wait.
    cut = call_deadline is not None and call_deadline - now <= wait
    if call_deadline is not None:
        wait = min(wait, call_deadline - now)
    if wait <= 0:
        raise pending
    poll = _core.get_call(op.tenant, op.key, wait)
    start = time.monotonic()
    try:
        # One long-poll: a store that fails it is backed off from below, and the reserve
        # after the pause says whether the wait is over (its retry would take the whole
        # wait again, past the approval wait).
        rec = yield from loop.budgeted(poll, once=True)
    except APIError as e:
        if loop.past_deadline() or (cut and time.monotonic() - start >= wait / 2):
            # The call's deadline, not the store, ended the wait (the Go client's
            # context): the approval is still pending, and nothing ran.
            raise pending from e
        if e.code == "not_found":
            return  # swept or released: the next reserve asks anew
        if e.code not in _core.RETRY_CODES:
            # Refused (a token that may not read the key): nothing ran.
            raise NotExecutedError(f"idemkv: waiting for the approval of {op.key!r}: {e}",
                                   decision="needs_approval", record=record, cause=e) from e
        # A store that does not answer (or sheds long-polls: resource_exhausted) is
        # waited for as the reserve waits for it: backing off, within store_wait, not
        # reserving and polling again at once.
        pause = loop.until_deadline(min(op.backoff_max, max(op.store_wait - loop.used, 0.0)))
        yield _Sleep(pause)
        loop.used += pause
        if loop.past_deadline():
            raise pending from e
        if loop.used >= op.store_wait:
            raise loop.store_wait_spent(poll, e) from e
        return
    a = rec.get("approval") or {}
    waiting = rec.get("status") == "awaiting_approval" and a.get("state") == "waiting"
    early = time.monotonic() - start < wait / 2
    if loop.past_deadline() or (cut and waiting and not early):
        raise pending
    if waiting and early:
        # Still waiting, and the long-poll ended early: do not spin.
        yield _Sleep(loop.until_deadline(op.backoff_max))
        if loop.past_deadline():
            raise pending
