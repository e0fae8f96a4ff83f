"""forkd v0.5 client code (v05_usage.py) runs unmodified against a real daemon, over TCP with a token as v0.5's
clients talk."""

import os
import subprocess
import sys
import unittest

from helpers import daemon_env


class V05Replay(unittest.TestCase):
    def test_v05_controller_code_runs_unmodified(self) -> None:
        daemon = daemon_env()
        env = {**os.environ, "FORKD_URL": daemon["FORKD_TEST_TCP_URL"], "FORKD_TOKEN": daemon["FORKD_TEST_TOKEN"]}
        script = os.path.join(os.path.dirname(__file__), "v05_usage.py")
        ran = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=900)
        self.assertEqual(ran.returncode, 0, f"stdout:\n{ran.stdout}\nstderr:\n{ran.stderr}")
        self.assertIn("grandchildren: 2", ran.stdout)
        self.assertIn("zeros: [0.0, 0.0, 0.0, 0.0, 0.0]", ran.stdout)
        self.assertIn("source branched: True 1", ran.stdout)
        self.assertIn("unknown sandbox: 404 sandbox sb-abc-0000 not found", ran.stdout)
        self.assertTrue(ran.stdout.rstrip().endswith("v0.5 usage: ok"), ran.stdout)


if __name__ == "__main__":
    unittest.main()
