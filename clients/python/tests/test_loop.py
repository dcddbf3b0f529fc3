"""The tool-call loop against a real node: replay, conflict, races, failures, waits,
recovery, heartbeats, for the sync Client and the AsyncClient alike."""

from __future__ import annotations

import asyncio
import threading
import time
import unittest
from typing import Any

import harness
import idemkv

TENANT = "acme"


def ticket_effect(args: dict[str, Any]) -> dict[str, Any]:
    return {"project": args["project"], "title": args["title"]}


class Downstream:
    """A ticket system that counts the tickets it made (the effects)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.tickets: dict[str, dict[str, Any]] = {}
        self.calls = 0
        self.lock = threading.Lock()

    def create(self, args: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.calls += 1
        time.sleep(self.delay)
        with self.lock:
            tid = f"LIN-{len(self.tickets) + 1}"
            t = {"id": tid, "title": args["title"], "url": f"https://linear.example/{tid}", "ext": args["ext"]}
            self.tickets[tid] = t
            return t

    def find(self, args: dict[str, Any]) -> Any:
        with self.lock:
            for t in self.tickets.values():
                if t["ext"] == args["ext"]:
                    return t
        return None


def args_for(key: str) -> dict[str, Any]:
    return {"conversation": key, "project": "OPS", "title": "Outage X", "ext": key}


class Base(unittest.TestCase):
    def setUp(self) -> None:
        self.node = harness.shared_node()
        self.client = idemkv.Client(self.node.http, tenant=TENANT, lease_ttl=30)
        self.addCleanup(self.client.close)
        self.key = harness.unique("conv")


class SyncLoop(Base):
    def test_replay_does_not_call_the_function(self) -> None:
        ds = Downstream()

        @self.client.idempotent(key=lambda a: a["conversation"] + ":create_ticket", effect=ticket_effect,
                                tool="create_ticket", side_effect="non_idempotent", probe=ds.find)
        def create_ticket(args: dict[str, Any]) -> dict[str, Any]:
            return ds.create(args)

        a = args_for(self.key)
        first = create_ticket(a)
        second = create_ticket(dict(a, trace_id="other"))  # volatile fields are not in the effect
        self.assertEqual(ds.calls, 1)
        self.assertEqual(first, second)
        self.assertEqual(second["id"], "LIN-1")
        rec = self.client.get(TENANT, self.key + ":create_ticket")
        assert rec is not None
        self.assertEqual((rec["status"], rec["receipt"]["remote_id"], rec["attempts"]), ("committed", "LIN-1", 1))
        print(f"\nreplay: 2 calls, {ds.calls} effect, both returned {second['id']}")

    def test_function_form_and_outcome(self) -> None:
        calls = []

        def tool() -> idemkv.Result:
            calls.append(1)
            return idemkv.Result("linear", "LIN-7", "https://linear.example/LIN-7", {"n": 1})

        out = self.client.do(tool, key=self.key, tool="create_ticket", effect={"t": 1})
        again = self.client.do(tool, key=self.key, tool="create_ticket", effect={"t": 1})
        self.assertEqual((out.decision, out.replayed, out.attempts), ("execute", False, 1))
        self.assertEqual((again.decision, again.replayed, again.value), ("replay", True, {"n": 1}))
        self.assertEqual(again.receipt["remote_id"], "LIN-7")
        self.assertEqual(len(calls), 1)

    def test_conflict(self) -> None:
        self.client.do(lambda: {"id": "A"}, key=self.key, tool="create_ticket", effect={"title": "a"})
        ran = []
        with self.assertRaises(idemkv.ConflictError) as cm:
            self.client.do(lambda: ran.append(1), key=self.key, tool="create_ticket", effect={"title": "b"})
        e = cm.exception
        self.assertEqual((e.kind, e.decision, e.conflict["reason"]),
                         ("conflict", "conflict", "idempotency_key_reused_with_different_effect"))
        self.assertEqual(e.conflict["existing_remote_id"], "A")
        self.assertEqual(ran, [])

    def test_racing_threads_one_effect(self) -> None:
        ds = Downstream(delay=0.4)
        create = idemkv.idempotent(ds.create, client=self.client, key=lambda a: a["conversation"],
                                   effect=ticket_effect, tool="create_ticket", probe=ds.find)
        results: list[Any] = []
        errors: list[BaseException] = []

        def worker() -> None:
            try:
                results.append(create(args_for(self.key)))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(len(ds.tickets), 1)
        self.assertEqual({r["id"] for r in results}, {"LIN-1"})
        print(f"\nracing threads: 8 callers, {len(ds.tickets)} effect, all got {results[0]['id']}")

    def test_permanent_failure_stored_and_replayed(self) -> None:
        calls = []

        def tool() -> Any:
            calls.append(1)
            raise idemkv.Permanent("project OPS is archived", code="project_archived", details={"project": "OPS"})

        with self.assertRaises(idemkv.StoredFailureError) as first:
            self.client.do(tool, key=self.key, tool="create_ticket", effect={"p": "OPS"})
        with self.assertRaises(idemkv.StoredFailureError) as second:
            self.client.do(tool, key=self.key, tool="create_ticket", effect={"p": "OPS"})
        self.assertEqual(len(calls), 1)
        self.assertFalse(first.exception.replayed)
        self.assertIsInstance(first.exception.cause, idemkv.Permanent)
        self.assertTrue(second.exception.replayed)
        self.assertEqual((second.exception.kind, second.exception.code), ("stored_failure", "project_archived"))
        self.assertEqual(second.exception.receipt["error"]["details"], {"project": "OPS"})

    def test_not_executed_releases(self) -> None:
        calls = []

        def refused() -> Any:
            calls.append(1)
            raise idemkv.NotExecuted("rate limited before sending")

        with self.assertRaises(idemkv.NotExecutedError) as cm:
            self.client.do(refused, key=self.key, tool="create_ticket", effect={"p": 1})
        self.assertEqual(cm.exception.kind, "not_executed")
        self.assertIsNone(self.client.get(TENANT, self.key))  # released
        out = self.client.do(lambda: {"id": "LIN-2"}, key=self.key, tool="create_ticket", effect={"p": 1})
        self.assertEqual((out.decision, out.receipt["remote_id"]), ("execute", "LIN-2"))

    def test_other_error_leaves_pending_then_probe_recovers(self) -> None:
        # The tool's request left but its answer was lost: the effect happened, the
        # error says nothing. The record stays pending; after the lease, the next
        # attempt waits, recovers, asks the probe, and commits what it finds.
        ds = Downstream()

        def flaky(args: dict[str, Any]) -> Any:
            ds.create(args)
            raise ConnectionResetError("answer lost")

        key = lambda a: a["conversation"]  # noqa: E731
        first = idemkv.idempotent(flaky, client=self.client, key=key, effect=ticket_effect, tool="create_ticket",
                                  probe=ds.find, lease_ttl=1)
        with self.assertRaises(idemkv.OutcomeUnknownError) as cm:
            first(args_for(self.key))
        self.assertIsInstance(cm.exception.cause, ConnectionResetError)
        rec = self.client.get(TENANT, self.key)
        assert rec is not None
        self.assertEqual(rec["status"], "pending")

        retry = idemkv.idempotent(ds.create, client=self.client, key=key, effect=ticket_effect, tool="create_ticket",
                                  probe=ds.find, lease_ttl=1, outcome=True)
        start = time.monotonic()
        out = retry(args_for(self.key))
        self.assertEqual((out.decision, out.probed, out.attempts), ("recover", True, 2))
        self.assertEqual(len(ds.tickets), 1)
        self.assertEqual(out.receipt["remote_id"], "LIN-1")
        print(f"\nrecover with probe: waited {time.monotonic() - start:.2f}s for the 1s lease, probe found "
              f"{out.receipt['remote_id']}, {len(ds.tickets)} effect")

    def test_probe_not_found_executes(self) -> None:
        self.client.reserve(TENANT, self.key, "create_ticket", fingerprint=idemkv.fingerprint({"p": 1}), lease_ttl=1)
        ds = Downstream()
        out = self.client.do(lambda: ds.create(args_for(self.key)), key=self.key, tool="create_ticket",
                             effect={"p": 1}, probe=lambda: ds.find(args_for(self.key)))
        self.assertEqual((out.decision, out.probed, len(ds.tickets)), ("recover", False, 1))

    def test_idempotent_tool_reexecutes_on_recover(self) -> None:
        self.client.reserve(TENANT, self.key, "set_status", fingerprint=idemkv.fingerprint({"s": "done"}),
                            lease_ttl=1)
        out = self.client.do(lambda: {"id": "T-1"}, key=self.key, tool="set_status", effect={"s": "done"},
                             side_effect="idempotent")
        self.assertEqual((out.decision, out.receipt["remote_id"]), ("recover", "T-1"))

    def test_idempotent_rerun_not_executed_keeps_the_key(self) -> None:
        # The dead attempt may have run the tool; the re-run's "not executed" says
        # nothing about it, so the key must stay pending, not be released (a release
        # would let other arguments take the key: two effects on one key).
        self.client.reserve(TENANT, self.key, "set_status", fingerprint=idemkv.fingerprint({"s": "done"}),
                            lease_ttl=1)

        def refuse() -> Any:
            raise idemkv.NotExecuted("downstream refused the re-run")

        with self.assertRaises(idemkv.OutcomeUnknownError):
            self.client.do(refuse, key=self.key, tool="set_status", effect={"s": "done"}, side_effect="idempotent")
        rec = self.client.get(TENANT, self.key)
        self.assertIsNotNone(rec)
        self.assertEqual(rec["status"], "pending")

    def test_heartbeat_keeps_the_lease(self) -> None:
        seen: list[str] = []

        def slow() -> Any:
            # Over two lease lengths: without heartbeats another attempt would recover.
            deadline = time.monotonic() + 4.5
            while time.monotonic() < deadline:
                time.sleep(0.4)
                r = self.client.reserve(TENANT, self.key, "create_ticket", fingerprint=idemkv.fingerprint({"x": 1}))
                seen.append(r["decision"])
            lease = idemkv.current_lease()
            assert lease is not None and not lease.lost.is_set()
            return {"id": "LIN-9"}

        out = self.client.do(slow, key=self.key, tool="create_ticket", effect={"x": 1}, lease_ttl=2)
        self.assertEqual((out.decision, out.attempts), ("execute", 1))
        self.assertTrue(seen and set(seen) == {"in_progress"}, seen)

    def test_read_only_runs_directly(self) -> None:
        out = self.client.do(lambda: 42, key=self.key, tool="search", side_effect="read_only")
        self.assertEqual(out.value, 42)
        self.assertIsNone(self.client.get(TENANT, self.key))
        with self.assertRaises(idemkv.NotExecutedError):
            self.client.do(lambda: 1 / 0, key=self.key, tool="search", side_effect="read_only")

    def test_invalid_calls_are_not_executed(self) -> None:
        ran = []
        with self.assertRaises(idemkv.NotExecutedError) as cm:
            self.client.do(lambda: ran.append(1), key=self.key, tool="t", effect={"id": 2**60 + 1})
        self.assertIsInstance(cm.exception.cause, idemkv.FingerprintError)
        with self.assertRaises(idemkv.NotExecutedError):
            self.client.do(lambda: ran.append(1), key=self.key, tool="t", effect={"a": 1}, side_effect="sometimes")
        self.assertEqual(ran, [])

    def test_wait_gives_up_at_the_deadline(self) -> None:
        self.client.reserve(TENANT, self.key, "t", fingerprint=idemkv.fingerprint({"a": 1}), lease_ttl=30)
        start = time.monotonic()
        with self.assertRaises(idemkv.NotExecutedError) as cm:
            self.client.do(lambda: 1, key=self.key, tool="t", effect={"a": 1}, deadline=0.6)
        self.assertEqual(cm.exception.decision, "in_progress")
        self.assertLess(time.monotonic() - start, 5)


class AsyncLoop(Base):
    def test_replay_and_racing_tasks(self) -> None:
        ds = Downstream()
        made = []

        async def main() -> None:
            aclient = idemkv.AsyncClient(self.node.http, tenant=TENANT)

            @idemkv.idempotent(client=aclient, key=lambda a: a["conversation"], effect=ticket_effect,
                               tool="create_ticket", probe=ds.find)
            async def create_ticket(args: dict[str, Any]) -> dict[str, Any]:
                made.append(1)
                await asyncio.sleep(0.4)
                return ds.create(args)

            results = await asyncio.gather(*(create_ticket(args_for(self.key)) for _ in range(8)))
            self.assertEqual({r["id"] for r in results}, {"LIN-1"})
            again = await create_ticket(args_for(self.key))
            self.assertEqual(again["id"], "LIN-1")
            await aclient.close()

        asyncio.run(main())
        self.assertEqual((len(made), len(ds.tickets)), (1, 1))
        print(f"\nracing tasks: 9 calls, {len(ds.tickets)} effect")

    def test_async_failures_and_heartbeat(self) -> None:
        async def main() -> None:
            a = self.client.aio()
            with self.assertRaises(idemkv.StoredFailureError):
                async def perm() -> Any:
                    raise idemkv.Permanent("no", code="bad")
                await a.do(perm, key=self.key, tool="t", effect={"a": 1})
            with self.assertRaises(idemkv.StoredFailureError) as cm:
                await a.do(perm, key=self.key, tool="t", effect={"a": 1})
            self.assertTrue(cm.exception.replayed)

            k2 = self.key + ":slow"

            async def slow() -> Any:
                await asyncio.sleep(4.5)  # over two leases
                return {"id": "S-1"}

            out = await a.do(slow, key=k2, tool="t", effect={"a": 2}, lease_ttl=2)
            self.assertEqual((out.decision, out.attempts), ("execute", 1))
            await a.close()

        asyncio.run(main())

    def test_lost_lease_cancels_the_task(self) -> None:
        # The event loop stalls past the lease (a blocking call in some other task), a
        # second worker recovers the key meanwhile, and when the loop runs again the
        # heartbeat learns it is fenced and cancels the tool.
        fp = idemkv.fingerprint({"a": 3})
        took_over = threading.Event()

        def thief() -> None:
            with idemkv.Client(self.node.http) as other:
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    r = other.reserve(TENANT, self.key, "t", fingerprint=fp, lease_ttl=60)
                    if r["decision"] == "recover":
                        took_over.set()
                        return
                    time.sleep(0.05)

        async def main() -> None:
            a = idemkv.AsyncClient(self.node.http, tenant=TENANT)
            cancelled = asyncio.Event()

            async def tool() -> Any:
                threading.Thread(target=thief, daemon=True).start()
                await asyncio.sleep(0.1)
                # The stall: the loop is blocked (no heartbeat can run) until the other
                # worker has recovered the key, however long the 1 s lease takes to lapse.
                took_over.wait(15)
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    cancelled.set()
                    raise
                return {"id": "never"}

            start = time.monotonic()
            with self.assertRaises(idemkv.OutcomeUnknownError) as cm:
                await a.do(tool, key=self.key, tool="t", effect={"a": 3}, lease_ttl=1)
            self.assertLess(time.monotonic() - start, 20)
            self.assertTrue(cancelled.is_set())
            self.assertIn("lost", str(cm.exception))
            await a.close()

        asyncio.run(main())
        self.assertTrue(took_over.is_set())


if __name__ == "__main__":
    unittest.main()
