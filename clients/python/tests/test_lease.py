"""A caller that gives up, a tool that raises, a store that sheds the approval wait: the
Python twins of the Go client's lease_test.go, for the sync Client and the AsyncClient."""

from __future__ import annotations

import asyncio
import datetime
import http.server
import json
import signal
import socketserver
import threading
import time
import unittest
import urllib.error
import urllib.request
from typing import Any, Optional

import harness
import idemkv
from test_retry import Answer, Scripted, error

TENANT = "acme"


class Panic(BaseException):
    """What a tool may raise that is no Exception (a KeyboardInterrupt, a SystemExit)."""


def _lease_ended(rec: Optional[dict[str, Any]]) -> bool:
    if rec is None or not rec.get("lease_expires_at"):
        return False
    t = datetime.datetime.fromisoformat(str(rec["lease_expires_at"]).replace("Z", "+00:00"))
    return t < datetime.datetime.now(datetime.timezone.utc)


class Heartbeat(unittest.TestCase):
    """The heartbeat lasts exactly as long as the tool."""

    def setUp(self) -> None:
        self.node = harness.shared_node()
        self.client = idemkv.Client(self.node.http, tenant=TENANT)
        self.addCleanup(self.client.close)
        self.key = harness.unique("lease")

    def test_a_tool_that_raises_stops_its_heartbeat(self) -> None:
        # The lease runs out, and the next attempt recovers the key instead of waiting
        # in_progress for as long as the caller lives.
        sync_key, async_key = self.key + ":sync", self.key + ":async"

        def panics() -> Any:
            raise Panic("boom")

        with self.assertRaises(Panic):
            self.client.do(panics, key=sync_key, tool="t", effect={"a": 1}, lease_ttl=1)

        async def fails() -> Any:
            raise RuntimeError("boom")

        async def main() -> None:
            async with idemkv.AsyncClient(self.node.http, tenant=TENANT) as a:
                with self.assertRaises(idemkv.OutcomeUnknownError):
                    await a.do(fails, key=async_key, tool="t", effect={"a": 1}, lease_ttl=1)

        asyncio.run(main())
        time.sleep(2.5)
        for key in (sync_key, async_key):
            rec = self.client.get(TENANT, key)
            self.assertTrue(_lease_ended(rec), f"{key}: the lease of the attempt whose tool raised is still live: {rec}")
            r = self.client.reserve(TENANT, key, "t", fingerprint=idemkv.fingerprint({"a": 1}))
            self.assertEqual(r["decision"], "recover", key)

    def test_async_cancelled_caller_keeps_the_lease_while_the_tool_runs(self) -> None:
        # A caller that gives up does not end the lease of a tool still running (one
        # that goes on when cancelled): the heartbeat goes on until the tool returns, so
        # no second worker recovers the key and runs it again meanwhile. What the tool
        # returned is stored, and then the cancellation goes on.
        made: list[dict[str, str]] = []

        def find() -> Any:
            return made[0] if made else None

        def create() -> dict[str, str]:
            made.append({"id": f"LIN-{len(made) + 1}"})
            return made[-1]

        async def main() -> None:
            async with idemkv.AsyncClient(self.node.http, tenant=TENANT) as a:
                started, release = asyncio.Event(), asyncio.Event()

                async def goes_on() -> dict[str, str]:
                    started.set()
                    while not release.is_set():  # an SDK call that does not stop when cancelled
                        try:
                            await release.wait()
                        except asyncio.CancelledError:
                            pass
                    return create()

                async def at_once() -> dict[str, str]:
                    return create()

                opts: dict[str, Any] = dict(key=self.key, tool="create_ticket", effect={"title": "x"}, lease_ttl=2,
                                            probe=find)
                first = asyncio.ensure_future(a.do(goes_on, **opts))
                await started.wait()
                first.cancel()
                try:
                    await asyncio.sleep(5)  # two leases and a half
                    with self.assertRaises(idemkv.NotExecutedError, msg="a second worker ran the tool again"):
                        await a.do(at_once, **opts, actor="worker-2", deadline=0.5)
                finally:
                    release.set()  # else asyncio.run would wait for the tool for good
                with self.assertRaises(asyncio.CancelledError):
                    await first
                rec = await a.get(TENANT, self.key)
                assert rec is not None
                self.assertEqual((rec["status"], rec["receipt"]["remote_id"]), ("committed", "LIN-1"))

        asyncio.run(main())
        self.assertEqual(len(made), 1, made)


class _Holding(http.server.BaseHTTPRequestHandler):
    """Forwards to the node, but holds the answer of the first reserve until released:
    the reserve lands, and the caller gives up before it hears of it."""

    target = ""
    landed: threading.Event
    release: threading.Event
    reserves = 0

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        req = urllib.request.Request(f"http://{self.target}{self.path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                data, status = r.read(), r.status
        except urllib.error.HTTPError as e:
            data, status = e.read(), e.code
        if self.path == "/v1/reserve":
            type(self).reserves += 1
            if type(self).reserves == 1:
                self.landed.set()
                self.release.wait(30)
                self.close_connection = True
                return
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a: Any) -> None:
        pass


class _NoHeartbeats(http.server.BaseHTTPRequestHandler):
    """Forwards to the node, but answers every heartbeat 503 unavailable: the worker
    behind it cannot renew its lease, and the cluster never hears from it."""

    target = ""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/heartbeat":
            data, status = json.dumps({"error": {"code": "unavailable", "message": "partitioned"}}).encode(), 503
        else:
            req = urllib.request.Request(f"http://{self.target}{self.path}", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    data, status = r.read(), r.status
            except urllib.error.HTTPError as e:
                data, status = e.read(), e.code
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a: Any) -> None:
        pass


class HeartbeatsFailingForAWholeLease(unittest.TestCase):
    """A worker whose heartbeats fail (unavailable, not fenced) for most of its lease
    tells its tool to stop (current_lease().lost, expiring; an async tool is cancelled)
    before another worker may recover the key, probe (nothing yet) and run the tool: a
    tool that heeds it does not create a second ticket (the Go client's
    TestHeartbeatsFailingPastTheLeaseStopTheTool)."""

    def setUp(self) -> None:
        self.node = harness.shared_node()
        self.client = idemkv.Client(self.node.http, tenant=TENANT)
        self.addCleanup(self.client.close)
        handler: Any = type("H", (_NoHeartbeats,), {"target": self.node.http})
        srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        self.proxy = f"127.0.0.1:{srv.server_address[1]}"
        self.tickets: list[str] = []
        self.proceed = threading.Event()
        self.addCleanup(self.proceed.set)

    def probe(self) -> Any:
        return {"id": self.tickets[0]} if self.tickets else None

    def create(self, who: str) -> dict[str, str]:
        self.tickets.append(who)
        return {"id": who}

    def second_worker(self, key: str) -> None:
        out = self.client.do(lambda: self.create("LIN-second"), key=key, tool="create_ticket",
                             effect={"title": "x"}, probe=self.probe, lease_ttl=1)
        self.assertEqual(out.decision, "recover")

    def test_sync(self) -> None:
        key = harness.unique("no-heartbeats-sync")
        running = threading.Event()
        told: list[bool] = []

        def tool() -> Any:
            running.set()
            lease = idemkv.current_lease()
            assert lease is not None
            while not self.proceed.is_set() and not lease.lost.is_set():
                time.sleep(0.01)
            if lease.lost.is_set():
                told.append(lease.expiring)
                raise TimeoutError("stopped: the lease is running out")
            return self.create("LIN-first")

        first = idemkv.Client(self.proxy, tenant=TENANT, backoff_min=0.005, backoff_max=0.05)
        self.addCleanup(first.close)
        errs: list[BaseException] = []

        def run() -> None:
            try:
                first.do(tool, key=key, tool="create_ticket", effect={"title": "x"}, probe=self.probe, lease_ttl=1)
            except BaseException as e:  # reported below
                errs.append(e)

        t = threading.Thread(target=run)
        t.start()
        self.assertTrue(running.wait(10))
        self.second_worker(key)
        self.proceed.set()
        t.join(20)
        self.assertEqual(self.tickets, ["LIN-second"], "the first worker's tool ran on after its lease ran out")
        self.assertEqual(told, [True])
        self.assertEqual(len(errs), 1, errs)
        self.assertIsInstance(errs[0], idemkv.OutcomeUnknownError)

    def test_async(self) -> None:
        key = harness.unique("no-heartbeats-async")
        cancelled: list[bool] = []

        async def tool() -> Any:
            try:
                while not self.proceed.is_set():
                    await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                lease = idemkv.current_lease()
                cancelled.append(lease is not None and lease.expiring)
                raise
            return self.create("LIN-first")

        async def main() -> Any:
            async with idemkv.AsyncClient(self.proxy, tenant=TENANT, backoff_min=0.005, backoff_max=0.05) as a:
                first = asyncio.ensure_future(a.do(tool, key=key, tool="create_ticket", effect={"title": "x"},
                                                   probe=self.probe, lease_ttl=1))
                await asyncio.sleep(0.2)
                await asyncio.get_running_loop().run_in_executor(None, self.second_worker, key)
                self.proceed.set()
                try:
                    await first
                except BaseException as e:  # reported below
                    return e
                return None

        err = asyncio.run(main())
        self.assertEqual(self.tickets, ["LIN-second"], "the first worker's tool ran on after its lease ran out")
        self.assertEqual(cancelled, [True])
        self.assertIsInstance(err, idemkv.OutcomeUnknownError)
        self.assertIsInstance(err.__cause__ or getattr(err, "cause", None), idemkv.LeaseExpired)


class _HangingHeartbeats(http.server.BaseHTTPRequestHandler):
    """Forwards to the node over kept-alive connections, but never answers a heartbeat
    (a partition that drops what the worker sends): each heartbeat waits out its
    timeout."""

    protocol_version = "HTTP/1.1"
    target = ""
    release = threading.Event()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/v1/heartbeat":
            self.release.wait(30)
            self.close_connection = True
            return
        req = urllib.request.Request(f"http://{self.target}{self.path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                data, status = r.read(), r.status
        except urllib.error.HTTPError as e:
            data, status = e.read(), e.code
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a: Any) -> None:
        pass


class HeartbeatsHangingForAWholeLease(unittest.TestCase):
    """A heartbeat that gets no answer is bounded by the time left before the tool is to
    be told, on a kept-alive connection too: the sync client tried a timed-out reused
    connection once more on a new one, a second whole bound, and told the tool to stop
    only once its lease had run out (when another worker may already run the tool)
    rather than a sixth of the lease before."""

    def test_sync(self) -> None:
        node = harness.shared_node()
        handler: Any = type("H", (_HangingHeartbeats,), {"target": node.http, "release": threading.Event()})
        self.addCleanup(handler.release.set)
        srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        first = idemkv.Client(f"127.0.0.1:{srv.server_address[1]}", tenant=TENANT, backoff_min=0.005, backoff_max=0.05)
        self.addCleanup(first.close)
        told: list[float] = []

        def tool() -> Any:
            lease = idemkv.current_lease()
            assert lease is not None
            while not lease.lost.wait(0.01):
                if time.monotonic() - start > 10:
                    break
            told.append(time.monotonic() - start)
            raise TimeoutError("stopped: the lease is running out")

        ttl = 3.0
        start = time.monotonic()
        with self.assertRaises(idemkv.OutcomeUnknownError):
            first.do(tool, key=harness.unique("hanging-heartbeats"), tool="create_ticket", effect={"title": "x"},
                     lease_ttl=ttl)
        self.assertEqual(len(told), 1)
        # Told a sixth of the lease before it ends (2.5 s after the reserve was sent),
        # with room for a slow machine; not at its end (3 s) or later.
        self.assertLess(told[0], ttl - ttl / 6 + 0.3, f"the tool was told {told[0]:.2f}s after the call began")


class GivingUpDuringTheFirstReserve(unittest.TestCase):
    """A reserve that lands while the caller gives up leaves this attempt holding the
    key. The cancellation (or interrupt) goes on, caused by a StoreUnavailableError that
    names the attempt to retry as: a retry as a new attempt waited out the lease and, for
    a tool without a probe, marked the key in doubt though nothing had run."""

    def setUp(self) -> None:
        self.node = harness.shared_node()
        self.client = idemkv.Client(self.node.http, tenant=TENANT)
        self.addCleanup(self.client.close)
        self.key = harness.unique("gave-up")
        self.handler: Any = type("H", (_Holding,), {"target": self.node.http, "reserves": 0,
                                                    "landed": threading.Event(), "release": threading.Event()})
        srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), self.handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        self.addCleanup(self.handler.release.set)
        self.proxy = f"127.0.0.1:{srv.server_address[1]}"
        self.runs: list[str] = []

    def create(self) -> dict[str, str]:
        self.runs.append("ran")
        return {"id": "LIN-7"}

    def retry_as(self, su: Optional[idemkv.StoreUnavailableError]) -> None:
        self.assertIsNotNone(su, "the caller's give-up carries no StoreUnavailableError")
        assert su is not None
        self.assertEqual(su.kind, "store_unavailable")
        self.assertTrue(su.attempt_id, "the error names no attempt")
        self.assertEqual(self.runs, [])
        rec = self.client.get(TENANT, self.key)
        assert rec is not None, "the reserve did not land"
        self.assertEqual((rec["status"], rec["attempt_id"]), ("pending", su.attempt_id))
        start = time.monotonic()
        out = self.client.do(self.create, key=self.key, tool="create_ticket", effect={"title": "x"},
                             attempt_id=su.attempt_id)
        took = time.monotonic() - start
        self.assertEqual((out.decision, out.replayed, self.runs), ("execute", False, ["ran"]))
        self.assertLess(took, 3, "the retry waited out the lease: it was not recognised as the same attempt")

    def test_async_cancelled(self) -> None:
        async def main() -> BaseException:
            async with idemkv.AsyncClient(self.proxy, tenant=TENANT) as a:
                async def create() -> dict[str, str]:
                    return self.create()

                call = a.do(create, key=self.key, tool="create_ticket", effect={"title": "x"}, lease_ttl=10)
                try:
                    # The reserve lands within milliseconds; its answer never comes.
                    await asyncio.wait_for(call, 2)
                except BaseException as e:  # noqa: BLE001 - what the caller sees is the point
                    return e
                raise AssertionError("the call returned")

        e = asyncio.run(main())
        self.assertTrue(self.handler.landed.is_set())
        self.assertIsInstance(e, asyncio.TimeoutError)  # asyncio's own answer to a timeout stays
        self.retry_as(idemkv.find_cause(e, idemkv.StoreUnavailableError))

    def test_sync_interrupted(self) -> None:
        c = idemkv.Client(self.proxy, tenant=TENANT)
        self.addCleanup(c.close)
        main = threading.get_ident()
        self.assertEqual(main, threading.main_thread().ident, "signals reach the main thread only")
        # Python's own SIGINT handler, whatever the runner installed (unittest --catch).
        self.addCleanup(signal.signal, signal.SIGINT, signal.signal(signal.SIGINT, signal.default_int_handler))

        def interrupt() -> None:
            self.handler.landed.wait(10)
            time.sleep(0.2)  # the client waits for the answer
            signal.pthread_kill(main, signal.SIGINT)  # the person at the terminal gives up

        t = threading.Thread(target=interrupt, daemon=True)
        t.start()
        with self.assertRaises(KeyboardInterrupt) as cm:
            c.do(self.create, key=self.key, tool="create_ticket", effect={"title": "x"}, lease_ttl=10)
        t.join()
        self.retry_as(idemkv.find_cause(cm.exception, idemkv.StoreUnavailableError))


NEEDS_APPROVAL: dict[str, Any] = {
    "decision": "needs_approval",
    "approval": {"id": "apr_1", "state": "waiting", "summary": "x", "requested_at": "2026-01-01T00:00:00.000Z",
                 "expires_at": "2999-01-01T00:00:00.000Z"},
    "record": {"status": "awaiting_approval", "effect_fingerprint": idemkv.fingerprint({"a": 1}),
               "approval": {"id": "apr_1", "state": "waiting"}},
}


class ApprovalWait(unittest.TestCase):
    """A store that sheds the approval long-poll (resource_exhausted) or fails it is
    waited for with backoff, within store_wait; a refused long-poll is not_executed."""

    def serve(self, get: Any) -> Scripted:
        def script(n: int, body: dict[str, Any]) -> Answer:
            if "path" in body:
                return get(body["path"])  # type: ignore[no-any-return]
            return 200, {}, NEEDS_APPROVAL

        s = Scripted(script)
        self.addCleanup(s.close)
        return s

    def both(self, s: Scripted, wait: float, **kw: Any) -> list[tuple[Optional[BaseException], float, int]]:
        """What a sync and an async call raise, how long each took, how many requests."""
        out: list[tuple[Optional[BaseException], float, int]] = []
        opts: dict[str, Any] = dict(key="k", tool="refund", effect={"a": 1},
                                    approval=idemkv.ApprovalRequirement(wait=wait))
        c = idemkv.Client(s.addr, tenant=TENANT, **kw)
        self.addCleanup(c.close)
        ran: list[int] = []
        for sync in (True, False):
            before = len(s.bodies)
            start = time.monotonic()
            err: Optional[BaseException] = None
            try:
                if sync:
                    c.do(lambda: ran.append(1), **opts)
                else:
                    async def tool() -> Any:
                        ran.append(1)

                    async def main() -> None:
                        async with idemkv.AsyncClient(config=c.config) as a:
                            await a.do(tool, **opts)

                    asyncio.run(main())
            except Exception as e:  # noqa: BLE001 - the kind is the point
                err = e
            out.append((err, time.monotonic() - start, len(s.bodies) - before))
        self.assertEqual(ran, [])
        return out

    def test_a_shed_long_poll_backs_off_within_store_wait(self) -> None:
        s = self.serve(lambda path: error("resource_exhausted", 429))
        # An approval wait longer than store_wait: the store's silence ends the call.
        for err, took, n in self.both(s, 5, store_wait=2):
            self.assertIsInstance(err, idemkv.StoreUnavailableError)
            assert isinstance(err, idemkv.StoreUnavailableError)
            self.assertTrue(err.attempt_id)
            self.assertLess(n, 60, f"{n} requests in a wait of {took:.1f}s: no backoff")
            self.assertLess(took, 4)

    def test_a_refused_long_poll_is_not_executed(self) -> None:
        s = self.serve(lambda path: error("permission_denied", 403))
        for err, _, _ in self.both(s, 1):
            self.assertIsInstance(err, idemkv.NotExecutedError)

    def test_long_polls_that_fail_at_their_end_keep_to_the_approval_wait(self) -> None:
        # A proxy that cuts every long-poll when it is due (504): the wait for the
        # decision still ends about when the approval wait does, not after another
        # full long-poll for every pause that store_wait allows.
        def cut(path: str) -> Answer:
            q = path.partition("?")[2]
            ms = int(dict(p.split("=", 1) for p in q.split("&") if "=" in p).get("wait_ms", "0"))
            time.sleep(ms / 1000)
            return 504, {}, b"gateway timeout"

        s = self.serve(cut)
        for err, took, n in self.both(s, 1, store_wait=30):
            self.assertIsInstance(err, idemkv.ApprovalPendingError)
            self.assertLess(took, 4, f"a wait of 1 s took {took:.1f}s ({n} requests)")


if __name__ == "__main__":
    unittest.main()
