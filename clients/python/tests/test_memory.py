"""The in-memory store (idemkv.testing) decides as the server does: the scenarios of
testdata/decisions, which the Go tests hold to the server's own decision functions, and
the tool-call loop over it (issue 24, point 9)."""

from __future__ import annotations

import json
import os
import unittest
from typing import Any, Optional

import harness
import idemkv
import idemkv.testing

VECTORS = os.path.join(harness.repo_root(), "testdata", "decisions", "vectors.json")
FPS = {"A": "sha256:" + "a0" * 32, "B": "sha256:" + "b1" * 32}
START = 1_800_000_000_000


class DecisionVectors(unittest.TestCase):
    def test_scenarios(self) -> None:
        with open(VECTORS, encoding="utf-8") as f:
            scenarios = json.load(f)["scenarios"]
        steps = 0
        for sc in scenarios:
            with self.subTest(sc["name"]):
                at = [0]
                store = idemkv.testing.MemoryStore(clock=lambda: START + at[0])
                kv = idemkv.testing.MemoryClient(store, tenant="acme")
                fences: list[int] = []
                for i, s in enumerate(sc["steps"]):
                    at[0] = s["at"]
                    steps += 1
                    self.step(kv, store, s, fences, f"{sc['name']}, step {i}")
        self.assertGreaterEqual(steps, 40)
        print(f"\nin-memory store: {len(scenarios)} decision scenarios, {steps} steps, as the server decides them")

    def step(self, kv: Any, store: Any, s: dict[str, Any], fences: list[int], where: str) -> None:
        fp = FPS[s.get("fp", "A")]
        fence = fences[-1] if fences else 1
        if s.get("fence") == "previous" and len(fences) > 1:
            fence = fences[-2]
        elif s.get("fence") == "never":
            fence += 1000
        lease = s.get("lease_ms", 30000) / 1000
        want = s["want"]
        res: Optional[dict[str, Any]] = None
        try:
            call = s["call"]
            if call == "reserve":
                res = kv.reserve("acme", "k", s.get("tool", "create_ticket"), fingerprint=fp, attempt_id=s["attempt"],
                                 lease_ttl=lease, ttl=s.get("ttl_ms", 86400000) / 1000)
            elif call == "commit":
                kv.commit("acme", "k", fp, fence, "tickets", s["remote_id"])
            elif call == "fail":
                kv.fail("acme", "k", fp, fence, s["code"], "failed")
            elif call == "release":
                kv._send(idemkv._core.release_call("acme", "k", fp, fence))
            elif call == "heartbeat":
                kv.heartbeat("acme", "k", fence, lease)
            elif call == "doubt":
                kv.doubt("acme", "k", fp, fence)
            elif call == "resolve":
                kw = {"remote_system": "tickets", "remote_id": s["remote_id"]} if s["outcome"] == "committed" else {}
                kv.resolve("acme", "k", fp, s["outcome"], **kw)
            elif call == "get":
                kv.get("acme", "k")
            err = ""
        except idemkv.APIError as e:
            err = e.code
        self.assertEqual(err, want.get("error", ""), where)
        if res is not None:
            self.assertEqual(res["decision"], want["decision"], where)
            if want.get("fence") == "new":
                self.assertTrue(res["fence"] > (fences[-1] if fences else 0), where)
                fences.append(res["fence"])
            elif want.get("fence") == "same":
                self.assertEqual(res["fence"], fences[-1], where)
        live = {r["idempotency_key"]: r for r in store.records()}.get("k")
        if "status" in want:
            self.assertEqual(live["status"] if live else "absent", want["status"], where)
        if "in_doubt" in want:
            self.assertEqual(bool(live and live.get("in_doubt")), want["in_doubt"], where)
        if "remote_id" in want:
            self.assertEqual(((live or {}).get("receipt") or {}).get("remote_id"), want["remote_id"], where)
        if "attempts" in want:
            self.assertEqual((live or {}).get("attempts"), want["attempts"], where)


class LoopOverMemory(unittest.TestCase):
    """A runtime's unit test: the wrapper over the in-memory store, no node."""

    def test_a_tool_that_requires_approval_is_refused_not_run(self) -> None:
        kv = idemkv.testing.MemoryClient(tenant="acme")
        ran: list[int] = []
        with self.assertRaises(idemkv.NotExecutedError) as cm:
            kv.do(lambda: ran.append(1), key="k", tool="refund", effect={"order": 1},
                  approval=idemkv.ApprovalRequirement(summary="Refund"))
        self.assertIn("does not model approvals", str(cm.exception))
        self.assertEqual(ran, [])

    def test_replay_conflict_and_recovery(self) -> None:
        kv = idemkv.testing.MemoryClient(tenant="acme", lease_ttl=5)
        made: list[str] = []

        def find(title: str) -> Optional[dict[str, str]]:
            return {"id": "LIN-1"} if made else None

        @kv.idempotent(key="title", tool="create_ticket", probe=find)
        def create(title: str) -> dict[str, str]:
            made.append(title)
            return {"id": "LIN-1"}

        self.assertEqual(create("Outage X"), create("Outage X"))
        self.assertEqual(len(made), 1)
        # A worker that died after its effect: the next attempt, once the lease ran out,
        # finds it through the probe instead of creating a second ticket.
        res = kv.reserve("acme", "Outage Y:create_ticket", "create_ticket",
                         fingerprint=idemkv.fingerprint({"title": "Outage Y"}), lease_ttl=5)
        self.assertEqual(res["decision"], "execute")
        made.append("Outage Y")
        kv.store.advance(6)
        out = idemkv.idempotent(create.__wrapped__, key="title", tool="create_ticket", probe=find, client=kv,
                                outcome=True)("Outage Y")
        self.assertTrue(out.probed)
        self.assertEqual(made, ["Outage X", "Outage Y"])
        with self.assertRaises(idemkv.ConflictError):
            idemkv.idempotent(lambda title, severity: {"id": "x"}, key=lambda title, severity: f"{title}:create_ticket",
                              tool="create_ticket", client=kv)("Outage X", "sev1")

    def test_methods(self) -> None:
        kv = idemkv.testing.MemoryClient(tenant="acme")

        class Agent:
            def __init__(self) -> None:
                self.made = 0

            @kv.idempotent(key=lambda self, title: f"{title}:create_ticket", tool="create_ticket",
                           probe=lambda self, title: None)
            def create(self, title: str) -> dict[str, str]:
                self.made += 1
                return {"id": "LIN-1"}

        a = Agent()
        self.assertEqual(a.create("x"), a.create("x"))
        self.assertEqual(a.made, 1)

    def test_set_passthrough(self) -> None:
        @idemkv.idempotent(tool="t")
        def f(x: int) -> int:
            return x + 1

        idemkv.set_passthrough(True)
        try:
            self.assertEqual(f(1), 2)
        finally:
            idemkv.set_passthrough(False)
        with self.assertRaises(idemkv.NotExecutedError):
            f(1)

    def test_async_over_memory(self) -> None:
        import asyncio

        kv = idemkv.testing.MemoryClient(tenant="acme")
        runs: list[int] = []

        @kv.idempotent(key="n", tool="count")
        async def count(n: int) -> dict[str, int]:
            runs.append(n)
            return {"id": n}

        async def main() -> list[Any]:
            return await asyncio.gather(*(count(1) for _ in range(5)))

        self.assertEqual(asyncio.run(main()), [{"id": 1}] * 5)
        self.assertEqual(runs, [1])


if __name__ == "__main__":
    unittest.main()
