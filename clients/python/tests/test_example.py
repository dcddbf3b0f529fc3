"""examples/python/tickets.py runs against a real node and says what it should."""

from __future__ import annotations

import os
import subprocess
import sys
import unittest

import harness


class Example(unittest.TestCase):
    def test_tickets_example(self) -> None:
        node = harness.shared_node()
        script = os.path.join(harness.repo_root(), "examples", "python", "tickets.py")
        env = dict(os.environ, IDEMKV_ENDPOINTS=node.http)
        out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        print("\n" + out.stdout)
        self.assertIn("(replayed)", lines[1])
        self.assertIn("api calls=1", lines[1])
        self.assertRegex(lines[2], r"tickets \['OPS-2', 'OPS-2'\]")
        self.assertIn("outcome_unknown", lines[3])
        self.assertIn("attempts=2", lines[4])
        self.assertIn("conflict", lines[5])
        self.assertIn("replayed=True", lines[7])
        self.assertIn("tickets made: 3 ", lines[8])

    def test_framework_recipes(self) -> None:
        # The LangGraph and OpenAI Agents recipes (issue 24, point 11), under stand-ins
        # of the frameworks' tool contracts: a resume and a retried turn replay.
        node = harness.shared_node()
        script = os.path.join(harness.repo_root(), "examples", "python", "frameworks.py")
        env = dict(os.environ, IDEMKV_ENDPOINTS=node.http)
        out = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        print("\n" + out.stdout)
        self.assertIn("langgraph: LIN-1 then, on resume, LIN-1 (tickets 1)", out.stdout)
        self.assertIn("openai agents: LIN-2, retried LIN-2, a new tool call LIN-3 (tickets 3)", out.stdout)
        self.assertIn("tickets created: 3 for 3 tool calls", out.stdout)


if __name__ == "__main__":
    unittest.main()
