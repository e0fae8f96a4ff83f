"""What every call of the :class:`~forkd.Controller` shares: its settings, the JSON exchange with the daemon, the
route helpers and the durations of forkd's table of limits (``_limits``) in seconds."""

from __future__ import annotations

import json
import math
import ssl
from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

from . import _limits
from ._transport import Request, Response, exchange, is_daemon_reachable, path_of
from .cancel import CancelToken
from .errors import ForkdError, InvalidArgumentError
from .settings import Settings, check_duration, resolve_settings

__all__ = [
    "ControllerBase",
    "BranchMode",
    "DEFAULT_SNAPSHOT_TIMEOUT",
    "MAX_GUEST_TIMEOUT",
    "GUEST_WORK_GRACE",
    "SPAWN_SECONDS_PER_CHILD",
    "STDIN_FRAME_BYTES",
    "Stdin",
    "StreamedStdin",
]

BranchMode = str
"""BRANCH mode: ``"full"`` (the default: a snapshot that stands alone), ``"diff"`` (only what changed, on top of the
sandbox's base) or ``"live"`` (like diff, memory captured while the sandbox runs; needs ``live_fork=True``)."""

# forkd's table of limits (src/common/limits.ts, generated into _limits.py) in seconds, as the Python SDK counts.

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

#: What a command's stdin may be given as: text, bytes, or (streamed) an iterable of either.
Stdin = Union[str, bytes, bytearray, memoryview]
StreamedStdin = Union[Stdin, Iterable[Union[str, bytes]]]


class ControllerBase:
    """The connection settings and the plumbing every group of calls shares (see :class:`~forkd.Controller`)."""

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

    def is_reachable(self) -> bool:
        """True if the daemon answers ``GET /healthz``; never raises."""
        return is_daemon_reachable(self.settings())

    def version(self, *, request_timeout: Optional[float] = None, cancel: Optional[CancelToken] = None) -> Dict[str, Any]:
        """``GET /version``: ``{"version", "api"}``."""
        return self._object(Request("GET", "/version"), request_timeout, cancel)

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
