"""forkd's warm Python worker.

One long-lived interpreter per sandbox, started by the guest agent before the parent VM is snapshotted, so
every child inherits it warm (modules imported, warm-up state in its namespace). The agent talks to it over
fd 3 (a socketpair): each message is a 4-byte big-endian length and UTF-8 JSON.

agent -> worker:
  {"id", "op": "cell", "code", "context"?, "cwd"?, "env"?, "stream", "warmup", "max_chars", "max_traceback",
   "reseed"}
  {"id", "op": "context.create", "context"?, "cwd"?, "language"?} | {"id", "op": "context.list"}
  {"id", "op": "context.restart" | "context.remove", "context"}
worker -> agent:
  {"ready": true, "pid", "python"} once at start;
  {"id", "stream": "stdout" | "stderr", "text"} while a streaming cell runs: one line each (with its newline),
   as Jupyter streams; a line without one goes out when the cell flushes, displays something or ends;
  {"id", "stream": "display", "text": JSON of {text?, html?, png?, ..., chart?}} for display(value) and for a
   matplotlib figure still open at the end of the cell (Jupyter's display_data);
  {"id", "result", "result_truncated", "formats"?, "stdout", "stderr", "stdout_truncated", "stderr_truncated",
   "error": {type, message, traceback} | null, "execution_count"} when a cell ends;
  {"id", "context": {id, cwd, language}} | {"id", "contexts": [...]} | {"id"} for context ops;
  {"id", "fail": {"code", "message"}} when a request cannot be served (e.g. an unknown context).

Contexts are namespaces: `default` is the warm namespace the template's warm-up ran in; a new context starts
as a shallow copy of the namespace as it was right after the warm-up, so nothing is imported again. A bash or
javascript context is a process of that language instead (kernels.py, loaded on first use).

`display(value, ...)` is a builtin, as in a Jupyter kernel: in a streaming cell each value becomes a display
output; otherwise its repr is printed.

The request path is kept lean on purpose (a restored child pays for every step under TCG): no imports, no
process spawn, one read and one write per cell (plus one write per streamed print). A cell runs like a notebook
cell: statements execute in the context's namespace and the repr of a trailing expression is the result; a
directory it changes to stays its context's; IPython's `!cmd` and `%magic` lines work as in Jupyter (magics.py).
SIGINT interrupts a running cell (KeyboardInterrupt) and is ignored between cells.
"""

import ast
import base64
import builtins
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
MAX_CONTEXTS = 1024
DEFAULT = "default"
# A streamed line longer than this goes out in pieces (a print without newlines must not grow without bound).
MAX_STREAM_LINE = 64 * 1024
# Display outputs of one cell; more are dropped (each is bounded by max_chars per format).
MAX_DISPLAYS = 256

# IPython's display protocol: method -> key of the result's formats; binary ones are base64.
REPR_METHODS = (
    ("_repr_html_", "html", False),
    ("_repr_markdown_", "markdown", False),
    ("_repr_svg_", "svg", False),
    ("_repr_png_", "png", True),
    ("_repr_jpeg_", "jpeg", True),
    ("_repr_pdf_", "pdf", True),
    ("_repr_latex_", "latex", False),
    ("_repr_json_", "json", False),
    ("_repr_javascript_", "javascript", False),
)


class Context:
    def __init__(self, cid, namespace, cwd, language="python", kernel=None):
        self.id = cid
        self.namespace = namespace
        self.cwd = cwd
        self.count = 0
        self.language = language
        # The process of a bash or javascript context (kernels.py); None for Python.
        self.kernel = kernel

    def info(self):
        return {"id": self.id, "cwd": self.cwd, "language": self.language}


def fresh_namespace():
    return {"__name__": "__main__", "__doc__": None}


class State:
    running = False
    # A SIGINT that arrived while a streaming cell was writing to the agent (delivered right after).
    pending_interrupt = False
    cells = 0
    # The namespace as it was right after the warm-up: what new and restarted contexts start from.
    warm_names = fresh_namespace()
    contexts = {DEFAULT: Context(DEFAULT, fresh_namespace(), "/")}
    next_context = 0
    # The running cell's display sink (display() while no cell runs prints the repr).
    cell = None


def on_sigint(signum, frame):
    if State.running:
        raise KeyboardInterrupt
    State.pending_interrupt = True


class Capture(io.TextIOBase):
    """A bounded replacement for sys.stdout/sys.stderr while a cell runs; streams when `stream` is set."""

    def __init__(self, limit, stream=None, request_id=None):
        self.parts = []
        self.size = 0
        self.limit = limit
        self.truncated = False
        self.stream = stream
        self.request_id = request_id
        # Streaming: the line written so far, sent once it is complete (or flushed).
        self.pending = ""

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
        if self.stream is not None:
            if text:
                self.pending += text
                if "\n" in text or len(self.pending) >= MAX_STREAM_LINE:
                    cut = self.pending.rfind("\n") + 1 or len(self.pending)
                    ready, self.pending = self.pending[:cut], self.pending[cut:]
                    stream_out(self.request_id, self.stream, ready.splitlines(True))
            return len(text)
        room = self.limit - self.size
        if room > 0:
            part = text[:room]
            self.parts.append(part)
            self.size += len(part)
        if len(text) > room:
            self.truncated = True
        return len(text)

    def flush(self):
        if self.stream is not None and self.pending:
            line, self.pending = self.pending, ""
            stream_out(self.request_id, self.stream, [line])

    def getvalue(self):
        return "".join(self.parts)


def stream_out(request_id, stream, texts):
    """Sends streamed output to the agent, one message per text (a line, or a display's JSON)."""
    # An interrupt must not cut a message to the agent in half: it is held until the writes are done.
    was_running = State.running
    State.running = False
    State.pending_interrupt = False
    try:
        for text in texts:
            send({"id": request_id, "stream": stream, "text": text})
    finally:
        State.running = was_running
    if was_running and State.pending_interrupt:
        State.pending_interrupt = False
        raise KeyboardInterrupt


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
    data = json.dumps(message).encode("utf-8", "surrogatepass")
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


def rich_formats(value, limit):
    """What the value offers through the display protocol, each bounded (a failing method is skipped)."""
    formats = {}
    for method, key, binary in REPR_METHODS:
        fn = getattr(type(value), method, None)
        if fn is None:
            continue
        try:
            data = fn(value)
        except Exception:  # noqa: BLE001 - a broken repr must not fail the cell
            continue
        if isinstance(data, tuple) and data:
            data = data[0]  # (data, metadata)
        if data is None:
            continue
        if binary and isinstance(data, (bytes, bytearray)):
            data = base64.b64encode(data).decode("ascii")
        elif key == "json" and not isinstance(data, str):
            try:
                data = json.dumps(data)
            except (TypeError, ValueError):
                continue
        if not isinstance(data, str) or len(data) > limit:
            continue
        formats[key] = data
    return formats


class CellOutput:
    """Where a streaming cell's display outputs go (and the captures they must not overtake)."""

    def __init__(self, request, out, err):
        self.request_id = request["id"]
        self.limit = request["max_chars"]
        self.out = out
        self.err = err
        self.streaming = out.stream is not None
        self.count = 0

    def show(self, data):
        if not self.streaming:
            print(data.get("text", ""))
            return
        if self.count >= MAX_DISPLAYS:
            return
        self.count += 1
        self.out.flush()
        self.err.flush()
        stream_out(self.request_id, "display", [json.dumps(data)])

    def value(self, value):
        data = rich_formats(value, self.limit)
        text = bounded_repr(value, self.limit)
        if text is not None:
            data["text"] = text
        self.show(data)


def bounded_repr(value, limit):
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken repr must not fail the display
        return None
    return text[:limit]


def display(*values, **_options):
    """Jupyter's display(): each value becomes a display output of the running cell."""
    cell = State.cell
    for value in values:
        if cell is None:
            print(bounded_repr(value, 4096))
        else:
            cell.value(value)


def show_figures(cell):
    """Like Jupyter's inline backend: every matplotlib figure still open at the end of a cell is displayed once
    (PNG, its repr as text, E2B's chart data where the image has e2b_charts) and closed."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    for number in pyplot.get_fignums():
        figure = pyplot.figure(number)
        data = {"text": bounded_repr(figure, cell.limit) or "<Figure>"}
        try:
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", bbox_inches="tight")
            png = base64.b64encode(buffer.getvalue()).decode("ascii")
            if len(png) <= cell.limit:
                data["png"] = png
        except Exception:  # noqa: BLE001 - a figure that cannot render is shown as text only
            pass
        chart = figure_chart(figure)
        if chart is not None and len(chart) <= cell.limit:
            data["chart"] = chart
        cell.show(data)
    pyplot.close("all")


def figure_chart(figure):
    """E2B's chart data for a figure (what its code interpreter adds), when the image has the e2b_charts package."""
    try:
        from e2b_charts import chart_figure_to_dict  # noqa: PLC0415 - only in images that have it
    except ImportError:
        return None
    try:
        return json.dumps(chart_figure_to_dict(figure), default=str)
    except Exception:  # noqa: BLE001 - E2B's own server sends no chart when extraction fails
        return None


def with_cwd_env(request, context, run):
    """Runs `run` in the context's working directory with the request's extra environment laid over it."""
    cwd = request.get("cwd")
    if cwd is not None:
        context.cwd = cwd
    try:
        os.chdir(context.cwd)
    except OSError:
        pass
    extra = request.get("env") or {}
    saved = {key: os.environ.get(key) for key in extra}
    os.environ.update(extra)
    try:
        return run()
    finally:
        # A cell that changed directory (os.chdir, %cd) leaves its context there, as a kernel's process is.
        try:
            context.cwd = os.getcwd()
        except OSError:
            pass
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def parse_cell(code, name):
    """The cell's syntax tree; a cell that is not Python but has IPython's `!cmd` or `%magic` lines is read as
    IPython reads it (magics.py, loaded only then). Its own SyntaxError otherwise."""
    try:
        return ast.parse(code, name, "exec")
    except SyntaxError:
        if "!" not in code and "%" not in code:
            raise
        import magics  # noqa: PLC0415 - only cells with IPython syntax pay for it

        rewritten = magics.transform(code)
        if rewritten is None:
            raise
        magics.install()
        try:
            return ast.parse(rewritten, name, "exec")
        except SyntaxError:
            pass
        raise


def run_cell(request, context):
    State.cells += 1
    context.count += 1
    name = f"<cell-{State.cells}>"
    code = request["code"]
    limit = request["max_chars"]
    streaming = request.get("stream") is True
    out = Capture(limit, "stdout" if streaming else None, request["id"])
    err = Capture(limit, "stderr" if streaming else None, request["id"])
    namespace = context.namespace
    reply = {"id": request["id"], "result": None, "result_truncated": False, "error": None}
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    State.cell = CellOutput(request, out, err)
    try:
        try:
            tree = parse_cell(code, name)
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
            if State.cell.streaming:
                show_figures(State.cell)
            out.flush()
            err.flush()
            State.running = False
            if value is not None:
                namespace["_"] = value
                text = repr(value)
                if len(text) > limit:
                    text = text[:limit]
                    reply["result_truncated"] = True
                reply["result"] = text
                formats = rich_formats(value, limit)
                if formats:
                    reply["formats"] = formats
        except BaseException as error:  # noqa: BLE001 - user code may raise anything, SystemExit included
            State.running = False
            reply["error"] = describe(error, error.__traceback__, request["max_traceback"])
            flush_quietly(out, err)
    finally:
        State.running = False
        State.cell = None
        sys.stdout, sys.stderr = saved
        reply["stdout"] = out.getvalue()
        reply["stderr"] = err.getvalue()
        reply["stdout_truncated"] = out.truncated
        reply["stderr_truncated"] = err.truncated
        reply["execution_count"] = context.count
    return reply


def flush_quietly(*captures):
    # What a failed cell printed before its error still goes out (an interrupt now is one too many: dropped).
    for capture in captures:
        try:
            capture.flush()
        except BaseException:  # noqa: BLE001
            capture.pending = ""


def failure(request, code, message):
    return {"id": request.get("id"), "fail": {"code": code, "message": message}}


def context_of(request):
    cid = request.get("context") or DEFAULT
    return State.contexts.get(cid), cid


def serve_cell(request):
    context, cid = context_of(request)
    if context is None:
        return failure(request, "not_found", f"no context {cid!r} (create it with context.create)")
    if request.get("reseed"):
        reseed()
    if context.kernel is not None:
        return context.kernel.run_cell(request, context)
    reply = with_cwd_env(request, context, lambda: run_cell(request, context))
    if request.get("warmup") and reply["error"] is None:
        State.warm_names = dict(context.namespace)
    return reply


def serve_context(request):
    op = request["op"]
    if op == "context.list":
        return {"id": request["id"], "contexts": [c.info() for c in State.contexts.values()]}
    if op == "context.create":
        cid = request.get("context")
        if cid is None:
            State.next_context += 1
            cid = f"ctx-{State.next_context}"
            while cid in State.contexts:
                State.next_context += 1
                cid = f"ctx-{State.next_context}"
        if cid in State.contexts:
            return failure(request, "conflict", f"context {cid!r} already exists")
        if len(State.contexts) >= MAX_CONTEXTS:
            return failure(request, "too_many_requests", f"at most {MAX_CONTEXTS} contexts")
        language = request.get("language") or "python"
        cwd = request.get("cwd") or "/"
        kernel = None
        if language != "python":
            import kernels  # noqa: PLC0415 - only cells of other languages pay for it

            kernel, problem = kernels.start(language, cwd)
            if kernel is None:
                return failure(request, "not_implemented", problem)
        context = Context(cid, dict(State.warm_names), cwd, language, kernel)
        State.contexts[cid] = context
        return {"id": request["id"], "context": context.info()}
    context, cid = context_of(request)
    if context is None:
        return failure(request, "not_found", f"no context {cid!r}")
    if op == "context.restart":
        context.namespace = dict(State.warm_names)
        context.count = 0
        if context.kernel is not None:
            import kernels  # noqa: PLC0415

            context.kernel.stop()
            context.kernel, problem = kernels.start(context.language, context.cwd)
            if context.kernel is None:
                del State.contexts[cid]
                return failure(request, "unavailable", problem)
        return {"id": request["id"], "context": context.info()}
    if op == "context.remove":
        if cid == DEFAULT:
            return failure(request, "invalid_argument", "the default context cannot be removed")
        if context.kernel is not None:
            context.kernel.stop()
        del State.contexts[cid]
        return {"id": request["id"]}
    return failure(request, "not_implemented", f"unknown worker op {op!r}")


def prime():
    # Runs the cell path (value, print capture, streaming, rich formats, exception and traceback) once before
    # the parent VM is snapshotted, so a restored child's first cell does not pay for first use.
    context = State.contexts[DEFAULT]
    for code in ("None", "print(1)\n2", "1/0"):
        run_cell({"id": 0, "code": code, "max_chars": 64, "max_traceback": 4096}, context)
    for cell in range(1, State.cells + 1):
        linecache.cache.pop(f"<cell-{cell}>", None)
    State.cells = 0
    context.count = 0
    context.namespace = fresh_namespace()


def main():
    os.set_inheritable(CHANNEL, False)  # processes the cells spawn must not see the agent's channel
    builtins.display = display
    # Figures render off-screen and are shown at the end of their cell, as Jupyter's inline backend does.
    os.environ.setdefault("MPLBACKEND", "Agg")
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
            if request.get("op") == "cell":
                reply = serve_cell(request)
            else:
                reply = serve_context(request)
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
