"""The flat install from the source tree (issue 24, point 12): no pip, no wheel, no
network, and the installed package imports from elsewhere with its metadata in place."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import unittest

import harness

INSTALL = os.path.join(harness.HERE, "..", "install.py")


class FlatInstall(unittest.TestCase):
    def test_install_target(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            target = os.path.join(d, "site")
            out = subprocess.run([sys.executable, INSTALL, "--target", target], capture_output=True, text=True, check=True)
            self.assertIn("installed", out.stdout)
            # From a directory that has nothing of the source tree, with only the target
            # on the path: the installed copy is what imports.
            probe = ("import idemkv, idemkv.testing, importlib.metadata as m; "
                     "print(idemkv.__file__); print(m.version('idemkv'))")
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            env["PYTHONPATH"] = target
            got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=d, env=env,
                                 check=True).stdout.split()
            self.assertTrue(got[0].startswith(target), got)
            self.assertEqual(got[1], "0.1.0")
            record = os.path.join(target, "idemkv-0.1.0.dist-info", "RECORD")
            with open(record) as f:
                self.assertIn("idemkv/py.typed", f.read())


if __name__ == "__main__":
    unittest.main()
