"""Crashes: a worker SIGKILLed mid-tool, and the leader of a three-node cluster killed
mid-call. Either way the effect happens once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import unittest
from typing import Any, Optional

import harness
import idemkv

TENANT = "acme"
HERE = os.path.dirname(os.path.abspath(__file__))


def read_tickets(path: str) -> list[str]:
    try:
        with open(path) as f:
            return [line for line in f.read().splitlines() if line]
    except FileNotFoundError:
        return []


class KilledWorker(unittest.TestCase):
    def run_and_kill(self, when: str, marker: str) -> tuple[str, str]:
        node = harness.shared_node()
        key = harness.unique("crash")
        tickets = os.path.join(harness._tmp, key.replace(":", "_") + ".tickets")
        proc = subprocess.Popen([sys.executable, os.path.join(HERE, "worker.py"), node.http, key, tickets, when],
                                stdout=subprocess.PIPE, text=True)
        self.addCleanup(proc.kill)
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.strip() == marker:
                break
        else:
            self.fail("the worker never reached " + marker)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.assertEqual(proc.returncode, -signal.SIGKILL)
        return key, tickets

    def recover(self, key: str, tickets: str) -> tuple[idemkv.Outcome, list[str]]:
        ran = []

        def create_ticket() -> dict[str, str]:
            ran.append(1)
            with open(tickets, "a") as f:
                f.write(f"LIN-retry {key}\n")
            return {"id": "LIN-retry"}

        def find_ticket() -> Optional[dict[str, str]]:
            for line in read_tickets(tickets):
                tid, ext = line.split(" ", 1)
                if ext == key:
                    return {"id": tid}
            return None

        with idemkv.Client(harness.shared_node().http, tenant=TENANT) as c:
            out = c.do(create_ticket, key=key, tool="create_ticket", effect={"title": "Outage X", "ext": key},
                       probe=find_ticket)
        return out, read_tickets(tickets)

    def test_killed_after_the_effect_probe_finds_it(self) -> None:
        key, tickets = self.run_and_kill("after_effect", "EFFECT_DONE")
        out, lines = self.recover(key, tickets)
        self.assertEqual((out.decision, out.probed, out.attempts), ("recover", True, 2))
        self.assertEqual(out.receipt["remote_id"], "LIN-worker")
        self.assertEqual(len(lines), 1, lines)
        print(f"\nkilled worker (after the effect): SIGKILL, retry decision={out.decision} probed={out.probed} "
              f"remote_id={out.receipt['remote_id']}, tickets={len(lines)}")

    def test_killed_before_the_effect_probe_finds_nothing(self) -> None:
        key, tickets = self.run_and_kill("before_effect", "TOOL_STARTED")
        out, lines = self.recover(key, tickets)
        self.assertEqual((out.decision, out.probed, out.receipt["remote_id"]), ("recover", False, "LIN-retry"))
        self.assertEqual(len(lines), 1, lines)
        print(f"\nkilled worker (before the effect): retry decision={out.decision} probed={out.probed} "
              f"remote_id={out.receipt['remote_id']}, tickets={len(lines)}")


    def test_killed_without_a_probe_in_doubt_then_resolved(self) -> None:
        key, tickets = self.run_and_kill("after_effect", "EFFECT_DONE")
        effect = {"title": "Outage X", "ext": key}
        with idemkv.Client(harness.shared_node().http, tenant=TENANT) as c:
            with self.assertRaises(idemkv.InDoubtError) as cm:
                c.do(lambda: {"id": "never"}, key=key, tool="create_ticket", effect=effect)
            # A person looks downstream, finds the ticket, and says so.
            tid = read_tickets(tickets)[0].split(" ", 1)[0]
            c.resolve(TENANT, key, idemkv.fingerprint(effect), "committed", remote_system="tickets", remote_id=tid)
            out = c.do(lambda: {"id": "never"}, key=key, tool="create_ticket", effect=effect)
        self.assertEqual((out.decision, out.receipt["remote_id"]), ("replay", "LIN-worker"))
        self.assertEqual(len(read_tickets(tickets)), 1)
        print(f"\nkilled worker, no probe: {cm.exception.kind} (in_doubt_since "
              f"{(cm.exception.record or {}).get('in_doubt_since')}), resolved committed {tid}, retry {out.decision}")


class LeaderKilled(unittest.TestCase):
    def test_leader_killed_mid_call_one_effect(self) -> None:
        nodes = harness.cluster3()
        leader = harness.leader_of(nodes)
        followers = [n for n in nodes if n is not leader]
        dead = harness.free_addr()
        # The dead endpoint first, then a follower: the client moves on, and learns the
        # leader from the Idemkv-Leader header of the follower's answer.
        c = idemkv.Client([dead, followers[0].http, leader.http, followers[1].http], tenant=TENANT, lease_ttl=5)
        self.addCleanup(c.close)
        c.cluster()
        self.assertEqual(c.leader, "http://" + leader.http)

        key = harness.unique("leader")
        effects: list[str] = []
        started, go = threading.Event(), threading.Event()
        lock = threading.Lock()

        def create_ticket() -> dict[str, str]:
            with lock:
                effects.append(key)
                n = len(effects)
            started.set()
            go.wait(30)
            return {"id": f"LIN-{n}"}

        results: list[Any] = []

        def call() -> None:
            try:
                results.append(c.do(create_ticket, key=key, tool="create_ticket", effect={"k": key}))
            except BaseException as e:  # noqa: BLE001
                results.append(e)

        first = threading.Thread(target=call)
        first.start()
        self.assertTrue(started.wait(30))
        t0 = time.monotonic()
        leader.kill()
        # A second worker arrives during the election.
        second = threading.Thread(target=call)
        second.start()
        time.sleep(0.5)
        go.set()
        first.join(60)
        second.join(60)
        took = time.monotonic() - t0
        self.assertEqual(len(results), 2, results)
        for r in results:
            self.assertIsInstance(r, idemkv.Outcome, r)
        self.assertEqual(len(effects), 1, effects)
        self.assertEqual({r.receipt["remote_id"] for r in results}, {"LIN-1"})
        new_leader = harness.leader_of(followers)
        self.assertNotEqual(new_leader.id, leader.id)
        with idemkv.Client([f.http for f in followers], tenant=TENANT) as other:
            again = other.do(create_ticket, key=key, tool="create_ticket", effect={"k": key})
        self.assertEqual((again.decision, again.receipt["remote_id"], len(effects)), ("replay", "LIN-1", 1))
        print(f"\nleader {leader.id} killed mid-call: {len(effects)} effect, both callers got LIN-1 "
              f"(decisions {sorted(r.decision for r in results)}), new leader {new_leader.id}, "
              f"settled {took:.2f}s after the kill")
        for n in nodes:
            n.kill()


if __name__ == "__main__":
    unittest.main()
