"""IPython's shell escapes and a few magics, for forkd's warm worker (worker.py imports this on first use).

E2B's code interpreter is a Jupyter kernel, so agent code (and frameworks such as smolagents, whose E2B
executor installs packages with `!pip install ...`) writes IPython syntax in Python cells. A cell that does not
parse as Python is rewritten line by line, as IPython's input transformers do, and parsed again:

  !cmd            runs `cmd` in the shell ($SHELL, else /bin/sh) with stdin from /dev/null; its output (stderr
                  merged, as the notebook shows it) streams as the cell's stdout; `_exit_code` holds its status
  x = !cmd        the same, its output captured as a list of lines instead of shown
  %pip ARGS       the sandbox's pip (`python -m pip`), as IPython's %pip
  %cd DIR         changes the working directory (kept by the context) and prints it
  %env [N[=V]]    shows or sets environment variables
  %matplotlib     accepted: figures are always shown inline, at the end of their cell
  %%bash, %%sh    at the top of a cell: the rest of the cell is a shell script
  any other %     UsageError, as IPython's "Line magic function `%x` not found."

`{expr}` and `$name` in a command or magic line expand from the cell's namespace, as IPython's do (`$$` is a
literal `$`; a `$NAME` with no such Python name is left for the shell). A cell that parses as Python is never
rewritten, so a string holding such lines keeps them.
"""

import builtins
import os
import re
import shlex
import signal
import subprocess
import sys

ESCAPE = re.compile(r"^([ \t]*)(?:([A-Za-z_][\w.]*(?:\[[^\]]*\])?)[ \t]*=[ \t]*)?(!|%)(?!%)(.*)$")
CELL_MAGIC = re.compile(r"^%%(bash|sh)[ \t]*(.*)$")
READ_BYTES = 64 * 1024


class UsageError(Exception):
    """IPython's error for a magic it does not know or cannot run."""


def transform(code):
    """The cell with its IPython lines as calls of this module (bound as a builtin); None: nothing to do."""
    first, _, rest = code.lstrip("\n").partition("\n")
    cell = CELL_MAGIC.match(first)
    if cell:
        return f"__forkd_magics__.system({rest!r}, globals(), shell={cell.group(1)!r})\n"
    lines = code.split("\n")
    changed = False
    for index, line in enumerate(lines):
        match = ESCAPE.match(line)
        if not match:
            continue
        indent, target, kind, text = match.groups()
        if kind == "!":
            call = f"__forkd_magics__.system({text!r}, globals(), capture={target is not None})"
        else:
            name, _, args = text.partition(" ")
            call = f"__forkd_magics__.line({name!r}, {args.strip()!r}, globals())"
        lines[index] = f"{indent}{target} = {call}" if target is not None else f"{indent}{call}"
        changed = True
    return "\n".join(lines) if changed else None


def install():
    builtins.__forkd_magics__ = sys.modules[__name__]


def expand(text, namespace):
    """IPython's variable expansion: `{expr}` (evaluated in the namespace) and `$name`; `$$` is `$`."""

    def braces(match):
        try:
            return str(eval(match.group(1), namespace))  # noqa: S307 - the user's own cell, as in IPython
        except Exception:  # noqa: BLE001 - left as written, as IPython does
            return match.group(0)

    def dollar(match):
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return str(namespace[name]) if name in namespace else match.group(0)

    text = re.sub(r"\{([^{}]+)\}", braces, text)
    return re.sub(r"\$\$|\$([A-Za-z_]\w*)", dollar, text)


def system(command, namespace, capture=False, shell=None):
    """Runs `command` in the shell: streams its output (or returns it as lines) and sets `_exit_code`."""
    if shell is not None:
        program = "/bin/bash" if shell == "bash" else "/bin/sh"
    else:
        program = os.environ.get("SHELL") or "/bin/sh"
        if not os.access(program, os.X_OK):
            program = "/bin/sh"
        command = expand(command, namespace)
    process = subprocess.Popen(
        [program, "-c", command],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
    )
    captured = []
    try:
        while True:
            chunk = os.read(process.stdout.fileno(), READ_BYTES)
            if not chunk:
                break
            text = chunk.decode("utf-8", "replace")
            if capture:
                captured.append(text)
            else:
                sys.stdout.write(text)
        status = process.wait()
    except BaseException:
        # An interrupt (or anything else) stops the command's whole process group, then goes on up.
        try:
            os.killpg(process.pid, signal.SIGINT)
            process.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        raise
    finally:
        process.stdout.close()
    namespace["_exit_code"] = status if status >= 0 else 128 - status
    if capture:
        return "".join(captured).splitlines()
    return None


def line(name, args, namespace):
    args = expand(args, namespace)
    if name == "pip":
        return system(shlex.join([sys.executable, "-m", "pip", *shlex.split(args)]), {})
    if name == "matplotlib":
        # Figures are already rendered off-screen and shown at the end of their cell (`inline`).
        return None
    if name == "cd":
        target = os.path.expanduser(args or "~")
        try:
            os.chdir(target)
        except OSError as error:
            raise UsageError(f"cd: {error.strerror}: {target}") from None
        print(os.getcwd())
        return None
    if name == "env":
        if not args:
            return dict(os.environ)
        key, sep, value = args.partition("=")
        if not sep:
            key, _, value = args.partition(" ")
            if not value:
                return os.environ.get(key)
        os.environ[key.strip()] = value.strip()
        print(f"env: {key.strip()}={value.strip()}")
        return None
    raise UsageError(f"Line magic function `%{name}` not found.")
