"""Low-level calls, the store-wait bound, tokens and TLS, against real nodes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import unittest
from typing import Any

import harness
import idemkv

TENANT = "acme"


class LowLevel(unittest.TestCase):
    def setUp(self) -> None:
        self.node = harness.shared_node()
        self.c = idemkv.Client(self.node.http)
        self.addCleanup(self.c.close)
        self.key = harness.unique("ll/with:odd chars")
        self.fp = idemkv.fingerprint({"k": self.key})

    def test_the_calls(self) -> None:
        c, k, fp = self.c, self.key, self.fp
        r = c.reserve(TENANT, k, "create_ticket", fingerprint=fp, actor="w1", lease_ttl=5, ttl=120)
        self.assertEqual(r["decision"], "execute")
        fence = r["fence"]
        self.assertGreater(fence, 0)
        self.assertEqual(c.heartbeat(TENANT, k, fence, lease_ttl=5)["status"], "pending")
        with self.assertRaises(idemkv.APIError) as cm:
            c.commit(TENANT, k, fp, fence - 1, "linear", "LIN-1")
        self.assertEqual((cm.exception.code, cm.exception.status), ("fenced", 409))

        # A long-poll in another thread wakes up when the record is committed.
        got: list[Any] = []
        t = threading.Thread(target=lambda: got.append(c.get(TENANT, k, wait=10)))
        t.start()
        time.sleep(0.3)
        receipt = c.commit(TENANT, k, fp, fence, "linear", "LIN-1", "https://linear.example/LIN-1", {"n": 1})
        t.join(10)
        self.assertEqual(got[0]["status"], "committed")
        self.assertEqual((receipt["status"], receipt["remote_id"], receipt["result"]), ("committed", "LIN-1", {"n": 1}))
        self.assertEqual(c.commit(TENANT, k, fp, fence, "linear", "LIN-1")["committed_at"], receipt["committed_at"])
        again = c.reserve(TENANT, k, "create_ticket", fingerprint=fp)
        self.assertEqual((again["decision"], again["receipt"]["remote_id"]), ("replay", "LIN-1"))
        self.assertEqual(c.reserve(TENANT, k, "create_ticket", fingerprint="sha256:" + "0" * 64)["decision"],
                         "conflict")

        k2 = k + "/2"
        r2 = c.reserve(TENANT, k2, "t", effect={"a": 1})  # the server fingerprints it
        self.assertEqual(r2["record"]["effect_fingerprint"], idemkv.fingerprint({"a": 1}))
        rec = c.fail(TENANT, k2, r2["record"]["effect_fingerprint"], r2["fence"], "bad_input", "no such project",
                     {"p": "X"})
        self.assertEqual((rec["status"], rec["error"]["code"]), ("failed", "bad_input"))

        k3 = k + "/3"
        r3 = c.reserve(TENANT, k3, "t", fingerprint=fp)
        self.assertEqual(c.release(TENANT, k3, fp, r3["fence"]), {"released": True})
        self.assertIsNone(c.get(TENANT, k3))
        # What the release left: the key's tombstone, its history ended by the release.
        tomb = c.released(TENANT, k3)
        assert tomb is not None
        self.assertEqual([e["event"] for e in tomb["history"]], ["execute", "release"])
        self.assertEqual((tomb["tool"], tomb["effect_fingerprint"]), ("t", fp))
        self.assertIsNone(c.released(TENANT, k))  # a key that holds a record
        self.assertIsNone(c.released(TENANT, k + "/never"))

        page = c.list(TENANT, prefix=k, limit=10)
        self.assertEqual([x["idempotency_key"] for x in page["records"]], [k, k2])
        self.assertEqual([x["idempotency_key"] for x in c.list(TENANT, prefix=k, status="failed")["records"]], [k2])
        info = c.cluster()
        self.assertEqual(info["leader"]["api_addr"], self.node.http)
        self.assertEqual(c.leader, "http://" + self.node.http)  # from the Idemkv-Leader header

    def test_invalid_argument_is_not_retried(self) -> None:
        start = time.monotonic()
        with self.assertRaises(idemkv.APIError) as cm:
            self.c.reserve(TENANT, self.key, "t", fingerprint=self.fp, lease_ttl=0.1)
        self.assertEqual((cm.exception.code, cm.exception.field), ("invalid_argument", "lease_ttl_ms"))
        self.assertLess(time.monotonic() - start, 2)

    def test_async_calls(self) -> None:
        async def main() -> None:
            async with idemkv.AsyncClient(self.node.http) as a:
                r = await a.reserve(TENANT, self.key, "t", fingerprint=self.fp)
                waiter = asyncio.ensure_future(a.get(TENANT, self.key, wait=10))
                await asyncio.sleep(0.2)
                await a.commit(TENANT, self.key, self.fp, r["fence"], "s", "ID-1")
                rec = await waiter
                self.assertEqual(rec["receipt"]["remote_id"], "ID-1")
                self.assertIsNone(await a.get(TENANT, self.key + "/absent"))
                self.assertEqual((await a.cluster())["leader"]["api_addr"], self.node.http)
                page = await a.list(TENANT, prefix=self.key)
                self.assertEqual(len(page["records"]), 1)

        asyncio.run(main())


class StoreWait(unittest.TestCase):
    """No node answers: every call ends within store_wait, and no tool runs."""

    def test_sync_bound(self) -> None:
        dead = harness.free_addr()  # nothing listens there
        c = idemkv.Client([dead], tenant=TENANT, store_wait=1.5, backoff_max=0.2)
        self.addCleanup(c.close)
        ran = []
        start = time.monotonic()
        with self.assertRaises(idemkv.StoreUnavailableError) as cm:
            c.do(lambda: ran.append(1), key="k", tool="create_ticket", effect={"a": 1})
        took = time.monotonic() - start
        self.assertEqual((cm.exception.kind, ran), ("store_unavailable", []))
        self.assertGreaterEqual(took, 1.45)  # the whole bound is used, not given up early
        self.assertLess(took, 3.0)
        print(f"\nstore unavailable: raised after {took:.2f}s with store_wait=1.5s; the tool did not run")

        # Unguarded: an idempotent tool runs anyway; a non-idempotent one still does not.
        u = idemkv.Client([dead], tenant=TENANT, store_wait=0.5, on_store_unavailable="unguarded")
        self.addCleanup(u.close)
        out = u.do(lambda: {"id": "X"}, key="k", tool="set", effect={"a": 1}, side_effect="idempotent")
        self.assertTrue(out.unguarded)
        with self.assertRaises(idemkv.StoreUnavailableError):
            u.do(lambda: ran.append(1), key="k", tool="create", effect={"a": 1})
        self.assertEqual(ran, [])

    def test_killed_node(self) -> None:
        n = harness.Node("doomed").start().wait_ready()
        c = idemkv.Client([n.http], tenant=TENANT, store_wait=1.0)
        self.addCleanup(c.close)
        c.do(lambda: {"id": "1"}, key="before", tool="t", effect={"a": 1})
        n.kill()
        start = time.monotonic()
        with self.assertRaises(idemkv.StoreUnavailableError):
            c.do(lambda: {"id": "2"}, key="after", tool="t", effect={"a": 1})
        self.assertLess(time.monotonic() - start, 2.5)

    def test_async_bound(self) -> None:
        dead = harness.free_addr()

        async def main() -> float:
            a = idemkv.AsyncClient([dead], tenant=TENANT, store_wait=1.0)
            start = time.monotonic()
            with self.assertRaises(idemkv.StoreUnavailableError):
                async def tool() -> Any:
                    raise AssertionError("ran")
                await a.do(tool, key="k", tool="t", effect={"a": 1})
            return time.monotonic() - start

        took = asyncio.run(main())
        self.assertGreaterEqual(took, 0.95)
        self.assertLess(took, 2.5)


def _openssl(*args: str, cwd: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d: str) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate."""
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "ca.key",
             "-out", "ca.pem", "-days", "1", "-subj", "/CN=idemkv test CA",
             # Python 3.13 verifies strictly (VERIFY_X509_STRICT): a CA needs key usage.
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    leaf = "keyUsage=critical,digitalSignature\nauthorityKeyIdentifier=keyid,issuer\n"
    for name, ext in (("server", leaf + "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
                      ("client", leaf + "extendedKeyUsage=clientAuth\n")):
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write(ext)
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", name + ".key",
                 "-out", name + ".csr", "-subj", "/CN=" + name, cwd=d)
        _openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", name + ".pem", "-days", "1", "-extfile", name + ".ext", cwd=d)


@unittest.skipIf(shutil.which("openssl") is None and not os.environ.get("CI"), "openssl is needed to make certificates")
class TokensAndTLS(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.dir = tempfile.mkdtemp(prefix="idemkv-pki-")
        make_pki(cls.dir)
        cls.token = "tok-" + os.urandom(8).hex()
        hashed = subprocess.run([harness.binary(), "auth", "hash-token", cls.token], check=True, capture_output=True,
                                text=True).stdout.strip()
        with open(os.path.join(cls.dir, "tokens.json"), "w") as f:
            json.dump({"tokens": [{"name": "acme", "hash": hashed, "role": "client", "tenants": [TENANT]}]}, f)
        p = lambda n: os.path.join(cls.dir, n)  # noqa: E731
        cls.node = harness.Node("tls", scheme="https", extra=[
            "--auth-file", p("tokens.json"), "--tls-cert", p("server.pem"), "--tls-key", p("server.key"),
            "--tls-client-ca", p("ca.pem"), "--tls-ca", p("ca.pem")]).start()
        ctx = idemkv.Config(ca_file=p("ca.pem"), cert_file=p("client.pem"), key_file=p("client.key")).make_ssl_context()

        def ready() -> bool:
            import urllib.request
            with urllib.request.urlopen(cls.node.url("/readyz"), timeout=2, context=ctx) as r:
                return r.status == 200 or None  # type: ignore[return-value]

        harness.eventually(30, "tls node ready", ready)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.node.kill()
        shutil.rmtree(cls.dir, True)

    def client(self, **kw: Any) -> idemkv.Client:
        p = lambda n: os.path.join(self.dir, n)  # noqa: E731
        opts = dict(tenant=TENANT, token=self.token, ca_file=p("ca.pem"), cert_file=p("client.pem"),
                    key_file=p("client.key"), store_wait=1.0)
        opts.update(kw)
        c = idemkv.Client([self.node.http], **{k: v for k, v in opts.items() if v is not None})
        self.addCleanup(c.close)
        return c

    def test_token_and_client_certificate(self) -> None:
        c = self.client()
        out = c.do(lambda: {"id": "LIN-1"}, key=harness.unique(), tool="t", effect={"a": 1})
        self.assertEqual(out.decision, "execute")
        self.assertTrue(c.leader.startswith("https://"))

        async def main() -> str:
            async with idemkv.AsyncClient(config=c.config) as a:
                async def tool() -> Any:
                    return {"id": "LIN-2"}
                return (await a.do(tool, key=harness.unique(), tool="t", effect={"a": 2})).decision

        self.assertEqual(asyncio.run(main()), "execute")

    def test_refusals(self) -> None:
        with self.assertRaises(idemkv.APIError) as cm:
            self.client(token=None).reserve(TENANT, "k", "t", fingerprint=idemkv.fingerprint(1))
        self.assertEqual((cm.exception.code, cm.exception.status), ("unauthenticated", 401))
        with self.assertRaises(idemkv.APIError) as cm:
            self.client().reserve("beta", "k", "t", fingerprint=idemkv.fingerprint(1))
        self.assertEqual(cm.exception.code, "permission_denied")
        ran = []
        with self.assertRaises(idemkv.NotExecutedError) as ne:
            self.client(token="wrong").do(lambda: ran.append(1), key="k", tool="t", effect={"a": 1})
        self.assertEqual((ne.exception.cause.code, ran), ("unauthenticated", []))  # type: ignore[union-attr]
        # Without a client certificate the handshake fails: no node can be reached.
        with self.assertRaises(idemkv.StoreUnavailableError):
            self.client(cert_file=None, key_file=None).cluster()


if __name__ == "__main__":
    unittest.main()
