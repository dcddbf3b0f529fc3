"""Answers lost after the server applied the request, against a real node with tokens,
through a proxy that delivers every request and drops the answers it is told to: a
decision whose answer was lost is recognised as the caller's own however the server
recorded its approver; a write sent whose answer never came back is outcome_unknown,
not unavailable (which says it certainly was not applied); and the tool-call loop
retries such writes as before, without running a tool again."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
import threading
import unittest
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

import harness
import idemkv
from idemkv import _core
from test_approval import _hash

TENANT = "shop"


class LossyProxy:
    """Forwards each request to upstream and relays the answer, one request a
    connection, unless lose(method, path) says to drop it: then the connection closes
    after the node applied the request, as a reset would. close() stops listening, so
    that later attempts find nobody. The leader header is not relayed (the client would
    go around the proxy to the address it names)."""

    def __init__(self, upstream: str, lose: Callable[[str, str], bool]) -> None:
        self.upstream = urlsplit(upstream if "://" in upstream else "http://" + upstream).netloc
        self.lose = lose
        self.lost: list[str] = []
        self.seen: list[str] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.addr = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept in flight (close alone does not)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            f = conn.makefile("rb")
            line = f.readline().decode("latin-1").rstrip("\r\n")
            if not line:
                return
            method, target, _ = line.split(" ", 2)
            headers: dict[str, str] = {}
            while True:
                h = f.readline().decode("latin-1").rstrip("\r\n")
                if not h:
                    break
                name, _, value = h.partition(":")
                headers[name.strip()] = value.strip()
            n = int(next((v for k, v in headers.items() if k.lower() == "content-length"), "0"))
            body = f.read(n) if n else None
            fwd = {k: v for k, v in headers.items() if k.lower() not in ("host", "connection", "content-length")}
            up = http.client.HTTPConnection(self.upstream, timeout=30)
            try:
                up.request(method, target, body=body, headers=fwd)
                resp = up.getresponse()
                data = resp.read()
                out = [(k, v) for k, v in resp.getheaders()
                       if k.lower() not in ("connection", "content-length", "transfer-encoding",
                                            _core.HEADER_LEADER.lower())]
            finally:
                up.close()
            path = urlsplit(target).path
            self.seen.append(f"{method} {path}")
            if self.lose(method, path):
                self.lost.append(f"{method} {path}")
                return  # applied, and the answer never comes back
            head = [f"HTTP/1.1 {resp.status} {resp.reason}"] + [f"{k}: {v}" for k, v in out]
            head += [f"Content-Length: {len(data)}", "Connection: close"]
            conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data)
        except OSError:
            pass
        finally:
            conn.close()


def lose_first(n: int, method: str, prefix: str, then: Optional[Callable[[], None]] = None
               ) -> Callable[[str, str], bool]:
    """Loses the answers of the first n requests of method to paths under prefix; then()
    after the n-th."""
    count = [0]

    def lose(m: str, path: str) -> bool:
        if m != method or not path.startswith(prefix) or count[0] >= n:
            return False
        count[0] += 1
        if count[0] == n and then is not None:
            then()
        return True

    return lose


class LostAnswers(unittest.TestCase):
    node: harness.Node
    agent_token = "agent-" + os.urandom(8).hex()
    approver_token = "approver-" + os.urandom(8).hex()

    @classmethod
    def setUpClass(cls) -> None:
        d = os.path.join(harness._tmp, "lost-" + os.urandom(4).hex())
        os.makedirs(d)
        tokens = os.path.join(d, "tokens.json")
        with open(tokens, "w") as f:
            json.dump({"tokens": [
                {"name": "agent", "hash": _hash(cls.agent_token), "role": "client", "tenants": [TENANT]},
                {"name": "ana", "hash": _hash(cls.approver_token), "role": "approver", "tenants": [TENANT]},
            ]}, f)
        cls.node = harness.Node("lost", extra=["--auth-file", tokens]).start().wait_ready()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.node.kill()

    def setUp(self) -> None:
        self.agent = idemkv.Client(self.node.http, tenant=TENANT, token=self.agent_token)
        self.addCleanup(self.agent.close)

    def proxy(self, lose: Callable[[str, str], bool]) -> LossyProxy:
        p = LossyProxy(self.node.http, lose)
        self.addCleanup(p.close)
        return p

    def via(self, p: LossyProxy, token: str, store_wait: float = 30.0) -> idemkv.Client:
        c = idemkv.Client(p.addr, token=token, store_wait=store_wait, backoff_min=0.01, backoff_max=0.1)
        self.addCleanup(c.close)
        return c

    def ask(self, key: str) -> dict[str, Any]:
        res = self.agent.reserve(TENANT, key, "refund", effect={"order": 17, "eur": 40}, actor="agent-1",
                                 approval={"required": True, "summary": "Refund 40 EUR"})
        self.assertEqual(res["decision"], "needs_approval", res)
        return res

    def decide(self, c: idemkv.Client, key: str, res: dict[str, Any], decision: str, approver: str) -> dict[str, Any]:
        return c.decide_approval(TENANT, key, approval_id=res["record"]["approval"]["id"],
                                 fingerprint=res["record"]["effect_fingerprint"], decision=decision,
                                 approver=approver, reason="ok")

    # A decision whose answer was lost, under tokens.

    def test_own_decision_is_recognised_however_the_approver_was_recorded(self) -> None:
        long = "é" * 64  # 128 bytes: clipped to make room for the token
        for named in ("ana", "cfo-alice", long):
            with self.subTest(named=named[:10]):
                key = harness.unique("own")
                res = self.ask(key)
                p = self.proxy(lose_first(1, "POST", "/v1/approvals/"))
                rec = self.decide(self.via(p, self.approver_token), key, res, "approve", named)
                self.assertEqual(p.lost, [f"POST /v1/approvals/{TENANT}/{_core.escape_segment(key)}"],
                                 "the first answer was lost")
                self.assertEqual(rec["approval"]["state"], "approved")
                recorded = rec["approval"]["approver"]
                self.assertTrue(recorded.endswith("ana (approver)"), recorded)
                self.assertTrue(_core.approver_named(recorded, named), recorded)
                if named == long:
                    self.assertNotIn(long, recorded, "clipped")
        # Someone else's decision is still not this one.
        key = harness.unique("other")
        res = self.ask(key)
        direct = idemkv.Client(self.node.http, token=self.approver_token)
        self.addCleanup(direct.close)
        self.decide(direct, key, res, "approve", "bob")
        p = self.proxy(lose_first(1, "POST", "/v1/approvals/"))
        with self.assertRaises(idemkv.ApprovalNotPendingError):
            self.decide(self.via(p, self.approver_token), key, res, "approve", "ana")
        with self.assertRaises(idemkv.ApprovalNotPendingError):
            self.decide(self.via(self.proxy(lose_first(1, "POST", "/v1/approvals/")), self.approver_token), key, res,
                        "approve", "bo")

    def test_own_decision_is_recognised_async(self) -> None:
        key = harness.unique("own-aio")
        res = self.ask(key)
        p = self.proxy(lose_first(1, "POST", "/v1/approvals/"))

        async def main() -> dict[str, Any]:
            c = idemkv.AsyncClient(p.addr, token=self.approver_token, backoff_min=0.01, backoff_max=0.1)
            try:
                return await c.deny(TENANT, key, approval_id=res["record"]["approval"]["id"],
                                    fingerprint=res["record"]["effect_fingerprint"], approver="cfo-alice")
            finally:
                await c.close()

        rec = asyncio.run(main())
        self.assertEqual(p.lost, [f"POST /v1/approvals/{TENANT}/{_core.escape_segment(key)}"])
        self.assertEqual((rec["approval"]["state"], rec["approval"]["approver"]),
                         ("denied", "cfo-alice via ana (approver)"))

    def test_approver_named_as_go(self) -> None:
        # Records made by Go's RecordedApprover, and what ApproverNamed says of them.
        long = "é" * 64
        clipped = "é" * 54 + " via ana (approver)"
        cases = [
            ("ana", "ana", True), ("ana (approver)", "ana", True), ("cfo-alice via ana (approver)", "cfo-alice", True),
            ("alice via approvals bot via slack (approver)", "alice", True), (clipped, long, True),
            ("bob via phone via bot (admin)", "bob via phone", True),
            ("ana (approver)", "an", False), ("ana (approver)", "anabelle", False),
            ("cfo-alice via ana (approver)", "ana", False), ("cfo-alice via ana (approver)", "cfo", False),
            (clipped, "é" * 10 + "x", False), ("bob via phone via bot (admin)", "bob", True),
            ("x" * 109 + " via ana (approver)", "x" * 120, True), ("x" * 109 + " via ana (approver)", "x" * 100, False),
            ("x" * 100 + " via ana (approver)", "x" * 120, False),
        ]
        for recorded, named, want in cases:
            with self.subTest(recorded=recorded[:30], named=named[:20]):
                self.assertEqual(_core.approver_named(recorded, named), want)

    # A write sent whose answer never came back is outcome_unknown.

    def test_a_denial_whose_every_answer_is_lost_is_outcome_unknown(self) -> None:
        key = harness.unique("lost")
        res = self.ask(key)
        p = self.proxy(lambda m, path: m == "POST" and path.startswith("/v1/approvals/"))
        with self.assertRaises(idemkv.APIError) as cm:
            self.decide(self.via(p, self.approver_token, store_wait=1.0), key, res, "deny", "ana")
        self.assertEqual(cm.exception.code, "outcome_unknown", cm.exception)
        self.assertTrue(cm.exception.retryable)
        self.assertGreater(len(p.lost), 1, "retried")
        rec = self.agent.get(TENANT, key)
        assert rec is not None
        self.assertEqual(rec["approval"]["state"], "denied")

    def test_a_denial_whose_every_answer_is_lost_is_outcome_unknown_async(self) -> None:
        key = harness.unique("lost-aio")
        res = self.ask(key)
        p = self.proxy(lambda m, path: m == "POST" and path.startswith("/v1/approvals/"))

        async def main() -> None:
            c = idemkv.AsyncClient(p.addr, token=self.approver_token, store_wait=1.0, backoff_min=0.01,
                                   backoff_max=0.1)
            try:
                await c.deny(TENANT, key, approval_id=res["record"]["approval"]["id"],
                             fingerprint=res["record"]["effect_fingerprint"], approver="ana")
            finally:
                await c.close()

        with self.assertRaises(idemkv.APIError) as cm:
            asyncio.run(main())
        self.assertEqual(cm.exception.code, "outcome_unknown", cm.exception)
        rec = self.agent.get(TENANT, key)
        assert rec is not None
        self.assertEqual(rec["approval"]["state"], "denied")

    def test_outcome_unknown_stays_when_later_attempts_reach_nobody(self) -> None:
        # The first answer is lost and then nobody listens: the last attempt was merely
        # unavailable, but the first may have been applied (it was).
        key = harness.unique("gone")
        res = self.ask(key)
        holder: list[LossyProxy] = []
        p = self.proxy(lose_first(1, "POST", "/v1/approvals/", then=lambda: holder[0].close()))
        holder.append(p)
        with self.assertRaises(idemkv.APIError) as cm:
            self.decide(self.via(p, self.approver_token, store_wait=0.5), key, res, "deny", "ana")
        self.assertEqual(cm.exception.code, "outcome_unknown", cm.exception)
        rec = self.agent.get(TENANT, key)
        assert rec is not None
        self.assertEqual(rec["approval"]["state"], "denied")

    def test_a_read_whose_answers_are_lost_is_still_unavailable(self) -> None:
        p = self.proxy(lambda m, path: m == "GET")
        with self.assertRaises(idemkv.StoreUnavailableError) as cm:
            self.via(p, self.agent_token, store_wait=0.3).get(TENANT, harness.unique("read"))
        cause = cm.exception.__cause__
        self.assertIsInstance(cause, idemkv.APIError)
        assert isinstance(cause, idemkv.APIError)
        self.assertEqual(cause.code, "unavailable")

    # The loop retries writes whose answers were lost as before: no tool runs again.

    def test_the_loop_retries_lost_writes_and_runs_the_tool_once(self) -> None:
        for route in ("/v1/reserve", "/v1/commit"):
            with self.subTest(route=route):
                p = self.proxy(lose_first(2, "POST", route))
                c = self.via(p, self.agent_token)
                key = harness.unique("loop")
                runs: list[int] = []
                out = c.do(lambda: runs.append(1) or {"id": "RF-1"}, key=key, tool="refund", tenant=TENANT,
                           effect={"order": 17})
                self.assertEqual(len(p.lost), 2)
                self.assertEqual(runs, [1])
                self.assertEqual(out.receipt["status"], "committed")
                again = c.do(lambda: runs.append(2), key=key, tool="refund", tenant=TENANT, effect={"order": 17})
                self.assertTrue(again.replayed)
                self.assertEqual(runs, [1])

    def test_the_loop_retries_a_lost_release(self) -> None:
        p = self.proxy(lose_first(2, "POST", "/v1/release"))
        c = self.via(p, self.agent_token)
        key = harness.unique("release")

        def refuse() -> None:
            raise idemkv.NotExecuted("the downstream refused before acting")

        with self.assertRaises(idemkv.NotExecutedError):
            c.do(refuse, key=key, tool="refund", tenant=TENANT, effect={"order": 17})
        self.assertEqual(len(p.lost), 2)
        self.assertIsNone(self.agent.get(TENANT, key), "released")
        runs: list[int] = []
        out = c.do(lambda: runs.append(1) or {"id": "RF-2"}, key=key, tool="refund", tenant=TENANT,
                   effect={"order": 17})
        self.assertEqual((runs, out.receipt["status"]), ([1], "committed"))

    def test_every_commit_answer_lost_leaves_it_outcome_unknown_and_the_tool_ran_once(self) -> None:
        p = self.proxy(lambda m, path: m == "POST" and path == "/v1/commit")
        c = self.via(p, self.agent_token, store_wait=1.0)
        key = harness.unique("commit")
        runs: list[int] = []
        with self.assertRaises(idemkv.OutcomeUnknownError):
            c.do(lambda: runs.append(1) or {"id": "RF-3"}, key=key, tool="refund", tenant=TENANT,
                 effect={"order": 17})
        self.assertEqual(runs, [1])
        rec = self.agent.get(TENANT, key)
        assert rec is not None
        self.assertEqual(rec["status"], "committed", "the commit landed; its answers were lost")
        out = self.agent.do(lambda: runs.append(2), key=key, tool="refund", tenant=TENANT, effect={"order": 17})
        self.assertTrue(out.replayed)
        self.assertEqual(runs, [1])

    def test_every_reserve_answer_lost_is_store_unavailable_naming_the_attempt(self) -> None:
        p = self.proxy(lambda m, path: m == "POST" and path == "/v1/reserve")
        c = self.via(p, self.agent_token, store_wait=0.5)
        key = harness.unique("reserve")
        runs: list[int] = []
        with self.assertRaises(idemkv.StoreUnavailableError) as cm:
            c.do(lambda: runs.append(1), key=key, tool="refund", tenant=TENANT, effect={"order": 17})
        self.assertEqual(runs, [])
        self.assertIsNotNone(cm.exception.attempt_id)
        # Retried as the same attempt, the key it holds is its own: the tool runs once.
        out = self.agent.do(lambda: runs.append(1) or {"id": "RF-4"}, key=key, tool="refund", tenant=TENANT,
                            effect={"order": 17}, attempt_id=cm.exception.attempt_id)
        self.assertEqual((runs, out.receipt["status"]), ([1], "committed"))


if __name__ == "__main__":
    unittest.main()
