"""The :class:`~forkd.Controller`'s snapshot calls: list, info, create, delete, compact, diff, pack and unpack."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _limits
from ._controller_base import ControllerBase, DEFAULT_SNAPSHOT_TIMEOUT, _ms, _required
from ._transport import CallScope, QueryValue, Request, open_stream, path_of
from .cancel import CancelToken
from .errors import InvalidArgumentError
from .settings import check_duration

__all__ = ["SnapshotCalls"]


class SnapshotCalls(ControllerBase):
    """``/v1/snapshots...``"""

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
