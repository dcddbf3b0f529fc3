"""Installs the idemkv package from this source tree without pip, wheel or a network.

    python3 clients/python/install.py              # this interpreter's (or venv's) site-packages
    python3 clients/python/install.py --user       # the user's site-packages
    python3 clients/python/install.py --target DIR # any directory, for PYTHONPATH

The package is pure Python with no dependencies, so installing it is copying
src/idemkv and writing the metadata pip reads: afterwards ``pip show idemkv`` and
``pip uninstall idemkv`` work as for any installed package. ``pip install
./clients/python`` does the same where pip can build (setuptools >= 61 and wheel, or an
index to fetch them from).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import shutil
import site
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "src", "idemkv")


def version() -> str:
    with open(os.path.join(SRC, "__init__.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if m is None:
        raise SystemExit("install.py: no __version__ in src/idemkv/__init__.py")
    return m.group(1)


def record_line(root: str, path: str) -> str:
    with open(path, "rb") as f:
        data = f.read()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{os.path.relpath(path, root)},sha256={digest},{len(data)}"


def install(target: str) -> str:
    os.makedirs(target, exist_ok=True)
    dest = os.path.join(target, "idemkv")
    if os.path.exists(dest):
        shutil.rmtree(dest)
    shutil.copytree(SRC, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    v = version()
    for old in os.listdir(target):
        if old.startswith("idemkv-") and old.endswith(".dist-info"):
            shutil.rmtree(os.path.join(target, old))
    info = os.path.join(target, f"idemkv-{v}.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(f"Metadata-Version: 2.1\nName: idemkv\nVersion: {v}\n"
                "Summary: Python client of idemkv, the idempotency store AI agents run on\n"
                "Requires-Python: >=3.10\n")
    with open(os.path.join(info, "INSTALLER"), "w", encoding="utf-8") as f:
        f.write("idemkv-install.py\n")
    lines = []
    for d in (dest, info):
        for dirpath, _, names in os.walk(d):
            lines += [record_line(target, os.path.join(dirpath, n)) for n in sorted(names)]
    lines.append(f"{os.path.relpath(os.path.join(info, 'RECORD'), target)},,")
    with open(os.path.join(info, "RECORD"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return dest


def main() -> None:
    p = argparse.ArgumentParser(description="Install idemkv from this source tree (no pip, no network).")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--user", action="store_true", help="into the user's site-packages")
    g.add_argument("--target", help="into this directory (put it on PYTHONPATH)")
    a = p.parse_args()
    if a.target:
        target = a.target
    elif a.user:
        target = site.getusersitepackages()
    else:
        target = sysconfig.get_paths()["purelib"]
    dest = install(target)
    print(f"idemkv {version()} installed in {dest} for {sys.executable}")


if __name__ == "__main__":
    main()
