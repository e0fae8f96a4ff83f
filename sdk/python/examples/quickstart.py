"""forkd Python SDK quick start: one sandbox, a streamed command, Python in the warm interpreter, files.

    python3 sdk/python/examples/quickstart.py

Talks to the daemon at FORKD_URL (default unix:/run/forkd/forkd.sock; FORKD_TOKEN over TCP). Spawns from the
snapshot FORKD_SNAPSHOT if set, else from the template "pyagent" (whose snapshot the daemon builds on first use).
"""

import os

from forkd import CommandExitError, Sandbox

snapshot = os.environ.get("FORKD_SNAPSHOT")

# The sandbox is killed when the block ends, however it ends.
with Sandbox.create(None if snapshot else "pyagent", snapshot_tag=snapshot, timeout=120) as sandbox:
    print(f"sandbox {sandbox.id} is {sandbox.info['status']}")

    # Each line reaches the callback as soon as the command prints it.
    result = sandbox.commands.run(
        "uname -sr; for i in 1 2 3; do echo tick $i; sleep 0.2; done",
        on_stdout=lambda line: print(f"  | {line}", end=""),
    )
    print(f"exit code {result.exit_code}")

    # A failing command raises, carrying its output.
    try:
        sandbox.commands.run("echo 'no such thing' >&2; exit 3")
    except CommandExitError as err:
        print(f"failed as expected: exit {err.exit_code}, stderr {err.stderr!r}")

    # numpy was imported before the snapshot was taken, so this does not pay for the import.
    code = sandbox.run_code("import numpy\nprint('computing')\nnumpy.arange(10).sum()")
    print(f"run_code: result={code.result} stdout={code.stdout!r} error={code.error}")
    failed = sandbox.run_code("1 / 0")
    print(f"a Python error is a value, not an exception: {failed.error.name if failed.error else None}")

    # Files are binary-safe.
    data = bytes(range(256))
    sandbox.files.write("/tmp/bytes.bin", data)
    back = sandbox.files.read("/tmp/bytes.bin", format="bytes")
    print(f"file round trip: {len(back)} bytes, equal={back == data}")
    print("entries in /tmp:", sorted(entry.name for entry in sandbox.files.list("/tmp")))
