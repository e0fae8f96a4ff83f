"""``sandbox.commands``: a command in the sandbox, its output handed to line callbacks as it arrives."""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING, Any, Callable, List, Mapping, Optional, Sequence, Union

from . import _limits
from ._results import CommandResult
from .cancel import CancelToken
from .controller import StreamedStdin
from .errors import CommandExitError, ForkdError, InvalidArgumentError
from .exec_stream import ExitEvent

if TYPE_CHECKING:
    from .sandbox import Sandbox

__all__ = ["Commands", "SHELL", "LineCallback"]

#: A command line given as a string runs under bash, like the E2B SDK; a list runs without a shell.
SHELL = _limits.COMMAND_SHELL_ARGV
LineCallback = Callable[[str], Any]


class _Lines:
    """Decodes a byte stream as UTF-8 without splitting characters and hands each line (newline kept) to a
    callback as soon as it is complete; the rest at the end."""

    def __init__(self, callback: Optional[LineCallback]) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._callback = callback
        self._parts: List[str] = []
        self._line = ""

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def push(self, data: bytes) -> None:
        self._emit(self._decoder.decode(data))

    def end(self) -> None:
        self._emit(self._decoder.decode(b"", final=True))
        if self._line and self._callback is not None:
            line, self._line = self._line, ""
            self._callback(line)

    def _emit(self, text: str) -> None:
        if not text:
            return
        self._parts.append(text)
        if self._callback is None:
            return
        pending = self._line + text
        start = 0
        newline = pending.find("\n")
        while newline >= 0:
            self._callback(pending[start : newline + 1])
            start = newline + 1
            newline = pending.find("\n", start)
        self._line = pending[start:]


class Commands:
    """``sandbox.commands``: run a command in the sandbox, its output handed to callbacks as it happens."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sandbox = sandbox

    def run(
        self,
        cmd: Union[str, Sequence[str]],
        *,
        on_stdout: Optional[LineCallback] = None,
        on_stderr: Optional[LineCallback] = None,
        timeout: Optional[float] = None,
        envs: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Optional[StreamedStdin] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> CommandResult:
        """Runs ``cmd`` and returns its result when it exits 0.

        A string is a bash command line; a list is the program and its arguments, run without a shell.
        ``on_stdout``/``on_stderr`` get each line (with its newline; a last unterminated line at the end) as soon
        as it is complete; a callback that raises stops the command and ``run`` raises that exception.
        ``timeout``: seconds until the command is killed (default: the sandbox's ``command_timeout``, 60; 0 = no
        limit). ``stdin``: text/bytes written then closed, or an iterable of chunks streamed while it runs.

        Raises :class:`~forkd.CommandExitError` (with ``exit_code``, ``stdout``, ``stderr``) when the command exits
        non-zero, is killed or runs past its timeout.
        """
        argv = [*SHELL, cmd] if isinstance(cmd, str) else list(cmd)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise InvalidArgumentError("cmd must be a command line or a non-empty list of program and arguments")
        shown = repr(cmd) if isinstance(cmd, str) else repr(" ".join(argv))
        stdout, stderr = _Lines(on_stdout), _Lines(on_stderr)
        limit = self._sandbox.command_timeout if timeout is None else timeout
        exit_event: Optional[ExitEvent] = None
        try:
            with self._sandbox.controller.exec_stream(
                self._sandbox.id,
                argv,
                timeout_secs=limit,
                env=envs,
                cwd=cwd,
                stdin=stdin,
                request_timeout=request_timeout,
                cancel=cancel,
            ) as events:
                for event in events:
                    if isinstance(event, ExitEvent):
                        exit_event = event
                    elif event.type == "stdout":
                        stdout.push(event.data)
                    else:
                        stderr.push(event.data)
                stdout.end()
                stderr.end()
        except ForkdError as err:
            raise self._sandbox._diagnose(err, f"command {shown}") from err
        if exit_event is None:
            raise ForkdError(f"command {shown}: the daemon reported no exit")
        result = CommandResult(
            exit_code=exit_event.exit_code,
            stdout=stdout.text,
            stderr=stderr.text,
            signal=exit_event.signal,
            timed_out=exit_event.timed_out,
        )
        if result.exit_code != 0:
            raise CommandExitError(
                shown,
                exit_code=result.exit_code,
                stdout=result.stdout,
                stderr=result.stderr,
                signal=result.signal,
                timed_out=result.timed_out,
            )
        return result
