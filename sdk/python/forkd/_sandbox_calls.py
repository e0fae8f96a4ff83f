"""The :class:`~forkd.Controller`'s sandbox calls: spawn, list, kill, lifetimes, network, pause and resume, ping,
BRANCH, and forkd v0.5's workspaces."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence

from ._controller_base import (
    BranchMode,
    ControllerBase,
    SPAWN_SECONDS_PER_CHILD,
    _ms,
    _required,
    _sandbox,
    _workspace,
)
from ._transport import QueryValue, Request
from .cancel import CancelToken
from .errors import InvalidArgumentError
from .network import NetworkRequest, network_to_wire, policy
from .settings import check_duration

__all__ = ["SandboxCalls"]


class SandboxCalls(ControllerBase):
    """``/v1/sandboxes...`` and ``/v1/workspaces...``"""

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
        public_ports: Optional[bool] = None,
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
        or ``"none"`` (a NIC that leads nowhere). ``public_ports=False``: the sandboxes' ports are not public on
        the E2B data plane (requests there need their traffic access token; E2B's allowPublicTraffic). ``per_child_netns`` is accepted (every networked sandbox has a
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
        if public_ports is not None:
            body["public_ports"] = public_ports
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
