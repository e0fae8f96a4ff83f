"""``sandbox.files``: files in the sandbox, read and written through the daemon; binary-safe, ~16 MiB per call."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Literal, Mapping, Optional, TypeVar, Union, overload

from ._results import EntryInfo
from .cancel import CancelToken
from .errors import ForkdError, InvalidArgumentError, NotFoundError, SandboxNotFoundError

if TYPE_CHECKING:
    from .sandbox import Sandbox

__all__ = ["Files"]

T = TypeVar("T")


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
