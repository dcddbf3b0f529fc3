"""The sync client: low-level calls for every endpoint, and the tool-call loop."""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from typing import Any, Callable, Iterator, Optional, ParamSpec, TypeVar
from urllib.parse import urlsplit

from . import _core
from ._context import operation as _operation
from ._core import Call, Config
from .errors import APIError, StoreUnavailableError
from . import _otel

__all__ = ["Client"]

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")

# Errors of one attempt after which the request is safe to send again: nothing came
# back, so it may or may not have been applied, and every idemkv request is safe to
# repeat (a reserve carries its attempt id).
_TRANSPORT_ERRORS = (OSError, http.client.HTTPException, ssl.SSLError)

RETRY_CODES = _core.RETRY_CODES


def _callers(e: BaseException, start: float, timeout: float) -> bool:
    """Whether e, raised in an attempt begun at start whose socket timeout is timeout,
    is the caller's own timeout (a TimeoutError its signal handler raised) rather than a
    transport error to retry. A socket times out only once its timeout has passed, with
    no errno; a TimeoutError any sooner was raised by someone else, and ends the call as
    an interrupt does."""
    return isinstance(e, TimeoutError) and e.errno is None and time.monotonic() - start < timeout


def _exchange(
    conn: http.client.HTTPConnection, call: Call, body: Optional[bytes], hdrs: dict[str, str], sent: _core.Sent
) -> tuple[http.client.HTTPResponse, bytes]:
    conn.request(call.method, call.target(), body=body, headers=hdrs)
    # Written whole: from here on a write may have been applied, answer or not. (On a
    # reused connection too: the server may have taken it before closing.)
    sent.written = True
    resp = conn.getresponse()
    data = resp.read(_core.MAX_ANSWER_BYTES + 1)
    if len(data) > _core.MAX_ANSWER_BYTES:
        # An answer cut short, as far as the caller can tell (the async client's bound).
        raise http.client.HTTPException(f"the answer is larger than {_core.MAX_ANSWER_BYTES} bytes")
    return resp, data


class _Pool:
    """Idle keep-alive connections per base URL."""

    def __init__(self, ctx: Optional[ssl.SSLContext]) -> None:
        self._ctx = ctx
        self._lock = threading.Lock()
        self._idle: dict[str, list[http.client.HTTPConnection]] = {}

    def get(self, base: str, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            conns = self._idle.get(base)
            if conns:
                c = conns.pop()
                c.timeout = timeout
                if c.sock is not None:
                    c.sock.settimeout(timeout)
                return c, True
        return self.new(base, timeout), False

    def new(self, base: str, timeout: float) -> http.client.HTTPConnection:
        u = urlsplit(base)
        if u.scheme == "https":
            return http.client.HTTPSConnection(u.netloc, timeout=timeout, context=self._ctx)
        return http.client.HTTPConnection(u.netloc, timeout=timeout)

    def put(self, base: str, c: http.client.HTTPConnection) -> None:
        with self._lock:
            conns = self._idle.setdefault(base, [])
            if len(conns) < 16:
                conns.append(c)
                return
        c.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for c in conns:
                c.close()


class Client:
    """A client of an idemkv cluster. Safe for use from many threads.

    ``Client("10.0.0.1:7420", token=..., ca_file=...)`` or ``Client(config=Config(...))``;
    see :class:`Config` for every option. Low-level calls return the server's JSON
    answers as dicts; errors are :class:`APIError` (a wire code; ``outcome_unknown`` for a
    write sent whose answer never came back within ``store_wait``: it may have been
    applied) or :class:`StoreUnavailableError` (no node answered within ``store_wait``: not
    applied).
    """

    def __init__(self, endpoints: Any = None, *, config: Optional[Config] = None, **kw: Any) -> None:
        self.config = _core.config_from(config, endpoints, kw)
        self._router = _core.Router(self.config)
        self._pool = _Pool(self.config.make_ssl_context())
        self._tracer = _otel.tracer(self.config.tracer_provider)
        self._aio: Any = None

    def close(self) -> None:
        self._pool.close()

    def __del__(self) -> None:
        try:
            self._pool.close()
        except Exception:  # interpreter shutdown
            pass

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def leader(self) -> str:
        """The leader's base URL as last reported, or ""."""
        return self._router.leader

    def aio(self) -> Any:
        """An AsyncClient with this client's configuration (made once)."""
        if self._aio is None:
            from .aio import AsyncClient

            self._aio = AsyncClient(config=self.config)
        return self._aio

    # Sending.

    def _attempt(self, base: str, call: Call, body: Optional[bytes], timeout: float, sent: _core.Sent) -> Any:
        hdrs = _core.headers(self.config, body, _otel.inject())
        start = time.monotonic()
        conn, reused = self._pool.get(base, timeout)
        try:
            resp, data = _exchange(conn, call, body, hdrs, sent)
        except _TRANSPORT_ERRORS as e:
            conn.close()
            if not reused or _callers(e, start, timeout) or isinstance(e, TimeoutError):
                # A timeout is no idle connection the server had closed (that fails at
                # once): the attempt spent its whole timeout, and another one on a new
                # connection would double the bound the caller set (a heartbeat's,
                # which must end in time to tell the tool before its lease runs out).
                raise
            # An idle connection the server had closed: try once on a new one before
            # counting this as a failed attempt.
            conn = self._pool.new(base, timeout)
            try:
                resp, data = _exchange(conn, call, body, hdrs, sent)
            except BaseException:
                conn.close()
                raise
        except BaseException:
            conn.close()  # interrupted mid-exchange: not reusable
            raise
        self._router.saw_leader(resp.getheader(_core.HEADER_LEADER) or "")
        if resp.will_close:
            conn.close()
        else:
            self._pool.put(base, conn)
        return _core.read_answer(resp.status, data, call.method)

    def _send(self, call: Call, bound: Optional[float] = None,
              connect_wait: Optional[float] = None, once: bool = False) -> tuple[Any, bool]:
        """Sends call, retrying on another node after answers that leave it safe to
        repeat, until it succeeds or store_wait (plus a long-poll's wait) runs out.
        Returns the answer and whether an earlier attempt may have reached a node.
        once: one attempt, whose failure, even one safe to repeat, is raised (an
        APIError), for a caller that backs off itself."""
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
                return self._attempt(base, call, body, timeout, sent), retried
            except APIError as e:
                if e.code not in RETRY_CODES:
                    e.retried = retried  # type: ignore[attr-defined]
                    raise
                last = e
                only_refused = False
                unreached = False
            except _TRANSPORT_ERRORS as e:
                if _callers(e, start, timeout):
                    raise
                last = _core.lost_answer(call, base, e, sent)
                only_refused = only_refused and _core.refused(e)
                unreached = True
            if last.code == "outcome_unknown" and call.method != "GET":
                unknown = last
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
            time.sleep(pause)
            used += pause

    def _call(self, call: Call) -> Any:
        """A low-level call: the answer, or its error (APIError outcome_unknown when an
        attempt may have been applied and the bound ran out)."""
        try:
            return self._send(call)[0]
        except StoreUnavailableError as e:
            err = _core.low_level_error(e)
            if err is e:
                raise
            raise err from err.__cause__

    # Low-level calls: the server's answers as dicts (docs/protocol.md, "HTTP API").

    def reserve(self, tenant: str, key: str, tool: str, **kw: Any) -> dict[str, Any]:
        """Asks for the right to run an effect. Give ``fingerprint=`` or ``effect=``
        (the server fingerprints it); also ``actor``, ``attempt_id``, ``lease_ttl``,
        ``ttl`` (seconds), ``expires_at``. Answer: ``{decision, fence?, record, ...}``."""
        return self._call(_core.reserve_call(tenant, key, tool, **kw))  # type: ignore[no-any-return]

    def commit(self, tenant: str, key: str, fingerprint: str, fence: int, remote_system: str, remote_id: str,
               remote_url: Optional[str] = None, result: Any = None) -> dict[str, Any]:
        """Stores the receipt of the attempt holding fence; answer: the receipt."""
        c = _core.commit_call(tenant, key, fingerprint, fence, remote_system, remote_id, remote_url, result)
        return self._call(c)  # type: ignore[no-any-return]

    def fail(self, tenant: str, key: str, fingerprint: str, fence: int, code: str, message: str,
             details: Any = None) -> dict[str, Any]:
        """Stores a permanent failure; answer: the record."""
        return self._call(_core.fail_call(tenant, key, fingerprint, fence, code, message, details))  # type: ignore[no-any-return]

    def release(self, tenant: str, key: str, fingerprint: str, fence: int) -> dict[str, Any]:
        """Gives the key back. A not_found after an earlier attempt of this call may
        have landed is that attempt's doing, and reads as released."""
        try:
            return self._call(_core.release_call(tenant, key, fingerprint, fence))  # type: ignore[no-any-return]
        except APIError as e:
            if e.code == "not_found" and getattr(e, "retried", False):
                return {"released": True}
            raise

    def heartbeat(self, tenant: str, key: str, fence: int, lease_ttl: Optional[float] = None) -> dict[str, Any]:
        """Extends the lease of the attempt holding fence; answer: the record."""
        return self._call(_core.heartbeat_call(tenant, key, fence, lease_ttl))  # type: ignore[no-any-return]

    def doubt(self, tenant: str, key: str, fingerprint: str, fence: int) -> dict[str, Any]:
        """Marks the pending record this fence holds as in doubt; answer: the record."""
        return self._call(_core.doubt_call(tenant, key, fingerprint, fence))  # type: ignore[no-any-return]

    def resolve(self, tenant: str, key: str, fingerprint: str, outcome: str, **kw: Any) -> dict[str, Any]:
        """Settles an in-doubt record without a fence: outcome "committed" (with
        remote_system, remote_id, remote_url?, result?) or "not_executed"."""
        return self._call(_core.resolve_call(tenant, key, fingerprint, outcome, **kw))  # type: ignore[no-any-return]

    def get(self, tenant: str, key: str, wait: Optional[float] = None,
            consistency: Optional[str] = None, history: bool = False) -> Optional[dict[str, Any]]:
        """The record, or None when absent. With wait (seconds) it long-polls until the
        record is not pending; with history it includes the record's last events."""
        try:
            return self._call(_core.get_call(tenant, key, wait, consistency, history))  # type: ignore[no-any-return]
        except APIError as e:
            if e.code == "not_found":
                return None
            raise

    def released(self, tenant: str, key: str, consistency: Optional[str] = None) -> Optional[dict[str, Any]]:
        """What is left of a key whose record was released or resolved not executed: its
        tombstone (tool, fingerprint, released_at, expires_at, history), or None when the
        key holds a record or nothing is left of it."""
        try:
            self._call(_core.get_call(tenant, key, None, consistency, True))
        except APIError as e:
            if e.code == "not_found":
                t = e.details.get("released")
                return t if isinstance(t, dict) else None
            raise
        return None

    def list(self, tenant: str, **kw: Any) -> dict[str, Any]:
        """One page of a tenant's records: prefix, status, limit, after, in_doubt."""
        return self._call(_core.list_call(tenant, **kw))  # type: ignore[no-any-return]

    def cluster(self) -> dict[str, Any]:
        """The cluster as the answering node sees it."""
        return self._call(_core.cluster_call())  # type: ignore[no-any-return]

    # Approvals (docs/protocol.md section 7): what waits, and the approver's decision.

    def approvals(self, tenant: str, limit: Optional[int] = None, after: Optional[str] = None,
                  consistency: Optional[str] = None) -> dict[str, Any]:
        """One page of a tenant's waiting approvals, oldest first: ``{"approvals":
        [record...], "next"?}``, each record with its ``approval`` (id, summary,
        requested_at, expires_at), ``tool``, ``effect`` and ``effect_fingerprint``. Pass
        ``next`` as ``after`` for the next page."""
        return self._call(_core.approvals_call(tenant, limit, after, consistency))  # type: ignore[no-any-return]

    def iter_approvals(self, tenant: str, page_size: Optional[int] = None) -> Iterator[dict[str, Any]]:
        """Every waiting approval of the tenant, oldest first, a page at a time."""
        after: Optional[str] = None
        while True:
            page = self.approvals(tenant, limit=page_size, after=after)
            yield from page.get("approvals") or []
            after = page.get("next")
            if not after:
                return

    def decide_approval(self, tenant: str, key: str, *, approval_id: str, fingerprint: str, decision: str,
                        approver: str, reason: Optional[str] = None) -> dict[str, Any]:
        """Approves (``decision="approve"``) or denies (``"deny"``) the request the key
        waits for; needs an approver (or admin) token. approval_id and fingerprint are
        what the approver saw. Answer: the record. Raises
        :class:`~idemkv.ApprovalNotPendingError` when the request was decided, consumed
        or lapsed, :class:`~idemkv.ApprovalMismatchError` for another request or effect."""
        call = _core.decide_approval_call(tenant, key, approval_id, fingerprint, decision, approver, reason)
        try:
            return self._call(call)  # type: ignore[no-any-return]
        except APIError as e:
            if e.code == "not_pending" and getattr(e, "retried", False):
                # A retry met a decision: this call's own, whose answer was lost? A read
                # that fails leaves the not_pending as it is, as in the Go client (the
                # store's error would say the decision certainly was not taken).
                try:
                    rec = self.get(tenant, key)
                except (APIError, StoreUnavailableError):
                    rec = None
                if _core.decided_as(rec, call):
                    return rec  # type: ignore[return-value]
            raise _core.decision_error(e) from e.__cause__

    def approve(self, tenant: str, key: str, *, approval_id: str, fingerprint: str, approver: str,
                reason: Optional[str] = None) -> dict[str, Any]:
        """decide_approval(..., decision="approve")."""
        return self.decide_approval(tenant, key, approval_id=approval_id, fingerprint=fingerprint, decision="approve",
                                    approver=approver, reason=reason)

    def deny(self, tenant: str, key: str, *, approval_id: str, fingerprint: str, approver: str,
             reason: Optional[str] = None) -> dict[str, Any]:
        """decide_approval(..., decision="deny"): every retry of the key replays the denial."""
        return self.decide_approval(tenant, key, approval_id=approval_id, fingerprint=fingerprint, decision="deny",
                                    approver=approver, reason=reason)

    def set_approval_rule(self, tenant: str, tool: str, ttl: Optional[float] = None,
                          remove: bool = False) -> dict[str, Any]:
        """Makes every reserve of the tenant's tool require approval (admin token); ttl
        in seconds. Answer: ``{"rules": [...]}``, the tenant's rules."""
        return self._call(_core.approval_rule_call(tenant, tool, ttl, remove))  # type: ignore[no-any-return]

    def approval_rules(self, tenant: str) -> dict[str, Any]:
        """The tenant's approval rules: ``{"rules": [{tenant, tool, ttl_ms}...]}``."""
        return self._call(_core.approval_rules_call(tenant))  # type: ignore[no-any-return]

    # The tool-call loop.

    def do(self, fn: Callable[[], Any], **op: Any) -> Any:
        """Runs fn at most once for the key, across retries, workers and crashes;
        see :func:`idemkv.loop.run_sync` and :class:`idemkv.Op` for the options."""
        from .loop import make_op
        from .runner import run_sync

        return run_sync(self, make_op(self.config, **op), fn)

    def idempotent(self, **options: Any) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """``@client.idempotent(key=..., effect=..., tool=..., side_effect=..., probe=...)``;
        the options are idemkv.idempotent's and are checked here, when it is applied."""
        from .decorator import idempotent

        wrap: Callable[[Callable[P, R]], Callable[P, R]] = idempotent(client=self, **options)
        return wrap

    # with client.operation("run_9:approval_17"): the key of the block's tool calls.
    operation = staticmethod(_operation)
