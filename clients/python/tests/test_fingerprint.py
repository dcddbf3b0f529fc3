"""RFC 8785 canonical JSON and fingerprints: the shared vectors, Python values, and
the server's own fingerprint of the same effects."""

from __future__ import annotations

import json
import math
import os
import sys
import unittest
from typing import Any

import harness
import idemkv
from idemkv import jcs


def vector_file() -> str:
    # The one shared file every implementation reads (testdata/fingerprint/README.md).
    return os.path.join(harness.repo_root(), "testdata", "fingerprint", "vectors.json")


def load_vectors() -> list[dict]:
    with open(vector_file(), encoding="utf-8") as f:
        return json.load(f)["vectors"]


def input_bytes(v: dict) -> bytes:
    if "input_hex" in v:
        return bytes.fromhex(v["input_hex"])
    return v.get("input", "").encode("utf-8")


class SharedVectors(unittest.TestCase):
    def test_every_vector(self) -> None:
        vectors = load_vectors()
        self.assertGreater(len(vectors), 50, "the vector file shrank")
        valid = invalid = 0
        for v in vectors:
            with self.subTest(v["name"]):
                data, drop = input_bytes(v), v.get("drop", ())
                if v.get("invalid"):
                    with self.assertRaises(idemkv.FingerprintError):
                        jcs.canonicalize_json(data, drop)
                    invalid += 1
                    continue
                self.assertEqual(jcs.canonicalize_json(data, drop).decode("utf-8"), v["canonical"])
                self.assertEqual(idemkv.fingerprint(idemkv.RawJSON(data), drop), v["fingerprint"])
                valid += 1
        print(f"\nshared vectors: {valid} canonical forms and fingerprints equal, {invalid} invalid inputs refused")

    def test_python_values_of_the_vectors(self) -> None:
        # The canonical text read back into Python values canonicalizes to itself: the
        # value path (what @idempotent fingerprints) agrees with the text path; a value
        # holding a float of 2**53 or more is refused (it may have lost digits already).
        refused = 0
        for v in load_vectors():
            if v.get("invalid") or v.get("drop"):
                continue
            with self.subTest(v["name"]):
                value = json.loads(v["canonical"])
                if _big_float(value):
                    with self.assertRaises(idemkv.FingerprintError):
                        idemkv.fingerprint(value)
                    refused += 1
                    continue
                self.assertEqual(idemkv.fingerprint(value), v["fingerprint"])
        self.assertGreater(refused, 0)


def _nested_lists(n: int) -> Any:
    v: list[Any] = []
    for _ in range(n - 1):
        v = [v]
    return v


def _nested_dicts(n: int) -> Any:
    v: Any = 1
    for _ in range(n):
        v = {"a": v}
    return v


def _frames_left() -> int:
    """How many more Python frames the recursion limit allows here."""
    f, depth = sys._getframe(), 0
    while f is not None:
        depth += 1
        f = f.f_back  # type: ignore[assignment]
    return sys.getrecursionlimit() - depth


def _at_depth(frames: int, fn: Any) -> Any:
    """fn() called from frames more frames down the stack."""
    if frames <= 0:
        return fn()
    return _at_depth(frames - 1, fn)


def _big_float(v: Any) -> bool:
    """v holds a float of magnitude 2**53 or more."""
    if isinstance(v, float):
        return abs(v) >= 2**53
    if isinstance(v, dict):
        return any(_big_float(x) for x in v.values())
    if isinstance(v, list):
        return any(_big_float(x) for x in v)
    return False


class PythonValues(unittest.TestCase):
    def test_numbers_beyond_a_double_are_refused(self) -> None:
        for bad in (2**53 + 1, -(2**53) - 1, 2**60 + 1, 2**64 - 1, 10**30 + 1, float("nan"), float("inf"),
                    -float("inf")):
            with self.subTest(bad=bad), self.assertRaises(idemkv.FingerprintError) as cm:
                idemkv.fingerprint({"customer_id": bad})
            if isinstance(bad, int):
                self.assertIn("string", str(cm.exception))  # says to send it as a string
        self.assertEqual(idemkv.canonicalize({"n": 2**53}), b'{"n":9007199254740992}')
        self.assertEqual(idemkv.canonicalize({"n": -(2**53)}), b'{"n":-9007199254740992}')
        # The rule is the decimal value, not a range: these are doubles exactly.
        self.assertEqual(idemkv.canonicalize([2**53 + 2, 10**21, 10**30]), b"[9007199254740994,1e+21,1e+30]")
        for text in ("9007199254740993", "0.10000000000000000555", "1e-400", "18446744073709551615"):
            with self.subTest(text=text), self.assertRaises(idemkv.FingerprintError):
                jcs.canonicalize_json(text)

    def test_floats_of_2_to_the_53_or_more_are_refused(self) -> None:
        # json.loads reads 9007199254740993.0 as 9007199254740992.0: as floats, two
        # identifiers would share a fingerprint, the second call replaying the first.
        for text in ("9007199254740993.0", "9007199254740993e0", "9007199254740992.0", "-9007199254740992.0",
                     "1e21", "1.7976931348623157e308"):
            value = json.loads(text)
            self.assertIsInstance(value, float)
            with self.subTest(text=text), self.assertRaises(idemkv.FingerprintError) as cm:
                idemkv.fingerprint({"channel_id": value})
            self.assertIn("2**53", str(cm.exception))
            self.assertIn("string", str(cm.exception))
        for ok in (9007199254740991.0, -9007199254740991.0, 1e15 + 0.5, 0.1, -0.0):
            with self.subTest(ok=ok):
                idemkv.fingerprint({"x": ok})
        # An int keeps its digits, and JSON text is fingerprinted as written.
        self.assertEqual(idemkv.canonicalize({"n": 2**53}), b'{"n":9007199254740992}')
        self.assertEqual(idemkv.canonicalize(idemkv.RawJSON("9007199254740992.0")), b"9007199254740992")
        self.assertEqual(idemkv.canonicalize(b'{"n":1e21}'), b'{"n":1e+21}')
        with self.assertRaises(idemkv.FingerprintError):
            idemkv.canonicalize(idemkv.RawJSON("9007199254740993.0"))  # its digits are not the double's

    def test_numbers_of_many_digits_are_fingerprint_errors(self) -> None:
        # str() and int() refuse past 4300 digits with a plain ValueError; every refusal
        # here is a FingerprintError, and the text path agrees with the Go fingerprint.
        import enum

        for i, bad in enumerate((10**5000, -(10**5000), 10**4301, 2**1024)):
            with self.subTest(i=i), self.assertRaises(idemkv.FingerprintError) as cm:
                idemkv.fingerprint({"n": bad})
            self.assertIn("string", str(cm.exception))
        with self.assertRaises(idemkv.FingerprintError):
            jcs.key_text(10**5000)
        for text in ("1" * 5000, "1e" + "9" * 5000, "1e-" + "9" * 5000, "0." + "0" * 5000 + "1"):
            with self.subTest(text=text[:12]), self.assertRaises(idemkv.FingerprintError):
                jcs.canonicalize_json(text)
        # An exponent of many digits that holds a small value, and zero with any
        # exponent, are numbers as Go reads them.
        self.assertEqual(jcs.canonicalize_json("1e" + "0" * 5000 + "1"), b"10")
        self.assertEqual(jcs.canonicalize_json("0e" + "9" * 5000), b"0")

        class Level(enum.IntEnum):
            HIGH = 3

        self.assertEqual(idemkv.canonicalize({"level": Level.HIGH}), b'{"level":3}')  # not "Level.HIGH" on 3.10

    def test_drop_reaches_into_json_text(self) -> None:
        # As the Go client drops from a json.RawMessage inside the effect.
        self.assertEqual(idemkv.canonicalize({"a": idemkv.RawJSON('{"trace":1,"x":2}')}, drop=["a.trace"]),
                         b'{"a":{"x":2}}')
        self.assertEqual(idemkv.canonicalize({"a": [idemkv.RawJSON('{"trace":1,"x":2}')]}, drop=["a.*.trace"]),
                         b'{"a":[{"x":2}]}')

    def test_what_drop_removes_is_checked_as_the_rest(self) -> None:
        # Go parses and checks the whole effect before dropping fields: a number no
        # double keeps, or a float of 2**53 or more, is refused under a dropped member
        # too (these three were fingerprinted).
        for effect in (idemkv.RawJSON(b'{"a":1,"t":9007199254740993}'), idemkv.RawJSON(b'{"a":1,"t":1e400}'),
                       {"a": 1, "t": 2.0**60}, {"a": 1, "t": {"x": [idemkv.RawJSON(b"9007199254740993")]}},
                       {"a": 1, "t": {1: "x"}}, {"a": 1, "t": object()}):
            with self.assertRaises(idemkv.FingerprintError, msg=repr(effect)):
                idemkv.fingerprint(effect, ["t"])
        self.assertEqual(idemkv.fingerprint(idemkv.RawJSON(b'{"a":1,"t":9007199254740992}'), ["t"]),
                         idemkv.fingerprint({"a": 1}))

    def test_deep_nesting_is_a_fingerprint_error(self) -> None:
        v: list[Any] = []
        for _ in range(5000):
            v = [v]
        with self.assertRaises(idemkv.FingerprintError):
            idemkv.canonicalize(v)
        with self.assertRaises(idemkv.FingerprintError):
            jcs.canonicalize_json("[" * 5000 + "]" * 5000)
        cycle: dict[str, Any] = {}
        cycle["self"] = cycle
        with self.assertRaises(idemkv.FingerprintError):
            idemkv.canonicalize(cycle)

    def test_depth_is_the_servers_whatever_the_stack(self) -> None:
        """Go's fingerprint.MaxDepth: 1000 arrays and objects inside one another are an
        effect, 1001 are refused, on the text and the value path alike, called from
        deep in the caller's own stack or with a raised recursion limit."""
        for frames, limit in ((0, None), (_frames_left() - 40, None), (0, 20000)):
            old = sys.getrecursionlimit()
            if limit is not None:
                sys.setrecursionlimit(limit)
            try:
                for n in (999, 1000, 1001, 1002):
                    with self.subTest(frames=frames, limit=limit, n=n):
                        _at_depth(frames, lambda: self._check_depth(n, ok=n <= 1000))
            finally:
                sys.setrecursionlimit(old)

    def _check_depth(self, n: int, ok: bool) -> None:
        arrays, objects = "[" * n + "]" * n, '{"a":' * n + "1" + "}" * n
        values: list[Any] = [_nested_lists(n), _nested_dicts(n), [idemkv.RawJSON(arrays[1:-1])] if n > 1 else None]
        for effect in [arrays.encode(), objects.encode(), idemkv.RawJSON(arrays)] + values:
            if ok:
                c = idemkv.canonicalize(effect)
                self.assertTrue(c.startswith(b"[" * min(n, 3)) or c.startswith(b'{"a":'))
                self.assertEqual(idemkv.canonicalize(effect, drop=["zz"]), c)
            else:
                with self.assertRaises(idemkv.FingerprintError) as cm:
                    idemkv.canonicalize(effect)
                self.assertIn("nesting too deep", str(cm.exception))
                # Go parses the whole effect before it drops fields: so does the check.
                with self.assertRaises(idemkv.FingerprintError):
                    idemkv.canonicalize(effect, drop=["a"])
        # The default effect of a tool of one dict, and of two arguments (one more level).
        def one(args: Any) -> None: ...

        def two(args: Any, b: int) -> None: ...

        if ok:
            self.assertEqual(idemkv.fingerprint(idemkv.default_effect(one, [_nested_dicts(n)], {})),
                             idemkv.fingerprint(_nested_dicts(n)))
        else:
            with self.assertRaises(idemkv.FingerprintError):
                idemkv.default_effect(one, [_nested_dicts(n)], {})
        if n + 1 <= 1000:
            idemkv.fingerprint(idemkv.default_effect(two, [_nested_dicts(n), 1], {}))
        else:
            with self.assertRaises(idemkv.FingerprintError):
                idemkv.fingerprint(idemkv.default_effect(two, [_nested_dicts(n), 1], {}))

    def test_ecmascript_number_layout(self) -> None:
        # Python's repr and ECMAScript's Number::toString differ in layout only.
        cases = {
            1e16: "10000000000000000", 1e21: "1e+21", 1e20: "100000000000000000000", 1e-5: "0.00001",
            1e-6: "0.000001", 1e-7: "1e-7", 1.5e-7: "1.5e-7", 123.0: "123", -0.0: "0", 0.1 + 0.2: "0.30000000000000004",
            5e-324: "5e-324", 1.7976931348623157e308: "1.7976931348623157e+308", 2.5e22: "2.5e+22", -1234.5: "-1234.5",
            100.0: "100", 1e300: "1e+300", 0.000123: "0.000123",
        }
        for f, want in cases.items():
            with self.subTest(f=f):
                self.assertEqual(jcs.format_number(f), want)
        self.assertEqual(idemkv.canonicalize([1, 1.0, True, None]), b"[1,1,true,null]")

    def test_values(self) -> None:
        a = {"title": "Outage X: API 5xx", "tenant": "tenant_42", "project": "OPS", "severity": "sev1",
             "customer_id": "cus_9", "incident_id": "inc_17"}
        b = dict(reversed(list(a.items())))
        self.assertEqual(idemkv.fingerprint(a), idemkv.fingerprint(b))
        self.assertEqual(idemkv.fingerprint(a), "sha256:76157b1f62c6c2942d526bb835ec2d1ee237f3ad3701791256e1a8e5cf57b02f")
        self.assertEqual(idemkv.fingerprint({"x": 1, "trace_id": "t"}, drop=["trace_id"]), idemkv.fingerprint({"x": 1}))
        self.assertEqual(idemkv.canonicalize({"a": ("x", 2)}), b'{"a":["x",2]}')
        with self.assertRaises(idemkv.FingerprintError):
            idemkv.fingerprint({"bad": "\ud800"})  # a lone surrogate has no UTF-8 form
        with self.assertRaises(idemkv.FingerprintError):
            idemkv.fingerprint({1: "x"})
        with self.assertRaises(idemkv.FingerprintError):
            idemkv.fingerprint({"x": object()})
        with self.assertRaises(idemkv.FingerprintError):
            idemkv.fingerprint({"x": 1}, drop=["a..b"])
        self.assertTrue(math.isfinite(1.0))


class KeyText(unittest.TestCase):
    """A key argument is written as the gateway's key templates and the TypeScript
    client write it (testdata/keytext): equal numbers are one key."""

    def test_shared_vectors(self) -> None:
        with open(os.path.join(harness.repo_root(), "testdata", "keytext", "vectors.json"), encoding="utf-8") as f:
            cases = json.load(f)["cases"]
        self.assertGreaterEqual(len(cases), 15)
        for c in cases:
            with self.subTest(json=c["json"]):
                v = json.loads(c["json"])
                if c["key"] is None:
                    with self.assertRaises((TypeError, ValueError)):
                        jcs.key_text(v)
                else:
                    self.assertEqual(jcs.key_text(v), c["key"])

    def test_python_values(self) -> None:
        import enum
        import uuid

        class Color(str, enum.Enum):
            RED = "red"

        class Level(enum.IntEnum):
            HIGH = 3

        self.assertEqual(jcs.key_text(Color.RED), "red")
        self.assertEqual(jcs.key_text(Level.HIGH), "3")
        self.assertEqual(jcs.key_text(2**53 + 1), "9007199254740993")  # an int is exact
        # A float from 2**53 up may not hold the digits it was sent with: refused.
        for bad in (1e21, 1e23, 9007199254740993.0, -1e39):
            with self.subTest(bad=bad), self.assertRaises(idemkv.FingerprintError):
                jcs.key_text(bad)
        self.assertEqual(jcs.key_text(9007199254740991.0), "9007199254740991")
        u = uuid.UUID("12345678-1234-5678-1234-567812345678")
        self.assertEqual(jcs.key_text(u), str(u))
        for bad in (10**40, float("nan"), float("inf")):
            with self.subTest(bad=bad), self.assertRaises(idemkv.FingerprintError):
                jcs.key_text(bad)
        self.assertEqual(jcs.key_text(10**40 - 1), "9" * 40)
        # str() of an arbitrary object can hold its address: another key in every process.
        for bad in (object(), b"ord-1", ("a",), None):
            with self.subTest(bad=bad), self.assertRaises(TypeError):
                jcs.key_text(bad)

    def test_equal_numbers_name_one_operation(self) -> None:
        import idemkv.testing

        kv = idemkv.testing.MemoryClient(tenant="acme")
        runs: list[Any] = []

        @kv.idempotent(key="order_id", tool="refund", outcome=True)
        def refund(order_id: Any) -> dict[str, str]:
            runs.append(order_id)
            return {"id": "RF-1"}

        first = refund(17)
        again = refund(17.0)  # the same order, as a model that writes numbers as floats sends it
        self.assertEqual(runs, [17], "17 and 17.0 ran twice")
        self.assertTrue(again.replayed)
        self.assertEqual(first.receipt["idempotency_key"], "17:refund")


class ServerAgrees(unittest.TestCase):
    """The server fingerprints an effect sent whole (reserve with "effect"); it must
    compute the bytes the client computes."""

    def test_server_fingerprint_equals_client(self) -> None:
        node = harness.shared_node()
        c = idemkv.Client(node.http, tenant="fp")
        self.addCleanup(c.close)
        checked = 0
        for v in load_vectors():
            if v.get("invalid") or v.get("drop"):
                continue
            value = json.loads(v["canonical"])
            res = c.reserve("fp", harness.unique("vec"), "fp_check", effect=value)
            # A float of 2**53 or more has no fingerprint as a value; as text it has.
            mine = idemkv.fingerprint(idemkv.RawJSON(v["canonical"]) if _big_float(value) else value)
            self.assertEqual(res["record"]["effect_fingerprint"], mine, v["name"])
            self.assertEqual(res["record"]["effect_fingerprint"], v["fingerprint"], v["name"])
            checked += 1
        self.assertGreater(checked, 40)
        print(f"\nserver agrees on {checked} effects")


if __name__ == "__main__":
    unittest.main()
