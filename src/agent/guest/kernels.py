"""Code contexts in languages other than Python, for forkd's warm worker (worker.py imports this on first use).

A context of another language is a long-lived process of that language, so its state (variables, functions,
the working directory) lives on between cells as in E2B's kernels:

  bash        `bash --noprofile --norc`; a cell is written to a file and sourced (stdin from /dev/null), then a
              marker line with a per-context random token and the exit status ends it on stdout and stderr.
              A non-zero status is the cell's error (as bash_kernel reports it: name "", value the status).

Output streams line by line to the agent while the cell runs (through worker.stream_out); an interrupt (the
agent's SIGINT to the worker) is passed to the kernel's process group and the cell ends with the marker.
"""

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
    return None, f"language {language!r} is not available in this sandbox's image (python and bash are)"


class BashKernel:
    def __init__(self, path, cwd):
        self.token = secrets.token_hex(8)
        self.marker = f"\x1eforkd-{self.token}:"
        self.process = subprocess.Popen(
            [path, "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd if os.path.isdir(cwd) else "/",
            start_new_session=True,
            close_fds=True,
        )
        # An interrupt stops the cell's commands, not the shell.
        self._send("trap ':' INT\n")
        self.script = f"/tmp/.forkd-cell-{self.process.pid}-{self.token}.sh"

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
                "message": f"the bash process exited ({self.process.returncode}); restart the context",
                "traceback": "",
            }
            return reply
        env = request.get("env") or {}
        bad = [name for name in env if not name or not set(name) <= ENV_NAME_CHARS or name[0].isdigit()]
        if bad:
            reply["error"] = {"type": "ValueError", "message": f"not a shell variable name: {bad[0]!r}",
                              "traceback": ""}
            return reply
        with open(self.script, "w", encoding="utf-8") as script:
            script.write(request["code"])
            script.write("\n")
        self._send(self._cell_command(env))
        streaming = request.get("stream") is True
        status, captured = self._collect(request, streaming)
        if not streaming:
            reply["stdout"], reply["stderr"] = captured
        if status != 0:
            reply["error"] = {"type": "", "message": str(status), "traceback": ""}
        return reply

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

    def _collect(self, request, streaming):
        """Reads stdout and stderr until both carry the marker; returns (status, (stdout, stderr))."""
        limit = request["max_chars"]
        streams = {self.process.stdout: "stdout", self.process.stderr: "stderr"}
        pending = {"stdout": "", "stderr": ""}
        captured = {"stdout": [], "stderr": []}
        sizes = {"stdout": 0, "stderr": 0}
        status = None
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
                        tail = text[at + len(self.marker):].split("\n", 1)[0]
                        if name == "stdout":
                            status = int(tail) if tail.strip().lstrip("-").isdigit() else 1
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
        if status is None:
            status = self.process.poll() if self.process.poll() is not None else 1
        return status, ("".join(captured["stdout"]), "".join(captured["stderr"]))

    def _interrupt(self):
        try:
            os.killpg(self.process.pid, signal.SIGINT)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    sys.exit("kernels.py is imported by forkd's worker.py")
