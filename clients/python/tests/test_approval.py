"""Approvals bound to the effect (docs/protocol.md section 7) against a real node with
tokens: an agent's client token asks, an approver token decides."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
import unittest
from typing import Any

import harness
import idemkv

TENANT = "shop"


def _hash(token: str) -> str:
    return subprocess.run([harness.binary(), "auth", "hash-token", token], check=True, capture_output=True,
                          text=True).stdout.strip()


class Approvals(unittest.TestCase):
    node: harness.Node
    agent_token = "agent-" + os.urandom(8).hex()
    approver_token = "approver-" + os.urandom(8).hex()

    @classmethod
    def setUpClass(cls) -> None:
        d = os.path.join(harness._tmp, "approvals-" + os.urandom(4).hex())
        os.makedirs(d)
        tokens = os.path.join(d, "tokens.json")
        with open(tokens, "w") as f:
            json.dump({"tokens": [
                {"name": "agent-1", "hash": _hash(cls.agent_token), "role": "client", "tenants": [TENANT]},
                {"name": "ana", "hash": _hash(cls.approver_token), "role": "approver", "tenants": [TENANT]},
            ]}, f)
        cls.node = harness.Node("approvals", extra=["--auth-file", tokens]).start().wait_ready()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.node.kill()

    def setUp(self) -> None:
        self.agent = idemkv.Client(self.node.http, tenant=TENANT, token=self.agent_token)
        self.approver = idemkv.Client(self.node.http, token=self.approver_token)
        self.addCleanup(self.agent.close)
        self.addCleanup(self.approver.close)
        self.ran: list[tuple[str, int]] = []
        self.order = harness.unique("order")

    def refund_tool(self, client: Any, wait: float = 0.0) -> Any:
        @idemkv.idempotent(client=client, tool="refund", key="order", remote_system="payments",
                           approval=idemkv.ApprovalRequirement(
                               ttl=3600, wait=wait, summary=lambda order, amount: f"Refund {amount} EUR to {order}"))
        def refund(order: str, amount: int) -> dict[str, Any]:
            self.ran.append((order, amount))
            return {"id": f"re_{len(self.ran)}", "amount": amount}

        return refund

    def waiting(self, key: str) -> list[dict[str, Any]]:
        return [r for r in self.approver.iter_approvals(TENANT) if r["idempotency_key"] == key]

    def test_suspend_and_resume_shows_one_card_and_runs_once(self) -> None:
        refund = self.refund_tool(self.agent)
        key = f"{self.order}:refund"
        ids = set()
        for _ in range(3):  # the runtime suspends, is resumed, suspends again
            with self.assertRaises(idemkv.ApprovalPendingError) as cm:
                refund(self.order, 40)
            p = cm.exception
            self.assertEqual(p.kind, "approval_pending")
            self.assertEqual((p.tenant, p.key, p.summary), (TENANT, key, f"Refund 40 EUR to {self.order}"))
            self.assertTrue(p.approval_id.startswith("apr_"), p.approval_id)
            self.assertTrue(p.expires_at and p.requested_at, p.approval)
            self.assertEqual(p.fingerprint, idemkv.fingerprint({"order": self.order, "amount": 40}))
            ids.add(p.approval_id)
        self.assertEqual(len(ids), 1, "a resume asked for a second approval")
        self.assertEqual(self.ran, [])

        cards = self.waiting(key)
        self.assertEqual(len(cards), 1, cards)
        card = cards[0]
        self.assertEqual(card["approval"]["id"], p.approval_id)
        self.assertEqual(card["effect"], {"amount": 40, "order": self.order})
        self.assertEqual(card["tool"], "refund")

        # Another effect under the key is a conflict, never the approved call.
        with self.assertRaises(idemkv.ConflictError):
            refund(self.order, 41)
        # The agent cannot approve itself.
        with self.assertRaises(idemkv.APIError) as denied:
            self.agent.approve(TENANT, key, approval_id=p.approval_id, fingerprint=p.fingerprint, approver="agent")
        self.assertEqual(denied.exception.code, "permission_denied")
        # A decision names what the approver saw: another request is a mismatch.
        with self.assertRaises(idemkv.ApprovalMismatchError) as mm:
            self.approver.approve(TENANT, key, approval_id="apr_1", fingerprint=p.fingerprint, approver="ana")
        self.assertEqual((mm.exception.code, mm.exception.status), ("fingerprint_mismatch", 409))

        rec = self.approver.approve(TENANT, key, approval_id=p.approval_id, fingerprint=p.fingerprint,
                                    approver="ana", reason="customer called")
        self.assertEqual((rec["approval"]["state"], rec["approval"]["approver"]), ("approved", "ana (approver)"))
        with self.assertRaises(idemkv.ApprovalNotPendingError) as again:
            self.approver.deny(TENANT, key, approval_id=p.approval_id, fingerprint=p.fingerprint, approver="bo")
        self.assertEqual(again.exception.code, "not_pending")
        self.assertIsInstance(again.exception, idemkv.APIError)
        self.assertEqual(self.waiting(key), [])

        self.assertEqual(refund(self.order, 40), {"id": "re_1", "amount": 40})
        self.assertEqual(refund(self.order, 40), {"id": "re_1", "amount": 40})  # a replay
        self.assertEqual(self.ran, [(self.order, 40)])
        rec = self.agent.get(TENANT, key)
        assert rec is not None
        self.assertEqual((rec["status"], rec["approval"]["id"], rec["approval"]["reason"]),
                         ("committed", p.approval_id, "customer called"))

    def test_denial_is_typed_and_replayed_and_the_tool_never_runs(self) -> None:
        async def main() -> None:
            aio = self.agent.aio()

            @idemkv.idempotent(client=self.agent, tool="delete_account", key="user",
                               approval=idemkv.ApprovalRequirement(summary="Delete the account"))
            async def delete_account(user: str) -> dict[str, Any]:
                self.ran.append((user, 0))
                return {"id": user}

            with self.assertRaises(idemkv.ApprovalPending) as cm:
                await delete_account(self.order)
            p = cm.exception
            rec = await self.approver.aio().deny(TENANT, p.key, approval_id=p.approval_id, fingerprint=p.fingerprint,
                                                 approver="ana", reason="not the owner")
            self.assertEqual(rec["status"], "failed")
            for _ in range(2):
                with self.assertRaises(idemkv.ApprovalDeniedError) as d:
                    await delete_account(self.order)
                e = d.exception
                self.assertIsInstance(e, idemkv.StoredFailureError)
                self.assertEqual((e.kind, e.code, e.approver, e.reason, e.approval_id, e.replayed),
                                 ("stored_failure", "approval_denied", "ana (approver)", "not the owner", p.approval_id, True))
            self.assertEqual(self.ran, [])
            await aio.close()
            await self.approver.aio().close()

        asyncio.run(main())

    def test_wait_mode_is_woken_by_the_decision(self) -> None:
        key = f"{self.order}:refund"
        out: list[Any] = []

        def agent() -> None:
            try:
                out.append(self.agent.do(lambda: self.ran.append((self.order, 7)) or {"id": "re_w"}, key=key,
                                         tool="refund", effect={"order": self.order, "amount": 7},
                                         approval=idemkv.ApprovalRequirement(summary="Refund 7", wait=60)))
            except BaseException as e:  # noqa: BLE001 - reported below
                out.append(e)

        t = threading.Thread(target=agent)
        t.start()
        card = harness.eventually(20, "the request listed", lambda: (self.waiting(key) or [None])[0])
        self.assertEqual(self.ran, [])
        decided = time.monotonic()
        self.approver.approve(TENANT, key, approval_id=card["approval"]["id"], fingerprint=card["effect_fingerprint"],
                              approver="ana")
        t.join(30)
        woke = time.monotonic() - decided
        self.assertFalse(t.is_alive())
        self.assertIsInstance(out[0], idemkv.Outcome, out)
        self.assertEqual((out[0].decision, out[0].receipt["remote_id"]), ("execute", "re_w"))
        self.assertEqual(self.ran, [(self.order, 7)])
        self.assertLess(woke, 5.0, "the long-poll did not wake on the decision")

    def test_the_wait_is_bounded(self) -> None:
        refund = self.refund_tool(self.agent, wait=1.0)
        start = time.monotonic()
        with self.assertRaises(idemkv.ApprovalPendingError):
            refund(self.order, 5)
        took = time.monotonic() - start
        self.assertGreaterEqual(took, 1.0)
        self.assertLess(took, 6.0)
        self.assertEqual(self.ran, [])

    def test_an_approved_grant_answered_past_the_deadline_uses_the_approval(self) -> None:
        # The reserve that consumes the approval is answered past deadline=: releasing
        # the key (as for a grant without one) would delete the record and the
        # person's approval with it, and the next reserve would ask anew. The tool
        # runs, as the Go client runs it once it holds the grant. Before the fix the
        # call raised StoreUnavailableError and the record was gone.
        key = f"{self.order}:late"
        effect = {"order": self.order, "amount": 7}
        req = idemkv.ApprovalRequirement(ttl=3600, summary="Refund 7 EUR")

        def tool() -> dict[str, Any]:
            self.ran.append((self.order, 7))
            return {"id": "re_late"}

        with self.assertRaises(idemkv.ApprovalPendingError) as cm:
            self.agent.do(tool, key=key, tool="refund", effect=effect, approval=req, remote_system="payments")
        p = cm.exception
        self.approver.approve(TENANT, key, approval_id=p.approval_id, fingerprint=p.fingerprint, approver="ana")
        send = self.agent._send

        def late(call: Any, *a: Any, **kw: Any) -> Any:
            answer = send(call, *a, **kw)
            if call.route == "/v1/reserve":
                time.sleep(0.4)  # answered past the deadline
            return answer

        self.agent._send = late  # type: ignore[method-assign]
        out = self.agent.do(tool, key=key, tool="refund", effect=effect, approval=req, remote_system="payments",
                            deadline=0.2)
        self.assertEqual((out.decision, out.receipt["remote_id"]), ("execute", "re_late"))
        self.assertEqual(self.ran, [(self.order, 7)])
        rec = self.agent.get(TENANT, key)
        self.assertEqual((rec["status"], rec["approval"]["state"]), ("committed", "approved"))

    def test_bad_requirements_are_refused_before_anything_runs(self) -> None:
        with self.assertRaises(idemkv.NotExecutedError):
            self.agent.do(lambda: None, key=self.order, tool="refund", fingerprint=idemkv.fingerprint(1),
                          approval=idemkv.ApprovalRequirement())
        with self.assertRaises(TypeError):
            idemkv.idempotent(lambda x: x, key="x", approval={"required": True})  # type: ignore[arg-type]
        with self.assertRaises(TypeError):  # the summary function cannot take the tool's arguments
            idemkv.idempotent(lambda x: x, key="x", approval=idemkv.ApprovalRequirement(summary=lambda a, b: ""))
        for bad in (dict(ttl=10), dict(ttl=31 * 86400), dict(wait=-1)):
            with self.assertRaises(ValueError):
                idemkv.ApprovalRequirement(**bad)  # type: ignore[arg-type]
        self.assertIsNone(self.agent.get(TENANT, self.order))

    def test_approvals_page_oldest_first(self) -> None:
        refund = self.refund_tool(self.agent)
        orders = [f"{self.order}-{i}" for i in range(3)]
        for o in orders:
            with self.assertRaises(idemkv.ApprovalPendingError):
                refund(o, 1)
        seen = [r["idempotency_key"] for r in self.approver.iter_approvals(TENANT, page_size=1)]
        mine = [k for k in seen if k.startswith(self.order)]
        self.assertEqual(mine, [f"{o}:refund" for o in orders])
        page = self.approver.approvals(TENANT, limit=1)
        self.assertEqual(len(page["approvals"]), 1)
        self.assertTrue(page.get("next"))


if __name__ == "__main__":
    unittest.main()
