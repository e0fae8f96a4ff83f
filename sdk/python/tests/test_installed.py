"""The package under test is the one installed from the wheel (when run by the npm test), and it needs nothing
beyond the standard library."""

import os
import subprocess
import sys
import unittest

import forkd


class Installed(unittest.TestCase):
    def test_imports_from_the_installed_wheel(self) -> None:
        if not os.environ.get("FORKD_TEST_INSTALLED"):
            raise unittest.SkipTest("run through `npm test`, which installs the wheel into a clean venv")
        self.assertTrue(forkd.__file__.startswith(sys.prefix), forkd.__file__)
        self.assertTrue(os.path.exists(os.path.join(os.path.dirname(forkd.__file__), "py.typed")))

    def test_only_the_standard_library(self) -> None:
        if not hasattr(sys, "stdlib_module_names"):
            raise unittest.SkipTest("sys.stdlib_module_names needs Python 3.10")
        probe = (
            "import sys; before = set(sys.modules); import forkd; "
            "print('\\n'.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))"
        )
        ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        imported = set(ran.stdout.split())
        foreign = sorted(imported - set(sys.stdlib_module_names) - {"forkd"})
        self.assertEqual(foreign, [], "forkd imports modules outside the standard library")
        self.assertIn("http", imported)

if __name__ == "__main__":
    unittest.main()
