"""The tool-call loop (docs/protocol.md, "Tool classes"), the same as the Go client's Do.

reserve → replay | conflict | wait while in progress | recover (probe, or in doubt)
| execute under a heartbeat → commit the receipt; a Permanent failure is stored and
replayed, a NotExecuted one releases the key, any other leaves the record pending.

The loop is written once, as a generator that yields what it needs done (send a
request, sleep, run the tool or the probe under a lease) and is sent the results;
:func:`idemkv.runner.run_sync` drives it with threads, :func:`idemkv.runner.run_async`
with asyncio tasks, so that both clients decide exactly alike.
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime as _dt
import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Optional, Sequence

from . import _core, _otel
from ._core import Call, Config, new_attempt_id
from .approval import ApprovalRequirement, ApprovalWait, await_approval, reserve_effect
from .holder import await_holder
from .errors import (
    APPROVAL_DENIED,
    APIError,
    ApprovalDeniedError,
    ConflictError,
    InDoubtError,
    NotExecuted,
    NotExecutedError,
    OutcomeUnknownError,
    Permanent,
    StoredFailureError,
    StoreUnavailableError,
)
from .jcs import fingerprint as _fingerprint

__all__ = ["make_op", "Op", "Outcome", "Result", "Lease", "current_lease", "CLASSES", "OMITTED_RESULT_KEY",
           "result_omitted"]

READ_ONLY = "read_only"
IDEMPOTENT = "idempotent_mutation"
NON_IDEMPOTENT = "non_idempotent_mutation"

# The classes of docs/protocol.md and the short names a decorator may use.
CLASSES = {
    "read_only": READ_ONLY,
    "idempotent": IDEMPOTENT,
    "idempotent_mutation": IDEMPOTENT,
    "non_idempotent": NON_IDEMPOTENT,
    "non_idempotent_mutation": NON_IDEMPOTENT,
}

# Bounds the rounds of probe, resolve not_executed and reserve again in one call,
# should other callers keep marking the key in doubt in between (the Go maxSettles).
_MAX_SETTLES = 8

# Wire codes that say our lease went to a newer attempt (or the record is gone).
_LOST = frozenset({"fenced", "not_pending", "not_found"})

# The one member of the note stored in place of a result the server refused as too
# large (the Go client's OmittedResultKey): the effect happened, so its receipt is
# stored without the result rather than not at all (docs/protocol.md, "Results too
# large to store").
OMITTED_RESULT_KEY = "idemkv_result_omitted"


def _omitted_note(size: int) -> dict[str, Any]:
    return {OMITTED_RESULT_KEY: {"bytes": size, "message": (
        f"the tool's result ({size} bytes) was larger than idemkv stores; "
        "the call did take effect and its receipt is stored without the result")}}


def result_omitted(result: Any) -> bool:
    """Whether a stored result is the note that stands in for one too large to store."""
    return isinstance(result, dict) and len(result) == 1 and OMITTED_RESULT_KEY in result


def _encoded_size(v: Any) -> int:
    return len(json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8"))


@dataclass
class Result:
    """What a tool or a probe reports: the downstream system's receipt."""

    remote_system: str  # "linear"
    remote_id: str  # "LIN-1842"
    remote_url: str = ""
    result: Any = None  # stored with the receipt and replayed with it (any JSON)


@dataclass
class Outcome:
    """What the loop returns when the operation has a committed receipt."""

    decision: str  # the reserve decision that led here: execute, recover or replay
    receipt: dict[str, Any]
    value: Any  # the tool's return value; on a replay or probe, the stored result
    fingerprint: str = ""
    fence: int = 0
    attempts: int = 0
    replayed: bool = False  # the tool did not run; the receipt is the stored one
    probed: bool = False  # a recovered attempt found the effect through the probe
    unguarded: bool = False  # the store was unreachable and the tool ran without it
    # The stored receipt holds the note of OMITTED_RESULT_KEY instead of the result,
    # which was too large to store; this call's value is the tool's own when it ran.
    result_omitted: bool = False


@dataclass
class Op:
    """One tool call (the Go client's Op)."""

    tenant: str
    key: str  # names the business operation; every retry by any worker carries it
    tool: str
    side_effect: str = NON_IDEMPOTENT
    effect: Any = None  # the fields that define the effect; fingerprinted with JCS
    drop: Sequence[str] = ()  # volatile fields to leave out of the fingerprint
    fingerprint: Optional[str] = None  # instead of effect: computed elsewhere
    actor: Optional[str] = None
    ttl: Optional[float] = None  # seconds the record is kept; server default 24 h
    lease_ttl: float = 30.0
    # probe(*args) looks the effect up downstream after an attempt died: the receipt
    # (a Result, or a value to_result reads) when it happened, None when it did not.
    probe: Optional[Callable[[], Any]] = None
    # Reads the tool's return value as a receipt; default: see default_result.
    to_result: Optional[Callable[[Any], Result]] = None
    remote_system: Optional[str] = None
    # Bounds the call before the tool runs (seconds): reserves, the wait behind another
    # attempt, the approval wait, the probe of a key whose holder died (not started past
    # it; an async one cancelled there). No tool runs past it. It does not stop a tool
    # that runs; past it, storing what the tool (or a probe) found is bounded by
    # commit_grace too.
    deadline: Optional[float] = None
    poll_wait: float = 30.0
    backoff_min: float = 0.02
    backoff_max: float = 1.0
    unguarded: bool = False
    # The budget for waiting on an unresponsive store before the tool runs, across
    # every reserve and long-poll of this call (the Go RunConfig.StoreWait).
    store_wait: float = 30.0
    # Once the caller has given up (cancelled, or past deadline=): how long storing
    # what the tool did goes on, within store_wait (the Go RunConfig.CommitGrace).
    commit_grace: float = _core.DEFAULT_COMMIT_GRACE
    # Before the tool runs: the bound while every endpoint refuses connections (the Go
    # and TypeScript ConnectWait); an answer of any node, such as an election's 503,
    # lifts it to store_wait.
    connect_wait: float = 3.0
    # Names this attempt to the server (the Go Op.AttemptID); default: a fresh one.
    # Pass StoreUnavailableError.attempt_id to retry a call whose reserve may have
    # landed unanswered: the server recognises the same attempt instead of a stranger
    # that waits out the phantom lease and then finds the key in doubt.
    attempt_id: Optional[str] = None
    # Exceptions of the tool that mean "the effect certainly did not happen" (the key
    # is released, as for NotExecuted) and "failed for good" (stored and replayed, as
    # for Permanent). Any other exception leaves the record pending.
    not_executed_on: tuple[type[BaseException], ...] = ()
    permanent_on: tuple[type[BaseException], ...] = ()
    # The value of a tool as the JSON stored with its receipt (default: see _jsonable).
    serialize: Optional[Callable[[Any], Any]] = None
    # What this tool asks of approvals (docs/protocol.md section 7); see
    # ApprovalRequirement. Its summary here is the text itself.
    approval: Optional[ApprovalRequirement] = None

    @classmethod
    def make(cls, config: Config, **kw: Any) -> "Op":
        kw.setdefault("tenant", config.tenant)
        kw.setdefault("actor", config.actor)
        if kw.get("lease_ttl") is None:
            kw["lease_ttl"] = config.lease_ttl
        kw.setdefault("poll_wait", config.poll_wait)
        kw.setdefault("backoff_min", config.backoff_min)
        kw.setdefault("backoff_max", config.backoff_max)
        kw.setdefault("unguarded", config.on_store_unavailable == "unguarded")
        kw.setdefault("store_wait", config.store_wait)
        kw.setdefault("commit_grace", config.commit_grace or _core.DEFAULT_COMMIT_GRACE)
        kw.setdefault("connect_wait", config.connect_wait)
        if "side_effect" in kw:
            se = kw["side_effect"]
            if se not in CLASSES:
                raise ValueError(f"idemkv: unknown side_effect {se!r}; one of {sorted(CLASSES)}")
            kw["side_effect"] = CLASSES[se]
        op = cls(**kw)
        op.validate()
        return op

    def validate(self) -> None:
        if not self.tenant:
            raise ValueError("idemkv: a tenant is required (on the call or the client)")
        if not self.key:
            raise ValueError("idemkv: an idempotency key is required")
        if not self.tool:
            raise ValueError("idemkv: a tool name is required")
        if self.side_effect == READ_ONLY:
            return
        if self.fingerprint is not None and (self.effect is not None or self.drop):
            raise ValueError("idemkv: give an effect or a fingerprint, not both")
        if self.fingerprint is None and self.effect is None:
            raise ValueError("idemkv: a mutating tool call needs an effect or a fingerprint")
        if self.lease_ttl < 1:
            raise ValueError("idemkv: the lease must be at least 1 second")
        a = self.approval
        if a is not None:
            if not isinstance(a, ApprovalRequirement):
                raise TypeError(f"idemkv: approval= takes an idemkv.ApprovalRequirement, not {type(a).__name__}")
            if callable(a.summary):
                raise TypeError("idemkv: a summary function is for @idempotent (it is called with the tool's "
                                "arguments); give the text here")
            if a.required and self.effect is None:
                raise ValueError("idemkv: a call that requires approval needs its effect, not only a fingerprint: "
                                 "the approver approves what they can read")

    def compute_fingerprint(self) -> str:
        if self.fingerprint is not None:
            return self.fingerprint
        return _fingerprint(self.effect, self.drop)


def _jsonable(v: Any) -> Any:
    """v as something json can encode, or None when it cannot be stored."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        v = dataclasses.asdict(v)
    elif hasattr(v, "model_dump"):  # pydantic v2 models, common in agent frameworks
        try:
            v = v.model_dump(mode="json")
        except Exception:
            return None
    try:
        json.dumps(v, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return v


def default_result(op: Op, value: Any) -> Result:
    """The receipt of a tool that returned something other than a Result.

    remote_id is the value's "remote_id", "id" or "key" member (or attribute); the
    server requires one, so a value that names none is receipted under the
    idempotency key itself. The value, when it is JSON, is stored as the result and is
    what a replay returns.
    """
    if isinstance(value, Result):
        return value
    rid: Any = None
    for name in ("remote_id", "id", "key"):
        if isinstance(value, dict) and value.get(name) not in (None, ""):
            rid = value[name]
            break
        if not isinstance(value, dict) and getattr(value, name, None) not in (None, ""):
            rid = getattr(value, name)
            break
    url = ""
    if isinstance(value, dict):
        url = str(value.get("url") or value.get("remote_url") or "")
    return Result(
        remote_system=op.remote_system or op.tool,
        remote_id=str(rid) if rid is not None else op.key,
        remote_url=url,
        result=_jsonable(value if op.serialize is None else op.serialize(value)),
    )


class Lease:
    """The lease the running tool holds; ``current_lease()`` inside the tool.

    ``lost`` is set when a newer attempt took the key over, or when the lease is running
    out with no heartbeat getting through (``expiring`` then, a sixth of the lease before
    its end: another worker may recover the key from its end on): a sync tool should
    stop as soon as it can (an async tool is cancelled instead). What the tool returns
    after ``expiring`` is still stored, and is, if nobody took the key over."""

    def __init__(self, fence: int) -> None:
        self.fence = fence
        self.lost = threading.Event()
        self.error: Optional[APIError] = None
        self.expiring = False
        # When the store call that last renewed the lease was started (monotonic).
        self.renewed: Optional[float] = None


class LeaseExpired(Exception):
    """What an async tool cancelled because its lease was running out unrenewed reports
    (the Go client's ErrLeaseExpired); the record stays pending, as for any error."""


_lease: contextvars.ContextVar[Optional[Lease]] = contextvars.ContextVar("idemkv_lease", default=None)


def current_lease() -> Optional[Lease]:
    """The lease of the tool call this code runs in, or None."""
    return _lease.get()


def _seconds_until(stamp: Any) -> Optional[float]:
    if not stamp:
        return None
    try:
        t = _dt.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None
    return (t - _dt.datetime.now(_dt.timezone.utc)).total_seconds()


# Effects the generator yields; the drivers carry them out.
@dataclass
class _Send:
    call: Call
    bound: Optional[float] = None  # store_wait of this call (heartbeats use less)
    connect_wait: Optional[float] = None  # before the tool runs: give up soon when nobody listens
    # One attempt: a failure that is safe to retry is raised (an APIError) for the loop
    # to back off from itself, as a long-poll's must be, which is not sent again at once.
    once: bool = False
    # A call that stores what the tool did: a caller that gives up while it is in flight
    # does not cut it short for this many seconds from its start (async; the Go
    # client's CommitGrace).
    grace: Optional[float] = None


@dataclass
class _Sleep:
    seconds: float


@dataclass
class _Run:
    which: str  # "tool" or "probe"
    fence: Optional[int]  # run under a heartbeat for this fence; None: no lease
    # A probe's share of the deadline (seconds): the async driver cancels the probe
    # then and hands back a _DeadlinePassed error; a sync function cannot be stopped
    # from outside, so the sync driver lets it finish and the loop looks at the clock.
    until: Optional[float] = None
    # When the store call that granted or last renewed the lease was started
    # (monotonic): the lease runs out lease_ttl after it at the earliest.
    lease_from: Optional[float] = None


@dataclass
class _Ran:
    value: Any = None
    error: Optional[BaseException] = None
    lost: Optional[APIError] = None
    renewed: Optional[float] = None  # when the last renewal under the run was sent


@dataclass
class _Grant:
    decision: str
    fence: int
    record: Optional[dict[str, Any]]


Gen = Generator[Any, Any, Outcome]


@dataclass
class _Loop:
    op: Op
    fp: str
    span: Any
    attempt_id: str = ""
    # Store time spent before the tool ran (a long-poll's own wait excluded).
    used: float = 0.0
    # The op's deadline= on the monotonic clock, from the start of the call.
    deadline: Optional[float] = None
    # Set by the async driver when the caller was cancelled and the loop goes on to
    # store what the tool did.
    gave_up: bool = False
    # When the reserve that granted the lease, or its last renewal, was sent.
    lease_from: Optional[float] = None

    def __post_init__(self) -> None:
        if not self.attempt_id:
            self.attempt_id = self.op.attempt_id or new_attempt_id()

    def outcome(self, g: _Grant, receipt: dict[str, Any], value: Any, **kw: Any) -> Outcome:
        attempts = int((g.record or {}).get("attempts", 0))
        return Outcome(decision=g.decision, receipt=receipt, value=value, fingerprint=self.fp, fence=g.fence,
                       attempts=attempts, **kw)

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def left(self) -> Optional[float]:
        """Seconds until the deadline (0 once it passed), or None without one."""
        return None if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)

    def deadline_cause(self, what: str) -> "_DeadlinePassed":
        return _DeadlinePassed(f"idemkv: the deadline ({self.op.deadline:g}s) of {self.op.key!r} passed {what}")

    def budgeted(self, call: Call, once: bool = False) -> Generator[Any, Any, Any]:
        """Sends a call made before the tool runs within what is left of store_wait and
        of the deadline, so that a call whose store does not answer ends within
        store_wait in all, and a call with a deadline gives up there."""
        left = self.op.store_wait - self.used
        if left <= 0:
            raise self.store_wait_spent(call)
        if self.deadline is not None:
            until = self.deadline - time.monotonic()
            if until <= 0 and not call.wait:
                raise self.deadline_passed(call)
            # A long-poll's wait was cut to the deadline by its caller; the store may
            # take only what is left past it.
            left = min(left, max(until - call.wait, 0.05))
        start = time.monotonic()
        try:
            return (yield _Send(call, bound=left, connect_wait=self.op.connect_wait, once=once))
        except StoreUnavailableError as e:
            if self.past_deadline():
                raise self.deadline_passed(call, e) from e
            # The caller may retry as this same attempt (docs/protocol.md section 4).
            e.attempt_id = self.attempt_id
            raise
        except BaseException as e:
            # A TimeoutError here is the caller's own (a signal handler's): the clients
            # take the others for transport errors and retry.
            if not _gave_up(e) or call.route != "/v1/reserve":
                raise
            # The caller gave up (a cancelled task, an interrupt, its own timeout) with
            # this reserve in flight, and it may have landed: this attempt may hold the
            # key for its lease. The cancellation goes on, as asyncio needs it to,
            # caused by the error that names the attempt to retry as (a retry as a new
            # attempt would wait out that lease, then find the key in doubt though
            # nothing ran).
            raise e from StoreUnavailableError(
                f"idemkv: the caller gave up with the reserve of {self.op.key!r} in flight; it may hold the key: "
                f"retry with attempt_id={self.attempt_id!r}", attempt_id=self.attempt_id)
        finally:
            self.used += max(time.monotonic() - start - call.wait, 0.0)

    def store_wait_spent(self, call: Call, last: Optional[BaseException] = None) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"idemkv: {call.method} {call.route}: store_wait ({self.op.store_wait:g}s) spent before the tool ran"
            + (f" (last: {last})" if last is not None else ""), attempt_id=self.attempt_id, cause=last)

    def deadline_passed(self, call: Call, last: Optional[BaseException] = None) -> StoreUnavailableError:
        """The error of a deadline that passed in a reserve or its retries, the Go
        client's for a context that ended there: a reserve in flight may have landed
        and hold the key, so it names the attempt to retry as."""
        return StoreUnavailableError(
            f"idemkv: {call.method} {call.route}: the deadline ({self.op.deadline:g}s) passed before the tool ran; "
            f"retry with attempt_id={self.attempt_id!r}" + (f" (last: {last})" if last is not None else ""),
            attempt_id=self.attempt_id, cause=last)

    def stored(self, call: Call) -> _Send:
        """A call that stores what the loop learned (a receipt, a failure, a release, a
        doubt), the Go client's graceContext: bounded by store_wait while the caller
        waits, and by commit_grace too once it has given up (cancelled, or past its
        deadline), since an effect that happened must be recorded if at all possible."""
        op = self.op
        bound = op.store_wait
        if self.gave_up:
            bound = min(bound, op.commit_grace)
        left = self.left()
        if left is not None:
            # Past the deadline, commit_grace more at most: a call begun just before it
            # (a resolve after a quick probe, a commit) does not hold the caller for
            # store_wait past it.
            bound = min(bound, left + op.commit_grace)
        return _Send(call, bound=bound, grace=op.commit_grace)

    def main(self) -> Gen:
        op = self.op
        self.deadline = None if op.deadline is None else time.monotonic() + op.deadline
        effect, ask = None, None
        if op.approval is not None:
            # A record that waits for approval keeps the effect for the approver.
            ask = op.approval.ask()
            if op.effect is not None:
                effect = reserve_effect(op.effect, op.drop)
        reserve = _core.reserve_call(op.tenant, op.key, op.tool, fingerprint=self.fp, effect=effect, actor=op.actor,
                                     attempt_id=self.attempt_id, lease_ttl=op.lease_ttl, ttl=op.ttl, approval=ask)
        approval = ApprovalWait()
        waits = settles = 0
        while True:
            self.lease_from = time.monotonic()
            try:
                res = yield from self.budgeted(reserve)
            except StoreUnavailableError as e:
                # Past the deadline the caller has given up: nothing runs for it.
                if op.unguarded and op.side_effect == IDEMPOTENT and not self.past_deadline():
                    return (yield from self.unguarded(e))
                raise
            except APIError as e:
                # Refused before anything ran (a bad argument, a token without the
                # tenant): the effect did not happen.
                raise NotExecutedError(f"idemkv: reserve of {op.key!r} refused: {e}", cause=e) from e
            decision = res.get("decision", "")
            record = res.get("record")
            self.decided(res)
            if decision == "replay":
                return self.replay(res)
            if decision == "conflict":
                c = res.get("conflict") or {}
                raise ConflictError(
                    f"idemkv: conflict on {op.key!r}: {c.get('reason', '')} (existing {c.get('existing_fingerprint', '')}, "
                    f"received {c.get('received_fingerprint', '')})",
                    conflict=c, decision=decision, record=record)
            if decision == "in_progress":
                waits += 1
                try:
                    yield from await_holder(self, res, waits)
                except StoreUnavailableError as e:
                    if op.unguarded and op.side_effect == IDEMPOTENT and not self.past_deadline():
                        return (yield from self.unguarded(e))
                    raise
                continue
            if decision == "needs_approval":
                yield from await_approval(self, res, approval, self.deadline)
                continue
            g = _Grant(decision, int(res.get("fence") or 0), record)
            if decision == "execute":
                if self.past_deadline() and not _approved(record):
                    # Answered after the deadline (a reserve may take a moment past it):
                    # the tool does not run for a caller that has given up. The key
                    # this attempt holds is let go, and the error is that of a reserve
                    # the deadline cut, which names the attempt.
                    late = self.deadline_passed(reserve)
                    yield from self.let_go(g, late)
                    raise late
                # A grant that consumed an approval runs the tool even past the
                # deadline, as the Go client runs it once it holds the grant: a release
                # would delete the record and the person's approval with it (section 7).
                return (yield from self.execute(g))
            if decision == "recover" and g.fence:
                return (yield from self.recover(g))
            if decision == "recover":
                # In doubt: nobody holds the key and nobody gets it.
                settled = yield from self.in_doubt(g)
                if settled is not None:
                    return settled
                settles += 1
                if settles >= _MAX_SETTLES:
                    raise InDoubtError(f"idemkv: {op.key!r} still in doubt after {settles} rounds of probe and resolve",
                                       decision=decision, record=record)
                continue  # released, or settled by someone else: reserve again
            raise NotExecutedError(f"idemkv: unknown reserve decision {decision!r}", decision=decision, record=record)

    def decided(self, res: dict[str, Any]) -> None:
        attrs: dict[str, Any] = {_otel.DECISION: res.get("decision", "")}
        if res.get("fence"):
            attrs[_otel.FENCE] = int(res["fence"])
        rec = res.get("record") or {}
        if rec.get("attempts"):
            attrs[_otel.ATTEMPTS] = int(rec["attempts"])
        c = res.get("conflict")
        if c:
            attrs[_otel.CONFLICT_REASON] = c.get("reason", "")
            attrs[_otel.CONFLICT_EXISTING_FINGERPRINT] = c.get("existing_fingerprint", "")
            if c.get("existing_remote_id"):
                attrs[_otel.CONFLICT_EXISTING_REMOTE_ID] = c["existing_remote_id"]
        self.span.set_attributes(attrs)
        self.span.add_event("reserve", attrs)

    def replay(self, res: dict[str, Any]) -> Outcome:
        rec = res.get("record") or {}
        receipt = res.get("receipt") or _receipt_of(rec)
        if not receipt:
            raise NotExecutedError(f"idemkv: replay of {self.op.key!r} without a receipt", decision="replay", record=rec)
        if receipt.get("status") == "failed":
            raise _stored_failure(self.op.key, receipt, True, "replay", rec)
        g = _Grant("replay", int(rec.get("fence") or 0), rec)
        return self.outcome(g, receipt, receipt.get("result"), replayed=True,
                            result_omitted=result_omitted(receipt.get("result")))

    def until_deadline(self, pause: float) -> float:
        """pause, cut short at the deadline."""
        if self.deadline is None:
            return pause
        return max(min(pause, self.deadline - time.monotonic()), 0.0)

    def recover(self, g: _Grant) -> Gen:
        op = self.op
        if op.side_effect == IDEMPOTENT:
            if self.past_deadline():
                # Nothing runs past the deadline; the record stays pending as the
                # dead attempt left it, and the next attempt after this lease recovers.
                raise self.left_pending(g, "before the tool could run again")
            return (yield from self.execute(g, earlier=True))
        if op.probe is None:
            # Nobody can know whether the dead attempt's effect happened: mark the
            # record in doubt, so that retries stop re-leasing it, and say so.
            self.span.add_event("in_doubt")
            record = g.record
            try:
                record = yield self.stored(_core.doubt_call(op.tenant, op.key, self.fp, g.fence))
            except (APIError, StoreUnavailableError) as e:
                raise _in_doubt(op.key, g.record, e) from e
            except BaseException as e:
                if not _gave_up(e):
                    raise
                raise _given_up(e, _in_doubt(op.key, g.record, None))
            raise _in_doubt(op.key, record, None)
        if self.past_deadline():
            # The Go client's probe given a context that has ended: still unknown.
            raise self.left_pending(g, "before the probe could run")
        try:
            ran = yield _Run("probe", g.fence, until=self.left(), lease_from=self.lease_from)
        except BaseException as e:
            if not _gave_up(e):
                raise
            raise _given_up(e, OutcomeUnknownError(
                f"idemkv: interrupted while the probe for {op.key!r} ran; the record stays pending and the "
                "next attempt after its lease recovers it", decision=g.decision, record=g.record))
        if ran.renewed is not None:
            self.lease_from = ran.renewed
        if ran.lost is not None:
            raise _lost(op.key, ran)
        if ran.error is not None:
            # Still unknown: the record stays pending for the next attempt.
            raise OutcomeUnknownError(f"idemkv: probe for {op.key!r} failed: {ran.error}", decision=g.decision,
                                      record=g.record, cause=ran.error) from ran.error
        if ran.value is None:
            self.span.add_event("probe", {"found": False})
            if self.past_deadline() and not _approved(g.record):
                # The effect did not happen, and the tool does not run past the
                # deadline: the key is released (as a NotExecuted tool's), so that the
                # next attempt runs it at once.
                cause = self.deadline_cause("while the probe ran; it found no effect, and the tool was not run")
                yield from self.release(g, cause)
                raise NotExecutedError(f"idemkv: {op.key!r} not executed: {cause}", decision=g.decision,
                                       record=g.record, cause=cause) from cause
            # (With an approval the tool runs, as the Go client runs it: a release would
            # delete the record, and the next reserve would ask for a new approval.)
            return (yield from self.execute(g))
        self.span.add_event("probe", {"found": True})
        found = self.as_result(ran.value)
        return (yield from self.commit(g, found, ran.value if not isinstance(ran.value, Result) else found.result,
                                       probed=True))

    def in_doubt(self, g: _Grant) -> Generator[Any, Any, Optional[Outcome]]:
        """A recover without a fence: the record is in doubt. Without a probe that is
        the in-doubt error at once; with one, the probe settles it (resolve committed, or
        resolve not_executed and reserve again). None: reserve again."""
        op = self.op
        if op.probe is None:
            self.span.add_event("in_doubt")
            raise _in_doubt(op.key, g.record, None)
        if self.past_deadline():
            # The Go client's probe given a context that has ended: the record stays
            # in doubt, untouched.
            self.span.add_event("in_doubt")
            cause = self.deadline_cause("before the probe could run")
            raise _in_doubt(op.key, g.record, cause) from cause
        found: Optional[Result] = None
        value: Any = None
        try:
            ran = yield _Run("probe", None, until=self.left())
        except BaseException as e:
            if not _gave_up(e):
                raise
            raise _given_up(e, _in_doubt(op.key, g.record, None))
        if ran.error is not None:
            raise _in_doubt(op.key, g.record, ran.error) from ran.error
        if ran.value is not None:
            found = self.as_result(ran.value)
            value = ran.value if not isinstance(ran.value, Result) else found.result
        try:
            seen = g.record
            if seen is not None:
                # The probe answers for the doubt it looked at (the Go client's
                # settleInDoubt). Should the key have been settled and marked in doubt
                # anew while it looked (another caller released it, ran the tool and
                # died), its "not found" says nothing of that run, and a resolve by key
                # would release the key after an effect: reserve and look again.
                cur = yield self.stored(_core.get_call(op.tenant, op.key))
                if (cur.get("status") != "pending" or not cur.get("in_doubt")
                        or cur.get("fence") != seen.get("fence")):
                    self.span.add_event("doubt_changed")
                    return None
            if found is not None:
                self.span.add_event("probe", {"found": True})
                res = found
                receipt = yield from self.fitted(lambda r: _core.resolve_call(
                    op.tenant, op.key, self.fp, "committed", res.remote_system, res.remote_id,
                    res.remote_url or None, r), _jsonable(found.result))
                g = _Grant(g.decision, int((g.record or {}).get("fence") or 0), g.record)
                return self.outcome(g, receipt, value, probed=True, result_omitted=result_omitted(receipt.get("result")))
            self.span.add_event("probe", {"found": False})
            yield self.stored(_core.resolve_call(op.tenant, op.key, self.fp, "not_executed"))
        except APIError as e:
            if e.code not in ("not_pending", "not_found"):
                raise _in_doubt(op.key, g.record, e) from e
            # Someone settled it first: reserve again and read what they decided.
        except StoreUnavailableError as e:
            raise _in_doubt(op.key, g.record, e) from e
        except BaseException as e:
            if not _gave_up(e):
                raise
            # The resolve may or may not have landed: the record may still be in doubt.
            raise _given_up(e, InDoubtError(
                f"idemkv: interrupted while {op.key!r} was being resolved after its probe "
                f"(found: {found is not None}); it may still be in doubt", decision="recover", record=g.record))
        return None

    def execute(self, g: _Grant, earlier: bool = False) -> Gen:
        """Run the tool under g. earlier: an attempt before this one may have run it (an
        idempotent re-execution on recover), so a "not executed" from this run says
        nothing about that attempt: the key stays pending rather than being released,
        since a release frees the key for other arguments."""
        op = self.op
        try:
            ran = yield _Run("tool", g.fence, lease_from=self.lease_from)
        except BaseException as e:
            # An interrupt (a KeyboardInterrupt in a sync tool, a second cancellation
            # of an async one): it goes on, and says that the tool may have had its
            # effect, which is not stored.
            if not _gave_up(e):
                raise
            raise _given_up(e, OutcomeUnknownError(
                f"idemkv: interrupted while the tool for {op.key!r} ran: it may have had its effect, which "
                "is not stored; the record stays pending and the next attempt after its lease recovers it",
                decision=g.decision, record=g.record))
        if ran.lost is not None:
            # A newer attempt owns the key; it decides the outcome (and probes for ours).
            raise _lost(op.key, ran)
        err = ran.error
        if err is None:
            return (yield from self.commit(g, self.as_result(ran.value), ran.value))
        if not isinstance(err, (NotExecuted, Permanent)):
            if isinstance(err, op.not_executed_on):
                err = _declared(NotExecuted, err)
            elif isinstance(err, op.permanent_on):
                err = _declared(Permanent, err)
        if isinstance(err, NotExecuted) and earlier:
            self.span.add_event("left_pending")
            raise OutcomeUnknownError(
                f"idemkv: the re-run of {op.key!r} did not execute, but an earlier attempt may have: "
                f"the record stays pending: {err}", decision=g.decision, record=g.record, cause=err) from err
        if isinstance(err, NotExecuted):
            yield from self.release(g, err)
            raise NotExecutedError(f"idemkv: {op.key!r} not executed: {err}", decision=g.decision, record=g.record,
                                   cause=err) from err
        if isinstance(err, Permanent):
            return (yield from self.fail(g, err))
        self.span.add_event("left_pending")
        raise OutcomeUnknownError(
            f"idemkv: the tool for {op.key!r} failed and may have had its effect; the record stays pending "
            f"and the next attempt after its lease recovers it: {err!r}",
            decision=g.decision, record=g.record, cause=err) from err

    def as_result(self, value: Any) -> Result:
        if isinstance(value, Result):
            return value
        if self.op.to_result is not None:
            return self.op.to_result(value)
        return default_result(self.op, value)

    def commit(self, g: _Grant, res: Result, value: Any, probed: bool = False) -> Gen:
        op = self.op
        result = _jsonable(res.result)

        def call(r: Any) -> Call:
            return _core.commit_call(op.tenant, op.key, self.fp, g.fence, res.remote_system, res.remote_id,
                                     res.remote_url or None, r)

        try:
            receipt = yield from self.fitted(call, result)
        except (APIError, StoreUnavailableError) as e:
            raise OutcomeUnknownError(
                f"idemkv: the tool ran but its receipt for {op.key!r} was not stored (remote id {res.remote_id!r}): {e}",
                decision=g.decision, record=g.record, cause=e) from e
        except BaseException as e:
            # The caller gave up with the commit in flight (a KeyboardInterrupt, a
            # signal handler's TimeoutError; asyncio's cancellation is waited out up to
            # commit_grace first, by the driver): the interrupt goes on, caused by the
            # error that says the effect happened and its receipt may not be stored.
            if not _gave_up(e):
                raise
            raise _given_up(e, OutcomeUnknownError(
                f"idemkv: interrupted while the receipt for {op.key!r} was being stored (remote id "
                f"{res.remote_id!r}): {'the probe found the effect' if probed else 'the tool ran'}, and its receipt "
                "may not be stored; the record stays pending unless the commit landed, and the next attempt after "
                "its lease recovers it", decision=g.decision, record=g.record))
        if receipt.get("status") == "failed":
            # The first stored outcome wins, and it was a failure.
            raise _stored_failure(op.key, receipt, True, g.decision, g.record)
        if receipt.get("remote_id"):
            self.span.set_attributes({_otel.RECEIPT_REMOTE_ID: receipt["remote_id"]})
        return self.outcome(g, receipt, value, probed=probed, result_omitted=result_omitted(receipt.get("result")))

    def fitted(self, call: Callable[[Any], Call], result: Any) -> Generator[Any, Any, Any]:
        """Sends call(result); a result the server refuses as too large
        (payload_too_large) is sent again as the note of OMITTED_RESULT_KEY."""
        if result is not None and _encoded_size(result) > _core.MAX_BODY_BYTES:
            # Over the body limit every server has: no need to ask.
            return (yield self.stored(call(_omitted_note(_encoded_size(result)))))
        try:
            return (yield self.stored(call(result)))
        except APIError as e:
            if e.code != "payload_too_large" or result is None:
                raise
        self.span.add_event("result_omitted", {"bytes": _encoded_size(result)})
        return (yield self.stored(call(_omitted_note(_encoded_size(result)))))

    def fail(self, g: _Grant, perm: Permanent) -> Gen:
        op = self.op
        try:
            rec = yield self.stored(_core.fail_call(op.tenant, op.key, self.fp, g.fence, _printable(perm.code, 128),
                                                    _printable(str(perm), 4096), _jsonable(perm.details)))
        except (APIError, StoreUnavailableError) as e:
            raise OutcomeUnknownError(f"idemkv: storing the failure of {op.key!r}: {e}", decision=g.decision,
                                      record=g.record, cause=perm) from perm
        except BaseException as e:
            if not _gave_up(e):
                raise
            raise _given_up(e, OutcomeUnknownError(
                f"idemkv: interrupted while the failure of {op.key!r} was being stored: it may not be stored; "
                f"the record stays pending unless it landed: {perm}", decision=g.decision, record=g.record,
                cause=perm))
        receipt = _receipt_of(rec)
        if receipt.get("status") == "committed":
            return self.outcome(g, receipt, receipt.get("result"))
        err = StoredFailureError(f"idemkv: {op.key!r} failed permanently: {perm.code}: {perm}", receipt=receipt,
                                 replayed=False, decision=g.decision, record=rec, cause=perm)
        raise err from perm

    def release(self, g: _Grant, cause: BaseException) -> Generator[Any, Any, None]:
        op = self.op
        try:
            yield self.stored(_core.release_call(op.tenant, op.key, self.fp, g.fence))
        except APIError as e:
            if e.code not in ("not_found", "fenced"):
                # The tool did not run; the key stays held until its lease runs out.
                raise NotExecutedError(f"idemkv: {op.key!r} not executed; releasing the key: {e}",
                                       decision=g.decision, cause=cause) from e
            # Gone already, or a newer attempt owns the key: not ours to free.
        except StoreUnavailableError as e:
            raise NotExecutedError(f"idemkv: {op.key!r} not executed; releasing the key: {e}", decision=g.decision,
                                   cause=cause) from e
        except BaseException as e:
            if not _gave_up(e):
                raise
            raise _given_up(e, NotExecutedError(
                f"idemkv: {op.key!r} not executed; interrupted while the key was being released, which may "
                f"stay held until its lease runs out: {cause}", decision=g.decision, cause=cause))
        self.span.add_event("released")

    def let_go(self, g: _Grant, err: StoreUnavailableError) -> Generator[Any, Any, None]:
        """Releases the key of an execute grant the loop will not use (nothing ran), as
        well as it can: a failure leaves it held until its lease runs out, by the
        attempt err names."""
        try:
            yield self.stored(_core.release_call(self.op.tenant, self.op.key, self.fp, g.fence))
            self.span.add_event("released")
        except (APIError, StoreUnavailableError):
            pass
        except BaseException as e:
            if not _gave_up(e):
                raise
            raise _given_up(e, err)

    def left_pending(self, g: _Grant, when: str) -> OutcomeUnknownError:
        """The error of a recovered record the deadline leaves as it found it: pending,
        the dead attempt's outcome unknown (the Go client's probe or re-run given a
        context that has ended)."""
        self.span.add_event("left_pending")
        cause = self.deadline_cause(when)
        err = OutcomeUnknownError(
            f"idemkv: {cause}: an earlier attempt may have had its effect; the record stays pending and the next "
            "attempt after this lease recovers it", decision=g.decision, record=g.record, cause=cause)
        return err

    def unguarded(self, e: StoreUnavailableError) -> Gen:
        self.span.add_event("unguarded")
        ran = yield _Run("tool", None)
        if ran.error is not None:
            # Nothing is recorded: from idemkv's side the call never happened.
            raise NotExecutedError(f"idemkv: unguarded tool for {self.op.key!r} failed: {ran.error!r}",
                                   cause=ran.error) from ran.error
        res = self.as_result(ran.value)
        receipt = {"idempotency_key": self.op.key, "effect_fingerprint": self.fp, "status": "committed",
                   "remote_system": res.remote_system, "remote_id": res.remote_id}
        return Outcome(decision="execute", receipt=receipt, value=ran.value, fingerprint=self.fp, unguarded=True)


class _DeadlinePassed(TimeoutError):
    """The cause of an error the op's deadline= brought about after the reserve: a
    probe it cut or did not start, a re-run it did not start (the Go client's
    context.DeadlineExceeded)."""


def _gave_up(e: BaseException) -> bool:
    """Whether e, thrown into the loop by its driver, is the caller giving up: an
    interrupt or a cancellation (no Exception), or a TimeoutError, which the clients
    raise only when the caller's own (a signal handler's) cut a store call short; the
    others they take for transport errors."""
    return not isinstance(e, (Exception, GeneratorExit)) or isinstance(e, TimeoutError)


def _given_up(e: BaseException, answer: BaseException) -> BaseException:
    """e, the caller's interrupt or cancellation, to go on as it is (as Python and
    asyncio need), with what the loop has to say as its cause, which find_cause finds:
    e.g. an OutcomeUnknownError when the tool ran and its receipt may not be stored."""
    if e.__cause__ is None:
        e.__cause__ = answer
        e.__suppress_context__ = True
    return e


def _receipt_of(rec: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The receipt a terminal record replays (the Go Record.Outcome)."""
    if not rec or rec.get("status") not in ("committed", "failed"):
        return {}
    out = {"idempotency_key": rec.get("idempotency_key"), "effect_fingerprint": rec.get("effect_fingerprint"),
           "status": rec["status"]}
    if rec.get("receipt"):
        out.update(rec["receipt"])
    if rec.get("error"):
        out["error"] = rec["error"]
    return out


def _approved(record: Optional[dict[str, Any]]) -> bool:
    """Whether record carries an approval that was given (and which a grant consumes):
    releasing its key would delete the record and the approval with it."""
    a = (record or {}).get("approval") or {}
    return isinstance(a, dict) and a.get("state") == "approved"


def _stored_failure(key: str, receipt: dict[str, Any], replayed: bool, decision: str,
                    record: Optional[dict[str, Any]]) -> StoredFailureError:
    info = receipt.get("error") or {}
    if info.get("code") == APPROVAL_DENIED:
        return ApprovalDeniedError(f"idemkv: {key!r} was not run: its approval was {info.get('message', 'denied')}",
                                   receipt=receipt, replayed=replayed, decision=decision, record=record)
    return StoredFailureError(f"idemkv: {key!r} failed permanently: {info.get('code', '')}: {info.get('message', '')}",
                              receipt=receipt, replayed=replayed, decision=decision, record=record)


def _in_doubt(key: str, record: Optional[dict[str, Any]], cause: Optional[BaseException]) -> InDoubtError:
    return InDoubtError(
        f"idemkv: {key!r} is in doubt: an earlier attempt died and nothing can tell whether its effect happened; "
        f"resolve it (idemkv resolve TENANT KEY --committed --remote-system S --remote-id ID | --not-executed)",
        decision="recover", record=record, cause=cause)


def _lost(key: str, ran: _Ran) -> OutcomeUnknownError:
    return OutcomeUnknownError(f"idemkv: lease on {key!r} lost to a newer attempt while the tool ran: {ran.lost}",
                               decision="execute", cause=ran.error or ran.lost)


def _declared(kind: type[Exception], err: BaseException) -> Exception:
    """err, of a class the call declared not_executed_on or permanent_on, as the mark
    the loop acts on (NotExecuted or Permanent), with err as its cause."""
    mark = kind(f"{type(err).__name__}: {err}")
    mark.__cause__ = err
    return mark


def _printable(s: str, limit: int) -> str:
    """s as the server stores it: printable UTF-8 (errors often span lines), bounded."""
    s = "".join(ch if ch.isprintable() else " " for ch in s)
    while len(s.encode("utf-8")) > limit:
        s = s[:-1]
    return s


def make_op(config: Config, **kw: Any) -> Op:
    """Op.make, whose refusals (a missing tenant, a bad class) are not_executed errors."""
    try:
        return Op.make(config, **kw)
    except (ValueError, TypeError) as e:
        raise NotExecutedError(f"idemkv: invalid tool call: {e}", cause=e) from e
