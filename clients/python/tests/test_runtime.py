"""What a runtime developer needs from the wrapper (issue 24), against a real node:
oversized results, retrying as the same attempt, the one default effect, return types
on replay, keys from the run's context, exception classes, checks at decoration time."""

from __future__ import annotations

import asyncio
import dataclasses
import http.server
import inspect
import json
import os
import socketserver
import threading
import time
import typing
import unittest
import urllib.request
from typing import Any, Optional

import harness
import idemkv

TENANT = "acme"
VECTORS = os.path.join(harness.repo_root(), "testdata", "effect", "vectors.json")


@dataclasses.dataclass
class Ticket:
    id: str
    title: str
    url: str = ""


class Base(unittest.TestCase):
    def setUp(self) -> None:
        self.node = harness.shared_node()
        self.client = idemkv.Client(self.node.http, tenant=TENANT, lease_ttl=30)
        self.addCleanup(self.client.close)
        self.key = harness.unique("rt")


def _function_of(params: list[str]) -> Any:
    """A function with the vector's parameters ('x?' has a default, '**x' is VAR_KEYWORD)."""
    sig = []
    for p in params:
        if p.startswith("**"):
            sig.append(p)
        elif p.endswith("?"):
            sig.append(p[:-1] + "=None")
        else:
            sig.append(p)
    ns: dict[str, Any] = {}
    exec(f"def tool({', '.join(sig)}):\n    return None\n", ns)  # noqa: S102 - the vectors are ours
    return ns["tool"]


class DefaultEffect(unittest.TestCase):
    """Point 3: one default effect in every client, pinned by testdata/effect."""

    def test_vectors(self) -> None:
        with open(VECTORS, encoding="utf-8") as f:
            cases = json.load(f)["cases"]
        n = 0
        for c in cases:
            call = c.get("python")
            if call is None:
                continue
            with self.subTest(c["name"]):
                fn = _function_of(call["params"])
                args = list(call.get("args", []))
                if call["params"][:1] == ["self"]:
                    args = [object()] + args
                effect = idemkv.default_effect(fn, args, call.get("kwargs", {}))
                self.assertEqual(effect, c["effect"])
                self.assertEqual(idemkv.fingerprint(effect), c["fingerprint"])
                n += 1
        self.assertGreaterEqual(n, 8)
        print(f"\ndefault effect: {n} Python vectors agree")

    def test_dataclass_argument_is_its_object(self) -> None:
        def tool(t: Ticket) -> None: ...

        self.assertEqual(idemkv.default_effect(tool, [Ticket("T-1", "x")], {}), {"id": "T-1", "title": "x", "url": ""})


class DefaultEffectAliases(unittest.TestCase):
    """Two different calls never share a default effect, and one call has one."""

    def test_a_name_given_twice_is_refused(self) -> None:
        def po(name: str, /, **fields: Any) -> None: ...

        # po("alice", name="x") and po("bob", name="x") would both be {"name": "x"}.
        with self.assertRaises(idemkv.FingerprintError):
            idemkv.default_effect(po, ["alice"], {"name": "x"})
        self.assertEqual(idemkv.default_effect(po, ["alice"], {"age": 3}), {"name": "alice", "age": 3})

    def test_the_signature_decides_whether_an_object_is_the_effect(self) -> None:
        """Only a function of one parameter (no *args, **kwargs; self not counted) has
        its object argument as its effect: a call passing one object by name to a
        function of more parameters is not the call passing that object's members."""

        def update(record: Optional[dict[str, str]] = None, id: Optional[str] = None) -> None: ...

        def f(data: Optional[dict[str, int]] = None, **extra: int) -> None: ...

        def kw(**fields: Any) -> None: ...

        class Tools:
            def one(self, record: dict[str, str]) -> None: ...

        pairs = [
            (idemkv.default_effect(update, [], {"record": {"id": "42"}}), idemkv.default_effect(update, [], {"id": "42"})),
            (idemkv.default_effect(update, [{"id": "42"}], {}), idemkv.default_effect(update, [], {"id": "42"})),
            (idemkv.default_effect(f, [], {"data": {"x": 1}}), idemkv.default_effect(f, [], {"x": 1})),
            (idemkv.default_effect(kw, [], {"record": {"id": "42"}}), idemkv.default_effect(kw, [], {"id": "42"})),
        ]
        for one, other in pairs:
            with self.subTest(one=one, other=other):
                self.assertNotEqual(idemkv.fingerprint(one), idemkv.fingerprint(other))
        self.assertEqual(idemkv.default_effect(update, [], {"record": {"id": "42"}}), {"record": {"id": "42"}})
        self.assertEqual(idemkv.default_effect(f, [], {"data": {"x": 1}}), {"data": {"x": 1}})
        # One parameter: the object is the effect, by position or by name, self not counted.
        self.assertEqual(idemkv.default_effect(Tools.one, [Tools()], {"record": {"id": "42"}}), {"id": "42"})
        self.assertEqual(idemkv.default_effect(Tools().one, [{"id": "42"}], {}), {"id": "42"})

    def test_a_set_in_a_model_is_refused(self) -> None:
        class Model:
            """What pydantic's BaseModel gives the wrapper: its JSON mode writes a set as a
            list in the set's order, which string hashing changes between processes."""

            def __init__(self, tags: set[str]) -> None:
                self.tags = tags

            def model_dump(self, mode: str = "python") -> dict[str, Any]:
                return {"tags": list(self.tags) if mode == "json" else set(self.tags)}

        def tool(args: Model) -> None: ...

        with self.assertRaises(idemkv.FingerprintError) as cm:
            idemkv.default_effect(tool, [Model({"a", "b"})], {})
        self.assertIn("tags", str(cm.exception))

    def test_a_set_in_a_pydantic_model_is_refused(self) -> None:
        try:
            import pydantic
        except ImportError:
            self.skipTest("pydantic is not installed: test_a_set_in_a_model_is_refused covers the rule")

        class M(pydantic.BaseModel):
            tags: set[str]
            names: list[str]

        def tool(args: M) -> None: ...

        with self.assertRaises(idemkv.FingerprintError):
            idemkv.default_effect(tool, [M(tags={"a", "b"}, names=[])], {})

        class N(pydantic.BaseModel):
            names: list[str]

        def other(args: N) -> None: ...

        self.assertEqual(idemkv.default_effect(other, [N(names=["x"])], {}), {"names": ["x"]})


class Oversized(Base):
    """Point 1: a result over the server's limit is stored as a note beside the receipt."""

    def test_result_over_the_limit_is_stored_without_it(self) -> None:
        runs = []

        @self.client.idempotent(key=self.key, tool="export_report")
        def export(report: str) -> dict[str, Any]:
            runs.append(1)
            return {"id": "RPT-7", "url": "https://reports.example/RPT-7", "body": "x" * (100 << 10)}

        first = export("q3")
        self.assertEqual(len(first["body"]), 100 << 10, "the call that ran gets the tool's own value")
        replay = export("q3")
        self.assertEqual(len(runs), 1)
        self.assertEqual(replay["remote_id"], "RPT-7", f"a replay without the result returns the receipt: {replay}")
        self.assertTrue(idemkv.result_omitted(replay["result"]))
        out = self.client.do(lambda: None, key=self.key, tool="export_report", effect={"report": "q3"})
        self.assertTrue(out.replayed and out.result_omitted)
        rec = self.client.get(TENANT, self.key)
        assert rec is not None
        self.assertEqual(rec["status"], "committed")


class _Swallow(http.server.BaseHTTPRequestHandler):
    """Forwards to the node, but drops the answer of every reserve: the reserve lands
    and the caller never learns it."""

    target = ""
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
            self.close_connection = True
            return  # the answer is lost
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a: Any) -> None:
        pass


class SameAttempt(Base):
    """Point 2: StoreUnavailableError carries the attempt id, and a retry with it is the
    same attempt to the server."""

    def test_retry_with_the_attempt_id(self) -> None:
        handler = type("H", (_Swallow,), {"target": self.node.http, "reserves": 0})
        srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        lossy = idemkv.Client(f"127.0.0.1:{srv.server_address[1]}", tenant=TENANT, lease_ttl=2, store_wait=1.5,
                              backoff_max=0.2)
        self.addCleanup(lossy.close)
        runs = []

        def create(title: str) -> dict[str, str]:
            runs.append(title)
            return {"id": "LIN-9"}

        lossy_tool = lossy.idempotent(tool="create_ticket")(create)
        tool = self.client.idempotent(tool="create_ticket")(create)
        with self.assertRaises(idemkv.StoreUnavailableError) as cm:
            with idemkv.operation(self.key):
                lossy_tool(title="Outage X")
        self.assertGreaterEqual(handler.reserves, 1, "the reserve never reached the node")
        attempt = cm.exception.attempt_id
        self.assertTrue(attempt, "the error carries no attempt id")
        self.assertEqual(runs, [])
        start = time.monotonic()
        with idemkv.operation(self.key, attempt_id=attempt):
            self.assertEqual(tool(title="Outage X"), {"id": "LIN-9"})
        took = time.monotonic() - start
        self.assertEqual(runs, ["Outage X"])
        self.assertLess(took, 1.5, "the retry waited for a phantom lease: it was not recognised")
        print(f"\nsame attempt: {handler.reserves} reserves landed unanswered; the retry with {attempt} ran at once "
              f"({took * 1000:.0f} ms)")


class ReturnTypes(Base):
    """Point 5: a replay returns what the first call returned."""

    def test_dataclass_comes_back_as_the_dataclass(self) -> None:
        runs = []

        @self.client.idempotent(key="title", tool="create_ticket")
        def create(title: str) -> Ticket:
            runs.append(title)
            return Ticket(id="LIN-5", title=title, url="https://linear.example/LIN-5")

        t = self.key
        first, again = create(t), create(t)
        self.assertEqual(len(runs), 1)
        self.assertIsInstance(again, Ticket)
        self.assertEqual(first, again)

    def test_hooks(self) -> None:
        class Opaque:
            def __init__(self, n: int) -> None:
                self.n = n

        @self.client.idempotent(key="k", tool="count", serialize=lambda o: {"n": o.n},
                                deserialize=lambda d: Opaque(d["n"]))
        def count(k: str) -> Opaque:
            return Opaque(41)

        count(self.key)
        again = count(self.key)
        self.assertIsInstance(again, Opaque)
        self.assertEqual(again.n, 41)

    def test_resolved_without_result_returns_the_receipt(self) -> None:
        fp = idemkv.fingerprint({"title": "Outage X"})
        res = self.client.reserve(TENANT, self.key, "create_ticket", fingerprint=fp, lease_ttl=1)
        self.client.doubt(TENANT, self.key, fp, res["fence"])
        self.client.resolve(TENANT, self.key, fp, "committed", remote_system="linear", remote_id="LIN-77")

        @self.client.idempotent(key=self.key, tool="create_ticket")
        def create(title: str) -> Ticket:
            raise AssertionError("ran although resolved")

        got = create(title="Outage X")
        self.assertIsInstance(got, dict)
        self.assertEqual((got["remote_id"], got["status"]), ("LIN-77", "committed"))

        @self.client.idempotent(key=self.key, tool="create_ticket",
                                from_receipt=lambda r: Ticket(id=r["remote_id"], title="?"))
        def create2(title: str) -> Ticket:
            raise AssertionError("ran although resolved")

        self.assertEqual(create2(title="Outage X"), Ticket(id="LIN-77", title="?"))


class Keys(Base):
    """Point 6: keys from the run's context, and from a named argument."""

    def test_operation_context(self) -> None:
        seen: list[str] = []

        @self.client.idempotent(tool="create_ticket", outcome=True)
        def create(title: str) -> dict[str, str]:
            seen.append(title)
            return {"id": "LIN-1"}

        with idemkv.operation(self.key):
            out = create(title="Outage X")
        self.assertEqual(out.receipt["idempotency_key"], f"{self.key}:create_ticket")
        with self.assertRaises(idemkv.NotExecutedError) as cm:
            create(title="Outage X")
        self.assertIn("idemkv.operation", str(cm.exception))

    def test_operation_context_per_task(self) -> None:
        aclient = idemkv.AsyncClient(self.node.http, tenant=TENANT)
        runs: list[str] = []

        @aclient.idempotent(tool="create_ticket", outcome=True)
        async def create(title: str) -> dict[str, str]:
            await asyncio.sleep(0.05)
            runs.append(title)
            return {"id": title}

        async def one(i: int) -> str:
            with idemkv.operation(f"{self.key}:{i}"):
                await asyncio.sleep(0.01 * (3 - i))
                out = await create(title=f"t{i}")
                return str(out.receipt["idempotency_key"])

        async def main() -> list[str]:
            try:
                return await asyncio.gather(*(one(i) for i in range(3)))
            finally:
                await aclient.close()

        keys = asyncio.run(main())
        self.assertEqual(keys, [f"{self.key}:{i}:create_ticket" for i in range(3)])
        self.assertEqual(sorted(runs), ["t0", "t1", "t2"])

    def test_key_from_named_argument(self) -> None:
        @self.client.idempotent(key="order_id", tool="refund", outcome=True)
        def refund(amount_cents: int, order_id: str) -> dict[str, str]:
            return {"id": "RF-1"}

        out = refund(500, order_id=self.key)
        self.assertEqual(out.receipt["idempotency_key"], f"{self.key}:refund")
        self.assertTrue(refund(500, self.key).replayed)


class SignatureEffect(Base):
    """A call passing one object by name to a function of several parameters is not
    the call passing that object's members: the second is a conflict, not a replay of
    the first's receipt (its effect would otherwise be lost)."""

    def test_object_by_name_is_not_its_members(self) -> None:
        runs: list[dict[str, Any]] = []

        @self.client.idempotent(key=self.key, tool="update_record")
        def update(record: Optional[dict[str, str]] = None, id: Optional[str] = None) -> dict[str, str]:
            runs.append({"record": record, "id": id})
            return {"id": "U-1"}

        update(record={"id": "42"})
        with self.assertRaises(idemkv.ConflictError):
            update(id="42")
        self.assertEqual(len(runs), 1)


class Exceptions(Base):
    """Point 7: declared exception classes mean not executed, or permanent."""

    def test_not_executed_on_releases_the_key(self) -> None:
        calls = []

        @self.client.idempotent(key=self.key, tool="create_ticket", not_executed_on=ConnectionError,
                                lease_ttl=30)
        def create(title: str) -> dict[str, str]:
            calls.append(1)
            if len(calls) == 1:
                raise ConnectionRefusedError("downstream refused the connection")
            return {"id": "LIN-3"}

        with self.assertRaises(idemkv.NotExecutedError) as cm:
            create(title="x")
        self.assertIsInstance(cm.exception.cause.__cause__, ConnectionRefusedError)  # type: ignore[union-attr]
        start = time.monotonic()
        self.assertEqual(create(title="x"), {"id": "LIN-3"})
        self.assertLess(time.monotonic() - start, 5, "the retry waited out the 30 s lease: the key was not released")

    def test_permanent_on_is_stored_and_replayed(self) -> None:
        calls = []

        @self.client.idempotent(key=self.key, tool="create_ticket", permanent_on=(KeyError, ValueError))
        def create(title: str) -> dict[str, str]:
            calls.append(1)
            raise ValueError("project OPS is archived")

        for replayed in (False, True):
            with self.assertRaises(idemkv.StoredFailureError) as cm:
                create(title="x")
            self.assertEqual(cm.exception.replayed, replayed)
            self.assertIn("ValueError: project OPS is archived", str(cm.exception.receipt["error"]["message"]))
        self.assertEqual(len(calls), 1)

    def test_other_exceptions_leave_it_pending(self) -> None:
        @self.client.idempotent(key=self.key, tool="create_ticket", not_executed_on=ConnectionError)
        def create(title: str) -> dict[str, str]:
            raise RuntimeError("boom after the effect")

        with self.assertRaises(idemkv.OutcomeUnknownError):
            create(title="x")
        rec = self.client.get(TENANT, self.key)
        assert rec is not None
        self.assertEqual(rec["status"], "pending")


class Decoration(unittest.TestCase):
    """Point 8: mistakes surface when the decorator is applied; signatures survive."""

    def test_mistakes_at_decoration_time(self) -> None:
        def tool(title: str, severity: Optional[str] = None) -> dict[str, str]:
            return {}

        bad: list[tuple[str, dict[str, Any], type[Exception]]] = [
            ("side_effect", {"side_effect": "non-idempotent"}, ValueError),
            ("key naming no parameter", {"key": "ttitle"}, TypeError),
            ("key of the wrong arity", {"key": lambda a, b, c: "k"}, TypeError),
            ("effect of the wrong arity", {"key": "title", "effect": lambda: {}}, TypeError),
            ("drop as a string", {"key": "title", "drop": "trace_id"}, TypeError),
            ("lease under a second", {"key": "title", "lease_ttl": 0.5}, ValueError),
            ("not an exception class", {"key": "title", "permanent_on": "ValueError"}, TypeError),
            ("an unknown option", {"key": "title", "side_efect": "read_only"}, TypeError),
        ]
        for name, opts, exc in bad:
            with self.subTest(name), self.assertRaises(exc):
                idemkv.idempotent(tool, **opts)
        # Hooks that take the arguments one way or another are fine.
        idemkv.idempotent(tool, key=lambda title, severity=None: title)
        idemkv.idempotent(tool, key=lambda **kw: kw["title"])
        idemkv.idempotent(tool, key=lambda *a, **kw: "k")

    def test_signature_and_types_kept(self) -> None:
        def tool(title: str, severity: Optional[str] = None) -> Ticket:
            return Ticket("T", title)

        wrapped = idemkv.idempotent(tool, key="title")
        self.assertEqual(inspect.signature(wrapped), inspect.signature(tool))
        self.assertEqual(typing.get_type_hints(wrapped), typing.get_type_hints(tool))
        # The decorator's own types carry the wrapped signature (ParamSpec) for mypy
        # (typing records overloads from 3.11 on; mypy --strict checks them anyway).
        if not hasattr(typing, "get_overloads"):
            return
        overloads = typing.get_overloads(idemkv.idempotent)
        self.assertGreaterEqual(len(overloads), 2)
        hints = typing.get_type_hints(overloads[0])
        self.assertIn("ParamSpec", repr(typing.get_args(hints["fn"])[0]) + repr(type(typing.get_args(hints["fn"])[0])))

    def test_passthrough(self) -> None:
        @idemkv.idempotent(tool="create_ticket")  # no client, no key: fine in a pass-through
        def create(title: str) -> str:
            return "made " + title

        with idemkv.passthrough():
            self.assertEqual(create("x"), "made x")
        with self.assertRaises(idemkv.NotExecutedError):
            create("x")


if __name__ == "__main__":
    unittest.main()


class _Electing(http.server.BaseHTTPRequestHandler):
    """A node in an election: it answers, with 503 unavailable."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        data = b'{"error":{"code":"unavailable","message":"no leader"}}'
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a: Any) -> None:
        pass


class FailFast(unittest.TestCase):
    """Point 10: nobody listening fails within connect_wait; an election gets store_wait."""

    def tool(self, client: Any) -> Any:
        runs: list[int] = []
        self.runs = runs

        def create(title: str) -> dict[str, str]:
            runs.append(1)
            return {"id": "x"}

        async def acreate(title: str) -> dict[str, str]:
            return create(title)

        f = acreate if isinstance(client, idemkv.AsyncClient) else create
        return client.idempotent(key="title", tool="create_ticket")(f)

    def test_nobody_listens(self) -> None:
        dead = [harness.free_addr(), harness.free_addr()]
        for c in (idemkv.Client(dead, tenant=TENANT), idemkv.AsyncClient(dead, tenant=TENANT)):
            create = self.tool(c)
            start = time.monotonic()
            with self.assertRaises(idemkv.StoreUnavailableError) as cm:
                r = create("Outage X")
                if asyncio.iscoroutine(r):
                    asyncio.run(r)
            took = time.monotonic() - start
            self.assertIn("nobody listens", str(cm.exception))
            self.assertLess(took, 8, f"{type(c).__name__} took {took:.1f}s; the default connect_wait is 3 s")
            self.assertGreaterEqual(took, 2.5)
            self.assertEqual(self.runs, [])
            print(f"\nnobody listens ({type(c).__name__}): StoreUnavailableError after {took:.1f}s")

    def test_an_election_gets_store_wait(self) -> None:
        srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Electing)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        c = idemkv.Client(f"127.0.0.1:{srv.server_address[1]}", tenant=TENANT, store_wait=4, connect_wait=1,
                          backoff_max=0.2)
        self.addCleanup(c.close)
        create = self.tool(c)
        start = time.monotonic()
        with self.assertRaises(idemkv.StoreUnavailableError) as cm:
            create("Outage X")
        took = time.monotonic() - start
        self.assertNotIn("nobody listens", str(cm.exception))
        self.assertGreaterEqual(took, 3.5, "an answering node was given up on as if nobody listened")


class _Capture(http.server.BaseHTTPRequestHandler):
    """Forwards to the node and keeps each request's traceparent."""

    target = ""
    seen: list[tuple[str, str]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).seen.append((self.path, self.headers.get("traceparent") or ""))
        req = urllib.request.Request(f"http://{self.target}{self.path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            data, status = r.read(), r.status
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a: Any) -> None:
        pass


class TraceParent(Base):
    """Point 12: a tool call's span goes with its requests as W3C traceparent, also with a
    provider given without the opentelemetry package (as the TypeScript client does)."""

    def test_requests_carry_the_tool_call_span(self) -> None:
        @dataclasses.dataclass
        class Ctx:
            trace_id: int
            span_id: int
            trace_flags: int = 1

        class Span:
            def __init__(self, n: int) -> None:
                self.ctx = Ctx(0x4BF92F3577B34DA6A3CE929D0E0E4736, n)

            def get_span_context(self) -> Ctx:
                return self.ctx

            def set_attributes(self, a: Any) -> None: ...
            def add_event(self, *a: Any) -> None: ...
            def record_exception(self, e: Any) -> None: ...
            def set_status(self, s: Any) -> None: ...
            def end(self) -> None: ...

        class Provider:
            n = 0

            def get_tracer(self, *a: Any, **kw: Any) -> "Provider":
                return self

            def start_span(self, name: str, **kw: Any) -> Span:
                Provider.n += 1
                return Span(0x00F067AA0BA902B7 + Provider.n)

        handler = type("C", (_Capture,), {"target": self.node.http, "seen": []})
        srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        c = idemkv.Client(f"127.0.0.1:{srv.server_address[1]}", tenant=TENANT, tracer_provider=Provider())
        self.addCleanup(c.close)
        c.idempotent(key=self.key, tool="create_ticket")(lambda title: {"id": "LIN-1"})(title="x")
        want = f"00-4bf92f3577b34da6a3ce929d0e0e4736-{0x00F067AA0BA902B7 + Provider.n:016x}-01"
        self.assertEqual([p for p, _ in handler.seen], ["/v1/reserve", "/v1/commit"])
        self.assertEqual({tp for _, tp in handler.seen}, {want})
