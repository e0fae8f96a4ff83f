"""Controller: the daemon's REST API as methods.

The method set, argument names and return shapes are forkd v0.5's Python ``Controller`` (``list_snapshots``,
``spawn_sandboxes``, ``branch_sandbox``, ``exec_command``, ``eval_code``, ``ping_sandbox``, ``kill_sandbox``, ...):
results are the wire's JSON documents as dicts (docs/api.md), so code written for v0.5 runs unmodified. Beyond
v0.5: snapshot info/diff/compact and delete with cascade/force, files, streamed exec, lifetimes, kill-many, per-call
timeouts and cancellation.

Every method takes the keyword-only per-call options ``request_timeout`` (seconds for this HTTP exchange, 0 = none)
and ``cancel`` (a :class:`~forkd.CancelToken`).
"""

from __future__ import annotations

import base64
import json
import math
import os
import ssl
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

from . import _limits
from ._transport import (
    CallScope,
    QueryValue,
    Request,
    Response,
    exchange,
    is_daemon_reachable,
    open_stream,
    path_of,
)
from .cancel import CancelToken
from .errors import ForkdError, InvalidArgumentError
from .exec_stream import ExecStream
from .network import NetworkRequest, network_to_wire, policy
from .settings import DEFAULT_COMMAND_TIMEOUT, Settings, check_duration, resolve_settings

__all__ = ["Controller", "BranchMode", "DEFAULT_SNAPSHOT_TIMEOUT", "MAX_GUEST_TIMEOUT"]

BranchMode = str
"""BRANCH mode: ``"full"`` (the default: a snapshot that stands alone), ``"diff"`` (only what changed, on top of the
sandbox's base) or ``"live"`` (like diff, memory captured while the sandbox runs; needs ``live_fork=True``)."""

#: Building an image, booting and warming a parent takes minutes under TCG (create_snapshot, compact_snapshot).
DEFAULT_SNAPSHOT_TIMEOUT = _limits.DEFAULT_SNAPSHOT_CREATE_TIMEOUT_MS / 1000
#: The daemon's longest guest-side timeout, in seconds; "no limit" (0) is sent as this: the wire needs a bound.
MAX_GUEST_TIMEOUT = _limits.MAX_GUEST_TIMEOUT_MS / 1000
#: Network allowance on top of a command's own timeout, for calls that wait for guest work.
GUEST_WORK_GRACE = _limits.GUEST_WORK_GRACE_MS / 1000
#: Deadline allowance per child of a spawn request, on top of ``request_timeout``.
SPAWN_SECONDS_PER_CHILD = _limits.SPAWN_MS_PER_CHILD / 1000
#: Stdin bytes per NDJSON frame of a streamed-stdin exec (the daemon bounds one request line at 2 MiB).
STDIN_FRAME_BYTES = _limits.STDIN_FRAME_BYTES

Stdin = Union[str, bytes, bytearray, memoryview]
StreamedStdin = Union[Stdin, Iterable[Union[str, bytes]]]


class Controller:
    """Client of the forkd daemon's REST API.

    Args:
        url: the daemon's address: ``unix:/path/to/forkd.sock``, ``http://host:port`` or ``https://host:port``.
            Default: ``$FORKD_URL``, then the daemon's Unix socket ``unix:/run/forkd/forkd.sock``.
        token: bearer token (a line of the daemon's ``--token-file``), needed over TCP. Default: ``$FORKD_TOKEN``.
        timeout: seconds one HTTP exchange may take (v0.5's name; 0 disables). Default 60.
        base_url: forkd v0.5's name for ``url``.
        headers: extra HTTP headers sent with every request.
        ssl_context: for an ``https://`` daemon with a private CA, e.g.
            ``ssl.create_default_context(cafile="ca.pem")``.
        env: where ``FORKD_URL``/``FORKD_TOKEN`` are read (default ``os.environ``).

    A bad setting raises :class:`~forkd.InvalidArgumentError` at once, naming where it came from.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        timeout: Optional[float] = None,
        *,
        base_url: Optional[str] = None,
        headers: Optional[Mapping[str, str]] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> None:
        if url is not None and base_url is not None and url != base_url:
            raise InvalidArgumentError("give url or base_url (forkd v0.5's name for it), not both")
        self._options: Dict[str, Any] = {
            "url": url if url is not None else base_url,
            "token": token,
            "request_timeout": timeout,
            "headers": dict(headers or {}),
            "ssl_context": ssl_context,
            "env": None if env is None else dict(env),
        }
        # Resolved now so a bad FORKD_URL or token fails here, not at the first call; and again at each call, so
        # the environment is read when a call is made (as the TypeScript SDK does).
        self.settings()

    # --- settings ------------------------------------------------------------------------------------------

    def settings(self, *, request_timeout: Optional[float] = None) -> Settings:
        """The settings one call would use (per call -> client -> environment -> default)."""
        return resolve_settings(**self._options, call_request_timeout=request_timeout)

    @property
    def base_url(self) -> str:
        """The daemon's address (v0.5 attribute), e.g. ``unix:/run/forkd/forkd.sock`` or ``http://127.0.0.1:8889``."""
        return self.settings().address.display

    @property
    def token(self) -> Optional[str]:
        return self.settings().token

    @property
    def timeout(self) -> float:
        """Seconds one HTTP exchange may take (v0.5 attribute)."""
        return self.settings().request_timeout

    # --- daemon --------------------------------------------------------------------------------------------

    def is_reachable(self) -> bool:
        """True if the daemon answers ``GET /healthz``; never raises."""
        return is_daemon_reachable(self.settings())

    def version(self, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None) -> Dict[str, Any]:
        """``GET /version``: ``{"version", "api"}``."""
        return self._object(Request("GET", "/version"), request_timeout, cancel)

    # --- snapshots -----------------------------------------------------------------------------------------

    def list_snapshots(
        self, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None
    ) -> List[Dict[str, Any]]:
        """``GET /v1/snapshots``: every snapshot the daemon knows (SnapshotInfo dicts: ``tag``, ``status``, ...)."""
        return self._list(Request("GET", "/v1/snapshots"), request_timeout, cancel)

    def get_snapshot(
        self, tag: str, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None
    ) -> Dict[str, Any]:
        """``GET /v1/snapshots/:tag``: one SnapshotInfo."""
        return self._object(Request("GET", path_of("/v1/snapshots/{}", _required(tag, "tag"))), request_timeout, cancel)

    def snapshot_info(
        self, tag: str, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None
    ) -> Dict[str, Any]:
        """``GET /v1/snapshots/:tag/info``: the snapshot with its chain (``chain_depth``, ``ancestors``,
        ``dependents``, ``layers`` with bytes per layer, ...)."""
        return self._object(
            Request("GET", path_of("/v1/snapshots/{}/info", _required(tag, "tag"))), request_timeout, cancel
        )

    def create_snapshot(
        self,
        tag: str,
        template: Optional[str] = None,
        *,
        kernel: Optional[str] = None,
        rootfs: Optional[str] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``POST /v1/snapshots``: build the template's image if needed, boot, warm and snapshot a parent.

        ``template`` defaults to the tag. forkd v0.5's form, ``kernel`` and ``rootfs``, names the vmlinuz and
        rootfs.ext4 of a built forkd image on the daemon's host (in an allowed image directory; anything else is an
        InvalidArgumentError naming the directories). Blocks until the snapshot is ready; ``request_timeout``
        defaults to 30 minutes here.
        """
        body: Dict[str, Any] = {"tag": _required(tag, "tag")}
        if template is not None:
            body["template"] = _required(template, "template")
        if kernel is not None:
            body["kernel"] = _required(kernel, "kernel")
        if rootfs is not None:
            body["rootfs"] = _required(rootfs, "rootfs")
        return self._object(
            Request("POST", "/v1/snapshots", json=body, has_json=True),
            DEFAULT_SNAPSHOT_TIMEOUT if request_timeout is None else request_timeout,
            cancel,
        )

    def delete_snapshot(
        self,
        tag: str,
        *,
        cascade: bool = False,
        force: bool = False,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> None:
        """``DELETE /v1/snapshots/:tag``. ConflictError if a sandbox uses it, or if other snapshots depend on it
        and neither ``cascade`` (delete them too) nor ``force`` (leave them orphaned) is set."""
        query: Dict[str, QueryValue] = {}
        if cascade:
            query["cascade"] = True
        if force:
            query["force"] = True
        self._send(
            Request("DELETE", path_of("/v1/snapshots/{}", _required(tag, "tag")), query=query), request_timeout, cancel
        )

    def compact_snapshot(
        self,
        tag: str,
        to: str,
        *,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``POST /v1/snapshots/:tag/compact``: fold the chain ending at ``tag`` into a new flat snapshot ``to``
        (no parent). Blocks until it is ready; ``request_timeout`` defaults to 30 minutes here."""
        return self._object(
            Request(
                "POST",
                path_of("/v1/snapshots/{}/compact", _required(tag, "tag")),
                json={"to": _required(to, "to")},
                has_json=True,
            ),
            DEFAULT_SNAPSHOT_TIMEOUT if request_timeout is None else request_timeout,
            cancel,
        )

    def snapshot_diff(
        self,
        from_tag: str,
        tag: str,
        exec: Union[str, Sequence[str]],
        *,
        exec_timeout: Optional[float] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``POST /v1/snapshots/:from/diff``: a new snapshot ``tag`` layered on ``from_tag`` by running ``exec`` in a
        fresh sandbox (a string runs under ``sh -c``, a list as argv); the daemon BRANCHes it in diff mode and kills
        the sandbox. A failing command is an InvalidArgumentError (HTTP 422) with its output in the message.
        ``request_timeout`` defaults to none here (installs take minutes)."""
        body: Dict[str, Any] = {"tag": _required(tag, "tag"), "exec": exec if isinstance(exec, str) else list(exec)}
        if exec_timeout is not None:
            body["timeout_ms"] = _ms(check_duration(exec_timeout, "exec_timeout"))
        return self._object(
            Request("POST", path_of("/v1/snapshots/{}/diff", _required(from_tag, "from_tag")), json=body, has_json=True),
            0 if request_timeout is None else request_timeout,
            cancel,
        )

    def pack_snapshot(
        self,
        tag: str,
        out: str,
        *,
        without_image: bool = False,
        level: Optional[int] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``GET /v1/snapshots/:tag/pack``: download a pack of the chain ending at ``tag`` (and its guest image unless
        ``without_image``) into the file ``out``, which must not exist; ``unpack_snapshot`` (or ``forkd unpack``)
        installs it elsewhere. A failed download leaves no file. ``request_timeout`` defaults to 30 minutes here.
        Returns ``{"out", "bytes", "chain"}``."""
        query: Dict[str, QueryValue] = {}
        if without_image:
            query["without_image"] = True
        if level is not None:
            query["level"] = level
        request = Request(
            "GET",
            path_of("/v1/snapshots/{}/pack", _required(tag, "tag")),
            query=query,
            accept=_limits.PACK_CONTENT_TYPE,
        )
        timeout = check_duration(DEFAULT_SNAPSHOT_TIMEOUT if request_timeout is None else request_timeout,
                                 "request_timeout")
        try:
            target = open(_required(out, "out"), "xb")
        except OSError as err:
            raise InvalidArgumentError(f"cannot write the pack to {out}: {err.strerror}") from None
        scope = CallScope(cancel)
        scope.deadline(timeout, "request_timeout", f"packing {tag}")
        written = 0
        try:
            with target:
                stream = open_stream(self.settings(), request, scope)
                try:
                    for chunk in stream.chunks():
                        target.write(chunk)
                        written += len(chunk)
                    chain = [t for t in (stream.header(_limits.PACK_CHAIN_HEADER) or "").split(",") if t]
                finally:
                    stream.close()
        except BaseException:
            os.unlink(out)
            raise
        return {"out": out, "bytes": written, "chain": chain}

    def unpack_snapshot(
        self,
        file: str,
        *,
        tag: Optional[str] = None,
        force: bool = False,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``POST /v1/snapshots/unpack``: send the pack in ``file``; the daemon verifies every entry and installs its
        snapshots, all or none (``tag``: the head's new tag; ``force``: replace same-tagged snapshots that differ).
        Returns ``{"head", "chain", "installed", "reused", "replaced", "orphaned", "image", ...}``.
        ``request_timeout`` defaults to 30 minutes here."""
        try:
            source = open(_required(file, "file"), "rb")
        except OSError as err:
            raise InvalidArgumentError(f"cannot read the pack {file}: {err.strerror}") from None
        query: Dict[str, QueryValue] = {}
        if tag is not None:
            query["tag"] = tag
        if force:
            query["force"] = True
        with source:
            return self._object(
                Request(
                    "POST",
                    "/v1/snapshots/unpack",
                    query=query,
                    body_stream=iter(lambda: source.read(1 << 20), b""),
                    content_type=_limits.PACK_CONTENT_TYPE,
                ),
                DEFAULT_SNAPSHOT_TIMEOUT if request_timeout is None else request_timeout,
                cancel,
            )

    # --- sandboxes -----------------------------------------------------------------------------------------

    def spawn_sandboxes(
        self,
        snapshot_tag: str,
        n: int = 1,
        per_child_netns: bool = False,
        memory_limit_mib: Optional[int] = None,
        prewarm: bool = False,
        live_fork: bool = False,
        hugepages: bool = False,
        *,
        cpu_limit_millicores: Optional[int] = None,
        pids_limit: Optional[int] = None,
        disk_limit_mib: Optional[int] = None,
        lifetime: Optional[float] = None,
        on_timeout: Optional[str] = None,
        network: Optional[NetworkRequest] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> List[Dict[str, Any]]:
        """``POST /v1/sandboxes``: fork ``n`` children (1..1000) of a snapshot, all or none.

        Returns the SandboxInfo dicts (``id``, ``snapshot_tag``, ``pid``, ``status``, ``expires_at_unix_ms``, ...).
        ``lifetime``: seconds until the daemon kills each sandbox (0 = no limit); default: the daemon's, none
        unless it runs with ``--default-timeout-ms``. ``on_timeout``: what the end of the lifetime does, ``"kill"``
        (the default) or ``"pause"`` (to disk; :meth:`resume_sandbox` wakes it). ``live_fork=True`` makes ``mode="live"`` BRANCHes possible.
        ``network``: an egress policy, ``{"egress": "allow"|"deny", "allow_out": [...], "deny_out": [...]}`` (a
        field left out comes from the snapshot's template default, else the daemon's ``--egress``; docs/network.md),
        or ``"none"`` (a NIC that leads nowhere). ``per_child_netns`` is accepted (every networked sandbox has a
        namespace of its own); ``prewarm`` and ``hugepages`` are v0.5 flags this daemon answers 501 for when true.
        Limits (``memory_limit_mib``, ``cpu_limit_millicores``, ``pids_limit``, ``disk_limit_mib``): absent ones
        get the daemon's defaults; one the daemon's host cannot enforce is a 501 (docs/security.md, Limits).
        The call waits ``request_timeout`` plus one second per child.
        """
        body: Dict[str, Any] = {
            "snapshot_tag": _required(snapshot_tag, "snapshot_tag"),
            "n": n,
            "per_child_netns": per_child_netns,
        }
        if memory_limit_mib is not None:
            body["memory_limit_mib"] = memory_limit_mib
        if cpu_limit_millicores is not None:
            body["cpu_limit_millicores"] = cpu_limit_millicores
        if pids_limit is not None:
            body["pids_limit"] = pids_limit
        if disk_limit_mib is not None:
            body["disk_limit_mib"] = disk_limit_mib
        if prewarm:
            body["prewarm"] = True
        if live_fork:
            body["live_fork"] = True
        if hugepages:
            body["hugepages"] = True
        if lifetime is not None:
            body["timeout_ms"] = _ms(check_duration(lifetime, "lifetime"))
        if on_timeout is not None:
            body["on_timeout"] = on_timeout
        if network is not None:
            body["network"] = network_to_wire(network)
        base = self.settings(request_timeout=request_timeout).request_timeout
        count = n if isinstance(n, int) and n > 0 else 1
        return self._list(
            Request(
                "POST",
                "/v1/sandboxes",
                json=body,
                has_json=True,
                deadline_setting="request_timeout",
                deadline_what=f"spawning {count} sandbox{'' if count == 1 else 'es'} (request_timeout + 1 s per child)",
            ),
            0 if base == 0 else base + count * SPAWN_SECONDS_PER_CHILD,
            cancel,
        )

    def list_sandboxes(
        self,
        snapshot_tag: Optional[str] = None,
        *,
        status: Optional[str] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> List[Dict[str, Any]]:
        """``GET /v1/sandboxes``: every sandbox the daemon tracks (of one snapshot, in one state, if given)."""
        query: Dict[str, QueryValue] = {} if snapshot_tag is None else {"snapshot_tag": snapshot_tag}
        if status is not None:
            query["status"] = status
        return self._list(Request("GET", "/v1/sandboxes", query=query), request_timeout, cancel)

    def get_sandbox(
        self, sandbox_id: str, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None
    ) -> Dict[str, Any]:
        """``GET /v1/sandboxes/:id``: one SandboxInfo (with v0.5's ``has_branched``, ``branch_count``, ...)."""
        return self._object(Request("GET", _sandbox(sandbox_id)), request_timeout, cancel)

    def kill_sandbox(
        self, sandbox_id: str, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None
    ) -> None:
        """``DELETE /v1/sandboxes/:id``: kill it and free its resources; NotFoundError if the daemon does not know it."""
        self._send(Request("DELETE", _sandbox(sandbox_id)), request_timeout, cancel)

    def kill_sandboxes(
        self,
        *,
        all: bool = False,
        snapshot_tag: Optional[str] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> List[str]:
        """``DELETE /v1/sandboxes``: kill every sandbox (``all=True``) or every one of a snapshot; returns the ids."""
        if all == (snapshot_tag is not None):
            raise InvalidArgumentError("give all=True or snapshot_tag=..., exactly one")
        query: Dict[str, QueryValue] = {"all": True} if all else {"snapshot_tag": snapshot_tag}
        answer = self._object(Request("DELETE", "/v1/sandboxes", query=query), request_timeout, cancel)
        return [str(k) for k in answer["killed"]]

    def set_sandbox_timeout(
        self,
        sandbox_id: str,
        lifetime: float,
        *,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``POST /v1/sandboxes/:id/timeout``: the sandbox's remaining lifetime, seconds from now (0 = no limit)."""
        body = {"timeout_ms": _ms(check_duration(lifetime, "lifetime"))}
        return self._object(
            Request("POST", _sandbox(sandbox_id, "/timeout"), json=body, has_json=True), request_timeout, cancel
        )

    def set_network_policy(
        self,
        sandbox_id: str,
        egress: Optional[str] = None,
        *,
        allow_out: Optional[Sequence[str]] = None,
        deny_out: Optional[Sequence[str]] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``PUT /v1/sandboxes/:id/network``: replaces a running sandbox's egress policy (new connections follow it
        at once, established ones at their next packet). A field left out comes from the snapshot's template
        default, else the daemon's ``--egress``. Returns the SandboxInfo dict."""
        body = network_to_wire(policy(egress, allow_out, deny_out))
        return self._object(
            Request("PUT", _sandbox(sandbox_id, "/network"), json=body, has_json=True), request_timeout, cancel
        )

    def pause_sandbox(
        self,
        sandbox_id: str,
        *,
        merge: bool = False,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``POST /v1/sandboxes/:id/pause``: its state to disk, its VM stopped, its RAM given back.

        Returns ``{sandbox, tag, pause_ms, write_ms, bytes_captured, bytes_stored, merged, freed_bytes}``.
        ConflictError unless it is running. ``merge=True`` writes one layer holding everything since its snapshot.
        """
        body = {"merge": True} if merge else {}
        return self._object(
            Request("POST", _sandbox(sandbox_id, "/pause"), json=body, has_json=True), request_timeout, cancel
        )

    def resume_sandbox(
        self,
        sandbox_id: str,
        *,
        lifetime: Optional[float] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``POST /v1/sandboxes/:id/resume``: a paused sandbox runs again under its id, where it was.

        ``lifetime``: seconds from now (0 = no limit); default: the lifetime it had. ConflictError unless paused.
        """
        body: Dict[str, Any] = {}
        if lifetime is not None:
            body["timeout_ms"] = _ms(check_duration(lifetime, "lifetime"))
        return self._object(
            Request("POST", _sandbox(sandbox_id, "/resume"), json=body, has_json=True), request_timeout, cancel
        )

    def ping_sandbox(
        self, sandbox_id: str, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None
    ) -> Dict[str, Any]:
        """``POST /v1/sandboxes/:id/ping``: round trip to the guest agent (``pong``, agent facts)."""
        return self._object(Request("POST", _sandbox(sandbox_id, "/ping")), request_timeout, cancel)

    def branch_sandbox(
        self,
        sandbox_id: str,
        tag: Optional[str] = None,
        diff: bool = False,
        measure_diff: bool = False,
        mode: Optional[BranchMode] = None,
        wait: bool = True,
        *,
        parent_tag: Optional[str] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``POST /v1/sandboxes/:id/branch``: snapshot the running sandbox mid-work; it keeps running.

        ``mode``: ``"full"`` (the daemon's default, as in v0.5: the new snapshot stands alone), ``"diff"`` (only what
        the sandbox changed, on top of its base) or ``"live"`` (like diff, captured while it runs; needs a sandbox
        spawned with ``live_fork=True``). ``diff=True`` is v0.5's legacy spelling of ``mode="diff"``.
        ``measure_diff`` adds v0.5's ``diff_ms``/``diff_physical_bytes``/``diff_logical_bytes`` (diff mode always
        has them). ``wait=False`` (live only) answers as soon as the sandbox runs again, with ``status="writing"``:
        poll ``get_snapshot`` until it is ``"ready"``. ``parent_tag``: the base the caller expects (ConflictError if
        the sandbox's is another).

        Returns the new snapshot (SnapshotInfo) plus ``branched_from``, ``mode``, ``pause_ms`` (whole ms),
        ``bytes_captured``, ``bytes_written``; spawn from its ``tag``.
        """
        body: Dict[str, Any] = {}
        if tag is not None:
            body["tag"] = tag
        if mode is not None:
            body["mode"] = mode
        elif diff:
            body["diff"] = True
        if measure_diff:
            body["measure_diff"] = True
        if not wait:
            body["wait"] = False
        if parent_tag is not None:
            body["parent_tag"] = parent_tag
        return self._object(
            Request("POST", _sandbox(sandbox_id, "/branch"), json=body, has_json=True), request_timeout, cancel
        )

    # --- workspaces (forkd v0.5's /v1/workspaces: named sandboxes suspended and resumed by name) -------------

    def list_workspaces(
        self, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None
    ) -> List[Dict[str, Any]]:
        """``GET /v1/workspaces``: WorkspaceInfo dicts (``name``, ``status``, ``live_sandbox_id``, ...)."""
        return self._list(Request("GET", "/v1/workspaces"), request_timeout, cancel)

    def get_workspace(
        self, name: str, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None
    ) -> Dict[str, Any]:
        """``GET /v1/workspaces/:name``; NotFoundError if there is none."""
        return self._object(Request("GET", _workspace(name)), request_timeout, cancel)

    def create_workspace(
        self,
        name: str,
        snapshot_tag: str,
        memory_limit_mib: Optional[int] = None,
        *,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``POST /v1/workspaces``: a running sandbox from ``snapshot_tag`` under ``name`` (1-64 of [A-Za-z0-9_-]);
        it lives until the workspace is deleted. ConflictError if the name is taken."""
        body: Dict[str, Any] = {"name": _required(name, "name"), "snapshot_tag": _required(snapshot_tag, "snapshot_tag")}
        if memory_limit_mib is not None:
            body["memory_limit_mib"] = memory_limit_mib
        return self._object(Request("POST", "/v1/workspaces", json=body, has_json=True), request_timeout, cancel)

    def suspend_workspace(
        self,
        name: str,
        diff: bool = False,
        *,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``POST /v1/workspaces/:name/suspend``: its sandbox paused to disk. ``diff=True`` layers on the previous
        suspend; otherwise one layer since its snapshot. InvalidArgumentError (400) unless it is running."""
        return self._object(
            Request("POST", _workspace(name, "/suspend"), json={"diff": diff}, has_json=True), request_timeout, cancel
        )

    def resume_workspace(
        self, name: str, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None
    ) -> Dict[str, Any]:
        """``POST /v1/workspaces/:name/resume``: its sandbox runs again where it was suspended (the same id)."""
        return self._object(
            Request("POST", _workspace(name, "/resume"), json={}, has_json=True), request_timeout, cancel
        )

    def delete_workspace(
        self, name: str, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None
    ) -> None:
        """``DELETE /v1/workspaces/:name``: its sandbox killed, its layers removed unless a snapshot uses them."""
        self._send(Request("DELETE", _workspace(name)), request_timeout, cancel)

    # --- exec / eval ---------------------------------------------------------------------------------------

    def exec_command(
        self,
        sandbox_id: str,
        args: Sequence[str],
        timeout_secs: float = 30,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Optional[Stdin] = None,
        encoding: Optional[str] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``POST /v1/sandboxes/:id/exec``: run ``args`` (no shell) and return its output when it exits.

        Returns ``{"stdout", "stderr", "exit_code", ...}`` (v0.5's shape; ``exit_code`` is 128+N when signal N killed
        it, plus ``signal``, ``timed_out``, ``*_truncated``, ``duration_ms``). Output is kept up to 1 MiB per stream;
        use :meth:`exec_stream` for more or for live output. ``timeout_secs`` kills the command (0 = no limit; v0.5's
        default 30). ``encoding="base64"`` returns the output bytes exactly.
        """
        timeout = check_duration(timeout_secs, "timeout_secs")
        body = _exec_body(args, timeout, env, cwd)
        _inline_stdin(body, stdin)
        if encoding is not None:
            body["encoding"] = encoding
        return self._object(
            Request("POST", _sandbox(sandbox_id, "/exec"), json=body, has_json=True),
            self._guest_work_deadline(timeout, request_timeout),
            cancel,
            deadline_setting="timeout_secs",
        )

    def exec_stream(
        self,
        sandbox_id: str,
        args: Sequence[str],
        *,
        timeout_secs: float = DEFAULT_COMMAND_TIMEOUT,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Optional[StreamedStdin] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> ExecStream:
        """``POST /v1/sandboxes/:id/exec/stream``: run ``args`` (no shell) and iterate its output as it happens.

        Yields :class:`~forkd.OutputEvent` (``type`` ``"stdout"``/``"stderr"``, ``data`` bytes) and finally an
        :class:`~forkd.ExitEvent`. ``request_timeout`` bounds the wait for the daemon to start the command;
        ``timeout_secs`` bounds the command (0 = none). ``stdin``: text/bytes written then closed, or an iterable of
        chunks streamed while the command runs. Closing the stream, leaving its ``with`` block or cancelling kills
        the command in the guest.
        """
        timeout = check_duration(timeout_secs, "timeout_secs")
        body = _exec_body(args, timeout, env, cwd)
        body["encoding"] = "base64"
        route = _sandbox(sandbox_id, "/exec/stream")
        settings = self.settings(request_timeout=request_timeout)
        if stdin is None or isinstance(stdin, (str, bytes, bytearray, memoryview)):
            _inline_stdin(body, stdin)
            request = Request("POST", route, json=body, has_json=True, accept=_limits.NDJSON_CONTENT_TYPE)
        else:
            request = Request(
                "POST",
                route,
                body_stream=_stdin_frames(body, stdin),
                content_type=_limits.NDJSON_CONTENT_TYPE,
                accept=_limits.NDJSON_CONTENT_TYPE,
            )
        program = str(args[0])
        scope = CallScope(cancel)
        try:
            stop_handshake = scope.deadline(settings.request_timeout, "request_timeout", f"starting {program}")
            stream = open_stream(settings, request, scope)
            stop_handshake()
        except BaseException:
            scope.close()
            raise
        # The daemon kills the command at its timeout and reports it; this backstop catches a daemon that never does.
        if timeout != 0:
            scope.deadline(timeout + GUEST_WORK_GRACE, "timeout_secs", f"command {program}")
        return ExecStream(stream, f"{request.described} ({program})")

    def eval_code(
        self,
        sandbox_id: str,
        code: str,
        *,
        timeout_secs: Optional[float] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``POST /v1/sandboxes/:id/eval``: evaluate Python in the sandbox's warm interpreter (numpy already
        imported in pyagent snapshots).

        Returns ``{"result", "error", "exit_code", ...}`` (v0.5's shape: ``result`` is ``repr()`` of the trailing
        expression, ``error`` is ``"Type: message"`` or None; plus ``error_type``, ``traceback``, ``stdout``,
        ``stderr``). A Python exception is not raised: it is in ``error``. ``timeout_secs`` kills the evaluation
        (0 = no limit); without it the daemon's default applies, as for v0.5 clients.
        """
        if not isinstance(code, str):
            raise InvalidArgumentError("code must be a string of Python source")
        body: Dict[str, Any] = {"code": code}
        timeout: Optional[float] = None
        if timeout_secs is not None:
            timeout = check_duration(timeout_secs, "timeout_secs")
            body["timeout_ms"] = _ms(timeout or MAX_GUEST_TIMEOUT)
        if timeout is None:
            return self._object(
                Request("POST", _sandbox(sandbox_id, "/eval"), json=body, has_json=True), request_timeout, cancel
            )
        return self._object(
            Request("POST", _sandbox(sandbox_id, "/eval"), json=body, has_json=True),
            self._guest_work_deadline(timeout, request_timeout),
            cancel,
            deadline_setting="timeout_secs",
        )

    # --- files ---------------------------------------------------------------------------------------------

    def write_file(
        self,
        sandbox_id: str,
        path: str,
        data: Union[bytes, bytearray, memoryview, str],
        *,
        mode: Optional[int] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``PUT /v1/sandboxes/:id/files``: replace (or create) a file, creating parent directories; binary-safe.
        A ``str`` is written as UTF-8. At most ~16 MiB per call (PayloadTooLargeError beyond). Returns
        ``{"path", "bytes"}``."""
        payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        query: Dict[str, QueryValue] = {"path": _required(path, "path")}
        if mode is not None:
            query["mode"] = format(mode, "o")
        return self._object(
            Request("PUT", _sandbox(sandbox_id, "/files"), query=query, body=payload), request_timeout, cancel
        )

    def read_file(
        self,
        sandbox_id: str,
        path: str,
        *,
        max_bytes: Optional[int] = None,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> bytes:
        """``GET /v1/sandboxes/:id/files``: a file's bytes (PayloadTooLargeError past ~16 MiB or ``max_bytes``)."""
        request = Request(
            "GET",
            _sandbox(sandbox_id, "/files"),
            query={"path": _required(path, "path")},
            accept="application/octet-stream",
        )
        if max_bytes is not None:
            request.max_response_bytes = max_bytes
        return self._send(request, request_timeout, cancel).body

    def list_files(
        self,
        sandbox_id: str,
        path: str,
        *,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``GET /v1/sandboxes/:id/files/list``: ``{"path", "entries": [FileInfo], "truncated"}``."""
        return self._object(
            Request("GET", _sandbox(sandbox_id, "/files/list"), query={"path": _required(path, "path")}),
            request_timeout,
            cancel,
        )

    def stat_file(
        self,
        sandbox_id: str,
        path: str,
        *,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``GET /v1/sandboxes/:id/files/stat``: FileInfo ``{"name", "type", "size", "mode", "mtime_ms", ...}``."""
        return self._object(
            Request("GET", _sandbox(sandbox_id, "/files/stat"), query={"path": _required(path, "path")}),
            request_timeout,
            cancel,
        )

    def remove_file(
        self,
        sandbox_id: str,
        path: str,
        *,
        recursive: bool = False,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> None:
        """``DELETE /v1/sandboxes/:id/files``: remove a file, or a directory (``recursive=True`` if not empty)."""
        query: Dict[str, QueryValue] = {"path": _required(path, "path")}
        if recursive:
            query["recursive"] = True
        self._send(Request("DELETE", _sandbox(sandbox_id, "/files"), query=query), request_timeout, cancel)

    # --- plumbing ------------------------------------------------------------------------------------------

    def _send(self, request: Request, request_timeout: Optional[float], cancel: Optional[CancelToken]) -> Response:
        if request_timeout is not None:
            request.deadline = check_duration(request_timeout, "request_timeout")
        return exchange(self.settings(), request, cancel)

    def _json(
        self,
        request: Request,
        deadline: Optional[float],
        cancel: Optional[CancelToken],
        *,
        deadline_setting: Optional[str] = None,
    ) -> Any:
        """Sends a request and parses its JSON answer (None for an empty body, e.g. 204).

        ``deadline``: this exchange's deadline in seconds (0 = none; None = the client's ``request_timeout``).
        """
        if deadline is not None:
            request.deadline = check_duration(deadline, deadline_setting or "request_timeout")
        if deadline_setting is not None:
            request.deadline_setting = deadline_setting
        response = exchange(self.settings(), request, cancel)
        if not response.body:
            return None
        try:
            return json.loads(response.body)
        except ValueError:
            raise ForkdError(
                f"the daemon answered {request.described} with a body that is not JSON (is FORKD_URL pointing at "
                "forkd?)",
                request=request.described,
            ) from None

    def _object(
        self,
        request: Request,
        deadline: Optional[float],
        cancel: Optional[CancelToken],
        *,
        deadline_setting: Optional[str] = None,
    ) -> Dict[str, Any]:
        answer = self._json(request, deadline, cancel, deadline_setting=deadline_setting)
        if not isinstance(answer, dict):
            raise ForkdError(f"the daemon answered {request.described} with {type(answer).__name__}, not an object")
        return answer

    def _list(
        self, request: Request, deadline: Optional[float], cancel: Optional[CancelToken]
    ) -> List[Dict[str, Any]]:
        answer = self._json(request, deadline, cancel)
        if not isinstance(answer, list):
            raise ForkdError(f"the daemon answered {request.described} with {type(answer).__name__}, not a list")
        return answer

    def _guest_work_deadline(self, timeout: float, request_timeout: Optional[float]) -> float:
        """A call that waits on guest work gets the work's timeout plus the request timeout as its deadline."""
        base = self.settings(request_timeout=request_timeout).request_timeout
        if timeout == 0 or base == 0:
            return 0
        return timeout + base


def _sandbox(sandbox_id: str, suffix: str = "") -> str:
    return path_of("/v1/sandboxes/{}", _required(sandbox_id, "sandbox_id")) + suffix


def _workspace(name: str, suffix: str = "") -> str:
    return path_of("/v1/workspaces/{}", _required(name, "name")) + suffix


def _required(value: object, name: str) -> str:
    if not isinstance(value, str) or value == "":
        raise InvalidArgumentError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _ms(seconds: float) -> int:
    return int(math.ceil(seconds * 1000))


def _exec_body(
    args: Sequence[str], timeout: float, env: Optional[Mapping[str, str]], cwd: Optional[str]
) -> Dict[str, Any]:
    if isinstance(args, (str, bytes)) or not args or not all(isinstance(a, str) for a in args):
        raise InvalidArgumentError("args must be a non-empty list of strings (the program and its arguments)")
    body: Dict[str, Any] = {"args": list(args)}
    # v0.5's field when it can say it exactly (whole seconds), else milliseconds; "no limit" is the daemon's maximum.
    wire = timeout or MAX_GUEST_TIMEOUT
    if float(wire).is_integer() and wire >= 1:
        body["timeout_secs"] = int(wire)
    else:
        body["timeout_ms"] = _ms(wire)
    if env is not None:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    return body


def _inline_stdin(body: Dict[str, Any], stdin: Optional[Stdin]) -> None:
    if stdin is None:
        return
    if isinstance(stdin, str):
        body["stdin"] = stdin
    elif isinstance(stdin, (bytes, bytearray, memoryview)):
        body["stdin_b64"] = base64.b64encode(bytes(stdin)).decode("ascii")
    else:
        raise InvalidArgumentError("stdin must be str or bytes here (exec_stream also takes an iterable of chunks)")


def _stdin_frames(exec_request: Dict[str, Any], chunks: Iterable[Union[str, bytes]]) -> Iterator[bytes]:
    """The NDJSON request of a streamed-stdin exec: the exec request, one line per stdin piece, then EOF."""
    yield (json.dumps(exec_request) + "\n").encode("utf-8")
    for chunk in chunks:
        data = chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk)
        for offset in range(0, len(data), STDIN_FRAME_BYTES):
            part = base64.b64encode(data[offset : offset + STDIN_FRAME_BYTES]).decode("ascii")
            yield (json.dumps({"stdin_b64": part}) + "\n").encode("utf-8")
    yield b'{"eof": true}\n'
