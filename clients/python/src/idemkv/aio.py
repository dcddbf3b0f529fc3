"""The asyncio client: the same calls as :class:`~idemkv.Client`, awaited.

The standard library has no asyncio HTTP client, so this module speaks the little
HTTP/1.1 idemkv needs (JSON bodies, Content-Length or chunked answers, keep-alive)
over asyncio streams. Cancelling a call cancels its request at once.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, ParamSpec, TypeVar
from urllib.parse import urlsplit

from . import _core, _otel
from ._context import operation as _operation
from ._core import Call, Config
from .errors import APIError, StoreUnavailableError

__all__ = ["AsyncClient"]

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")

# Bounds on what a node may send back (_core.MAX_ANSWER_BYTES for the body); this only
# stops a confused peer.
_MAX_LINE = 64 << 10
_MAX_BODY = _core.MAX_ANSWER_BYTES


class _ProtocolError(Exception):
    """The peer's answer is not HTTP/1.1 as idemkv speaks it."""


_TRANSPORT_ERRORS = (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ssl.SSLError, _ProtocolError,
                     asyncio.LimitOverrunError)


def _cancelling(task: "Optional[asyncio.Task[Any]]") -> int:
    """How many requests to cancel task are pending (Task.cancelling, 3.11+; 0 before)."""
    f = getattr(task, "cancelling", None)
    return int(f()) if f is not None else 0


async def _within(aw: Awaitable[T], timeout: float) -> T:
    """asyncio.wait_for(aw, timeout) without its race before 3.12: a cancellation of the
    caller that comes in the turn of the event loop in which aw ends is raised, where
    wait_for hands back aw's answer or failure instead (3.11 still counts the request
    in Task.cancelling(); 3.10 has no such count, and the cancellation was lost: a
    caller that gave up had the tool run). Past timeout, aw is cancelled and awaited,
    and asyncio.TimeoutError raised, as wait_for does."""
    task = asyncio.ensure_future(aw)
    task.add_done_callback(_seen)
    try:
        done, _ = await asyncio.wait((task,), timeout=timeout)
    except BaseException:
        # The caller gave up: aw ends before the cancellation goes on, as in wait_for.
        task.cancel()
        await asyncio.wait((task,))
        raise
    if not done:
        task.cancel()
        await asyncio.wait((task,))
        if task.cancelled():
            raise asyncio.TimeoutError()
    return task.result()


def _seen(t: "asyncio.Future[Any]") -> None:
    """Marks a task's error as retrieved (its caller may have stopped awaiting it)."""
    if not t.cancelled():
        t.exception()


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:  # closing a transport whose loop is gone
            pass


class _Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes, keep: bool) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.keep = keep


async def _read_line(r: asyncio.StreamReader) -> bytes:
    line = await r.readuntil(b"\n")
    if len(line) > _MAX_LINE:
        raise _ProtocolError("header line too long")
    return line.rstrip(b"\r\n")


async def _exchange(conn: _Conn, host: str, call: Call, body: Optional[bytes], hdrs: dict[str, str],
                    sent: _core.Sent) -> _Answer:
    lines = [f"{call.method} {call.target()} HTTP/1.1", f"Host: {host}", "Connection: keep-alive"]
    lines += [f"{k}: {v}" for k, v in hdrs.items()]
    lines.append(f"Content-Length: {len(body) if body is not None else 0}")
    conn.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
    await conn.writer.drain()
    # Written whole: from here on a write may have been applied, answer or not. (On a
    # reused connection too: the server may have taken it before closing.)
    sent.written = True

    r = conn.reader
    status_line = (await _read_line(r)).decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise _ProtocolError(f"bad status line {status_line!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    while True:
        line = await _read_line(r)
        if not line:
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    keep = parts[0] == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks = []
        size = 0
        while True:
            n = int((await _read_line(r)).split(b";")[0], 16)
            if n == 0:
                while await _read_line(r):  # trailers
                    pass
                break
            size += n
            if size > _MAX_BODY:
                raise _ProtocolError("answer too large")
            chunks.append(await r.readexactly(n))
            await r.readexactly(2)
        data = b"".join(chunks)
    elif "content-length" in headers:
        n = int(headers["content-length"])
        if n > _MAX_BODY:
            raise _ProtocolError("answer too large")
        data = await r.readexactly(n)
    else:
        data = await r.read(_MAX_BODY)
        keep = False
    return _Answer(status, headers, data, keep)


class _Pool:
    """Idle keep-alive connections per base URL, for one event loop."""

    def __init__(self, ctx: Optional[ssl.SSLContext]) -> None:
        self._ctx = ctx
        self._idle: dict[str, list[_Conn]] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def get(self, base: str) -> Optional[_Conn]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # Connections belong to the loop that opened them (asyncio.run twice).
            self._idle, self._loop = {}, loop
        conns = self._idle.get(base)
        return conns.pop() if conns else None

    async def new(self, base: str) -> _Conn:
        u = urlsplit(base)
        https = u.scheme == "https"
        port = u.port or (443 if https else 80)
        ctx = (self._ctx or ssl.create_default_context()) if https else None
        reader, writer = await asyncio.open_connection(
            u.hostname, port, ssl=ctx, server_hostname=u.hostname if https else None, limit=_MAX_LINE * 2
        )
        return _Conn(reader, writer)

    def put(self, base: str, c: _Conn) -> None:
        conns = self._idle.setdefault(base, [])
        if len(conns) < 16:
            conns.append(c)
        else:
            c.close()

    def close(self) -> None:
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for c in conns:
                c.close()


class AsyncClient:
    """The asyncio twin of :class:`~idemkv.Client`: same options, same answers, every
    call awaited. Use it from one event loop at a time."""

    def __init__(self, endpoints: Any = None, *, config: Optional[Config] = None, **kw: Any) -> None:
        self.config = _core.config_from(config, endpoints, kw)
        self._router = _core.Router(self.config)
        self._pool = _Pool(self.config.make_ssl_context())
        self._tracer = _otel.tracer(self.config.tracer_provider)

    async def close(self) -> None:
        self._pool.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def leader(self) -> str:
        return self._router.leader

    def aio(self) -> "AsyncClient":
        return self

    async def _attempt(self, base: str, call: Call, body: Optional[bytes], sent: _core.Sent) -> Any:
        hdrs = _core.headers(self.config, body, _otel.inject())
        host = urlsplit(base).netloc
        conn = self._pool.get(base)
        if conn is not None:
            try:
                ans = await _exchange(conn, host, call, body, hdrs, sent)
            except _TRANSPORT_ERRORS:
                # An idle connection the server had closed: try once on a new one.
                conn.close()
                conn = None
            except BaseException:
                conn.close()  # cancelled mid-exchange: not reusable
                raise
        if conn is None:
            conn = await self._pool.new(base)
            try:
                ans = await _exchange(conn, host, call, body, hdrs, sent)
            except BaseException:
                conn.close()
                raise
        self._router.saw_leader(ans.headers.get(_core.HEADER_LEADER.lower(), ""))
        if ans.keep:
            self._pool.put(base, conn)
        else:
            conn.close()
        return _core.read_answer(ans.status, ans.body, call.method)

    async def _send(self, call: Call, bound: Optional[float] = None,
                    connect_wait: Optional[float] = None, once: bool = False) -> tuple[Any, bool]:
        cfg = self.config
        body = call.encoded_body()
        wait_for = bound or cfg.store_wait
        # The bound counts the store's time only: failed attempts and the pauses
        # between them, not a long-poll's own wait (the Go client counts alike).
        used = 0.0
        retried = False
        # connect_wait, when given, bounds the time while no endpoint even accepts a
        # connection: nobody listens, and waiting out store_wait would not help.
        only_refused = True
        # The caller's cancellation may come in the turn of the event loop in which the
        # attempt ends; asyncio.wait_for (3.10, 3.11) then hands back its answer or its
        # failure, which _within does not. Should anything else swallow it, the request
        # to cancel the task is still counted (3.11+), and ends the call (a reserve's
        # answer too: it may hold the key, and the loop names the attempt).
        task = asyncio.current_task()
        cancels = _cancelling(task)
        # An attempt that may have been applied (outcome_unknown): the call's error
        # says so even if a later attempt reached nobody.
        unknown: Optional[APIError] = None
        n = 0
        while True:
            n += 1
            base = self._router.target()
            timeout = max(min(cfg.timeout, wait_for - used), 0.05) + call.wait
            start = time.monotonic()
            sent = _core.Sent()
            try:
                answer = await _within(self._attempt(base, call, body, sent), timeout)
                if _cancelling(task) > cancels:
                    raise asyncio.CancelledError()
                return answer, retried
            except APIError as e:
                if e.code not in _core.RETRY_CODES:
                    e.retried = retried  # type: ignore[attr-defined]
                    raise
                last = e
                only_refused = False
                unreached = False
            except _TRANSPORT_ERRORS as e:
                # A timeout too: _within cancelled the attempt, which may have sent.
                last = _core.lost_answer(call, base, e, sent)
                only_refused = only_refused and _core.refused(e)
                unreached = True
            if last.code == "outcome_unknown" and call.method != "GET":
                unknown = last
            if _cancelling(task) > cancels:
                raise asyncio.CancelledError() from last
            used += max(time.monotonic() - start - call.wait, 0.0)
            retried = True
            # An answer (idemkv's error, a proxy's page) says the address is
            # reachable; only one that gave none is not followed again for a while.
            self._router.demote(base, unreached)
            if once:
                raise last
            left = wait_for - used
            if connect_wait is not None and only_refused:
                if used >= connect_wait:
                    raise _core.nobody_listens(call, n, used, last)
                left = min(left, connect_wait - used)
            if left <= 0:
                raise _core.store_wait_spent(call, wait_for, n, last, unknown)
            # The last pause ends at the bound, and one more attempt is made there.
            pause = min(_core.backoff(n, cfg.backoff_min, cfg.backoff_max), left)
            await asyncio.sleep(pause)
            used += pause

    async def _call(self, call: Call) -> Any:
        """A low-level call: the answer, or its error (APIError outcome_unknown when an
        attempt may have been applied and the bound ran out)."""
        try:
            return (await self._send(call))[0]
        except StoreUnavailableError as e:
            err = _core.low_level_error(e)
            if err is e:
                raise
            raise err from err.__cause__

    async def reserve(self, tenant: str, key: str, tool: str, **kw: Any) -> dict[str, Any]:
        return await self._call(_core.reserve_call(tenant, key, tool, **kw))  # type: ignore[no-any-return]

    async def commit(self, tenant: str, key: str, fingerprint: str, fence: int, remote_system: str, remote_id: str,
                     remote_url: Optional[str] = None, result: Any = None) -> dict[str, Any]:
        c = _core.commit_call(tenant, key, fingerprint, fence, remote_system, remote_id, remote_url, result)
        return await self._call(c)  # type: ignore[no-any-return]

    async def fail(self, tenant: str, key: str, fingerprint: str, fence: int, code: str, message: str,
                   details: Any = None) -> dict[str, Any]:
        return await self._call(_core.fail_call(tenant, key, fingerprint, fence, code, message, details))  # type: ignore[no-any-return]

    async def release(self, tenant: str, key: str, fingerprint: str, fence: int) -> dict[str, Any]:
        try:
            return await self._call(_core.release_call(tenant, key, fingerprint, fence))  # type: ignore[no-any-return]
        except APIError as e:
            if e.code == "not_found" and getattr(e, "retried", False):
                return {"released": True}
            raise

    async def heartbeat(self, tenant: str, key: str, fence: int, lease_ttl: Optional[float] = None) -> dict[str, Any]:
        return await self._call(_core.heartbeat_call(tenant, key, fence, lease_ttl))  # type: ignore[no-any-return]

    async def doubt(self, tenant: str, key: str, fingerprint: str, fence: int) -> dict[str, Any]:
        return await self._call(_core.doubt_call(tenant, key, fingerprint, fence))  # type: ignore[no-any-return]

    async def resolve(self, tenant: str, key: str, fingerprint: str, outcome: str, **kw: Any) -> dict[str, Any]:
        return await self._call(_core.resolve_call(tenant, key, fingerprint, outcome, **kw))  # type: ignore[no-any-return]

    async def get(self, tenant: str, key: str, wait: Optional[float] = None,
                  consistency: Optional[str] = None, history: bool = False) -> Optional[dict[str, Any]]:
        try:
            return await self._call(_core.get_call(tenant, key, wait, consistency, history))  # type: ignore[no-any-return]
        except APIError as e:
            if e.code == "not_found":
                return None
            raise

    async def released(self, tenant: str, key: str, consistency: Optional[str] = None) -> Optional[dict[str, Any]]:
        """What is left of a key whose record was released or resolved not executed: its
        tombstone (tool, fingerprint, released_at, expires_at, history), or None when the
        key holds a record or nothing is left of it."""
        try:
            await self._call(_core.get_call(tenant, key, None, consistency, True))
        except APIError as e:
            if e.code == "not_found":
                t = e.details.get("released")
                return t if isinstance(t, dict) else None
            raise
        return None

    async def list(self, tenant: str, **kw: Any) -> dict[str, Any]:
        return await self._call(_core.list_call(tenant, **kw))  # type: ignore[no-any-return]

    async def cluster(self) -> dict[str, Any]:
        return await self._call(_core.cluster_call())  # type: ignore[no-any-return]

    # Approvals: see the sync Client's calls of the same names.

    async def approvals(self, tenant: str, limit: Optional[int] = None, after: Optional[str] = None,
                        consistency: Optional[str] = None) -> dict[str, Any]:
        return await self._call(_core.approvals_call(tenant, limit, after, consistency))  # type: ignore[no-any-return]

    async def iter_approvals(self, tenant: str, page_size: Optional[int] = None) -> AsyncIterator[dict[str, Any]]:
        after: Optional[str] = None
        while True:
            page = await self.approvals(tenant, limit=page_size, after=after)
            for rec in page.get("approvals") or []:
                yield rec
            after = page.get("next")
            if not after:
                return

    async def decide_approval(self, tenant: str, key: str, *, approval_id: str, fingerprint: str, decision: str,
                              approver: str, reason: Optional[str] = None) -> dict[str, Any]:
        call = _core.decide_approval_call(tenant, key, approval_id, fingerprint, decision, approver, reason)
        try:
            return await self._call(call)  # type: ignore[no-any-return]
        except APIError as e:
            if e.code == "not_pending" and getattr(e, "retried", False):
                # A retry met a decision: this call's own, whose answer was lost? A read
                # that fails leaves the not_pending as it is, as in the Go client (the
                # store's error would say the decision certainly was not taken).
                try:
                    rec = await self.get(tenant, key)
                except (APIError, StoreUnavailableError):
                    rec = None
                if _core.decided_as(rec, call):
                    return rec  # type: ignore[return-value]
            raise _core.decision_error(e) from e.__cause__

    async def approve(self, tenant: str, key: str, *, approval_id: str, fingerprint: str, approver: str,
                      reason: Optional[str] = None) -> dict[str, Any]:
        return await self.decide_approval(tenant, key, approval_id=approval_id, fingerprint=fingerprint,
                                          decision="approve", approver=approver, reason=reason)

    async def deny(self, tenant: str, key: str, *, approval_id: str, fingerprint: str, approver: str,
                   reason: Optional[str] = None) -> dict[str, Any]:
        return await self.decide_approval(tenant, key, approval_id=approval_id, fingerprint=fingerprint,
                                          decision="deny", approver=approver, reason=reason)

    async def set_approval_rule(self, tenant: str, tool: str, ttl: Optional[float] = None,
                                remove: bool = False) -> dict[str, Any]:
        return await self._call(_core.approval_rule_call(tenant, tool, ttl, remove))  # type: ignore[no-any-return]

    async def approval_rules(self, tenant: str) -> dict[str, Any]:
        return await self._call(_core.approval_rules_call(tenant))  # type: ignore[no-any-return]

    async def do(self, fn: Callable[[], Awaitable[Any]], **op: Any) -> Any:
        """The tool-call loop for a coroutine function; see :meth:`Client.do`."""
        from .loop import make_op
        from .runner import run_async

        return await run_async(self, make_op(self.config, **op), fn)

    def idempotent(self, **options: Any) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """``@client.idempotent(key=..., effect=..., tool=..., side_effect=..., probe=...)``;
        the options are idemkv.idempotent's and are checked here, when it is applied."""
        from .decorator import idempotent

        wrap: Callable[[Callable[P, R]], Callable[P, R]] = idempotent(client=self, **options)
        return wrap

    # with client.operation("run_9:approval_17"): the key of the block's tool calls.
    operation = staticmethod(_operation)
