"""What the sync and the async client share: configuration, routing to the leader,
the wire form of each call, and the reading of answers. No I/O happens here."""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import random
import secrets
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional
from urllib.parse import quote, urlencode, urlsplit

from .errors import APIError

__all__ = ["Config", "HEADER_LEADER", "new_attempt_id", "refused"]

# The answer header that names the leader's API address (docs/protocol.md).
HEADER_LEADER = "Idemkv-Leader"

# Wire codes worth another attempt: unavailable (certainly not applied),
# outcome_unknown (retry with the same attempt id), resource_exhausted (a cap; later).
RETRY_CODES = frozenset({"unavailable", "outcome_unknown", "resource_exhausted"})

# The server's bound on one long-poll (idemkv.MaxWait): 5 minutes.
MAX_WAIT = 300.0

DEFAULT_ENDPOINT = "127.0.0.1:7420"

# The server's bound on a request body (idemkv.MaxRequestBytes): 1 MiB.
MAX_BODY_BYTES = 1 << 20

# The default of Config.commit_grace, also what a zero there means (the Go client's).
DEFAULT_COMMIT_GRACE = 30.0


@dataclass
class Config:
    """Configuration of :class:`~idemkv.Client` and :class:`~idemkv.AsyncClient`.

    Times are in seconds. Zero or None fields take the defaults shown.
    """

    # API addresses of some or all nodes, "host:port" or "http(s)://host:port". The
    # client goes to the leader any node names, and falls back to these.
    endpoints: list[str] = field(default_factory=lambda: [DEFAULT_ENDPOINT])
    token: Optional[str] = None  # sent as "Authorization: Bearer <token>"
    # TLS: a CA file to trust, a client certificate (and its key) to present. Any of
    # them, or ssl_context, makes endpoints without a scheme use https.
    ca_file: Optional[str] = None
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    ssl_context: Optional[ssl.SSLContext] = None
    # One HTTP attempt (a long-poll gets its wait on top).
    timeout: float = 10.0
    # The bound on the total time of one call across all its retries: past it the call
    # raises StoreUnavailableError (the Go client's Config.StoreWait).
    store_wait: float = 30.0
    # Before a tool runs, the bound on waiting while every endpoint refuses connections
    # (nobody listens: the cluster is down or the address is wrong), so that an
    # interactive agent hears within seconds instead of store_wait. Any answer, such as
    # a 503 during a leader election, means a node is there, and store_wait applies.
    connect_wait: float = 3.0
    # "fail_closed" (default): a tool call whose store is unreachable raises
    # StoreUnavailableError and does not run. "unguarded": read-only and idempotent
    # tools run anyway, without a record (non-idempotent ones still fail closed).
    on_store_unavailable: str = "fail_closed"
    # Jittered exponential backoff between retries.
    backoff_min: float = 0.02
    backoff_max: float = 1.0
    # The tool-call loop: the lease of a call that names none (heartbeat every third
    # of it), the bound of one long-poll while another attempt holds the key, and how
    # long storing what the tool did goes on once the caller has given up (cancelled,
    # or past its deadline=): store_wait bounds it while the caller waits, and the
    # lesser of the two after (the Go client's CommitGrace).
    lease_ttl: float = 30.0
    poll_wait: float = 30.0
    commit_grace: float = DEFAULT_COMMIT_GRACE
    # Defaults of every call that names none.
    tenant: Optional[str] = None
    actor: Optional[str] = None
    # An OpenTelemetry TracerProvider; default: the global one, when the
    # opentelemetry package is importable (nothing is traced otherwise).
    tracer_provider: Any = None

    def validate(self) -> None:
        if not self.endpoints:
            raise ValueError("idemkv: at least one endpoint is needed")
        for ep in self.endpoints:
            base_url(ep, self.tls)
        if self.timeout <= 0 or self.store_wait <= 0 or self.connect_wait <= 0:
            raise ValueError("idemkv: timeout, store_wait and connect_wait must be positive")
        if self.backoff_min < 0 or self.backoff_max < self.backoff_min:
            raise ValueError("idemkv: need 0 <= backoff_min <= backoff_max")
        if self.lease_ttl < 1:
            raise ValueError("idemkv: lease_ttl must be at least 1 second (the server's minimum)")
        if self.poll_wait <= 0 or self.poll_wait > MAX_WAIT:
            raise ValueError(f"idemkv: poll_wait must be in (0, {MAX_WAIT:g}] seconds")
        if self.commit_grace < 0:
            raise ValueError("idemkv: commit_grace must not be negative")
        if self.on_store_unavailable not in ("fail_closed", "unguarded"):
            raise ValueError('idemkv: on_store_unavailable is "fail_closed" or "unguarded"')
        if (self.cert_file is None) != (self.key_file is None) and self.cert_file is None:
            raise ValueError("idemkv: key_file needs cert_file")

    @property
    def tls(self) -> bool:
        return bool(self.ca_file or self.cert_file or self.ssl_context)

    def make_ssl_context(self) -> Optional[ssl.SSLContext]:
        if self.ssl_context is not None:
            return self.ssl_context
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


def config_from(config: Optional[Config], endpoints: Any, kw: Mapping[str, Any]) -> Config:
    if config is not None and (endpoints is not None or kw):
        raise TypeError("idemkv: give a Config or keyword arguments, not both")
    if config is None:
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        if endpoints is None:
            env = os.environ.get("IDEMKV_ENDPOINTS")
            endpoints = env.split(",") if env else [DEFAULT_ENDPOINT]
        config = Config(endpoints=list(endpoints), **kw)
    config.validate()
    return config


def base_url(ep: str, tls: bool) -> str:
    """"host:port" or "http(s)://host:port" as a base URL."""
    if "://" not in ep:
        ep = ("https://" if tls else "http://") + ep
    u = urlsplit(ep)
    if u.scheme not in ("http", "https") or not u.netloc or u.path not in ("", "/") or u.query:
        raise ValueError(f"idemkv: endpoint {ep!r} must be host:port or http(s)://host:port")
    return f"{u.scheme}://{u.netloc}"


def refused(e: BaseException) -> bool:
    """Whether a transport error means nobody listens at the address."""
    if isinstance(e, ConnectionRefusedError) or getattr(e, "errno", None) == errno.ECONNREFUSED:
        return True
    # asyncio's connect to a name with several addresses raises one OSError for all.
    return isinstance(e, OSError) and "Connect call failed" in str(e) and "111" in str(e)


def nobody_listens(call: "Call", n: int, waited: float, last: BaseException) -> Exception:
    from .errors import StoreUnavailableError

    return StoreUnavailableError(
        f"idemkv: {call.method} {call.route}: nobody listens: every endpoint refused the connection for "
        f"{waited:.1f}s ({n} attempts; last: {last}); is idemkv running at the configured endpoints?", cause=last)


def new_attempt_id() -> str:
    """A random attempt id: a reserve retried after a lost answer is the same attempt."""
    return "att_" + secrets.token_hex(12)


def escape_segment(s: str) -> str:
    e = quote(s, safe="")
    # A segment that is "." or ".." would be cleaned away by the server's mux.
    if e.strip(".") == "":
        return "%2E" * len(e)
    return e


def backoff(n: int, lo: float, hi: float) -> float:
    """A full-jitter exponential delay for the n-th retry (n >= 1)."""
    ceil = min(hi, lo * float(1 << min(n - 1, 30)))
    if ceil <= lo:
        return lo
    return lo + random.random() * (ceil - lo)


@dataclass
class Call:
    """One API call, before it is sent."""

    method: str
    route: str  # the pattern, for spans: "/v1/records/{tenant}/{key}"
    path: str  # escaped
    query: dict[str, str] = field(default_factory=dict)
    body: Optional[Mapping[str, Any]] = None
    wait: float = 0.0  # a long-poll's wait, added to the attempt timeout

    def target(self) -> str:
        return self.path + ("?" + urlencode(self.query) if self.query else "")

    def encoded_body(self) -> Optional[bytes]:
        if self.body is None:
            return None
        return json.dumps(self.body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


# Bounds what a node may send back: idemkv answers are small (a record with its result,
# a page of 1000 records); this only stops a confused or hostile peer from making a
# client read until it runs out of memory. A longer answer is an answer cut short.
MAX_ANSWER_BYTES = 64 << 20

# Seconds a leader that gave no answer at all is not followed again (Go's leaderShun).
LEADER_SHUN = 10.0


class Router:
    """Where the next attempt goes: the leader when one is known, else the preferred
    endpoint. A failed target is demoted, so that retries move on."""

    def __init__(self, config: Config) -> None:
        self.endpoints = [base_url(ep, config.tls) for ep in config.endpoints]
        self.scheme = self.endpoints[0].split("://", 1)[0]
        self._lock = threading.Lock()
        self._leader = ""
        self._preferred = 0
        # Leaders that gave no answer at all to an attempt, and until when (monotonic)
        # they are not followed again (the Go client's leaderShun): a node names the
        # leader's advertised address, which a client outside the cluster's network may
        # never reach; followed on every answer, it cost every call a failed attempt.
        self._unreached: dict[str, float] = {}

    @property
    def leader(self) -> str:
        with self._lock:
            return self._leader

    def target(self) -> str:
        with self._lock:
            return self._leader or self.endpoints[self._preferred % len(self.endpoints)]

    def demote(self, base: str, unreached: bool = False) -> None:
        with self._lock:
            if self._leader == base and unreached:
                now = time.monotonic()
                for u in [u for u, until in self._unreached.items() if until <= now]:
                    del self._unreached[u]
                self._unreached[base] = now + LEADER_SHUN
            if self._leader == base:
                self._leader = ""
            if self.endpoints[self._preferred % len(self.endpoints)] == base:
                self._preferred += 1

    def saw_leader(self, api_addr: str) -> None:
        if not api_addr:
            return
        try:
            u = base_url(api_addr if "://" in api_addr else f"{self.scheme}://{api_addr}", self.scheme == "https")
        except ValueError:
            return
        if not u.startswith(self.scheme + "://"):
            # Another scheme than the endpoints' is not followed: from https to http it
            # would send the token and every request in plain text.
            return
        host = urlsplit(u).hostname or ""
        # A node bound to a wildcard address advertises nothing a client can dial.
        try:
            if host == "" or ipaddress.ip_address(host).is_unspecified:
                return
        except ValueError:
            pass  # a name, not an address
        with self._lock:
            if self._unreached.get(u, 0.0) > time.monotonic():
                return
            self._leader = u


def headers(config: Config, body: Optional[bytes], extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    h = {"Accept": "application/json", "User-Agent": "idemkv-python"}
    if body is not None:
        h["Content-Type"] = "application/json"
    if config.token:
        h["Authorization"] = "Bearer " + config.token
    if extra:
        h.update(extra)
    return h


def read_answer(status: int, data: bytes, method: str = "GET") -> Any:
    """The decoded body of a 2xx answer; otherwise raises the APIError it carries."""
    if 200 <= status < 300:
        try:
            return json.loads(data)
        except ValueError as e:
            # A body cut short is a transport failure like any other, after the server
            # answered: a write it answered 2xx took effect.
            code = "unavailable" if method == "GET" else "outcome_unknown"
            raise APIError(code, f"reading the answer: {e}", status=status) from e
    try:
        err = json.loads(data)["error"]
        if isinstance(err, dict) and err.get("code"):
            details = err.get("details")
            raise APIError(str(err["code"]), str(err.get("message", "")), status=status, field=str(err.get("field", "")),
                           details=details if isinstance(details, dict) else None)
    except (ValueError, KeyError, TypeError):
        pass
    # Not idemkv's answer: a proxy in between. Gateways that could not reach a node
    # mean "try another"; anything else is not ours to read. A 502 (the node's answer
    # broke off) or a 504 (no answer in time) may come after the proxy forwarded a
    # write, which may then have been applied (the Go client's decodeError).
    code = "unavailable" if status in (502, 503, 504) else "internal"
    if status in (502, 504) and method != "GET":
        code = "outcome_unknown"
    raise APIError(code, f"HTTP {status}: {data[:200].decode('utf-8', 'replace').strip()}", status=status)


class Sent:
    """Whether an attempt wrote its request whole: a write whose answer then never
    came back may have been applied (the Go client's httptrace WroteRequest)."""

    __slots__ = ("written",)

    def __init__(self) -> None:
        self.written = False


def lost_answer(call: Call, base: str, e: BaseException, sent: Sent) -> APIError:
    """The error of an attempt that got no answer. Every idemkv request is safe to
    repeat, so either way it is tried again; but unavailable says the request certainly
    was not applied (docs/protocol.md section 2), and a write that was sent whole may
    have been: that is outcome_unknown (a denial that took effect was reported as not
    taken)."""
    if sent.written and call.method != "GET":
        err = APIError("outcome_unknown", f"{call.method} {base}: sent, and no answer came back: it may have been "
                                          f"applied: {e!r}")
    else:
        err = APIError("unavailable", f"{call.method} {base}: {e!r}")
    err.__cause__ = e
    return err


def store_wait_spent(call: Call, wait_for: float, n: int, last: APIError,
                     unknown: Optional[APIError]) -> Exception:
    """The error of a call whose every attempt failed, safe to repeat, until its bound:
    StoreUnavailableError, which the tool-call loop turns into its kind by where it
    stands (before the tool ran, or after), as the Go client's Do does. When an attempt
    may have been applied (unknown: sent, and its answer never came back; or the
    server's own outcome_unknown), it carries the error a low-level call raises instead
    (low_level_error)."""
    from .errors import StoreUnavailableError

    what = f"{call.method} {call.route}: no node answered within {wait_for:g}s ({n} attempts; last: {last})"
    err = StoreUnavailableError(f"idemkv: {what}", cause=last)
    if unknown is not None:
        maybe = APIError("outcome_unknown", f"{what}; an attempt was sent and its answer never came back, so it may "
                                            f"have been applied (sending it again is safe): {unknown}",
                         status=unknown.status)
        maybe.retried = True  # type: ignore[attr-defined]
        maybe.__cause__ = unknown
        err.outcome_unknown = maybe  # type: ignore[attr-defined]
    return err


def low_level_error(e: BaseException) -> BaseException:
    """What a low-level call raises for e, the error of its send: a call whose bound ran
    out after an attempt that may have been applied is APIError outcome_unknown, as the
    Go client's calls return idemkv.ErrOutcomeUnknown then, even if later attempts
    reached nobody: StoreUnavailableError would say it certainly was not applied."""
    maybe = getattr(e, "outcome_unknown", None)
    return maybe if isinstance(maybe, APIError) else e


def _key_path(tenant: str, key: str) -> str:
    return "/v1/records/" + escape_segment(tenant) + "/" + escape_segment(key)


def _drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def ms(seconds: Optional[float]) -> Optional[int]:
    return None if seconds is None else int(round(seconds * 1000))


# The calls, one builder each, shared by both clients.


def reserve_call(
    tenant: str,
    key: str,
    tool: str,
    *,
    fingerprint: Optional[str] = None,
    effect: Any = None,
    actor: Optional[str] = None,
    attempt_id: Optional[str] = None,
    lease_ttl: Optional[float] = None,
    ttl: Optional[float] = None,
    expires_at: Optional[str] = None,
    approval: Optional[Mapping[str, Any]] = None,
) -> Call:
    body = _drop_none(
        {
            "tenant": tenant,
            "idempotency_key": key,
            "tool": tool,
            "actor": actor,
            "effect_fingerprint": fingerprint,
            "effect": effect,
            # A reserve without an attempt id gets a fresh one, so that the retries of
            # this call are one attempt to the server.
            "attempt_id": attempt_id or new_attempt_id(),
            "lease_ttl_ms": ms(lease_ttl),
            "ttl_ms": ms(ttl),
            "expires_at": expires_at,
            # {"required", "ttl_ms"?, "summary"?}: docs/protocol.md section 7.
            "approval": dict(approval) if approval is not None else None,
        }
    )
    return Call("POST", "/v1/reserve", "/v1/reserve", body=body)


def commit_call(
    tenant: str,
    key: str,
    fingerprint: str,
    fence: int,
    remote_system: str,
    remote_id: str,
    remote_url: Optional[str] = None,
    result: Any = None,
) -> Call:
    body = _drop_none(
        {
            "tenant": tenant,
            "idempotency_key": key,
            "effect_fingerprint": fingerprint,
            "fence": fence,
            "remote_system": remote_system,
            "remote_id": remote_id,
            "remote_url": remote_url or None,
            "result": result,
        }
    )
    return Call("POST", "/v1/commit", "/v1/commit", body=body)


def fail_call(tenant: str, key: str, fingerprint: str, fence: int, code: str, message: str, details: Any = None) -> Call:
    error = _drop_none({"code": code, "message": message, "details": details})
    body = {"tenant": tenant, "idempotency_key": key, "effect_fingerprint": fingerprint, "fence": fence, "error": error}
    return Call("POST", "/v1/fail", "/v1/fail", body=body)


def release_call(tenant: str, key: str, fingerprint: str, fence: int) -> Call:
    body = {"tenant": tenant, "idempotency_key": key, "effect_fingerprint": fingerprint, "fence": fence}
    return Call("POST", "/v1/release", "/v1/release", body=body)


def heartbeat_call(tenant: str, key: str, fence: int, lease_ttl: Optional[float] = None) -> Call:
    body = _drop_none({"tenant": tenant, "idempotency_key": key, "fence": fence, "lease_ttl_ms": ms(lease_ttl)})
    return Call("POST", "/v1/heartbeat", "/v1/heartbeat", body=body)


def doubt_call(tenant: str, key: str, fingerprint: str, fence: int) -> Call:
    body = {"tenant": tenant, "idempotency_key": key, "effect_fingerprint": fingerprint, "fence": fence}
    return Call("POST", "/v1/doubt", "/v1/doubt", body=body)


def resolve_call(
    tenant: str,
    key: str,
    fingerprint: str,
    outcome: str,
    remote_system: Optional[str] = None,
    remote_id: Optional[str] = None,
    remote_url: Optional[str] = None,
    result: Any = None,
) -> Call:
    if outcome not in ("committed", "not_executed"):
        raise ValueError('idemkv: resolve outcome is "committed" or "not_executed"')
    body = _drop_none(
        {
            "tenant": tenant,
            "idempotency_key": key,
            "effect_fingerprint": fingerprint,
            "outcome": outcome,
            "remote_system": remote_system,
            "remote_id": remote_id,
            "remote_url": remote_url or None,
            "result": result,
        }
    )
    return Call("POST", "/v1/resolve", "/v1/resolve", body=body)


def get_call(tenant: str, key: str, wait: Optional[float] = None, consistency: Optional[str] = None,
             history: bool = False) -> Call:
    q: dict[str, str] = {}
    if history:
        q["history"] = "true"
    w = 0.0
    if wait:
        w = min(wait, MAX_WAIT)
        q["wait_ms"] = str(max(1, int(w * 1000)))
    if consistency:
        q["consistency"] = consistency
    return Call("GET", "/v1/records/{tenant}/{key}", _key_path(tenant, key), query=q, wait=w)


def list_call(
    tenant: str,
    prefix: Optional[str] = None,
    status: Optional[str] = None,
    limit: Optional[int] = None,
    after: Optional[str] = None,
    in_doubt: bool = False,
    consistency: Optional[str] = None,
) -> Call:
    q = {
        k: str(v)
        for k, v in {"prefix": prefix, "status": status, "limit": limit, "after": after, "consistency": consistency}.items()
        if v
    }
    if in_doubt:
        q["in_doubt"] = "true"
    return Call("GET", "/v1/records/{tenant}", "/v1/records/" + escape_segment(tenant), query=q)


def approvals_call(tenant: str, limit: Optional[int] = None, after: Optional[str] = None,
                   consistency: Optional[str] = None) -> Call:
    q = {k: str(v) for k, v in {"tenant": tenant, "limit": limit, "after": after, "consistency": consistency}.items()
         if v}
    return Call("GET", "/v1/approvals", "/v1/approvals", query=q)


# The verdicts of a decision, and the approval state each leaves.
VERDICTS = {"approve": "approved", "deny": "denied"}


def decide_approval_call(tenant: str, key: str, approval_id: str, fingerprint: str, decision: str, approver: str,
                         reason: Optional[str] = None) -> Call:
    if decision not in VERDICTS:
        raise ValueError('idemkv: an approval decision is "approve" or "deny"')
    body = _drop_none({"approval_id": approval_id, "effect_fingerprint": fingerprint, "decision": decision,
                       "approver": approver, "reason": reason or None})
    path = "/v1/approvals/" + escape_segment(tenant) + "/" + escape_segment(key)
    return Call("POST", "/v1/approvals/{tenant}/{key}", path, body=body)


# The server's bound on a recorded approver, in UTF-8 bytes (idemkv.MaxApproverLen).
MAX_APPROVER_LEN = 128
_VIA = " via "


def approver_named(recorded: str, named: str) -> bool:
    """Whether recorded, the approver a decision recorded, is what the server makes of
    a body naming named under some token (Go's idemkv.ApproverNamed, rule for rule):
    named itself without authentication; the token's identity alone, "ana (approver)",
    when named is the token's holder; else "named via <token identity>", named clipped to
    fit MAX_APPROVER_LEN bytes. The client does not know its token's name, so any token
    matches; the approval id, verdict and reason compared besides make the decision its
    own."""
    if recorded == named or recorded.startswith(named + " ("):
        return True
    i = 0
    while True:
        j = recorded.find(_VIA, i)
        if j < 0:
            return False
        # The name before " via " may have been clipped to make room for the token, and
        # then the whole is within a rune (4 bytes) of the limit.
        left = recorded[:j]
        if left == named or (left != "" and len(recorded.encode("utf-8")) > MAX_APPROVER_LEN - 4
                             and named.startswith(left)):
            return True
        i = j + len(_VIA)


def decided_as(rec: Optional[Mapping[str, Any]], call: Call) -> bool:
    """Whether rec holds exactly the decision call carries: a decision retried after its
    answer was lost meets not_pending, its own doing (the Go DecideApproval). Under
    tokens the record names the token besides the person (approver_named)."""
    a = (rec or {}).get("approval") or {}
    b = call.body or {}
    recorded = a.get("approver")
    return (a.get("id") == b.get("approval_id") and isinstance(recorded, str)
            and approver_named(recorded, str(b.get("approver", "")))
            and (a.get("reason") or None) == b.get("reason") and a.get("state") == VERDICTS[b["decision"]])


def decision_error(e: "APIError") -> "APIError":
    """A decision's 409s as their typed errors."""
    from .errors import ApprovalMismatchError, ApprovalNotPendingError

    kind = {"not_pending": ApprovalNotPendingError, "fingerprint_mismatch": ApprovalMismatchError}.get(e.code)
    if kind is None:
        return e
    typed = kind(e.code, e.message, status=e.status, field=e.field)
    typed.__cause__ = e
    return typed


def approval_rule_call(tenant: str, tool: str, ttl: Optional[float] = None, remove: bool = False) -> Call:
    body = _drop_none({"tenant": tenant, "tool": tool, "ttl_ms": ms(ttl), "remove": remove or None})
    return Call("POST", "/v1/approval-rules", "/v1/approval-rules", body=body)


def approval_rules_call(tenant: str) -> Call:
    return Call("GET", "/v1/approval-rules", "/v1/approval-rules", query={"tenant": tenant})


def cluster_call() -> Call:
    return Call("GET", "/v1/cluster", "/v1/cluster")
