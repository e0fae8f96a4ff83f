"""Sandbox: one forkd sandbox with the ergonomics of the E2B SDK, mirroring forkd's TypeScript SDK.

``Sandbox.create``, ``sandbox.commands.run`` (with line callbacks as output arrives), ``sandbox.run_code``,
``sandbox.files``, ``sandbox.branch``, ``sandbox.set_timeout``, ``sandbox.kill``, and ``with`` blocks that kill the
sandbox when they end. Durations are seconds; ``0`` disables the limit.
"""

from __future__ import annotations

import codecs
import functools
import ssl
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from types import TracebackType
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Type,
    TypeVar,
    Union,
    overload,
)

from . import _limits
from .cancel import CancelToken
from .controller import DEFAULT_SNAPSHOT_TIMEOUT, BranchMode, Controller, StreamedStdin
from .network import NetworkRequest
from .errors import (
    CancelledError,
    CommandExitError,
    ConflictError,
    ConnectionError,
    ForkdError,
    InvalidArgumentError,
    NotFoundError,
    SandboxNotFoundError,
    TimeoutError,
    UnavailableError,
)
from .exec_stream import ExitEvent
from .settings import DEFAULT_COMMAND_TIMEOUT, DEFAULT_SANDBOX_TIMEOUT, check_duration

__all__ = [
    "Sandbox",
    "Commands",
    "Files",
    "CommandResult",
    "CodeResult",
    "ExecutionError",
    "EntryInfo",
    "SHELL",
]

#: A command line given as a string runs under bash, like the E2B SDK; a list runs without a shell.
SHELL = _limits.COMMAND_SHELL_ARGV
SNAPSHOT_POLL_INTERVAL = 0.5
DIAGNOSIS_TIMEOUT = 5.0

T = TypeVar("T")
LineCallback = Callable[[str], Any]


@dataclass
class CommandResult:
    """What a command did. ``exit_code`` is 128+N when signal N killed it."""

    exit_code: int
    stdout: str
    stderr: str
    signal: Optional[str] = None
    timed_out: bool = False


@dataclass
class ExecutionError:
    """A Python exception raised by ``run_code`` (field names as in E2B's code interpreter)."""

    #: Exception class, e.g. "ZeroDivisionError".
    name: str
    #: Its message.
    value: str
    traceback: str


@dataclass
class CodeResult:
    """``run_code``'s answer. Python errors do not raise: they are in ``error``; SDK and daemon errors raise."""

    #: ``repr()`` of the code's trailing expression, or None.
    result: Optional[str]
    stdout: str
    stderr: str
    error: Optional[ExecutionError]


@dataclass
class EntryInfo:
    """A file or directory in the sandbox."""

    name: str
    #: Absolute path in the sandbox.
    path: str
    type: str  # "file" | "dir" | "symlink" | "other"
    size: int
    #: Permission bits, e.g. 0o644.
    mode: int
    modified_time: Optional[datetime]
    symlink_target: Optional[str]


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


class Files:
    """``sandbox.files``: read, write, list, stat and remove files in the sandbox; binary-safe, ~16 MiB per call."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sandbox = sandbox

    @overload
    def read(
        self,
        path: str,
        *,
        format: Literal["text"] = ...,
        max_bytes: Optional[int] = ...,
        request_timeout: Optional[float] = ...,
        cancel: Optional[CancelToken] = ...,
    ) -> str: ...

    @overload
    def read(
        self,
        path: str,
        *,
        format: Literal["bytes"],
        max_bytes: Optional[int] = ...,
        request_timeout: Optional[float] = ...,
        cancel: Optional[CancelToken] = ...,
    ) -> bytes: ...

    def read(
        self,
        path: str,
        *,
        format: str = "text",
        max_bytes: Optional[int] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Union[str, bytes]:
        """Reads a file as UTF-8 text (default) or, with ``format="bytes"``, as raw bytes."""
        if format not in ("text", "bytes"):
            raise InvalidArgumentError(f'format must be "text" or "bytes", got {format!r}')
        data: bytes = self._guard(
            f"reading {path}",
            lambda: self._sandbox.controller.read_file(
                self._sandbox.id, path, max_bytes=max_bytes, request_timeout=request_timeout, cancel=cancel
            ),
        )
        return data if format == "bytes" else data.decode("utf-8", errors="replace")

    def write(
        self,
        path: str,
        data: Union[str, bytes, bytearray, memoryview],
        *,
        mode: Optional[int] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """Replaces (or creates) the file at ``path``, creating missing parent directories. ``{"path", "bytes"}``."""
        if not isinstance(data, (str, bytes, bytearray, memoryview)):
            raise InvalidArgumentError("data must be str or bytes")
        written = self._guard(
            f"writing {path}",
            lambda: self._sandbox.controller.write_file(
                self._sandbox.id, path, data, mode=mode, request_timeout=request_timeout, cancel=cancel
            ),
        )
        return {"path": path, "bytes": written["bytes"]}

    def list(
        self, path: str, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None
    ) -> List[EntryInfo]:
        """A directory's entries."""
        listing = self._guard(
            f"listing {path}",
            lambda: self._sandbox.controller.list_files(
                self._sandbox.id, path, request_timeout=request_timeout, cancel=cancel
            ),
        )
        return [_entry(e, _join(path, e["name"])) for e in listing["entries"]]

    def stat(
        self, path: str, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None
    ) -> EntryInfo:
        """One file or directory (symlinks are not followed)."""
        info = self._guard(
            f"stat of {path}",
            lambda: self._sandbox.controller.stat_file(
                self._sandbox.id, path, request_timeout=request_timeout, cancel=cancel
            ),
        )
        return _entry(info, path)

    def get_info(
        self, path: str, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None
    ) -> EntryInfo:
        """Same as :meth:`stat` (the E2B SDK's name)."""
        return self.stat(path, request_timeout=request_timeout, cancel=cancel)

    def exists(
        self, path: str, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None
    ) -> bool:
        """True if something exists at ``path``."""
        try:
            self.stat(path, request_timeout=request_timeout, cancel=cancel)
            return True
        except SandboxNotFoundError:
            raise
        except NotFoundError:
            return False

    def remove(
        self,
        path: str,
        *,
        recursive: bool = False,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> None:
        """Removes a file, or a directory (``recursive=True`` if it is not empty)."""
        self._guard(
            f"removing {path}",
            lambda: self._sandbox.controller.remove_file(
                self._sandbox.id, path, recursive=recursive, request_timeout=request_timeout, cancel=cancel
            ),
        )

    def _guard(self, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except ForkdError as err:
            raise self._sandbox._diagnose(err, what) from err


class _KillDescriptor:
    """``Sandbox.kill(sandbox_id, ...)`` on the class (False if unknown), ``sandbox.kill()`` on an instance."""

    @overload
    def __get__(self, instance: None, owner: Type["Sandbox"]) -> Callable[..., bool]: ...

    @overload
    def __get__(self, instance: "Sandbox", owner: Type["Sandbox"]) -> Callable[..., None]: ...

    def __get__(self, instance: Optional["Sandbox"], owner: Type["Sandbox"]) -> Callable[..., Any]:
        if instance is None:
            return functools.partial(_kill_by_id, owner)
        return instance._kill


class Sandbox:
    """One forkd sandbox: a microVM forked copy-on-write from a warm snapshot.

    >>> with Sandbox.create("pyagent") as sandbox:          # killed when the block ends
    ...     sandbox.commands.run("echo hi", on_stdout=print)
    ...     sandbox.run_code("numpy.arange(10).sum()").result
    '45'

    Usually made by :meth:`create`, :meth:`create_many` or :meth:`connect`; ``Sandbox(controller, info)`` wraps a
    SandboxInfo dict from a :class:`~forkd.Controller` call. Calls go through ``controller`` (its connection
    settings and ``request_timeout``); ``command_timeout`` is the default ``timeout`` of this sandbox's
    ``commands.run`` and ``run_code``.
    """

    kill = _KillDescriptor()

    def __init__(
        self,
        controller: Controller,
        info: Mapping[str, Any],
        *,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
    ) -> None:
        self.controller = controller
        #: The daemon's record of the sandbox when this object was made (:meth:`get_info` for a fresh one).
        self.info: Dict[str, Any] = dict(info)
        self.id: str = str(info["id"])
        self.command_timeout = check_duration(command_timeout, "command_timeout")
        self.commands = Commands(self)
        self.files = Files(self)

    @property
    def sandbox_id(self) -> str:
        """The sandbox's id (the E2B name)."""
        return self.id

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, snapshot_tag={self.info.get('snapshot_tag')!r})"

    # --- making sandboxes ----------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        template: Optional[str] = None,
        *,
        snapshot_tag: Optional[str] = None,
        timeout: float = DEFAULT_SANDBOX_TIMEOUT,
        memory_limit_mib: Optional[int] = None,
        live_fork: bool = False,
        on_timeout: Optional[str] = None,
        network: Optional[NetworkRequest] = None,
        snapshot_timeout: float = DEFAULT_SNAPSHOT_TIMEOUT,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
        url: Optional[str] = None,
        token: Optional[str] = None,
        request_timeout: Optional[float] = None,
        headers: Optional[Mapping[str, str]] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
        env: Optional[Mapping[str, str]] = None,
        cancel: Optional[CancelToken] = None,
    ) -> "Sandbox":
        """Creates a sandbox from a snapshot (``snapshot_tag``) or a template (``template``).

        With ``template``, the snapshot tagged with the template's name is used; if there is none yet, the daemon
        first builds it (image, boot, warm-up: minutes the first time, bounded by ``snapshot_timeout``).
        ``timeout``: the sandbox's lifetime in seconds (default 300; 0 = until killed), extendable with
        :meth:`set_timeout`; ``on_timeout="pause"`` pauses it to disk instead of killing it when that runs out
        (:meth:`resume` or :meth:`connect` wakes it). ``network``: an egress policy (``{"egress": "deny",
        "allow_out": ["pypi.org"]}``; fields left out come from the template's ``[egress]``, else the daemon's
        ``--egress``) or ``"none"``; default: the template's, else the daemon's. Connection settings (``url``,
        ``token``, ``request_timeout``, ...) apply to every later call on the sandbox.
        """
        if (template is None) == (snapshot_tag is None):
            raise InvalidArgumentError(
                "Sandbox.create needs exactly one of `template` (a template name) or `snapshot_tag` (an existing "
                "snapshot)"
            )
        lifetime = check_duration(timeout, "timeout")
        snapshot_wait = check_duration(snapshot_timeout, "snapshot_timeout")
        controller = Controller(
            url, token, request_timeout, headers=headers, ssl_context=ssl_context, env=env
        )
        tag = str(snapshot_tag if snapshot_tag is not None else template)

        def spawn() -> "Sandbox":
            [info] = controller.spawn_sandboxes(
                tag,
                1,
                memory_limit_mib=memory_limit_mib,
                live_fork=live_fork,
                lifetime=lifetime,
                on_timeout=on_timeout,
                network=network,
                cancel=cancel,
            )
            return cls(controller, info, command_timeout=command_timeout)

        if template is None:
            return spawn()
        try:
            return spawn()
        except (NotFoundError, ConflictError):
            pass
        _ensure_template_snapshot(controller, template, snapshot_wait, cancel)
        return spawn()

    @classmethod
    def create_many(
        cls,
        n: int,
        *,
        snapshot_tag: Optional[str] = None,
        template: Optional[str] = None,
        timeout: float = DEFAULT_SANDBOX_TIMEOUT,
        memory_limit_mib: Optional[int] = None,
        live_fork: bool = False,
        network: Optional[NetworkRequest] = None,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
        url: Optional[str] = None,
        token: Optional[str] = None,
        request_timeout: Optional[float] = None,
        headers: Optional[Mapping[str, str]] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
        env: Optional[Mapping[str, str]] = None,
        cancel: Optional[CancelToken] = None,
    ) -> List["Sandbox"]:
        """Forks ``n`` sandboxes from one snapshot in a single request: all of them or none (forkd's fan-out).
        Options as for :meth:`create`, except that ``template`` must already have its snapshot."""
        tag = snapshot_tag if snapshot_tag is not None else template
        if tag is None:
            raise InvalidArgumentError("Sandbox.create_many needs `snapshot_tag` (or `template`)")
        lifetime = check_duration(timeout, "timeout")
        controller = Controller(
            url, token, request_timeout, headers=headers, ssl_context=ssl_context, env=env
        )
        infos = controller.spawn_sandboxes(
            tag,
            n,
            memory_limit_mib=memory_limit_mib,
            live_fork=live_fork,
            lifetime=lifetime,
            network=network,
            cancel=cancel,
        )
        return [cls(controller, info, command_timeout=command_timeout) for info in infos]

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        *,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
        url: Optional[str] = None,
        token: Optional[str] = None,
        request_timeout: Optional[float] = None,
        headers: Optional[Mapping[str, str]] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
        env: Optional[Mapping[str, str]] = None,
        cancel: Optional[CancelToken] = None,
    ) -> "Sandbox":
        """A Sandbox object for an existing sandbox; a paused one is resumed first (E2B's connect), with the
        lifetime it had. :class:`~forkd.SandboxNotFoundError` if it is gone."""
        controller = Controller(
            url, token, request_timeout, headers=headers, ssl_context=ssl_context, env=env
        )
        try:
            info = controller.get_sandbox(sandbox_id, cancel=cancel)
        except SandboxNotFoundError:
            raise
        except NotFoundError as err:
            raise SandboxNotFoundError(
                f"no sandbox {sandbox_id} on the daemon at {controller.base_url}",
                status=err.status,
                code=err.code,
                server_message=err.server_message,
                request=err.request,
                body=err.body,
                url=err.url,
            ) from err
        if info.get("status") == "dead":
            raise SandboxNotFoundError(f"sandbox {sandbox_id} is dead")
        if info.get("status") in ("pausing", "paused", "resuming"):
            info = _resume_or_join(controller, sandbox_id, None, cancel)
        return cls(controller, info, command_timeout=command_timeout)

    @classmethod
    def resume(
        cls,
        sandbox_id: str,
        *,
        timeout: Optional[float] = None,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
        url: Optional[str] = None,
        token: Optional[str] = None,
        request_timeout: Optional[float] = None,
        headers: Optional[Mapping[str, str]] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
        env: Optional[Mapping[str, str]] = None,
        cancel: Optional[CancelToken] = None,
    ) -> "Sandbox":
        """Resumes a paused sandbox by id where it was (processes, files, interpreter), under the same id.

        ``timeout``: its lifetime in seconds from now (0 = no limit); default: the lifetime it had.
        :class:`~forkd.ConflictError` if it is not paused.
        """
        controller = Controller(
            url, token, request_timeout, headers=headers, ssl_context=ssl_context, env=env
        )
        info = controller.resume_sandbox(sandbox_id, lifetime=timeout, cancel=cancel)
        return cls(controller, info, command_timeout=command_timeout)

    @classmethod
    def list(
        cls,
        *,
        snapshot_tag: Optional[str] = None,
        status: Optional[str] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
        request_timeout: Optional[float] = None,
        headers: Optional[Mapping[str, str]] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> List[Dict[str, Any]]:
        """The daemon's sandboxes (SandboxInfo dicts): all, of one snapshot, or in one state (``"paused"``)."""
        controller = Controller(url, token, request_timeout, headers=headers, ssl_context=ssl_context, env=env)
        return controller.list_sandboxes(snapshot_tag, status=status)

    # --- using it ------------------------------------------------------------------------------------------

    def run_code(
        self,
        code: str,
        *,
        timeout: Optional[float] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> CodeResult:
        """Evaluates Python in the sandbox's warm interpreter (numpy already imported in pyagent snapshots).

        ``timeout``: seconds until the evaluation is killed (default: ``command_timeout``; 0 = no limit).
        """
        limit = self.command_timeout if timeout is None else timeout
        try:
            answer = self.controller.eval_code(
                self.id, code, timeout_secs=limit, request_timeout=request_timeout, cancel=cancel
            )
        except ForkdError as err:
            raise self._diagnose(err, "running code") from err
        return CodeResult(
            result=answer.get("result"),
            stdout=answer.get("stdout") or "",
            stderr=answer.get("stderr") or "",
            error=_execution_error(answer),
        )

    def ping(self, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None) -> Dict[str, Any]:
        """Round trip to the guest agent."""
        try:
            return self.controller.ping_sandbox(self.id, request_timeout=request_timeout, cancel=cancel)
        except ForkdError as err:
            raise self._diagnose(err, "ping") from err

    def get_info(
        self, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None
    ) -> Dict[str, Any]:
        """A fresh copy of the daemon's record of this sandbox."""
        try:
            return self.controller.get_sandbox(self.id, request_timeout=request_timeout, cancel=cancel)
        except ForkdError as err:
            raise self._diagnose(err, "getting its info") from err

    def is_running(self, *, request_timeout: Optional[float] = None) -> bool:
        """True while the sandbox exists and runs."""
        try:
            return self.controller.get_sandbox(self.id, request_timeout=request_timeout).get("status") == "running"
        except NotFoundError:
            return False

    def pause(
        self, *, merge: bool = False, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None
    ) -> Dict[str, Any]:
        """Pauses the sandbox: its memory, processes and files to disk, its VM stopped, its RAM given back.

        It keeps its id, network and policy; :meth:`resume` or :meth:`connect` wakes it where it was. Returns the
        pause (``tag``, ``pause_ms``, ``bytes_stored``, ``freed_bytes``, ...). ConflictError if it is not running.
        """
        try:
            return self.controller.pause_sandbox(self.id, merge=merge, request_timeout=request_timeout, cancel=cancel)
        except ForkdError as err:
            raise self._diagnose(err, "pausing") from err

    def set_timeout(
        self, timeout: float, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None
    ) -> None:
        """Sets the sandbox's remaining lifetime to ``timeout`` seconds from now (0 = no limit); may shorten it."""
        try:
            self.controller.set_sandbox_timeout(self.id, timeout, request_timeout=request_timeout, cancel=cancel)
        except ForkdError as err:
            raise self._diagnose(err, "setting its timeout") from err

    def update_network(
        self,
        egress: Optional[str] = None,
        *,
        allow_out: Optional[Sequence[str]] = None,
        deny_out: Optional[Sequence[str]] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """Replaces the sandbox's egress policy while it runs (E2B's ``update_network``); fields left out come
        from the template's ``[egress]``, else the daemon's ``--egress``. Returns the policy now in force
        (``{"egress", "allow_out", "deny_out"}``)."""
        try:
            self.info = self.controller.set_network_policy(
                self.id,
                egress,
                allow_out=allow_out,
                deny_out=deny_out,
                request_timeout=request_timeout,
                cancel=cancel,
            )
        except ForkdError as err:
            raise self._diagnose(err, "updating its network") from err
        policy: Dict[str, Any] = self.info["network"]["egress"]
        return policy

    def branch(
        self,
        tag: Optional[str] = None,
        *,
        mode: Optional[BranchMode] = None,
        wait: bool = True,
        measure_diff: bool = False,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """Snapshots this sandbox where it is (BRANCH); it keeps running. ``Sandbox.create(snapshot_tag=result["tag"])``
        forks children that continue from here. ``mode`` ``"full"`` (the default) stands alone; ``"diff"`` layers on
        the sandbox's base; ``"live"`` needs ``live_fork=True`` at create."""
        try:
            return self.controller.branch_sandbox(
                self.id,
                tag,
                mode=mode,
                wait=wait,
                measure_diff=measure_diff,
                request_timeout=request_timeout,
                cancel=cancel,
            )
        except ForkdError as err:
            raise self._diagnose(err, "branching") from err

    def _kill(self, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None) -> None:
        """Kills the sandbox and frees its resources. Killing one that is already gone is not an error."""
        try:
            self.controller.kill_sandbox(self.id, request_timeout=request_timeout, cancel=cancel)
        except NotFoundError:
            pass

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self._kill()

    def _diagnose(self, err: ForkdError, what: str) -> ForkdError:
        """Makes an error say whether the sandbox itself is gone: after a 404, a 409, an unavailable answer or a
        dropped connection while the daemon is up, asks the daemon about the sandbox before blaming the path or
        the network."""
        worth_checking = (
            isinstance(err, (NotFoundError, ConflictError))
            or (isinstance(err, ConnectionError) and err.daemon_reachable is True)
            or (isinstance(err, UnavailableError) and not isinstance(err, ConnectionError))
        )
        if not worth_checking or isinstance(err, SandboxNotFoundError):
            return err
        state = "no longer exists"
        try:
            info = self.controller.get_sandbox(self.id, request_timeout=DIAGNOSIS_TIMEOUT)
            if info.get("status") == "stopping":
                state = "is being stopped"
            elif info.get("status") != "dead":
                return err
        except NotFoundError:
            pass
        except ForkdError:
            return err
        return SandboxNotFoundError(
            f"sandbox {self.id} {state} (killed, or its lifetime ran out) while {what}; to keep a sandbox longer pass "
            "a larger `timeout` to Sandbox.create or call sandbox.set_timeout(seconds) (0 = no limit)"
        )


def _kill_by_id(
    owner: Type[Sandbox],
    sandbox_id: str,
    *,
    url: Optional[str] = None,
    token: Optional[str] = None,
    request_timeout: Optional[float] = None,
    headers: Optional[Mapping[str, str]] = None,
    ssl_context: Optional[ssl.SSLContext] = None,
    env: Optional[Mapping[str, str]] = None,
) -> bool:
    """Kills a sandbox by id; False if it did not exist."""
    controller = Controller(url, token, request_timeout, headers=headers, ssl_context=ssl_context, env=env)
    try:
        controller.kill_sandbox(sandbox_id)
        return True
    except NotFoundError:
        return False


def _ensure_template_snapshot(
    controller: Controller, template: str, timeout: float, cancel: Optional[CancelToken]
) -> Dict[str, Any]:
    """Makes sure a snapshot tagged ``template`` exists and is ready, creating it from the template if needed."""
    deadline = float("inf") if timeout == 0 else time.monotonic() + timeout
    snapshot: Optional[Dict[str, Any]] = None
    try:
        snapshot = controller.get_snapshot(template, cancel=cancel)
    except NotFoundError:
        pass
    if snapshot is None:
        try:
            return controller.create_snapshot(template, template, request_timeout=timeout, cancel=cancel)
        except TimeoutError as err:
            if err.setting != "request_timeout":
                raise
            raise TimeoutError(
                f"building snapshot {template} from its template did not finish within snapshot_timeout={timeout:g} "
                "s; pass a larger `snapshot_timeout` (0 disables it)",
                setting="snapshot_timeout",
            ) from err
        except ConflictError:
            pass  # someone else is creating it: wait for theirs below
    while True:
        snapshot = controller.get_snapshot(template, cancel=cancel)
        status = snapshot.get("status")
        if status == "ready" and snapshot.get("bootable"):
            return snapshot
        if status == "failed" or (status == "ready" and not snapshot.get("bootable")):
            problem = snapshot.get("error")
            raise ConflictError(
                f"snapshot {template} exists but cannot be spawned from (status {status}"
                + (f": {problem}" if problem else "")
                + f"); delete it (forkd rmi {template}) to rebuild it from the template"
            )
        if time.monotonic() + SNAPSHOT_POLL_INTERVAL > deadline:
            raise TimeoutError(
                f"snapshot {template} was still {status} after snapshot_timeout={timeout:g} s; pass a larger "
                "`snapshot_timeout` (0 disables it)",
                setting="snapshot_timeout",
            )
        if cancel is not None and cancel.cancelled:
            raise CancelledError("the call was cancelled", reason=cancel.reason)
        time.sleep(SNAPSHOT_POLL_INTERVAL)


def _execution_error(answer: Mapping[str, Any]) -> Optional[ExecutionError]:
    """The wire's ``"Type: message"`` + ``error_type`` + ``traceback`` as E2B's ``{name, value, traceback}``."""
    error = answer.get("error")
    if error is None:
        return None
    text = str(error)
    name = answer.get("error_type") or (text.split(":", 1)[0] if ":" in text else "Error")
    value = text[len(name) + 2 :] if text.startswith(f"{name}: ") else text
    return ExecutionError(name=str(name), value=value, traceback=str(answer.get("traceback") or ""))


def _entry(info: Mapping[str, Any], path: str) -> EntryInfo:
    kind = info.get("type")
    mtime = info.get("mtime_ms")
    target = info.get("link_target")
    return EntryInfo(
        name=str(info.get("name")),
        path=path,
        type=kind if kind in ("file", "dir", "symlink") else "other",
        size=int(info.get("size") or 0),
        mode=int(info.get("mode") or 0),
        modified_time=(
            datetime.fromtimestamp(mtime / 1000, tz=timezone.utc) if isinstance(mtime, (int, float)) else None
        ),
        symlink_target=target if isinstance(target, str) else None,
    )


def _join(directory: str, name: str) -> str:
    return f"{directory}{name}" if directory.endswith("/") else f"{directory}/{name}"


def _resume_or_join(
    controller: Controller, sandbox_id: str, lifetime: Optional[float], cancel: Optional[CancelToken]
) -> Dict[str, Any]:
    """Resumes it; a resume another caller finished first counts (it runs, which is all connect needs)."""
    try:
        return controller.resume_sandbox(sandbox_id, lifetime=lifetime, cancel=cancel)
    except ConflictError:
        info = controller.get_sandbox(sandbox_id, cancel=cancel)
        if info.get("status") != "running":
            raise
        return info
