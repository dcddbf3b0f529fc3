"""Real idemkv processes for the tests: one shared node, and three-node clusters.

The binary is $IDEMKV_BIN, or built from this repository with ``go build`` once per
run. Ports come from below the ephemeral range, as the Go tests' internal/freeport
picks them, so that they do not collide with the clients' own sockets.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from typing import Callable, Optional, TypeVar

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

T = TypeVar("T")

_lock = threading.Lock()
_handed: set[int] = set()
_bin: Optional[str] = None
_tmp = tempfile.mkdtemp(prefix="idemkv-py-")
atexit.register(shutil.rmtree, _tmp, True)


def repo_root() -> str:
    d = HERE
    while d != "/":
        if os.path.exists(os.path.join(d, "go.mod")):
            return d
        d = os.path.dirname(d)
    raise RuntimeError("no go.mod above " + HERE)


def binary() -> str:
    global _bin
    with _lock:
        if _bin is None:
            env = os.environ.get("IDEMKV_BIN")
            if env:
                _bin = env
            else:
                out = os.path.join(_tmp, "idemkv")
                subprocess.run(["go", "build", "-o", out, "./cmd/idemkv"], cwd=repo_root(), check=True)
                _bin = out
        return _bin


def free_addr() -> str:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo_eph = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        lo_eph = 32768
    with _lock:
        for _ in range(1000):
            port = random.randrange(15000, lo_eph)
            if port in _handed:
                continue
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            finally:
                s.close()
            _handed.add(port)
            return f"127.0.0.1:{port}"
    raise RuntimeError("no free port")


def eventually(timeout: float, what: str, f: Callable[[], T]) -> T:
    """Polls f until it returns without raising (and not None), or fails the test."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            v = f()
            if v is not None:
                return v
        except Exception as e:  # noqa: BLE001 - the condition is not met yet
            last = e
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout}s (last: {last!r})")


class Node:
    """One ``idemkv serve`` process, restartable on its data dir."""

    def __init__(self, node_id: str, join: str = "", extra: Optional[list[str]] = None, scheme: str = "http") -> None:
        self.id = node_id
        self.http = free_addr()
        self.raft = free_addr()
        self.dir = os.path.join(_tmp, f"{node_id}-{uuid.uuid4().hex[:8]}")
        self.join = join
        self.extra = extra or []
        self.scheme = scheme
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.log = os.path.join(self.dir + ".log")

    def start(self) -> "Node":
        args = [binary(), "serve", "--id", self.id, "--data-dir", self.dir, "--http-addr", self.http,
                "--raft-addr", self.raft, "--heartbeat-timeout", "500ms", "--election-timeout", "500ms",
                "--leader-lease-timeout", "250ms"] + self.extra
        if self.join:
            args += ["--join", self.join]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        _live.append(self)
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def url(self, path: str) -> str:
        return f"{self.scheme}://{self.http}{path}"

    def wait_ready(self, timeout: float = 30) -> "Node":
        def ready() -> bool:
            if self.proc and self.proc.poll() is not None:
                raise AssertionError(f"{self.id} exited: {self.logs()[-2000:]}")
            with urllib.request.urlopen(self.url("/readyz"), timeout=2) as r:
                return r.status == 200 or None  # type: ignore[return-value]

        eventually(timeout, f"{self.id} ready", ready)
        return self

    def logs(self) -> str:
        try:
            return open(self.log, encoding="utf-8", errors="replace").read()
        except OSError:
            return ""


_live: list[Node] = []


@atexit.register
def _stop_all() -> None:
    for n in _live:
        n.kill()


_shared: Optional[Node] = None


def shared_node() -> Node:
    """One node for the tests that do not kill it; keys are unique per test."""
    global _shared
    if _shared is None:
        n = Node("shared").start()
        n.wait_ready()
        _shared = n
    return _shared


def cluster3() -> list[Node]:
    n1 = Node("n1").start().wait_ready()
    n2, n3 = Node("n2", join=n1.http).start(), Node("n3", join=n1.http).start()
    nodes = [n1, n2, n3]

    def three() -> bool:
        with urllib.request.urlopen(n1.url("/v1/cluster"), timeout=5) as r:
            info = json.load(r)
        # A node that joins is a learner until it caught up: wait for three voters, or
        # a test that kills the leader may leave one voter of two.
        ok = len(info["nodes"]) == 3 and all(x["api_addr"] and x.get("suffrage") == "voter" for x in info["nodes"])
        return ok or None  # type: ignore[return-value]

    eventually(60, "three voters", three)
    for n in nodes:
        n.wait_ready(60)
    return nodes


def leader_of(nodes: list[Node]) -> Node:
    def find() -> Optional[Node]:
        for n in nodes:
            if n.proc is None or n.proc.poll() is not None:
                continue
            try:
                with urllib.request.urlopen(n.url("/v1/cluster"), timeout=2) as r:
                    lid = json.load(r)["leader"]["id"]
            except Exception:  # noqa: BLE001
                continue
            for m in nodes:
                if m.id == lid and m.proc and m.proc.poll() is None:
                    return m
        return None

    return eventually(30, "a leader", find)


def unique(prefix: str = "k") -> str:
    return f"{prefix}:{uuid.uuid4().hex[:12]}"
