"""The wait behind another attempt that holds the key (an in_progress answer), as the
Go client's await: one long-poll at a time, and a reserve after each, which says
whether the holder is done, its lease ran out, or it is still at work."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Generator, Optional

from . import _core
from .errors import APIError, NotExecutedError

if TYPE_CHECKING:
    from .loop import _Loop

__all__: list[str] = []


def await_holder(loop: "_Loop", res: dict[str, Any], waits: int) -> Generator[Any, Any, None]:
    """Long-polls the record another attempt holds until it is settled or that
    attempt's lease runs out; the caller then reserves again and learns which.

    A failed long-poll is backed off from, within store_wait, and not sent again: the
    reserve after the pause looks at the holder and the deadline (a retry of the
    long-poll took its whole wait again, and looked at neither). Past the deadline the
    call gives up waiting: nothing ran, and the attempt that holds the key decides."""
    from .loop import _seconds_until, _Sleep

    op = loop.op
    wait = op.poll_wait
    until = _seconds_until(res.get("lease_expires_at"))
    if until is not None:
        # The server ends the wait at lease expiry itself; the margin covers a
        # server that only wakes on a change.
        wait = min(wait, until + 0.25)
    wait = max(wait, 0.1)
    # cut: the deadline ends this long-poll, and with it the wait.
    cut = False
    if loop.deadline is not None:
        left = loop.deadline - time.monotonic()
        if left <= 0:
            raise _gave_up(loop, res)
        if left <= wait:
            wait, cut = left, True
    poll = _core.get_call(op.tenant, op.key, wait)
    start = time.monotonic()
    try:
        rec = yield from loop.budgeted(poll, once=True)
    except APIError as e:
        # A long-poll the deadline cut that failed at its end (a proxy that cuts it)
        # ended as the deadline passed.
        if loop.past_deadline() or (cut and time.monotonic() - start >= wait / 2):
            raise _gave_up(loop, res, e) from e
        if e.code == "not_found":
            return
        if e.code not in _core.RETRY_CODES:
            raise NotExecutedError(f"idemkv: waiting on {op.key!r}: {e}", decision="in_progress", cause=e) from e
        # The reserve after the pause gives up if the deadline passed meanwhile.
        pause = loop.until_deadline(min(_core.backoff(waits, op.backoff_min, op.backoff_max),
                                        max(op.store_wait - loop.used, 0.0)))
        yield _Sleep(pause)
        loop.used += pause
        if loop.used >= op.store_wait:
            raise loop.store_wait_spent(poll, e) from e
        return
    early = time.monotonic() - start < wait / 2
    if loop.past_deadline() or (cut and rec.get("status") == "pending" and not early):
        raise _gave_up(loop, res)
    if rec.get("status") == "pending" and early:
        # Still held, and the wait ended early: do not spin on a server whose clock
        # and ours disagree about the lease.
        yield _Sleep(loop.until_deadline(_core.backoff(waits, op.backoff_min, op.backoff_max)))
        if loop.past_deadline():
            raise _gave_up(loop, res)


def _gave_up(loop: "_Loop", res: dict[str, Any], cause: Optional[BaseException] = None) -> NotExecutedError:
    return NotExecutedError(
        f"idemkv: gave up waiting for the attempt that holds {loop.op.key!r} (deadline {loop.op.deadline:g}s)",
        decision="in_progress", record=res.get("record"), cause=cause)
