"""Streaming exec with the Controller: output as it happens, input while it runs, and cancellation.

    python3 sdk/python/examples/stream.py

FORKD_SNAPSHOT names the snapshot (default "pyagent").
"""

import os
import threading
import time

from forkd import CancelledError, CancelToken, Controller

tag = os.environ.get("FORKD_SNAPSHOT", "pyagent")
controller = Controller()
[sandbox] = controller.spawn_sandboxes(tag, lifetime=120)
try:
    # Lines typed into a program while it runs (full duplex).
    def lines():
        for word in ("alpha", "beta", "gamma"):
            yield f"{word}\n"
            time.sleep(0.2)

    with controller.exec_stream(sandbox["id"], ["tr", "a-z", "A-Z"], stdin=lines()) as events:
        for event in events:
            if event.type == "stdout":
                print(f"stdout: {event.data.decode()!r}")
            elif event.type == "exit":
                print(f"exit {event.exit_code}")

    # Cancelling a running command kills it in the guest.
    token = CancelToken()
    threading.Timer(1.0, token.cancel, args=("took too long",)).start()
    started = time.monotonic()
    try:
        for event in controller.exec_stream(sandbox["id"], ["sleep", "60"], cancel=token):
            pass
    except CancelledError as err:
        print(f"cancelled after {time.monotonic() - started:.1f} s: {err.reason}")
finally:
    controller.kill_sandbox(sandbox["id"])
