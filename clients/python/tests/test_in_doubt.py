"""In doubt: a recovered attempt of a non-idempotent tool without a probe marks the
record in doubt; retries answer in_doubt at once and never re-lease it; a resolve (the
client's, or ``idemkv resolve``) settles it; a probe settles it by itself."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
import unittest
from typing import Any

import harness
import idemkv

TENANT = "acme"
EFFECT = {"project": "OPS", "title": "Outage X"}


class InDoubt(unittest.TestCase):
    def setUp(self) -> None:
        self.node = harness.shared_node()
        self.c = idemkv.Client(self.node.http, tenant=TENANT)
        self.addCleanup(self.c.close)
        self.key = harness.unique("doubt")
        self.fp = idemkv.fingerprint(EFFECT)
        self.ran: list[int] = []

    def tool(self) -> dict[str, str]:
        self.ran.append(1)
        return {"id": "LIN-new"}

    def dead_attempt(self) -> None:
        """An attempt that reserved and died: its 1 s lease runs out, nobody commits."""
        r = self.c.reserve(TENANT, self.key, "create_ticket", fingerprint=self.fp, lease_ttl=1)
        self.assertEqual(r["decision"], "execute")

    def make_in_doubt(self) -> dict[str, Any]:
        self.dead_attempt()
        with self.assertRaises(idemkv.InDoubtError) as cm:
            self.c.do(self.tool, key=self.key, tool="create_ticket", effect=EFFECT)
        e = cm.exception
        self.assertEqual((e.kind, e.decision), ("in_doubt", "recover"))
        assert e.record is not None
        self.assertTrue(e.record.get("in_doubt"), e.record)
        self.assertEqual(self.ran, [])
        return dict(e.record)

    def test_marked_then_answered_at_once_without_re_leasing(self) -> None:
        rec = self.make_in_doubt()
        self.assertIn("in_doubt_since", rec)
        start = time.monotonic()
        for _ in range(3):
            with self.assertRaises(idemkv.InDoubtError):
                self.c.do(self.tool, key=self.key, tool="create_ticket", effect=EFFECT)
        took = time.monotonic() - start
        self.assertLess(took, 3.0)  # no waiting for a lease: there is none (measured: ~10 ms)
        after = self.c.get(TENANT, self.key)
        assert after is not None
        self.assertEqual((after["fence"], after["attempts"], after["in_doubt"]), (rec["fence"], rec["attempts"], True))
        listed = self.c.list(TENANT, prefix=self.key, in_doubt=True)["records"]
        self.assertEqual([r["idempotency_key"] for r in listed], [self.key])
        self.assertEqual(self.ran, [])
        print(f"\nin doubt: 3 retries answered in_doubt in {took * 1000:.0f} ms, fence {after['fence']} and "
              f"attempts {after['attempts']} unchanged, the tool never ran")

    def test_resolve_committed_then_replay(self) -> None:
        self.make_in_doubt()
        receipt = self.c.resolve(TENANT, self.key, self.fp, "committed", remote_system="linear",
                                 remote_id="LIN-found", result={"by": "operator"})
        self.assertEqual((receipt["status"], receipt["remote_id"]), ("committed", "LIN-found"))
        out = self.c.do(self.tool, key=self.key, tool="create_ticket", effect=EFFECT)
        self.assertEqual((out.decision, out.receipt["remote_id"], out.value), ("replay", "LIN-found", {"by": "operator"}))
        self.assertEqual(self.ran, [])
        with self.assertRaises(idemkv.APIError) as cm:  # only an in-doubt record can be resolved
            self.c.resolve(TENANT, self.key, self.fp, "not_executed")
        self.assertEqual(cm.exception.code, "not_pending")

    def test_resolve_not_executed_with_the_cli_then_execute(self) -> None:
        self.make_in_doubt()
        cli = subprocess.run([harness.binary(), "resolve", TENANT, self.key, "--not-executed", "--endpoint",
                              self.node.http], capture_output=True, text=True, timeout=30)
        self.assertEqual(cli.returncode, 0, cli.stderr)
        self.assertIsNone(self.c.get(TENANT, self.key))
        out = self.c.do(self.tool, key=self.key, tool="create_ticket", effect=EFFECT)
        self.assertEqual((out.decision, out.receipt["remote_id"], len(self.ran)), ("execute", "LIN-new", 1))

    def test_a_probe_settles_it_found(self) -> None:
        self.make_in_doubt()
        out = self.c.do(self.tool, key=self.key, tool="create_ticket", effect=EFFECT,
                        probe=lambda: {"id": "LIN-downstream"})
        self.assertEqual((out.decision, out.probed, out.receipt["remote_id"]), ("recover", True, "LIN-downstream"))
        self.assertEqual(self.ran, [])
        again = self.c.do(self.tool, key=self.key, tool="create_ticket", effect=EFFECT)
        self.assertEqual((again.decision, again.receipt["remote_id"]), ("replay", "LIN-downstream"))

    def test_a_stale_probe_settles_only_the_doubt_it_looked_at(self) -> None:
        # B probes (nothing yet) and its answer takes a while; meanwhile A settles the
        # same doubt, creates the ticket and dies, and C marks the key in doubt again.
        # B's "not found" is about the old doubt: released on it, the key ran twice.
        self.make_in_doubt()
        created: list[str] = []
        probing, proceed = threading.Event(), threading.Event()
        probes: list[int] = []

        def look() -> Any:
            return {"id": created[0]} if created else None

        def slow_probe() -> Any:
            seen = look()
            probes.append(1)
            if len(probes) == 1:
                probing.set()
                proceed.wait(20)
            return seen

        def b_tool() -> dict[str, str]:
            created.append("LIN-B")
            return {"id": "LIN-B"}

        out: list[Any] = []

        def b() -> None:
            try:
                out.append(self.c.do(b_tool, key=self.key, tool="create_ticket", effect=EFFECT, probe=slow_probe))
            except Exception as e:  # reported below
                out.append(e)

        tb = threading.Thread(target=b)
        tb.start()
        self.assertTrue(probing.wait(20))

        def a_tool() -> Any:
            created.append("LIN-A")
            raise TimeoutError("POST /tickets: timed out")

        with self.assertRaises(idemkv.OutcomeUnknownError):
            self.c.do(a_tool, key=self.key, tool="create_ticket", effect=EFFECT, probe=look, lease_ttl=1)
        with self.assertRaises(idemkv.InDoubtError):
            self.c.do(self.tool, key=self.key, tool="create_ticket", effect=EFFECT)
        proceed.set()
        tb.join(20)
        self.assertEqual(created, ["LIN-A"], f"tickets for one operation (B: {out})")
        self.assertEqual(len(out), 1, out)
        o = out[0]
        self.assertIsInstance(o, idemkv.Outcome, o)
        self.assertTrue(o.probed, o)
        self.assertEqual(o.value, {"id": "LIN-A"}, o)

    def test_a_probe_settles_it_not_found(self) -> None:
        self.make_in_doubt()
        out = self.c.do(self.tool, key=self.key, tool="create_ticket", effect=EFFECT, probe=lambda: None)
        self.assertEqual((out.decision, out.receipt["remote_id"], len(self.ran)), ("execute", "LIN-new", 1))

    def test_a_failing_probe_leaves_it_in_doubt(self) -> None:
        self.make_in_doubt()

        def probe() -> Any:
            raise ConnectionError("ticket API down")

        with self.assertRaises(idemkv.InDoubtError) as cm:
            self.c.do(self.tool, key=self.key, tool="create_ticket", effect=EFFECT, probe=probe)
        self.assertIsInstance(cm.exception.cause, ConnectionError)
        rec = self.c.get(TENANT, self.key)
        assert rec is not None
        self.assertTrue(rec["in_doubt"])

    def test_async(self) -> None:
        self.make_in_doubt()

        async def main() -> None:
            async with idemkv.AsyncClient(self.node.http, tenant=TENANT) as a:
                async def tool() -> Any:
                    self.ran.append(1)
                    return {"id": "A-1"}

                with self.assertRaises(idemkv.InDoubtError):
                    await a.do(tool, key=self.key, tool="create_ticket", effect=EFFECT)

                async def probe() -> Any:
                    return idemkv.Result("linear", "LIN-async", result={"found": True})

                out = await a.do(tool, key=self.key, tool="create_ticket", effect=EFFECT, probe=probe)
                self.assertEqual((out.decision, out.probed, out.receipt["remote_id"], out.value),
                                 ("recover", True, "LIN-async", {"found": True}))

        asyncio.run(main())
        self.assertEqual(self.ran, [])


if __name__ == "__main__":
    unittest.main()
