"""Sandbox: one forkd sandbox with the ergonomics of the E2B SDK, mirroring forkd's TypeScript SDK.

``Sandbox.create``, ``sandbox.commands.run`` (with line callbacks as output arrives), ``sandbox.run_code``,
``sandbox.files``, ``sandbox.branch``, ``sandbox.set_timeout``, ``sandbox.kill``, and ``with`` blocks that kill the
sandbox when they end. Durations are seconds; ``0`` disables the limit.
"""

from __future__ import annotations

import functools
import ssl
import time
from types import TracebackType
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Type, overload

from ._commands import SHELL, Commands
from ._files import Files
from ._results import CodeResult, CommandResult, EntryInfo, ExecutionError
from .cancel import CancelToken
from .controller import DEFAULT_SNAPSHOT_TIMEOUT, BranchMode, Controller
from .errors import (
    CancelledError,
    ConflictError,
    ConnectionError,
    ForkdError,
    InvalidArgumentError,
    NotFoundError,
    SandboxNotFoundError,
    TimeoutError,
    UnavailableError,
)
from .network import NetworkRequest
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

#: How often ``create`` asks whether a template's snapshot being built is ready, in seconds.
SNAPSHOT_POLL_INTERVAL = 0.5
#: How long asking the daemon whether a sandbox is gone may take, after a call into it failed.
DIAGNOSIS_TIMEOUT = 5.0


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
