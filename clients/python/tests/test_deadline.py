"""How long a call may take once its caller has a bound: deadline= before the tool runs,
commit_grace for storing what the tool did once the caller has given up, and a caller's
own timeout (a signal handler's TimeoutError, asyncio's cancellation) in a store call.
Against scripted servers, for the sync Client and the AsyncClient."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
import unittest
from typing import Any, Callable, Optional

import harness  # noqa: F401  (puts src/ on sys.path)
import idemkv
from test_lease import NEEDS_APPROVAL
from test_retry import EXECUTE, Answer, Scripted, error

TENANT = "acme"

IN_PROGRESS = {"decision": "in_progress", "lease_expires_at": "2999-01-01T00:00:00.000Z",
               "record": {"status": "pending", "fence": 3, "attempts": 1}}
RECEIPT = {"status": "committed", "idempotency_key": "k", "remote_system": "t", "remote_id": "LIN-1"}


def kind_of(body: dict[str, Any]) -> str:
    if "path" in body:
        return "get"
    if "tool" in body:
        return "reserve"
    if "remote_id" in body:
        return "commit"
    return "other"


def wait_ms(body: dict[str, Any]) -> int:
    q = body["path"].partition("?")[2]
    return int(dict(p.split("=", 1) for p in q.split("&") if "=" in p).get("wait_ms", "0"))


class Base(unittest.TestCase):
    def serve(self, script: Callable[[str, dict[str, Any]], Answer]) -> Scripted:
        s = Scripted(lambda n, body: script(kind_of(body), body))
        # A client that gave up closed the connection a held answer is written to.
        s.server.handle_error = lambda *a: None  # type: ignore[method-assign]
        self.addCleanup(s.close)
        return s

    def count(self, s: Scripted, kind: str) -> int:
        return sum(1 for b in s.bodies if kind_of(b) == kind)

    def both(self, s: Scripted, fn: Callable[[], Any], **kw: Any) -> list[tuple[Optional[BaseException], float]]:
        """What a sync and an async call of the same op raise, and how long each took;
        kw holds the Client's options and the op's (key, deadline ...)."""
        cfg = {k: kw.pop(k) for k in ("store_wait", "commit_grace", "backoff_min", "backoff_max", "poll_wait",
                                      "on_store_unavailable") if k in kw}
        c = idemkv.Client(s.addr, tenant=TENANT, **cfg)
        self.addCleanup(c.close)
        out: list[tuple[Optional[BaseException], float]] = []
        for sync in (True, False):
            start = time.monotonic()
            err: Optional[BaseException] = None
            try:
                if sync:
                    c.do(fn, **kw)
                else:
                    async def atool() -> Any:
                        return fn()

                    async def main() -> None:
                        async with idemkv.AsyncClient(config=c.config) as a:
                            await a.do(atool, **kw)

                    asyncio.run(main())
            except Exception as e:  # noqa: BLE001 - the kind is the point
                err = e
            out.append((err, time.monotonic() - start))
        return out


class Deadline(Base):
    """deadline= bounds everything before the tool runs, as a Go context's deadline."""

    def test_a_reserve_past_the_deadline_gives_up_naming_the_attempt(self) -> None:
        # The reserve lands, and its answer (execute) comes after the deadline: the call
        # gives up at the deadline, the tool does not run, and the error names the
        # attempt to retry as (it holds the key). It ran the tool at 1.5 s.
        def script(kind: str, body: dict[str, Any]) -> Answer:
            if kind == "reserve":
                time.sleep(1.5)
                return 200, {}, EXECUTE
            return 200, {}, RECEIPT

        s = self.serve(script)
        ran: list[int] = []
        for opts in ({}, {"on_store_unavailable": "unguarded", "side_effect": "idempotent"}):
            before = len(s.bodies)
            for err, took in self.both(s, lambda: ran.append(1) or {"id": "LIN-1"}, key="k", tool="t",
                                       effect={"a": 1}, deadline=0.4, store_wait=10, **opts):
                self.assertIsInstance(err, idemkv.StoreUnavailableError, opts)
                assert isinstance(err, idemkv.StoreUnavailableError)
                self.assertLess(took, 1.2, opts)
                self.assertIn("deadline", str(err))
            reserves = [b for b in s.bodies[before:] if kind_of(b) == "reserve"]
            self.assertEqual(len(reserves), 2)
            self.assertEqual(err.attempt_id, reserves[-1]["attempt_id"])
        self.assertEqual(ran, [])

    def test_reserves_the_store_refuses_stop_at_the_deadline(self) -> None:
        s = self.serve(lambda kind, body: error("unavailable", 503))
        for err, took in self.both(s, lambda: {"id": "LIN-1"}, key="k", tool="t", effect={"a": 1}, deadline=0.5,
                                   store_wait=10, backoff_max=0.05):
            self.assertIsInstance(err, idemkv.StoreUnavailableError)
            self.assertLess(took, 1.5, "store_wait, not the deadline, ended the reserves")

    def test_the_wait_behind_a_holder_sends_one_long_poll_per_reserve(self) -> None:
        # A proxy that cuts every long-poll when it is due (504), as the Go client does:
        # each failed long-poll is followed by a reserve, which sees whether the holder
        # is done, and the deadline ends the wait. The long-poll was retried inside the
        # client, with its full wait each time, and the deadline never looked at again.
        def script(kind: str, body: dict[str, Any]) -> Answer:
            if kind == "get":
                time.sleep(wait_ms(body) / 1000)
                return 504, {}, b"gateway timeout"
            return 200, {}, IN_PROGRESS

        s = self.serve(script)
        for err, took in self.both(s, lambda: {"id": "LIN-1"}, key="k", tool="t", effect={"a": 1}, deadline=1.5,
                                   poll_wait=0.3, store_wait=2, backoff_max=0.05):
            self.assertIsInstance(err, (idemkv.NotExecutedError, idemkv.StoreUnavailableError))
            self.assertLess(took, 2.5)
        gets, reserves = self.count(s, "get"), self.count(s, "reserve")
        self.assertGreaterEqual(reserves, 6)
        self.assertLessEqual(gets, reserves)

        # Without a deadline, store_wait ends it, still one long-poll per reserve.
        s2 = self.serve(lambda kind, body: error("unavailable", 503) if kind == "get" else (200, {}, IN_PROGRESS))
        for err, took in self.both(s2, lambda: {"id": "LIN-1"}, key="k", tool="t", effect={"a": 1}, poll_wait=0.3,
                                   store_wait=1.0, backoff_max=0.05):
            self.assertIsInstance(err, idemkv.StoreUnavailableError)
        self.assertLessEqual(self.count(s2, "get"), self.count(s2, "reserve"))

    def test_the_approval_wait_ends_at_the_deadline_pending(self) -> None:
        awaiting = {"status": "awaiting_approval", "approval": {"id": "apr_1", "state": "waiting"}}

        def script(kind: str, body: dict[str, Any]) -> Answer:
            if kind == "get":
                time.sleep(wait_ms(body) / 1000)
                return 200, {}, awaiting
            return 200, {}, NEEDS_APPROVAL

        s = self.serve(script)
        for err, took in self.both(s, lambda: {"id": "LIN-1"}, key="k", tool="t", effect={"a": 1}, deadline=0.5,
                                   approval=idemkv.ApprovalRequirement(wait=5)):
            self.assertIsInstance(err, idemkv.ApprovalPendingError)
            self.assertLess(took, 1.5)


# A key whose holder died: the reserve answers recover with the dead attempt's record
# re-leased to this one (RECOVER), or, once it is marked in doubt, with no fence at all.
RECOVER = {"decision": "recover", "fence": 8, "record": {"status": "pending", "fence": 8, "attempts": 2}}
IN_DOUBT = {"decision": "recover", "record": {"status": "pending", "fence": 7, "attempts": 1, "in_doubt": True,
                                              "in_doubt_since": "2026-01-01T00:00:00.000Z"}}


def kind_of_settle(body: dict[str, Any]) -> str:
    """kind_of, with resolve (outcome) and release (a fence, nothing else) told apart."""
    if "outcome" in body:
        return "resolve"
    if "fence" in body and "remote_id" not in body and "error" not in body and "lease_ttl_ms" not in body:
        return "release"
    return kind_of(body)


class InDoubtDeadline(Base):
    """deadline= bounds the probe and the resolve of a key whose holder died, as a Go
    context bounds the probe (given the context) and the resolve (commit_grace past
    it): the errors are Go's for a context that ended there, the tool never runs past
    it, and the record is left as it was, or settled by what the probe found."""

    def settles(self, s: Scripted) -> list[str]:
        return [kind_of_settle(b) for b in s.bodies]

    def test_an_async_probe_of_an_in_doubt_key_is_cut_at_the_deadline(self) -> None:
        # It ran for as long as it liked (here 3 s, then not found: the key was
        # released and the caller got a StoreUnavailableError for a reserve never sent).
        s = self.serve(lambda kind, body: (200, {}, IN_DOUBT) if kind == "reserve" else (200, {}, {"released": True}))
        ran: list[int] = []

        async def main() -> BaseException:
            async with idemkv.AsyncClient(s.addr, tenant=TENANT) as a:
                async def tool() -> Any:
                    ran.append(1)
                    return {"id": "LIN-1"}

                async def probe() -> Any:
                    await asyncio.sleep(3)
                    return None

                try:
                    await a.do(tool, key="k", tool="t", effect={"a": 1}, probe=probe, deadline=0.4)
                except Exception as e:  # noqa: BLE001 - the kind is the point
                    return e
                raise AssertionError("the call returned")

        start = time.monotonic()
        e = asyncio.run(main())
        took = time.monotonic() - start
        self.assertIsInstance(e, idemkv.InDoubtError)
        self.assertIsInstance(idemkv.find_cause(e, TimeoutError), TimeoutError, "the deadline is the cause")
        self.assertLess(took, 1.5)
        self.assertEqual((ran, self.settles(s)), ([], ["reserve"]), "the record was left in doubt, untouched")

    def test_an_async_probe_of_a_recovered_key_is_cut_at_the_deadline(self) -> None:
        # Under the recovered lease: cut, outcome unknown, the record left pending. It
        # ran for 3 s, found nothing, and the tool ran past the deadline.
        s = self.serve(lambda kind, body: (200, {}, RECOVER) if kind == "reserve" else (200, {}, RECEIPT))
        ran: list[int] = []

        async def main() -> BaseException:
            async with idemkv.AsyncClient(s.addr, tenant=TENANT) as a:
                async def tool() -> Any:
                    ran.append(1)
                    return {"id": "LIN-1"}

                async def probe() -> Any:
                    await asyncio.sleep(3)
                    return None

                try:
                    await a.do(tool, key="k", tool="t", effect={"a": 1}, probe=probe, deadline=0.4)
                except Exception as e:  # noqa: BLE001
                    return e
                raise AssertionError("the call returned")

        start = time.monotonic()
        e = asyncio.run(main())
        took = time.monotonic() - start
        self.assertIsInstance(e, idemkv.OutcomeUnknownError)
        self.assertIsInstance(idemkv.find_cause(e, TimeoutError), TimeoutError)
        self.assertLess(took, 1.5)
        self.assertEqual((ran, self.settles(s)), ([], ["reserve"]))

    def test_a_probe_that_finds_nothing_past_the_deadline_runs_no_tool(self) -> None:
        # A sync probe cannot be cut; it returns after the deadline, finding nothing:
        # the key is released (the effect did not happen) and the tool does not run.
        # It ran the tool, and the call succeeded, 0.3 s past its deadline.
        s = self.serve(lambda kind, body: (200, {}, RECOVER) if kind == "reserve" else (200, {}, RECEIPT))
        ran: list[int] = []

        def probe() -> Any:
            time.sleep(0.6)
            return None

        for err, took in self.both(s, lambda: ran.append(1) or {"id": "LIN-1"}, key="k", tool="t", effect={"a": 1},
                                   probe=probe, deadline=0.3):
            assert isinstance(err, idemkv.NotExecutedError), err
            self.assertIsInstance(idemkv.find_cause(err, TimeoutError), TimeoutError)
            self.assertLess(took, 1.5)
        self.assertEqual(ran, [])
        self.assertEqual(self.settles(s), ["reserve", "release"] * 2)
        self.assertEqual([b["fence"] for b in s.bodies if kind_of_settle(b) == "release"], [8, 8])

    def test_a_probe_that_finds_nothing_past_the_deadline_keeps_an_approval(self) -> None:
        # The recovered record carries an approval that was given: a release would
        # delete it (docs/protocol.md section 7) and the next reserve would ask anew.
        # The tool runs instead, as the Go client runs it after its probe.
        approved = {**RECOVER, "record": {**RECOVER["record"], "approval": {"id": "apr_1", "state": "approved"}}}
        s = self.serve(lambda kind, body: (200, {}, approved) if kind == "reserve" else (200, {}, RECEIPT))
        ran: list[int] = []

        def probe() -> Any:
            time.sleep(0.6)
            return None

        for err, took in self.both(s, lambda: ran.append(1) or {"id": "LIN-1"}, key="k", tool="t", effect={"a": 1},
                                   probe=probe, deadline=0.3):
            self.assertIsNone(err)
        self.assertEqual(ran, [1, 1])
        self.assertEqual(self.settles(s), ["reserve", "commit"] * 2)

    def test_a_sync_probe_past_the_deadline_settles_what_it_found(self) -> None:
        # Found: the receipt is stored (commit_grace past the deadline), as Go's resolve.
        # Not found: the key is released, and the reserve after it is not sent (Go's
        # StoreUnavailableError for a context that has ended): nothing runs. Either way
        # the record is read again first: the probe settles only the doubt it looked at.
        for found in (True, False):
            s = self.serve(lambda kind, body: (200, {}, IN_DOUBT) if kind == "reserve" else
                           (200, {}, IN_DOUBT["record"]) if kind == "get" else
                           (200, {}, RECEIPT) if body.get("outcome") == "committed" else (200, {}, {"released": True}))
            c = idemkv.Client(s.addr, tenant=TENANT)
            self.addCleanup(c.close)
            ran: list[int] = []

            def probe() -> Any:
                time.sleep(0.5)
                return {"id": "LIN-1"} if found else None

            try:
                out = c.do(lambda: ran.append(1) or {"id": "LIN-2"}, key="k", tool="t", effect={"a": 1},
                           probe=probe, deadline=0.2)
                self.assertTrue(found)
                self.assertEqual((out.decision, out.probed, out.receipt["remote_id"]), ("recover", True, "LIN-1"))
            except idemkv.StoreUnavailableError as e:
                self.assertFalse(found)
                self.assertEqual(e.attempt_id, s.bodies[0]["attempt_id"])
            self.assertEqual(ran, [])
            self.assertEqual(self.settles(s), ["reserve", "get", "resolve"])
            self.assertEqual(s.bodies[2]["outcome"], "committed" if found else "not_executed")

    def test_the_resolve_is_bounded_by_commit_grace_past_the_deadline(self) -> None:
        # The probe answers at once, and the resolve meets a store that cannot serve: it
        # gives up commit_grace past the deadline, in doubt. It took store_wait (10 s).
        def script(kind: str, body: dict[str, Any]) -> Answer:
            return (200, {}, IN_DOUBT) if kind == "reserve" else error("unavailable", 503)

        s = self.serve(script)
        ran: list[int] = []
        for err, took in self.both(s, lambda: ran.append(1) or {"id": "LIN-1"}, key="k", tool="t", effect={"a": 1},
                                   probe=lambda: {"id": "LIN-1"}, deadline=0.4, store_wait=10, commit_grace=0.3,
                                   backoff_max=0.05):
            self.assertIsInstance(err, idemkv.InDoubtError)
            self.assertLess(took, 2)
        self.assertEqual(ran, [])

    def test_no_tool_runs_on_a_reserve_answered_past_the_deadline(self) -> None:
        # A reserve may be answered a moment past the deadline (its bound is at least
        # 50 ms): the tool does not run, the key is let go, and the error is that of a
        # reserve the deadline cut. The loop is driven by hand, so that the answer
        # comes past the deadline for sure.
        from idemkv import _otel
        from idemkv.loop import Op, _Loop, _Run, _Send

        op = Op(tenant=TENANT, key="k", tool="t", effect={"a": 1}, deadline=5)
        loop = _Loop(op, op.compute_fingerprint(), _otel._NoSpan())
        gen = loop.main()
        eff = next(gen)
        assert isinstance(eff, _Send)
        self.assertEqual(eff.call.route, "/v1/reserve")
        loop.deadline = time.monotonic() - 0.01  # the answer comes past it
        eff = gen.send(dict(EXECUTE))
        self.assertNotIsInstance(eff, _Run, "the tool ran past the deadline")
        assert isinstance(eff, _Send)
        self.assertEqual((eff.call.route, eff.call.body["fence"]), ("/v1/release", 7))  # type: ignore[index]
        with self.assertRaises(idemkv.StoreUnavailableError) as cm:
            gen.send({"released": True})
        self.assertEqual(cm.exception.attempt_id, loop.attempt_id)


class CommitGrace(Base):
    """Storing what the tool did: store_wait while the caller waits, commit_grace too
    once it has given up (past deadline=, or cancelled)."""

    def test_past_the_deadline_storing_the_receipt_is_bounded_by_commit_grace(self) -> None:
        def script(kind: str, body: dict[str, Any]) -> Answer:
            return (200, {}, EXECUTE) if kind == "reserve" else error("unavailable", 503)

        s = self.serve(script)

        def slow() -> Any:
            time.sleep(0.4)
            return {"id": "LIN-1"}

        for err, took in self.both(s, slow, key="k", tool="t", effect={"a": 1}, deadline=0.2, store_wait=5,
                                   commit_grace=0.5, backoff_max=0.05):
            self.assertIsInstance(err, idemkv.OutcomeUnknownError)
            self.assertLess(took, 2, "store_wait, not commit_grace, bounded the commit after the deadline")

        # A caller that still waits gets store_wait for it.
        for err, took in self.both(s, lambda: {"id": "LIN-1"}, key="k", tool="t", effect={"a": 1}, store_wait=1.2,
                                   commit_grace=0.1, backoff_max=0.05):
            self.assertIsInstance(err, idemkv.OutcomeUnknownError)
            self.assertGreater(took, 1.0)

    def test_async_cancelled_while_the_tool_runs(self) -> None:
        # The tool goes on when cancelled and returns; its receipt cannot be stored: the
        # cancellation goes on after commit_grace, not store_wait.
        def script(kind: str, body: dict[str, Any]) -> Answer:
            return (200, {}, EXECUTE) if kind == "reserve" else error("unavailable", 503)

        s = self.serve(script)

        async def main() -> BaseException:
            async with idemkv.AsyncClient(s.addr, tenant=TENANT, store_wait=5, commit_grace=0.5,
                                          backoff_max=0.05) as a:
                async def goes_on() -> Any:
                    try:
                        await asyncio.sleep(0.3)
                    except asyncio.CancelledError:
                        await asyncio.sleep(0.3)
                    return {"id": "LIN-1"}

                try:
                    await asyncio.wait_for(a.do(goes_on, key="k", tool="t", effect={"a": 1}), 0.1)
                except BaseException as e:  # noqa: BLE001 - what the caller sees is the point
                    return e
                raise AssertionError("the call returned")

        start = time.monotonic()
        e = asyncio.run(main())
        took = time.monotonic() - start
        self.assertIsInstance(e, asyncio.TimeoutError)
        self.assertIsNotNone(idemkv.find_cause(e, idemkv.OutcomeUnknownError))
        self.assertLess(took, 2, "store_wait, not commit_grace, bounded the commit after the cancellation")
        self.assertGreaterEqual(self.count(s, "commit"), 2)

    def test_async_cancelled_while_the_receipt_is_stored(self) -> None:
        # The caller gives up after the tool ran, with its commit in flight: the commit
        # goes on (its retry stores the receipt), within commit_grace, and then the
        # cancellation does. It cut the commit short, and the record stayed pending.
        def script(kind: str, body: dict[str, Any]) -> Answer:
            if kind == "reserve":
                return 200, {}, EXECUTE
            if kind == "commit" and self.count(s, "commit") == 1:
                time.sleep(0.6)
                return error("unavailable", 503)
            return 200, {}, RECEIPT

        s = self.serve(script)

        async def main(grace: float) -> BaseException:
            async with idemkv.AsyncClient(s.addr, tenant=TENANT, commit_grace=grace, backoff_max=0.05) as a:
                async def at_once() -> Any:
                    return {"id": "LIN-1"}

                try:
                    await asyncio.wait_for(a.do(at_once, key="k", tool="t", effect={"a": 1}), 0.3)
                except BaseException as e:  # noqa: BLE001
                    return e
                raise AssertionError("the call returned")

        start = time.monotonic()
        e = asyncio.run(main(30))
        self.assertIsInstance(e, asyncio.TimeoutError)
        self.assertIsNone(idemkv.find_cause(e, idemkv.OutcomeUnknownError), "the receipt was not stored")
        self.assertEqual(self.count(s, "commit"), 2)
        self.assertGreater(time.monotonic() - start, 0.5)

        # Past commit_grace, the commit is given up: outcome unknown.
        s.bodies.clear()
        start = time.monotonic()
        e = asyncio.run(main(0.4))
        took = time.monotonic() - start
        self.assertIsInstance(e, asyncio.TimeoutError)
        self.assertIsNotNone(idemkv.find_cause(e, idemkv.OutcomeUnknownError))
        self.assertEqual(self.count(s, "commit"), 1)
        self.assertLess(took, 0.65)


class CallersTimeout(Base):
    """A caller's own timeout in a store call ends the call, as a cancellation does: it
    is not a transport error to retry."""

    def alarm(self, after: float) -> None:
        self.assertIs(threading.current_thread(), threading.main_thread(), "signals reach the main thread only")

        def expired(*_: Any) -> None:
            raise TimeoutError("the caller's own timeout")

        self.addCleanup(signal.signal, signal.SIGALRM, signal.signal(signal.SIGALRM, expired))
        self.addCleanup(signal.setitimer, signal.ITIMER_REAL, 0)
        signal.setitimer(signal.ITIMER_REAL, after)

    def test_sync_signal_timeout_in_the_reserve(self) -> None:
        def script(kind: str, body: dict[str, Any]) -> Answer:
            if kind == "reserve":
                time.sleep(1.5)
                return 200, {}, EXECUTE
            return 200, {}, RECEIPT

        s = self.serve(script)
        c = idemkv.Client(s.addr, tenant=TENANT)
        self.addCleanup(c.close)
        ran: list[int] = []
        self.alarm(0.3)
        start = time.monotonic()
        with self.assertRaises(TimeoutError) as cm:
            c.do(lambda: ran.append(1) or {"id": "LIN-1"}, key="k", tool="t", effect={"a": 1})
        self.assertLess(time.monotonic() - start, 1.2)
        self.assertEqual((ran, self.count(s, "reserve")), ([], 1))
        su = idemkv.find_cause(cm.exception, idemkv.StoreUnavailableError)
        assert su is not None, "the timeout names no attempt to retry as"
        self.assertEqual(su.attempt_id, s.bodies[0]["attempt_id"])

    def test_sync_signal_timeout_in_the_tool_is_not_the_tools_error(self) -> None:
        # The caller's alarm cuts the tool short, which may have had its effect: even
        # with TimeoutError in not_executed_on the key is not released (that said "not
        # executed" and let the next call run it again); the timeout goes on, caused by
        # OutcomeUnknownError, as an interrupt does. A TimeoutError the tool raises
        # itself is still classified.
        s = self.serve(lambda kind, body: (200, {}, EXECUTE) if kind == "reserve" else (200, {}, {"released": True}))
        c = idemkv.Client(s.addr, tenant=TENANT)
        self.addCleanup(c.close)

        def tool() -> Any:
            time.sleep(1.5)
            return {"id": "LIN-1"}

        self.alarm(0.3)
        start = time.monotonic()
        with self.assertRaises(TimeoutError) as cm:
            c.do(tool, key="k", tool="t", effect={"a": 1}, not_executed_on=(TimeoutError,))
        self.assertLess(time.monotonic() - start, 1.2)
        self.assertNotIsInstance(cm.exception, idemkv.NotExecutedError)
        self.assertIsNotNone(idemkv.find_cause(cm.exception, idemkv.OutcomeUnknownError))
        self.assertEqual([kind_of_settle(b) for b in s.bodies], ["reserve"])

        def own() -> Any:
            raise TimeoutError("connect timed out")

        s.bodies.clear()
        with self.assertRaises(idemkv.NotExecutedError):
            c.do(own, key="k", tool="t", effect={"a": 1}, not_executed_on=(TimeoutError,))
        self.assertEqual([kind_of_settle(b) for b in s.bodies], ["reserve", "release"])

    def test_sync_signal_timeout_in_the_commit(self) -> None:
        def script(kind: str, body: dict[str, Any]) -> Answer:
            if kind == "commit":
                time.sleep(1.5)
                return 200, {}, RECEIPT
            return 200, {}, EXECUTE

        s = self.serve(script)
        c = idemkv.Client(s.addr, tenant=TENANT)
        self.addCleanup(c.close)
        self.alarm(0.3)
        start = time.monotonic()
        with self.assertRaises(TimeoutError) as cm:
            c.do(lambda: {"id": "LIN-1"}, key="k", tool="t", effect={"a": 1})
        self.assertLess(time.monotonic() - start, 1.2)
        self.assertEqual(self.count(s, "commit"), 1)
        self.assertIsNotNone(idemkv.find_cause(cm.exception, idemkv.OutcomeUnknownError))

    def interrupt(self, after: float) -> threading.Thread:
        """A SIGINT (KeyboardInterrupt) for the main thread after so many seconds."""
        main = threading.get_ident()
        self.assertEqual(main, threading.main_thread().ident, "signals reach the main thread only")
        # Python's own SIGINT handler, whatever the runner installed (unittest --catch).
        self.addCleanup(signal.signal, signal.SIGINT, signal.signal(signal.SIGINT, signal.default_int_handler))

        def later() -> None:
            time.sleep(after)
            signal.pthread_kill(main, signal.SIGINT)

        t = threading.Thread(target=later, daemon=True)
        t.start()
        self.addCleanup(t.join)
        return t

    def test_sync_interrupted_in_the_commit(self) -> None:
        # The tool ran and its commit is in flight when the person at the terminal gives
        # up: the interrupt goes on, caused by the error that says the outcome is not
        # stored. It came with no such cause, as if nothing had run.
        def script(kind: str, body: dict[str, Any]) -> Answer:
            if kind == "commit":
                time.sleep(1.5)
                return 200, {}, RECEIPT
            return 200, {}, EXECUTE

        s = self.serve(script)
        c = idemkv.Client(s.addr, tenant=TENANT)
        self.addCleanup(c.close)
        ran: list[int] = []
        self.interrupt(0.3)
        start = time.monotonic()
        with self.assertRaises(KeyboardInterrupt) as cm:
            c.do(lambda: ran.append(1) or {"id": "LIN-1"}, key="k", tool="t", effect={"a": 1})
        self.assertLess(time.monotonic() - start, 1.2)
        self.assertEqual((ran, self.count(s, "commit")), ([1], 1))
        ou = idemkv.find_cause(cm.exception, idemkv.OutcomeUnknownError)
        assert ou is not None, "the interrupt does not say that the tool ran and its outcome was not stored"
        self.assertIn("LIN-1", str(ou))
        self.assertIsNone(idemkv.find_cause(cm.exception, idemkv.StoreUnavailableError))

    def test_sync_interrupted_in_the_tool(self) -> None:
        # As an async tool cancelled: the effect may have happened, and is not stored.
        s = self.serve(lambda kind, body: (200, {}, EXECUTE) if kind == "reserve" else (200, {}, RECEIPT))
        c = idemkv.Client(s.addr, tenant=TENANT)
        self.addCleanup(c.close)
        self.interrupt(0.2)
        with self.assertRaises(KeyboardInterrupt) as cm:
            c.do(lambda: time.sleep(2) or {"id": "LIN-1"}, key="k", tool="t", effect={"a": 1})
        self.assertEqual(self.count(s, "commit"), 0)
        self.assertIsNotNone(idemkv.find_cause(cm.exception, idemkv.OutcomeUnknownError))

    def test_async_timeout_in_the_reserve(self) -> None:
        def script(kind: str, body: dict[str, Any]) -> Answer:
            time.sleep(1.5)
            return 200, {}, EXECUTE

        s = self.serve(script)

        async def main() -> BaseException:
            async with idemkv.AsyncClient(s.addr, tenant=TENANT) as a:
                async def tool() -> Any:
                    return {"id": "LIN-1"}

                try:
                    await asyncio.wait_for(a.do(tool, key="k", tool="t", effect={"a": 1}), 0.3)
                except BaseException as e:  # noqa: BLE001
                    return e
                raise AssertionError("the call returned")

        e = asyncio.run(main())
        self.assertIsInstance(e, asyncio.TimeoutError)
        self.assertIsNotNone(idemkv.find_cause(e, idemkv.StoreUnavailableError))

    def test_async_cancelled_as_the_attempt_ends(self) -> None:
        # The caller's cancellation and the end of the reserve's attempt come in the same
        # turn of the event loop: asyncio.wait_for (3.11) hands back the attempt's
        # failure or answer, not the cancellation. The failure was retried as a
        # transport error, and the tool ran, as it did on the answer, for a caller
        # that had given up.
        for fails in (True, False):
            self.cancelled_as_the_attempt_ends(fails)

    def cancelled_as_the_attempt_ends(self, fails: bool) -> None:
        s = self.serve(lambda kind, body: (200, {}, EXECUTE) if kind == "reserve" else (200, {}, RECEIPT))
        ran: list[int] = []

        async def main() -> Optional[BaseException]:
            async with idemkv.AsyncClient(s.addr, tenant=TENANT, backoff_min=0.01, backoff_max=0.01) as a:
                real = a._attempt
                caller: list[asyncio.Task[Any]] = []

                async def attempt(base: str, call: Any, body: Optional[bytes], *rest: Any) -> Any:
                    if len(caller) == 1:
                        caller.pop().cancel()
                        if fails:
                            raise ConnectionResetError("reset as the caller gave up")
                        return dict(EXECUTE)  # the answer, in the same turn
                    return await real(base, call, body, *rest)

                a._attempt = attempt  # type: ignore[method-assign]

                async def tool() -> Any:
                    ran.append(1)
                    return {"id": "LIN-1"}

                async def call() -> Optional[BaseException]:
                    try:
                        await a.do(tool, key="k", tool="t", effect={"a": 1})
                    except asyncio.CancelledError as e:
                        return e
                    return None

                task = asyncio.ensure_future(call())
                caller.append(task)
                return await task

        e = asyncio.run(main())
        self.assertEqual(ran, [], f"the tool ran after its caller was cancelled (the attempt failed: {fails})")
        self.assertIsInstance(e, asyncio.CancelledError)
        self.assertIsNotNone(idemkv.find_cause(e, idemkv.StoreUnavailableError))


if __name__ == "__main__":
    unittest.main()
