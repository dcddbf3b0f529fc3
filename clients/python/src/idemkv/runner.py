"""The drivers of the tool-call loop: :func:`run_sync` carries out what the loop
(:mod:`idemkv.loop`) asks with a heartbeat thread, :func:`run_async` with asyncio
tasks. Both decide nothing themselves, so that the two clients behave alike."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import signal
import sys
import threading
import time
from typing import Any, Awaitable, Callable, Optional

from . import _core, _otel
from .errors import APIError, NotExecutedError, StoreUnavailableError
from .loop import (
    _LOST,
    READ_ONLY,
    Lease,
    LeaseExpired,
    Op,
    Outcome,
    _lease,
    _Loop,
    _Ran,
    _Run,
    _DeadlinePassed,
    _Send,
    _Sleep,
)

__all__ = ["run_sync", "run_async"]


def _fingerprint_of(op: Op) -> str:
    try:
        return op.compute_fingerprint()
    except ValueError as e:  # FingerprintError: refused before any call
        raise NotExecutedError(f"idemkv: the effect of {op.key!r} has no fingerprint: {e}", cause=e) from e


def _start_span(client: Any, op: Op) -> Any:
    return _otel.start(client._tracer, "execute_tool " + op.tool, {
        _otel.TOOL_NAME: op.tool,
        _otel.TOOL_SIDE_EFFECT: op.side_effect != READ_ONLY,
        _otel.TOOL_CLASS: op.side_effect,
        _otel.IDEMPOTENCY_KEY: op.key,
        _otel.TENANT: op.tenant,
    })


def _finish_span(span: Any, out: Optional[Outcome], exc: Optional[BaseException]) -> None:
    if out is not None:
        span.set_attributes({_otel.REPLAYED: out.replayed})
        if out.receipt.get("remote_id"):
            span.set_attributes({_otel.RECEIPT_REMOTE_ID: out.receipt["remote_id"]})
    if exc is not None:
        span.fail(exc)
    span.end()


# The sync driver.


class _Renewals:
    """When the heartbeat renews and when it tells the tool (the Go client's heartbeat):
    the lease runs out by this worker's clock lease_ttl after the start of the call that
    last granted or renewed it (earlier than the leader's stamp, so never later than the
    lease itself); once a renewal has failed, the tool is told a sixth of the lease
    before that, so that it hears it in time to stop before another worker may recover
    the key and run the tool beside it."""

    def __init__(self, op: Op, lease: Lease, lease_from: Optional[float]) -> None:
        self.lease = lease
        self.every = op.lease_ttl / 3
        self.tell = op.lease_ttl - op.lease_ttl / 6
        self.start = lease_from if lease_from is not None else time.monotonic()
        self.tried = False
        # A grant that took long to arrive (retries inside the reserve) is renewed at once.
        self.nxt = 0.0 if self.left() < self.every else self.every

    def left(self) -> float:
        return self.start + self.tell - time.monotonic()

    def wait(self) -> float:
        if self.lease.expiring or not self.tried:
            return self.nxt
        return max(min(self.nxt, self.left()), 0.0)

    def due(self) -> bool:
        """Whether the tool is to be told now; then marks the lease expiring."""
        if self.lease.expiring or not self.tried or self.left() > 0:
            return False
        self.lease.expiring = True
        self.lease.lost.set()
        return True

    def bound(self) -> float:
        """The next renewal's bound: cut short when the tool is to be told."""
        left = self.left()
        if not self.lease.expiring and 0 < left < self.every:
            return left
        return self.every

    def sent(self, at: float) -> None:
        self.start = at
        self.lease.renewed = at
        self.nxt = self.every

    def failed(self) -> None:
        self.tried = True
        self.nxt = max(self.every / 6, 0.05)


def _heartbeat_thread(client: Any, op: Op, lease: Lease, stop: threading.Event,
                      lease_from: Optional[float] = None) -> None:
    r = _Renewals(op, lease, lease_from)
    call = _core.heartbeat_call(op.tenant, op.key, lease.fence, op.lease_ttl)
    while not stop.wait(r.wait()):
        r.due()
        sent = time.monotonic()
        try:
            client._send(call, bound=r.bound())
            r.tried = True
            r.sent(sent)
        except APIError as e:
            if e.code in _LOST:
                lease.error = e
                lease.lost.set()
                return
            r.failed()
        except Exception:
            # Try again soon: the lease may still have time to run.
            r.failed()


def _signal_timeout(e: BaseException) -> bool:
    """Whether e is a TimeoutError a signal handler raised (the caller's own timeout,
    signal.alarm or setitimer, cutting the tool short): raised in a frame of a function
    installed as a handler of some signal now. Not the tool's error to classify through
    not_executed_on (its effect may have happened): it goes on, as an interrupt does."""
    if not isinstance(e, TimeoutError) or e.errno is not None:
        return False
    codes = set()
    for sig in signal.valid_signals():
        try:
            h: Any = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        while isinstance(h, functools.partial):
            h = h.func
        code = getattr(getattr(h, "__func__", h), "__code__", None)
        if code is not None:
            codes.add(code)
    tb = e.__traceback__
    while tb is not None and codes:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


def _run_sync(client: Any, op: Op, fn: Callable[[], Any], eff: _Run) -> _Ran:
    f = fn if eff.which == "tool" else op.probe
    assert f is not None
    if eff.fence is None:
        try:
            return _Ran(value=f())
        except Exception as e:
            if _signal_timeout(e):
                raise
            return _Ran(error=e)
    lease = Lease(eff.fence)
    stop = threading.Event()
    hb = threading.Thread(target=_heartbeat_thread, args=(client, op, lease, stop, eff.lease_from),
                          name="idemkv-heartbeat", daemon=True)
    hb.start()
    token = _lease.set(lease)
    try:
        try:
            ran = _Ran(value=f())
        except Exception as e:
            if _signal_timeout(e):
                raise  # the loop says that the tool may have had its effect
            ran = _Ran(error=e)
    finally:
        _lease.reset(token)
        stop.set()
        hb.join()
    ran.lost = lease.error
    ran.renewed = lease.renewed
    return ran


def run_sync(client: Any, op: Op, fn: Callable[[], Any]) -> Outcome:
    """Runs fn (no arguments) at most once for op.key; see the module doc."""
    span = _start_span(client, op)
    out: Optional[Outcome] = None
    try:
        if op.side_effect == READ_ONLY:
            try:
                value = fn()
            except Exception as e:
                # A read has no effect to be unsure of.
                raise NotExecutedError(f"idemkv: read-only tool for {op.key!r} failed: {e!r}", cause=e) from e
            out = Outcome(decision="execute", receipt={}, value=value)
            return out
        fp = _fingerprint_of(op)
        span.set_attributes({_otel.FINGERPRINT: fp})
        gen = _Loop(op, fp, span).main()
        send: Any = None
        throw: Optional[BaseException] = None
        while True:
            try:
                eff = gen.throw(throw) if throw is not None else gen.send(send)
            except StopIteration as stop:
                out = stop.value
                return stop.value  # type: ignore[no-any-return]
            send, throw = None, None
            try:
                if isinstance(eff, _Send):
                    send = client._send(eff.call, bound=eff.bound, connect_wait=eff.connect_wait, once=eff.once)[0]
                elif isinstance(eff, _Sleep):
                    time.sleep(eff.seconds)
                else:
                    send = _run_sync(client, op, fn, eff)
            except BaseException as e:
                # An interrupt too: the loop says what it cut short, and lets it go on.
                throw = e
    except BaseException as e:
        _finish_span(span, None, e)
        raise
    finally:
        if out is not None:
            _finish_span(span, out, None)


# The asyncio driver.


async def _heartbeat_task(client: Any, op: Op, lease: Lease, tool: "asyncio.Task[Any]",
                          lease_from: Optional[float] = None) -> None:
    r = _Renewals(op, lease, lease_from)
    call = _core.heartbeat_call(op.tenant, op.key, lease.fence, op.lease_ttl)
    while True:
        await asyncio.sleep(r.wait())
        if r.due():
            tool.cancel()
        sent = time.monotonic()
        try:
            await client._send(call, bound=r.bound())
            r.tried = True
            r.sent(sent)
        except APIError as e:
            if e.code in _LOST:
                lease.error = e
                lease.lost.set()
                tool.cancel()
                return
            r.failed()
        except Exception:
            r.failed()


async def _run_async(client: Any, op: Op, fn: Callable[[], Awaitable[Any]],
                     eff: _Run) -> tuple[_Ran, Optional[asyncio.CancelledError]]:
    """Runs the tool or the probe; also returns the caller's cancellation, when the
    caller gave up while a leased run went on."""
    maybe = fn if eff.which == "tool" else op.probe
    assert maybe is not None
    f: Callable[[], Any] = maybe

    async def call() -> Any:
        v = f()
        if asyncio.iscoroutine(v) or isinstance(v, asyncio.Future):
            v = await v
        return v

    if eff.fence is None and eff.until is None:
        try:
            return _Ran(value=await call()), None
        except Exception as e:
            return _Ran(error=e), None
    if eff.fence is None:
        # A probe within what is left of the deadline: cancelled there, and awaited.
        probe = asyncio.ensure_future(call())
        probe.add_done_callback(_retrieved)
        try:
            await asyncio.wait((probe,), timeout=eff.until)
        finally:
            # The caller's cancellation goes on once the probe has ended (as it would
            # have, awaited in place); a second one is not waited out.
            if not probe.done():
                probe.cancel()
                await asyncio.wait((probe,))
        ran = _ended(probe, None, eff, op)
        if ran.error is not None and not isinstance(ran.error, Exception):
            raise ran.error  # as the probe awaited in place raised it: not its answer
        return ran, None
    lease = Lease(eff.fence)
    ctx = contextvars.copy_context()
    ctx.run(_lease.set, lease)
    # The tool's task runs in a context that holds its lease (current_lease()).
    tool: "asyncio.Task[Any]"
    if _HAS_TASK_CONTEXT:
        tool = asyncio.get_running_loop().create_task(call(), context=ctx)
    else:  # 3.10: a task copies the context it is created in
        tool = ctx.run(lambda: asyncio.ensure_future(call()))
    hb = asyncio.ensure_future(_heartbeat_task(client, op, lease, tool, eff.lease_from))
    # The heartbeat lasts exactly as long as the tool's task, whoever still awaits it:
    # not less when the caller gives up (a tool that goes on when cancelled would lose
    # the key to a worker that recovers it and runs it again), not more when it raises.
    tool.add_done_callback(lambda _: hb.cancel())
    tool.add_done_callback(_retrieved)
    hb.add_done_callback(_retrieved)
    cancelled: Optional[asyncio.CancelledError] = None
    try:
        try:
            # A probe is cut at the deadline (until), as a Go probe's context is.
            await asyncio.wait((tool,), timeout=eff.until)
            if not tool.done():
                tool.cancel()
                await asyncio.wait((tool,))
        except asyncio.CancelledError as e:
            # The caller gave up: the tool is asked to stop too, and awaited under its
            # lease; what it did is stored before the cancellation goes on (the Go Do
            # returns once the tool has). A second cancellation is not waited out.
            cancelled = e
            tool.cancel()
            await asyncio.wait((tool,))
    finally:
        if tool.done():
            hb.cancel()
            await asyncio.wait((hb,))
    ran = _ended(tool, lease, eff, op, cancelled)
    ran.lost = lease.error
    ran.renewed = lease.renewed
    return ran, cancelled


def _ended(task: "asyncio.Task[Any]", lease: Optional[Lease], eff: _Run, op: Op,
           cancelled: Optional[asyncio.CancelledError] = None) -> _Ran:
    """What a run's ended task did."""
    if task.cancelled():
        if lease is not None and lease.error is not None:
            # Stopped by the heartbeat: the lease went to a newer attempt.
            return _Ran()
        if lease is not None and lease.expiring and cancelled is None:
            # Stopped by the heartbeat: the lease was running out unrenewed.
            return _Ran(error=LeaseExpired(
                f"idemkv: lease on {op.key!r} running out without a renewal; the {eff.which} was cancelled"))
        if eff.until is not None and cancelled is None:
            # Stopped at the deadline (a probe's): it could not tell.
            return _Ran(error=_DeadlinePassed(
                f"idemkv: the deadline ({op.deadline:g}s) of {op.key!r} passed while the {eff.which} ran; "
                f"it was cancelled"))
        # Stopped by the caller's cancellation: whether its effect happened is unknown.
        return _Ran(error=asyncio.CancelledError())
    err = task.exception()
    if err is not None:
        return _Ran(error=err)
    return _Ran(value=task.result())


async def _store(client: Any, eff: _Send) -> tuple[Any, Optional[BaseException], Optional[asyncio.CancelledError]]:
    """Sends a call that stores what the tool did (eff.grace is set). A caller that gives
    up meanwhile does not cut it short, as a Go context does not cut a commit: it goes
    on for up to eff.grace from its start, and the cancellation is handed back, to go
    on once the loop has settled what it could. A second cancellation is not waited out.
    Returns the answer, or the error to throw into the loop, and that cancellation."""
    assert eff.grace is not None
    start = time.monotonic()
    send = asyncio.ensure_future(client._send(eff.call, bound=eff.bound, connect_wait=eff.connect_wait,
                                              once=eff.once))
    send.add_done_callback(_retrieved)
    cancelled: Optional[asyncio.CancelledError] = None
    try:
        await asyncio.wait((send,))
    except asyncio.CancelledError as e:
        cancelled = e
        try:
            left = eff.grace - (time.monotonic() - start)
            if left > 0:
                await asyncio.wait((send,), timeout=left)
        finally:
            if not send.done():
                send.cancel()
        if not send.done():
            await asyncio.wait((send,))
    if send.cancelled():
        return None, StoreUnavailableError(
            f"idemkv: {eff.call.method} {eff.call.route}: not done within commit_grace ({eff.grace:g}s) after the "
            "caller gave up"), cancelled
    if send.exception() is not None:
        return None, send.exception(), cancelled
    return send.result()[0], None, cancelled


def _retrieved(t: "asyncio.Future[Any]") -> None:
    """Marks a task's error as seen (a caller cancelled twice no longer awaits the tool)."""
    if not t.cancelled():
        t.exception()


_HAS_TASK_CONTEXT = sys.version_info >= (3, 11)


async def run_async(client: Any, op: Op, fn: Callable[[], Awaitable[Any]]) -> Outcome:
    """run_sync for coroutine functions: the heartbeat is a task, and a lost lease
    cancels the tool's task."""
    span = _start_span(client, op)
    out: Optional[Outcome] = None
    try:
        if op.side_effect == READ_ONLY:
            try:
                v = fn()
                if asyncio.iscoroutine(v):
                    v = await v
            except Exception as e:
                raise NotExecutedError(f"idemkv: read-only tool for {op.key!r} failed: {e!r}", cause=e) from e
            out = Outcome(decision="execute", receipt={}, value=v)
            return out
        fp = _fingerprint_of(op)
        span.set_attributes({_otel.FINGERPRINT: fp})
        loop = _Loop(op, fp, span)
        gen = loop.main()
        send: Any = None
        throw: Optional[BaseException] = None
        # The caller's cancellation while the tool ran on, or while what it did was
        # being stored: it goes on once the loop has stored what the tool did (within
        # commit_grace), with the loop's error, if any, as its cause.
        cancelled: Optional[asyncio.CancelledError] = None
        while True:
            try:
                eff = gen.throw(throw) if throw is not None else gen.send(send)
            except StopIteration as stop:
                result: Outcome = stop.value
                break
            except Exception as e:
                if cancelled is None:
                    raise
                raise cancelled from e
            send, throw = None, None
            try:
                gave_up: Optional[asyncio.CancelledError] = None
                if isinstance(eff, _Send) and eff.grace is not None and cancelled is None:
                    send, throw, gave_up = await _store(client, eff)
                elif isinstance(eff, _Send):
                    send = (await client._send(eff.call, bound=eff.bound, connect_wait=eff.connect_wait,
                                               once=eff.once))[0]
                elif isinstance(eff, _Sleep):
                    await asyncio.sleep(eff.seconds)
                else:
                    send, gave_up = await _run_async(client, op, fn, eff)
                if gave_up is not None and cancelled is None:
                    # What is still to store is bounded by commit_grace from here on.
                    cancelled, loop.gave_up = gave_up, True
            except BaseException as e:
                # A cancellation too: the loop says what it cut short, and lets it go on.
                throw = e
        if cancelled is not None:
            raise cancelled
        out = result
        return out
    except BaseException as e:
        _finish_span(span, None, e)
        raise
    finally:
        if out is not None:
            _finish_span(span, out, None)
