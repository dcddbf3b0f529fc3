"""An in-memory idemkv for a runtime's unit tests: no node, the same decisions.

    kv = idemkv.testing.MemoryClient(tenant="acme")
    create_ticket = kv.idempotent(tool="create_ticket", probe=find_ticket)(create_ticket)

:class:`MemoryClient` is a :class:`~idemkv.Client` whose calls go to a :class:`MemoryStore`
in this process instead of a cluster, and ``MemoryClient.aio()`` its asyncio twin on the
same store. The store answers every call the tool-call loop makes with the server's
decision table (docs/protocol.md section 1): the scenarios in testdata/decisions, which
the Go tests hold to the server's own decision functions, hold it to the same answers.
Its clock is injectable (``MemoryStore(clock=...)``, ``store.advance(seconds)``) so that
tests of leases and TTLs need not wait. It keeps no history, enforces no payload limit
unless given one, and knows no tokens: it is for tests, not a store.

To run the wrapped functions without any store at all, see :func:`idemkv.passthrough`.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as _dt
import json
import threading
import time
from typing import Any, Callable, Optional

from ._core import Call, Config, _drop_none, config_from
from .aio import AsyncClient
from .client import Client
from .errors import APIError

__all__ = ["MemoryStore", "MemoryClient", "AsyncMemoryClient"]

_TERMINAL = ("committed", "failed")


def _stamp(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class MemoryStore:
    """The records of one process, decided as the server decides them.

    clock: milliseconds since the epoch (default: the wall clock), plus whatever
    advance() added. max_payload_bytes: refuse larger result + error with
    payload_too_large, as a server does (default: no limit)."""

    def __init__(self, clock: Optional[Callable[[], int]] = None, max_payload_bytes: Optional[int] = None) -> None:
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._offset = 0
        self._records: dict[tuple[str, str], dict[str, Any]] = {}
        self._index = 0  # the fence of the next grant: it only grows, as a Raft index does
        self._changed = threading.Condition()
        self.max_payload_bytes = max_payload_bytes
        self.calls: list[str] = []  # the routes called, in order, for assertions

    def now(self) -> int:
        return self._clock() + self._offset

    def advance(self, seconds: float) -> None:
        """Moves the store's clock on (leases and TTLs run out without waiting)."""
        with self._changed:
            self._offset += int(seconds * 1000)
            self._changed.notify_all()

    def records(self) -> list[dict[str, Any]]:
        """Every live record, as GET would answer it."""
        with self._changed:
            now = self.now()
            return [self._wire(r) for r in self._records.values() if r["expires_at"] > now]

    # Answers, one per route, the server's JSON.

    def handle(self, call: Call) -> Any:
        with self._changed:
            self.calls.append(call.route)
            # Through JSON, as over the wire: nobody keeps a reference into the store.
            body = json.loads(call.encoded_body() or b"{}")
            now = self.now()
            if call.method == "GET" and call.route == "/v1/records/{tenant}/{key}":
                tenant, key = _path_key(call.path)
                rec = self._live(tenant, key, now)
                wait_ms = int(call.query.get("wait_ms", "0"))
                deadline = time.monotonic() + wait_ms / 1000
                while rec is not None and rec["status"] == "pending" and time.monotonic() < deadline:
                    left = deadline - time.monotonic()
                    if rec.get("lease_expires_at") and not rec.get("in_doubt"):
                        left = min(left, max((rec["lease_expires_at"] - now) / 1000, 0))
                        if left <= 0:
                            break
                    self._changed.wait(left)
                    now = self.now()
                    rec = self._live(tenant, key, now)
                if rec is None:
                    raise APIError("not_found", f"no record for {key!r}", status=404)
                return self._wire(rec)
            handler = _ROUTES.get((call.method, call.route))
            if handler is None:
                raise APIError("invalid_argument", f"the in-memory store does not serve {call.method} {call.route}",
                               status=400)
            out = handler(self, body, now)
            self._changed.notify_all()
            return out

    def _live(self, tenant: str, key: str, now: int) -> Optional[dict[str, Any]]:
        rec = self._records.get((tenant, key))
        if rec is None or rec["expires_at"] <= now:
            return None
        return rec

    def _owner(self, b: dict[str, Any], now: int, fingerprint: bool = True) -> dict[str, Any]:
        rec = self._live(b["tenant"], b["idempotency_key"], now)
        if rec is None:
            raise APIError("not_found", "no live record for this key", status=404)
        if fingerprint and b.get("effect_fingerprint") != rec["effect_fingerprint"]:
            raise APIError("fingerprint_mismatch", f"the record holds {rec['effect_fingerprint']}", status=409)
        if int(b.get("fence", 0)) != rec["fence"]:
            raise APIError("fenced", f"fence {b.get('fence')} is not the current fence {rec['fence']}", status=409)
        return rec

    def _check_payload(self, result: Any, error: Any = None) -> None:
        if self.max_payload_bytes is None:
            return
        size = sum(len(json.dumps(v, separators=(",", ":")).encode()) for v in (result, error) if v is not None)
        if size > self.max_payload_bytes:
            raise APIError("payload_too_large", f"result is {size} bytes; the limit is {self.max_payload_bytes}",
                           status=413, field="result")

    def _reserve(self, b: dict[str, Any], now: int) -> dict[str, Any]:
        if (b.get("approval") or {}).get("required"):
            # Refused rather than run unapproved: a unit test must not pass a tool that
            # would wait for a person against a node.
            raise APIError("invalid_argument", "the in-memory store does not model approvals (docs/protocol.md "
                           "section 7); test a tool that requires approval against a node", status=400,
                           field="approval")
        tenant, key = b["tenant"], b["idempotency_key"]
        fp, tool, attempt = b.get("effect_fingerprint", ""), b["tool"], b.get("attempt_id", "")
        lease = int(b.get("lease_ttl_ms") or 30_000)
        ttl = int(b.get("ttl_ms") or 86_400_000)
        self._index += 1
        rec = self._live(tenant, key, now)
        if rec is None:
            rec = {"tenant": tenant, "idempotency_key": key, "effect_fingerprint": fp, "tool": tool,
                   "actor": b.get("actor"), "status": "pending", "fence": self._index, "attempt_id": attempt,
                   "attempts": 1, "created_at": now, "updated_at": now, "lease_expires_at": now + lease,
                   "expires_at": max(now + ttl, now + lease)}
            self._records[(tenant, key)] = rec
            return self._granted("execute", rec)
        if rec["tool"] != tool or rec["effect_fingerprint"] != fp:
            conflict = {"status": "conflict", "reason": "idempotency_key_reused_with_different_effect",
                        "existing_fingerprint": rec["effect_fingerprint"], "received_fingerprint": fp}
            if rec["tool"] != tool:
                conflict.update(reason="idempotency_key_reused_with_different_tool", existing_tool=rec["tool"],
                                received_tool=tool)
            if rec["status"] == "committed":
                conflict["existing_remote_id"] = rec["receipt"]["remote_id"]
            return {"decision": "conflict", "conflict": conflict, "record": self._wire(rec)}
        if rec["status"] in _TERMINAL:
            return {"decision": "replay", "receipt": self._outcome(rec), "record": self._wire(rec)}
        if rec.get("in_doubt"):
            return {"decision": "recover", "record": self._wire(rec)}
        if attempt and attempt == rec["attempt_id"]:
            rec["updated_at"] = now
            rec["lease_expires_at"] = max(rec["lease_expires_at"] or 0, now + lease)
            rec["expires_at"] = max(rec["expires_at"], now + ttl, rec["lease_expires_at"])
            return self._granted("recover" if rec["attempts"] > 1 else "execute", rec)
        if (rec["lease_expires_at"] or 0) > now:
            return {"decision": "in_progress", "lease_expires_at": _stamp(rec["lease_expires_at"]),
                    "record": self._wire(rec)}
        rec.update(fence=self._index, attempt_id=attempt, actor=b.get("actor"), attempts=rec["attempts"] + 1,
                   updated_at=now, lease_expires_at=now + lease)
        rec["expires_at"] = max(rec["expires_at"], now + ttl, rec["lease_expires_at"])
        return self._granted("recover", rec)

    def _granted(self, decision: str, rec: dict[str, Any]) -> dict[str, Any]:
        return {"decision": decision, "fence": rec["fence"], "attempt_id": rec["attempt_id"],
                "lease_expires_at": _stamp(rec["lease_expires_at"]), "record": self._wire(rec)}

    def _commit(self, b: dict[str, Any], now: int) -> dict[str, Any]:
        rec = self._owner(b, now)
        if rec["status"] in _TERMINAL:
            return self._outcome(rec)
        self._check_payload(b.get("result"))
        rec.update(status="committed", updated_at=now, lease_expires_at=None, in_doubt=False, in_doubt_since=None,
                   receipt=_drop_none({"remote_system": b["remote_system"], "remote_id": b["remote_id"],
                                       "remote_url": b.get("remote_url"), "result": b.get("result"),
                                       "committed_at": now}))
        return self._outcome(rec)

    def _fail(self, b: dict[str, Any], now: int) -> dict[str, Any]:
        rec = self._owner(b, now)
        if rec["status"] not in _TERMINAL:
            self._check_payload(None, (b.get("error") or {}).get("details"))
            rec.update(status="failed", updated_at=now, lease_expires_at=None, in_doubt=False, in_doubt_since=None,
                       error=copy.deepcopy(b["error"]))
        return self._wire(rec)

    def _release(self, b: dict[str, Any], now: int) -> dict[str, Any]:
        rec = self._owner(b, now)
        if rec["status"] in _TERMINAL:
            raise APIError("not_pending", f"the record is {rec['status']}", status=409)
        del self._records[(b["tenant"], b["idempotency_key"])]
        return {"released": True}

    def _heartbeat(self, b: dict[str, Any], now: int) -> dict[str, Any]:
        rec = self._owner(b, now, fingerprint=False)
        if rec["status"] in _TERMINAL or rec.get("in_doubt"):
            raise APIError("not_pending", "the record is not held by a running attempt", status=409)
        rec["updated_at"] = now
        rec["lease_expires_at"] = max(rec["lease_expires_at"] or 0, now + int(b.get("lease_ttl_ms") or 30_000))
        rec["expires_at"] = max(rec["expires_at"], rec["lease_expires_at"])
        return self._wire(rec)

    def _doubt(self, b: dict[str, Any], now: int) -> dict[str, Any]:
        rec = self._owner(b, now)
        if rec["status"] in _TERMINAL:
            raise APIError("not_pending", f"the record is {rec['status']}", status=409)
        if not rec.get("in_doubt"):
            rec.update(in_doubt=True, in_doubt_since=now, updated_at=now, lease_expires_at=None)
        return self._wire(rec)

    def _resolve(self, b: dict[str, Any], now: int) -> dict[str, Any]:
        rec = self._live(b["tenant"], b["idempotency_key"], now)
        if rec is None:
            raise APIError("not_found", "no live record for this key", status=404)
        if b.get("effect_fingerprint") != rec["effect_fingerprint"]:
            raise APIError("fingerprint_mismatch", f"the record holds {rec['effect_fingerprint']}", status=409)
        if rec["status"] in _TERMINAL or not rec.get("in_doubt"):
            raise APIError("not_pending", "only an in-doubt record can be resolved", status=409)
        if b.get("outcome") == "not_executed":
            del self._records[(b["tenant"], b["idempotency_key"])]
            return {"released": True}
        self._check_payload(b.get("result"))
        rec.update(status="committed", in_doubt=False, in_doubt_since=None, updated_at=now, lease_expires_at=None,
                   receipt=_drop_none({"remote_system": b["remote_system"], "remote_id": b["remote_id"],
                                       "remote_url": b.get("remote_url"), "result": b.get("result"),
                                       "committed_at": now}))
        return self._outcome(rec)

    def _wire(self, rec: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(rec)
        for f in ("created_at", "updated_at", "lease_expires_at", "expires_at", "in_doubt_since"):
            out[f] = _stamp(out[f]) if out.get(f) else None
        if out.get("receipt"):
            out["receipt"]["committed_at"] = _stamp(out["receipt"]["committed_at"])
        if not out.get("in_doubt"):
            out.pop("in_doubt", None)
        return _drop_none(out)

    def _outcome(self, rec: dict[str, Any]) -> dict[str, Any]:
        w = self._wire(rec)
        out = {"idempotency_key": w["idempotency_key"], "effect_fingerprint": w["effect_fingerprint"],
               "status": w["status"]}
        out.update(w.get("receipt") or {})
        if w.get("error"):
            out["error"] = w["error"]
        return out


_ROUTES: dict[tuple[str, str], Callable[[MemoryStore, dict[str, Any], int], Any]] = {
    ("POST", "/v1/reserve"): MemoryStore._reserve,
    ("POST", "/v1/commit"): MemoryStore._commit,
    ("POST", "/v1/fail"): MemoryStore._fail,
    ("POST", "/v1/release"): MemoryStore._release,
    ("POST", "/v1/heartbeat"): MemoryStore._heartbeat,
    ("POST", "/v1/doubt"): MemoryStore._doubt,
    ("POST", "/v1/resolve"): MemoryStore._resolve,
}


def _path_key(path: str) -> tuple[str, str]:
    from urllib.parse import unquote

    _, _, _, tenant, key = path.split("/", 4)
    return unquote(tenant), unquote(key)


class MemoryClient(Client):
    """A Client whose calls a MemoryStore in this process answers (see the module doc).
    Options are Client's (tenant, lease_ttl ...); endpoints are not used."""

    def __init__(self, store: Optional[MemoryStore] = None, *, config: Optional[Config] = None, **kw: Any) -> None:
        if config is None:
            kw.setdefault("endpoints", ["memory:0"])
            config = config_from(None, kw.pop("endpoints"), kw)
        super().__init__(config=config)
        self.store = store or MemoryStore()

    def _send(self, call: Call, bound: Optional[float] = None,
              connect_wait: Optional[float] = None, once: bool = False) -> tuple[Any, bool]:
        return self.store.handle(call), False

    def aio(self) -> "AsyncMemoryClient":
        if self._aio is None:
            self._aio = AsyncMemoryClient(self.store, config=self.config)
        return self._aio  # type: ignore[no-any-return]


class AsyncMemoryClient(AsyncClient):
    """The asyncio twin of MemoryClient, on the same store."""

    def __init__(self, store: Optional[MemoryStore] = None, *, config: Optional[Config] = None, **kw: Any) -> None:
        if config is None:
            kw.setdefault("endpoints", ["memory:0"])
            config = config_from(None, kw.pop("endpoints"), kw)
        super().__init__(config=config)
        self.store = store or MemoryStore()

    async def _send(self, call: Call, bound: Optional[float] = None,
                    connect_wait: Optional[float] = None, once: bool = False) -> tuple[Any, bool]:
        if call.wait:
            # A long-poll would block the event loop: wait in a thread.
            return await asyncio.get_running_loop().run_in_executor(None, self.store.handle, call), False
        return self.store.handle(call), False
