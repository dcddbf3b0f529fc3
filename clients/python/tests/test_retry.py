"""Retries and routing against scripted HTTP servers: what a real node rarely does on
demand (outcome_unknown, a proxy's 502, a leader named in a header)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import harness  # noqa: F401  (puts src/ on sys.path)
import idemkv

Answer = tuple[int, dict[str, str], Any]


class Scripted:
    """An HTTP server that answers POSTs from a script and records their bodies."""

    def __init__(self, script: Callable[[int, dict[str, Any]], Answer]) -> None:
        self.bodies: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def answer(self, body: dict[str, Any]) -> None:
                outer.bodies.append(body)
                status, headers, payload = script(len(outer.bodies), body)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length", "0"))
                self.answer(json.loads(self.rfile.read(n) or b"{}"))

            def do_GET(self) -> None:  # noqa: N802
                self.answer({"path": self.path})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def error(code: str, status: int) -> Answer:
    return status, {}, {"error": {"code": code, "message": code}}


EXECUTE = {"decision": "execute", "fence": 7, "record": {"status": "pending", "fence": 7, "attempts": 1}}


class Retries(unittest.TestCase):
    def serve(self, script: Callable[[int, dict[str, Any]], Answer]) -> Scripted:
        s = Scripted(script)
        self.addCleanup(s.close)
        return s

    def test_outcome_unknown_is_retried_with_the_same_attempt(self) -> None:
        s = self.serve(lambda n, b: error("outcome_unknown", 503) if n < 3 else (200, {}, EXECUTE))
        c = idemkv.Client(s.addr, backoff_min=0.001, backoff_max=0.01)
        self.addCleanup(c.close)
        self.assertEqual(c.reserve("t", "k", "tool", fingerprint="sha256:" + "a" * 64)["fence"], 7)
        ids = {b["attempt_id"] for b in s.bodies}
        self.assertEqual((len(s.bodies), len(ids)), (3, 1))

    def test_unavailable_proxy_and_resource_exhausted_are_retried_the_rest_not(self) -> None:
        answers = [error("unavailable", 503), (502, {}, b"bad gateway"), error("resource_exhausted", 429),
                   (200, {}, {"released": True})]
        s = self.serve(lambda n, b: answers[n - 1])
        c = idemkv.Client(s.addr, backoff_min=0.001, backoff_max=0.01)
        self.addCleanup(c.close)
        self.assertEqual(c.release("t", "k", "sha256:" + "a" * 64, 7), {"released": True})
        self.assertEqual(len(s.bodies), 4)

        s2 = self.serve(lambda n, b: error("fenced", 409))
        c2 = idemkv.Client(s2.addr)
        self.addCleanup(c2.close)
        with self.assertRaises(idemkv.APIError) as cm:
            c2.commit("t", "k", "sha256:" + "a" * 64, 7, "s", "id")
        self.assertEqual((cm.exception.code, len(s2.bodies)), ("fenced", 1))

    def test_a_proxys_502_or_504_to_a_write_may_have_been_applied(self) -> None:
        # A proxy answers 504 when the node took the write and did not answer in time,
        # 502 when its answer broke off: the write may have been applied, so a call
        # that ends on it is outcome_unknown (retried as before). A proxy's 503, and a
        # read's 502 or 504, stay unavailable; idemkv's own error body is read as is.
        from idemkv import _core

        for status in (502, 504):
            self.assertEqual(self.code_of(lambda: _core.read_answer(status, b"bad gateway", "POST")),
                             "outcome_unknown")
            self.assertEqual(self.code_of(lambda: _core.read_answer(status, b"bad gateway", "GET")), "unavailable")
            self.assertEqual(self.code_of(lambda: _core.read_answer(
                status, b'{"error":{"code":"unavailable","message":"m"}}', "POST")), "unavailable")
        self.assertEqual(self.code_of(lambda: _core.read_answer(503, b"busy", "POST")), "unavailable")

        # Retried as before, with the same attempt; a call whose bound runs out on one
        # says outcome_unknown.
        s = self.serve(lambda n, b: (504, {}, b"gateway timeout") if n < 3 else (200, {}, EXECUTE))
        c = idemkv.Client(s.addr, backoff_min=0.001, backoff_max=0.01)
        self.addCleanup(c.close)
        self.assertEqual(c.reserve("t", "k", "tool", fingerprint="sha256:" + "a" * 64)["fence"], 7)
        self.assertEqual((len(s.bodies), len({b["attempt_id"] for b in s.bodies})), (3, 1))
        s2 = self.serve(lambda n, b: (502, {}, b"bad gateway"))
        c2 = idemkv.Client(s2.addr, store_wait=0.2, backoff_min=0.001, backoff_max=0.01)
        self.addCleanup(c2.close)
        with self.assertRaises(idemkv.APIError) as cm:
            c2.commit("t", "k", "sha256:" + "a" * 64, 7, "s", "id")
        self.assertEqual(cm.exception.code, "outcome_unknown")
        self.assertGreater(len(s2.bodies), 1)

    def code_of(self, f: Callable[[], Any]) -> str:
        try:
            f()
        except idemkv.APIError as e:
            return e.code
        self.fail("no APIError")

    def test_a_retried_release_that_finds_nothing_was_ours(self) -> None:
        s = self.serve(lambda n, b: error("unavailable", 503) if n == 1 else error("not_found", 404))
        c = idemkv.Client(s.addr, backoff_min=0.001, backoff_max=0.01)
        self.addCleanup(c.close)
        self.assertEqual(c.release("t", "k", "sha256:" + "a" * 64, 7), {"released": True})

    def test_the_leader_header_is_followed(self) -> None:
        leader = self.serve(lambda n, b: (200, {"Idemkv-Leader": "unused"}, EXECUTE))
        follower = self.serve(lambda n, b: (200, {"Idemkv-Leader": leader.addr}, EXECUTE))
        c = idemkv.Client([follower.addr])
        self.addCleanup(c.close)
        c.reserve("t", "k1", "tool", fingerprint="sha256:" + "a" * 64)
        self.assertEqual(c.leader, "http://" + leader.addr)
        c.reserve("t", "k2", "tool", fingerprint="sha256:" + "a" * 64)
        self.assertEqual((len(follower.bodies), len(leader.bodies)), (1, 1))

        # A wildcard address names nothing a client can dial: it is not followed.
        wild = self.serve(lambda n, b: (200, {"Idemkv-Leader": "0.0.0.0:7420"}, EXECUTE))
        c2 = idemkv.Client([wild.addr])
        self.addCleanup(c2.close)
        c2.reserve("t", "k", "tool", fingerprint="sha256:" + "a" * 64)
        self.assertEqual(c2.leader, "")

        # Nor is another scheme than the endpoints': from https to http it would send
        # the token and every request in plain text.
        other = self.serve(lambda n, b: (200, {"Idemkv-Leader": "https://" + leader.addr}, EXECUTE))
        c3 = idemkv.Client([other.addr])
        self.addCleanup(c3.close)
        c3.reserve("t", "k", "tool", fingerprint="sha256:" + "a" * 64)
        self.assertEqual(c3.leader, "")

    def test_a_leader_that_gave_no_answer_is_not_followed_again_for_a_while(self) -> None:
        # A node behind a load balancer names its in-cluster address, which this client
        # cannot reach: followed on every answer, every call paid a failed attempt first.
        dead = socket.socket()
        dead.bind(("127.0.0.1", 0))
        dead_addr = "127.0.0.1:%d" % dead.getsockname()[1]
        dead.close()
        follower = self.serve(lambda n, b: (200, {"Idemkv-Leader": dead_addr}, EXECUTE))
        c = idemkv.Client([follower.addr], backoff_min=0.001, backoff_max=0.01)
        self.addCleanup(c.close)
        c.reserve("t", "k1", "tool", fingerprint="sha256:" + "a" * 64)
        self.assertEqual(c.leader, "http://" + dead_addr)
        c.reserve("t", "k2", "tool", fingerprint="sha256:" + "a" * 64)  # refused, then the follower
        self.assertEqual(c.leader, "")
        c.reserve("t", "k3", "tool", fingerprint="sha256:" + "a" * 64)
        self.assertEqual(len(follower.bodies), 3)

        # A leader that answered, even 503 during an election, is followed again.
        leader = self.serve(lambda n, b: error("unavailable", 503) if n == 1 else (200, {}, EXECUTE))
        f2 = self.serve(lambda n, b: (200, {"Idemkv-Leader": leader.addr}, EXECUTE))
        c2 = idemkv.Client([f2.addr], backoff_min=0.001, backoff_max=0.01)
        self.addCleanup(c2.close)
        for k in ("k1", "k2", "k3"):
            c2.reserve("t", k, "tool", fingerprint="sha256:" + "a" * 64)
        self.assertEqual((len(f2.bodies), len(leader.bodies), c2.leader), (2, 2, "http://" + leader.addr))

    def test_an_endless_answer_is_not_read_to_the_end(self) -> None:
        # A node (or anything posing as one) that answers without end does not make the
        # client read until it runs out of memory: past MAX_ANSWER_BYTES the answer is
        # one cut short, unavailable for a read.
        endless = 3 * idemkv._core.MAX_ANSWER_BYTES
        written: list[int] = []

        class Endless(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Connection", "close")
                self.end_headers()
                chunk = b"a" * (1 << 20)
                n = 0
                try:
                    self.wfile.write(b'{"tenant":"')
                    while n < endless:
                        self.wfile.write(chunk)
                        n += len(chunk)
                except OSError:
                    pass
                written.append(n)

            def log_message(self, *a: Any) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Endless)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        c = idemkv.Client(["127.0.0.1:%d" % srv.server_address[1]], store_wait=0.1)
        self.addCleanup(c.close)
        with self.assertRaises(idemkv.StoreUnavailableError) as cm:
            c.get("t", "k")
        self.assertIn("larger than", str(cm.exception))
        for _ in range(500):
            if written:
                break
            time.sleep(0.01)
        self.assertTrue(written)
        self.assertLess(max(written), idemkv._core.MAX_ANSWER_BYTES + (16 << 20),
                        "the client read %d MiB of one answer" % (max(written) >> 20))

    def test_async_same_attempt_and_leader(self) -> None:
        leader = self.serve(lambda n, b: error("outcome_unknown", 503) if n == 1 else (200, {}, EXECUTE))
        # The follower cannot reach a leader but names it: the retry goes there.
        follower = self.serve(lambda n, b: (503, {"Idemkv-Leader": leader.addr},
                                            {"error": {"code": "unavailable", "message": "no leader yet"}}))

        async def main() -> dict[str, Any]:
            async with idemkv.AsyncClient([follower.addr], backoff_min=0.001, backoff_max=0.01) as a:
                return await a.reserve("t", "k", "tool", fingerprint="sha256:" + "a" * 64)

        self.assertEqual(asyncio.run(main())["fence"], 7)
        ids = {b["attempt_id"] for b in follower.bodies + leader.bodies}
        # follower (names the leader) → leader (outcome_unknown: it may have lost the
        # leadership, so it is forgotten) → follower again → leader: one attempt id.
        self.assertEqual((len(follower.bodies), len(leader.bodies), len(ids)), (2, 2, 1))

    def test_store_wait_is_one_budget_for_the_whole_call(self) -> None:
        # The reserve gets through after 0.6 s of 503s, says in_progress, and every
        # long-poll after it fails: the call still ends within its 1 s store_wait, not
        # 0.6 s + a fresh 1 s for the long-poll.
        import time

        first: list[float] = []
        in_progress = {"decision": "in_progress", "lease_expires_at": "2999-01-01T00:00:00.000Z",
                       "record": {"status": "pending", "fence": 3, "attempts": 1}}

        def script(n: int, body: dict[str, Any]) -> Answer:
            if "path" in body:  # the long-poll
                return error("unavailable", 503)
            first.append(time.monotonic())
            if first[-1] - first[0] < 0.6:
                return error("unavailable", 503)
            return 200, {}, in_progress

        s = self.serve(script)
        c = idemkv.Client(s.addr, tenant="t", store_wait=1.0, backoff_min=0.01, backoff_max=0.05)
        self.addCleanup(c.close)
        start = time.monotonic()
        with self.assertRaises(idemkv.StoreUnavailableError):
            c.do(lambda: {"id": "x"}, key="k", tool="tool", effect={"a": 1})
        took = time.monotonic() - start
        self.assertGreaterEqual(took, 0.9)
        self.assertLess(took, 1.4)


if __name__ == "__main__":
    unittest.main()
