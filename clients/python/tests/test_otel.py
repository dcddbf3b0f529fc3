"""Spans: one per tool call, with the Go client's attribute names."""

from __future__ import annotations

import os
import re
import unittest
from typing import Any, Optional

import harness
import idemkv
from idemkv import _otel


class RecordingSpan:
    def __init__(self, name: str, attributes: dict[str, Any]) -> None:
        self.name = name
        self.attributes = dict(attributes)
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.exceptions: list[BaseException] = []
        self.ended = False

    def set_attributes(self, attrs: dict[str, Any]) -> None:
        self.attributes.update(attrs)

    def add_event(self, name: str, attrs: Optional[dict[str, Any]] = None) -> None:
        self.events.append((name, dict(attrs or {})))

    def record_exception(self, exc: BaseException) -> None:
        self.exceptions.append(exc)

    def set_status(self, status: Any) -> None:
        pass

    def end(self) -> None:
        self.ended = True


class RecordingProvider:
    """Stands in for an OpenTelemetry TracerProvider (get_tracer, start_span)."""

    def __init__(self) -> None:
        self.spans: list[RecordingSpan] = []
        self.scope = ""

    def get_tracer(self, name: str, *a: Any, **kw: Any) -> "RecordingProvider":
        self.scope = name
        return self

    def start_span(self, name: str, attributes: Optional[dict[str, Any]] = None, **kw: Any) -> RecordingSpan:
        s = RecordingSpan(name, attributes or {})
        self.spans.append(s)
        return s


class Spans(unittest.TestCase):
    def test_attribute_names_are_the_go_clients(self) -> None:
        # Every attribute key the Python client uses is spelled exactly as in the Go
        # package telemetry/semconv.
        with open(os.path.join(harness.repo_root(), "telemetry", "semconv", "semconv.go")) as f:
            go_keys = set(re.findall(r'attribute\.Key\("([^"]+)"\)', f.read()))
        py_keys = {v for k, v in vars(_otel).items() if k.isupper() and isinstance(v, str) and "." in v
                   and not v.startswith("github.com")}
        self.assertGreaterEqual(len(py_keys), 14)
        self.assertEqual(py_keys - go_keys, set())
        self.assertEqual({"agent.tool.name", "agent.tool.side_effect", "agent.idempotency.key",
                          "agent.idempotency.fingerprint", "agent.idempotency.decision",
                          "agent.idempotency.receipt.remote_id", "idemkv.tenant", "idemkv.fence"} - py_keys, set())

    def test_a_span_per_tool_call(self) -> None:
        node = harness.shared_node()
        prov = RecordingProvider()
        c = idemkv.Client(node.http, tenant="acme", tracer_provider=prov)
        self.addCleanup(c.close)
        key = harness.unique("span")
        c.do(lambda: {"id": "LIN-5"}, key=key, tool="create_ticket", effect={"a": 1})
        c.do(lambda: {"id": "LIN-6"}, key=key, tool="create_ticket", effect={"a": 1})
        with self.assertRaises(idemkv.ConflictError):
            c.do(lambda: {"id": "LIN-7"}, key=key, tool="create_ticket", effect={"a": 2})
        self.assertEqual(prov.scope, _otel.SCOPE_NAME)
        execute, replay, conflict = prov.spans
        self.assertEqual(execute.name, "execute_tool create_ticket")
        a = execute.attributes
        self.assertEqual((a["agent.tool.name"], a["agent.tool.side_effect"], a["agent.idempotency.key"],
                          a["idemkv.tenant"], a["agent.idempotency.decision"],
                          a["agent.idempotency.receipt.remote_id"], a["agent.idempotency.replayed"]),
                         ("create_ticket", True, key, "acme", "execute", "LIN-5", False))
        self.assertEqual(a["agent.idempotency.fingerprint"], idemkv.fingerprint({"a": 1}))
        self.assertGreater(a["idemkv.fence"], 0)
        self.assertEqual((replay.attributes["agent.idempotency.decision"], replay.attributes["agent.idempotency.replayed"]),
                         ("replay", True))
        self.assertEqual(conflict.attributes["agent.idempotency.conflict.existing_remote_id"], "LIN-5")
        self.assertEqual(len(conflict.exceptions), 1)
        self.assertTrue(all(s.ended for s in prov.spans))

    def test_no_provider_no_package_no_spans(self) -> None:
        if _otel.ENABLED:
            self.skipTest("opentelemetry is installed here")
        self.assertIsNone(_otel.tracer(None))
        self.assertEqual(_otel.inject(), {})


if __name__ == "__main__":
    unittest.main()
