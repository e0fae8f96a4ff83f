"""forkd's warm Python worker.

One long-lived interpreter per sandbox, started by the guest agent before the parent VM is snapshotted, so
every child inherits it warm (modules imported, warm-up state in its namespace). The agent talks to it over
fd 3 (a socketpair): each message is a 4-byte big-endian length and UTF-8 JSON.

agent -> worker: {"id": n, "code": str, "max_chars": n, "max_traceback": n, "reseed": bool}
worker -> agent: {"ready": true, "pid": n, "python": "3.11.2"} once at start, then per request
                 {"id": n, "result": str|null, "result_truncated": bool, "stdout": str, "stderr": str,
                  "stdout_truncated": bool, "stderr_truncated": bool, "error": {type, message, traceback}|null}

The request path is kept lean on purpose (a restored child pays for every step under TCG): no imports, no
process spawn, one read and one write per cell. A cell runs like a notebook cell: statements execute in one
persistent namespace and the repr of a trailing expression is the result. SIGINT interrupts a running cell
(KeyboardInterrupt) and is ignored between cells.
"""

import ast
import io
import json
import linecache
import os
import signal
import sys
import time
import traceback

CHANNEL = 3
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_REMEMBERED_CELLS = 200

namespace = {"__name__": "__main__", "__doc__": None}


class State:
    running = False
    cells = 0


def on_sigint(signum, frame):
    if State.running:
        raise KeyboardInterrupt


class Capture(io.TextIOBase):
    """A bounded replacement for sys.stdout/sys.stderr while a cell runs."""

    def __init__(self, limit):
        self.parts = []
        self.size = 0
        self.limit = limit
        self.truncated = False

    @property
    def encoding(self):
        return "utf-8"

    def writable(self):
        return True

    def isatty(self):
        return False

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        room = self.limit - self.size
        if room > 0:
            part = text[:room]
            self.parts.append(part)
            self.size += len(part)
        if len(text) > room:
            self.truncated = True
        return len(text)

    def getvalue(self):
        return "".join(self.parts)


def read_exact(count):
    parts = []
    while count:
        chunk = os.read(CHANNEL, count)
        if not chunk:
            sys.exit(0)  # the agent went away
        parts.append(chunk)
        count -= len(chunk)
    return b"".join(parts)


def send(message):
    data = json.dumps(message).encode("utf-8")
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        written = os.write(CHANNEL, view)
        view = view[written:]


def remember_source(name, code):
    # Lets tracebacks show the cell's lines; old cells are forgotten so the cache stays bounded.
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    stale = f"<cell-{State.cells - MAX_REMEMBERED_CELLS}>"
    linecache.cache.pop(stale, None)


def describe(error, tb, max_traceback):
    try:
        message = str(error)
    except BaseException:
        message = "<exception str() failed>"
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    try:
        text = "".join(traceback.format_exception(type(error), error, tb))
    except BaseException:
        text = f"{type(error).__name__}: {message}\n"
    if len(text) > max_traceback:
        text = "…(truncated)\n" + text[-max_traceback:]
    return {"type": type(error).__name__, "message": message[:4096], "traceback": text}


def reseed():
    # Every child of a snapshot starts with the parent's PRNG states; give each its own once the kernel RNG
    # has been reseeded by the host's entropy. Only modules the cells already imported are touched.
    module = sys.modules.get("random")
    if module is not None:
        module.seed()
    module = sys.modules.get("numpy.random")
    if module is not None:
        module.seed()


def run_cell(request):
    State.cells += 1
    name = f"<cell-{State.cells}>"
    code = request["code"]
    limit = request["max_chars"]
    out, err = Capture(limit), Capture(limit)
    reply = {"id": request["id"], "result": None, "result_truncated": False, "error": None}
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        try:
            tree = ast.parse(code, name, "exec")
            tail = None
            if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
                tail = compile(ast.Expression(tree.body.pop().value), name, "eval")
            body = compile(tree, name, "exec")
        except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as error:
            # Errors of the compile step: the worker's own frames mean nothing to the caller.
            reply["error"] = describe(error, None, request["max_traceback"])
            return reply
        remember_source(name, code)
        try:
            State.running = True
            exec(body, namespace)
            value = eval(tail, namespace) if tail is not None else None
            if value is not None:
                namespace["_"] = value
                text = repr(value)
                if len(text) > limit:
                    text = text[:limit]
                    reply["result_truncated"] = True
                reply["result"] = text
            State.running = False
        except BaseException as error:  # noqa: BLE001 - user code may raise anything, SystemExit included
            State.running = False
            reply["error"] = describe(error, error.__traceback__, request["max_traceback"])
    finally:
        State.running = False
        sys.stdout, sys.stderr = saved
        reply["stdout"] = out.getvalue()
        reply["stderr"] = err.getvalue()
        reply["stdout_truncated"] = out.truncated
        reply["stderr_truncated"] = err.truncated
    return reply


def prime():
    # Runs the cell path (value, print capture, exception and traceback) once before the parent VM is
    # snapshotted, so a restored child's first cell does not pay for first use. Leaves no trace.
    for code in ("None", "print(1)\n2", "1/0"):
        run_cell({"id": 0, "code": code, "max_chars": 64, "max_traceback": 4096})
    for cell in range(1, State.cells + 1):
        linecache.cache.pop(f"<cell-{cell}>", None)
    State.cells = 0
    namespace.pop("_", None)


def main():
    os.set_inheritable(CHANNEL, False)  # processes the cells spawn must not see the agent's channel
    signal.signal(signal.SIGINT, on_sigint)
    prime()
    send({"ready": True, "pid": os.getpid(), "python": sys.version.split()[0]})
    while True:
        size = int.from_bytes(read_exact(4), "big")
        if size > MAX_MESSAGE_BYTES:
            sys.exit(f"forkd worker: message of {size} bytes is too large")
        request = json.loads(read_exact(size))
        started = time.monotonic()
        try:
            if request.get("reseed"):
                reseed()
            reply = run_cell(request)
        except BaseException as error:  # noqa: BLE001 - e.g. an interrupt racing the end of a cell
            reply = {
                "id": request.get("id"),
                "result": None,
                "result_truncated": False,
                "stdout": "",
                "stderr": "",
                "stdout_truncated": False,
                "stderr_truncated": False,
                "error": describe(error, None, 4096),
            }
        reply["duration_ms"] = (time.monotonic() - started) * 1000
        send(reply)


if __name__ == "__main__":
    main()
