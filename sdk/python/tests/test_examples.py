"""The examples in sdk/python/examples run against a real daemon and leave no sandbox behind."""

import os
import subprocess
import sys
import unittest

import forkd
from helpers import daemon_env

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")

EXPECTED = {
    "quickstart.py": ["exit code 0", "failed as expected: exit 3", "run_code: result=45", "equal=True"],
    "fan_out.py": ["child 0: 0", "child 2: 6"],
    "branch.py": ["child 1: plan=['read', 'think', 'child 1'] notes='step 1 done'",
                  "source: plan=['read', 'think', 'source only']", "deleted "],
    "stream.py": ["ALPHA", "exit 0", "cancelled after"],
}


class Examples(unittest.TestCase):
    def test_every_example_runs(self) -> None:
        daemon = daemon_env()
        env = {**os.environ, "FORKD_URL": daemon["FORKD_TEST_URL"], "FORKD_SNAPSHOT": daemon["FORKD_TEST_SNAPSHOT"]}
        env.pop("FORKD_TOKEN", None)
        self.assertEqual(sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py")), sorted(EXPECTED))
        for name, markers in EXPECTED.items():
            with self.subTest(example=name):
                ran = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), "3"], env=env,
                                     capture_output=True, text=True, timeout=600)
                self.assertEqual(ran.returncode, 0, f"{name}\nstdout:\n{ran.stdout}\nstderr:\n{ran.stderr}")
                for marker in markers:
                    self.assertIn(marker, ran.stdout, name)
        left = forkd.Controller(daemon["FORKD_TEST_URL"], env={}).list_sandboxes()
        self.assertEqual(left, [], "the examples killed their sandboxes")


if __name__ == "__main__":
    unittest.main()
