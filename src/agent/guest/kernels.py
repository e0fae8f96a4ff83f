"""Code contexts in languages other than Python, for forkd's warm worker (worker.py imports this on first use).

A context of another language is a long-lived process of that language, so its state (variables, functions,
the working directory) lives on between cells as in E2B's kernels:

  bash        `bash --noprofile --norc`; a cell is written to a file and sourced (stdin from /dev/null), then a
              marker line with a per-context random token and the exit status ends it on stdout and stderr.
              A non-zero status is the cell's error (as bash_kernel reports it: name "", value the status).
  javascript  `node` running NODE_KERNEL (below): a cell is read from a file and run as a script in the
              process's own global scope (vm.runInThisContext), so `var`, `let`, `const`, functions and
              `require`d modules stay for later cells; the last expression's value (a promise's, once it
              settles) is the cell's result, a thrown error its error. Top-level `await` works as in E2B's
              kernel and Node's REPL: such a cell is rewritten by the REPL's own rewrite (Node's
              internal/repl/await, reached with --expose-internals: Node's bundled parser, not one of ours),
              which hoists its declarations to the global scope so later cells see them. A marker line with
              the same token carries the outcome as JSON. Needs a `node` on the image's PATH (Debian's
              nodejs, say).

Output streams line by line to the agent while the cell runs (through worker.stream_out); an interrupt (the
agent's SIGINT to the worker) is passed to the kernel's process group and the cell ends with the marker.
"""

import json
import os
import secrets
import selectors
import shlex
import shutil
import signal
import subprocess
import sys

# The running worker (worker.py runs as __main__: importing it by name would load a second copy).
worker = sys.modules["__main__"]
MAX_STREAM_LINE = worker.MAX_STREAM_LINE
ENV_NAME_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def start(language, cwd):
    """(kernel, None), or (None, why) when this image cannot run the language."""
    if language == "bash":
        path = shutil.which("bash")
        if path is None:
            return None, "this sandbox's image has no bash"
        return BashKernel(path, cwd), None
    if language == "javascript":
        path = shutil.which("node")
        if path is None:
            return None, ("javascript contexts need Node.js, and this sandbox's image has no `node` on its PATH "
                          "(add Debian's nodejs to the template's packages)")
        return NodeKernel(path, cwd), None
    return None, f"language {language!r} is not available in this sandbox's image (python and bash are)"


# The JavaScript kernel's own program (node -e): one line per cell on stdin, {"file", "env"}; the cell's
# output on stdout/stderr, then the marker and the outcome ({"text"} or {"error": {type, message,
# traceback}} or {}) on stdout and the marker on stderr. SIGINT interrupts the running cell (breakOnSigint)
# or the promise it waits for, never the process.
NODE_KERNEL = r"""
const fs = require("node:fs");
const util = require("node:util");
const vm = require("node:vm");
const marker = process.argv[1];
let interrupt = null;
process.on("SIGINT", () => { if (interrupt) interrupt(); });
globalThis.require = require;
globalThis.module = module;
// Node's REPL rewrite of a cell with top-level await (an async wrapper, its declarations hoisted); absent from a
// node without it, where such a cell stays the SyntaxError V8 reports.
let topLevelAwait = null;
try {
  ({ processTopLevelAwait: topLevelAwait } = require("internal/repl/await"));
} catch {}
// The cell as a script: itself, or (awaited) the REPL's async wrapper, whose promise settles with {value}.
function asScript(code) {
  if (topLevelAwait === null || !code.includes("await")) return { code, awaited: false };
  try {
    const wrapped = topLevelAwait(code);
    return wrapped === null ? { code, awaited: false } : { code: wrapped, awaited: true };
  } catch {
    // Not valid even with await allowed: V8 compiles the cell as written and reports the error.
    return { code, awaited: false };
  }
}
const settled = (value) => new Promise((resolve, reject) => {
  interrupt = () => reject(new Error("Script execution was interrupted by SIGINT"));
  value.then(resolve, reject);
});
const thenable = (value) => value !== null && typeof value === "object" && typeof value.then === "function";
const describe = (error) => error instanceof Error
  ? { type: error.name, message: error.message, traceback: error.stack ?? String(error) }
  : { type: "Error", message: util.inspect(error), traceback: util.inspect(error) };
const show = (value) => (typeof value === "string" ? value : util.inspect(value));
async function run(cell) {
  const saved = {};
  for (const [name, value] of Object.entries(cell.env ?? {})) {
    saved[name] = process.env[name];
    process.env[name] = value;
  }
  try {
    const script = asScript(fs.readFileSync(cell.file, "utf8"));
    let value = vm.runInThisContext(script.code, { filename: "<cell>", breakOnSigint: true });
    if (script.awaited) value = (await settled(value))?.value;
    if (thenable(value)) value = await settled(value);
    return value === undefined ? {} : { text: show(value) };
  } catch (error) {
    return { error: describe(error) };
  } finally {
    interrupt = null;
    for (const [name, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
  }
}
let buffered = "";
let queue = Promise.resolve();
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => {
  buffered += chunk;
  let newline;
  while ((newline = buffered.indexOf("\n")) >= 0) {
    const line = buffered.slice(0, newline);
    buffered = buffered.slice(newline + 1);
    queue = queue.then(async () => {
      const outcome = await run(JSON.parse(line));
      process.stdout.write(marker + JSON.stringify(outcome) + "\n");
      process.stderr.write(marker + "\n");
    });
  }
});
"""


class Kernel:
    """A context's process: cells written to a file it reads, output streamed until the marker line ends them."""

    NAME = ""
    SUFFIX = ""

    def __init__(self, argv, cwd):
        self.token = secrets.token_hex(8)
        self.marker = f"\x1eforkd-{self.token}:"
        self.process = subprocess.Popen(
            argv(self.marker),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd if os.path.isdir(cwd) else "/",
            start_new_session=True,
            close_fds=True,
        )
        self.script = f"/tmp/.forkd-cell-{self.process.pid}-{self.token}{self.SUFFIX}"

    def _send(self, text):
        self.process.stdin.write(text.encode("utf-8"))
        self.process.stdin.flush()

    def stop(self):
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            stream.close()
        try:
            os.unlink(self.script)
        except FileNotFoundError:
            pass

    def run_cell(self, request, context):
        context.count += 1
        reply = {
            "id": request["id"],
            "result": None,
            "result_truncated": False,
            "stdout": "",
            "stderr": "",
            "stdout_truncated": False,
            "stderr_truncated": False,
            "error": None,
            "execution_count": context.count,
        }
        if self.process.poll() is not None:
            reply["error"] = {
                "type": "KernelDied",
                "message": f"the {self.NAME} process exited ({self.process.returncode}); restart the context",
                "traceback": "",
            }
            return reply
        env = request.get("env") or {}
        bad = [name for name in env if not name or not set(name) <= ENV_NAME_CHARS or name[0].isdigit()]
        if bad:
            reply["error"] = {"type": "ValueError", "message": f"not a variable name: {bad[0]!r}",
                              "traceback": ""}
            return reply
        with open(self.script, "w", encoding="utf-8") as script:
            script.write(request["code"])
            script.write("\n")
        self._send(self._cell_command(env))
        streaming = request.get("stream") is True
        end, captured = self._collect(request, streaming)
        if not streaming:
            reply["stdout"], reply["stderr"] = captured
        self._outcome(end, reply, request)
        return reply


    def _collect(self, request, streaming):
        """Reads stdout and stderr until both carry the marker; returns (the text after the marker on stdout, or
        None when the process ended without it, (stdout, stderr))."""
        limit = request["max_chars"]
        streams = {self.process.stdout: "stdout", self.process.stderr: "stderr"}
        pending = {"stdout": "", "stderr": ""}
        captured = {"stdout": [], "stderr": []}
        sizes = {"stdout": 0, "stderr": 0}
        end = None
        open_streams = set(streams.values())
        selector = selectors.DefaultSelector()
        for stream in streams:
            os.set_blocking(stream.fileno(), False)
            selector.register(stream, selectors.EVENT_READ)
        worker.State.running = True
        try:
            while open_streams:
                try:
                    ready = selector.select()
                except KeyboardInterrupt:
                    self._interrupt()
                    continue
                for key, _ in ready:
                    name = streams[key.fileobj]
                    chunk = os.read(key.fileobj.fileno(), 65536)
                    if not chunk:
                        open_streams.discard(name)
                        continue
                    text = pending[name] + chunk.decode("utf-8", "replace")
                    at = text.find(self.marker)
                    if at >= 0:
                        newline = text.find("\n", at)
                        if newline < 0:
                            pending[name] = text  # the marker's line is not complete yet
                            continue
                        if name == "stdout":
                            end = text[at + len(self.marker):newline]
                        text = text[:at]
                        open_streams.discard(name)
                        selector.unregister(key.fileobj)
                        pending[name] = ""
                        lines = text.splitlines(True)
                    else:
                        cut = text.rfind("\n") + 1
                        if cut == 0 and len(text) >= MAX_STREAM_LINE:
                            cut = len(text)
                        # Keep a possible start of the marker back until it is complete.
                        lines, pending[name] = text[:cut].splitlines(True), text[cut:]
                    if streaming:
                        try:
                            worker.stream_out(request["id"], name, lines)
                        except KeyboardInterrupt:
                            self._interrupt()
                    else:
                        for line in lines:
                            room = limit - sizes[name]
                            captured[name].append(line[: max(room, 0)])
                            sizes[name] += len(line)
        finally:
            worker.State.running = False
            selector.close()
        return end, ("".join(captured["stdout"]), "".join(captured["stderr"]))

    def _interrupt(self):
        try:
            os.killpg(self.process.pid, signal.SIGINT)
        except ProcessLookupError:
            pass


class BashKernel(Kernel):
    NAME = "bash"
    SUFFIX = ".sh"

    def __init__(self, path, cwd):
        super().__init__(lambda _marker: [path, "--noprofile", "--norc"], cwd)
        # An interrupt stops the cell's commands, not the shell.
        self._send("trap ':' INT\n")

    def _outcome(self, end, reply, request):
        if end is None:
            status = self.process.poll() if self.process.poll() is not None else 1
        else:
            status = int(end) if end.strip().lstrip("-").isdigit() else 1
        if status != 0:
            reply["error"] = {"type": "", "message": str(status), "traceback": ""}

    def _cell_command(self, env):
        lines = []
        for i, (name, value) in enumerate(env.items()):
            lines.append(f'if [ "${{{name}+set}}" = set ]; then __fk_had{i}=1; __fk_old{i}="${name}"; '
                         f"else __fk_had{i}=0; fi; export {name}={shlex.quote(value)}")
        lines.append(f". {shlex.quote(self.script)} </dev/null; __fk_status=$?")
        for i, name in enumerate(env):
            lines.append(f'if [ "$__fk_had{i}" = 1 ]; then export {name}="$__fk_old{i}"; else unset {name}; fi')
        lines.append(f"printf '{self.marker}%d\\n' \"$__fk_status\"; printf '{self.marker}\\n' >&2")
        return "\n".join(lines) + "\n"


class NodeKernel(Kernel):
    NAME = "node"
    SUFFIX = ".js"

    def __init__(self, path, cwd):
        super().__init__(lambda marker: [path, "--expose-internals", "-e", NODE_KERNEL, marker], cwd)

    def _cell_command(self, env):
        return json.dumps({"file": self.script, "env": env}) + "\n"

    def _outcome(self, end, reply, request):
        if end is None:
            reply["error"] = {"type": "KernelDied", "message": f"the node process exited ({self.process.poll()})",
                              "traceback": ""}
            return
        try:
            outcome = json.loads(end)
        except ValueError:
            outcome = {"error": {"type": "KernelError", "message": "unreadable outcome", "traceback": end[:4096]}}
        limit = request["max_chars"]
        if "text" in outcome:
            reply["result"] = outcome["text"][:limit]
            reply["result_truncated"] = len(outcome["text"]) > limit
        if "error" in outcome:
            error = outcome["error"]
            reply["error"] = {
                "type": str(error.get("type", "Error")),
                "message": str(error.get("message", ""))[:limit],
                "traceback": str(error.get("traceback", ""))[: request["max_traceback"]],
            }


if __name__ == "__main__":
    sys.exit("kernels.py is imported by forkd's worker.py")
