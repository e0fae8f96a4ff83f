"""Every error the SDK raises is a :class:`ForkdError`.

One subclass per HTTP status family the daemon answers with, :class:`TimeoutError` for deadlines on either
side, :class:`ConnectionError` when the daemon cannot be reached or the connection drops,
:class:`CancelledError` when the caller's :class:`~forkd.CancelToken` fired, and :class:`CommandExitError` for a
command that exited non-zero. Messages say which setting to change.

``ForkdError`` subclasses ``RuntimeError`` (forkd v0.5's ``ControllerError`` did, and ``ControllerError`` is kept as
its alias with v0.5's ``status``, ``body`` and ``url``). ``TimeoutError``, ``ConnectionError`` and
``NotImplementedError`` also subclass the builtins of those names, so ``except TimeoutError`` catches both.
"""

from __future__ import annotations

import builtins
import email.utils
import json
import time
from typing import Any, Dict, Mapping, Optional

from . import _limits

__all__ = [
    "ForkdError",
    "ControllerError",
    "InvalidArgumentError",
    "AuthenticationError",
    "NotFoundError",
    "SandboxNotFoundError",
    "ConflictError",
    "PayloadTooLargeError",
    "RateLimitError",
    "ServerError",
    "NotImplementedError",
    "UnavailableError",
    "ConnectionError",
    "TimeoutError",
    "CancelledError",
    "CommandExitError",
]


class ForkdError(RuntimeError):
    """Base of every SDK error.

    Attributes:
        status: the HTTP status the daemon answered with, if it answered.
        code: the daemon's error code (``not_found``, ``conflict``, ...), if its body carried one.
        server_message: the daemon's own message (``{"error": "..."}``), if any.
        request: the request that failed, e.g. ``"POST /v1/sandboxes"``.
        body: the daemon's parsed error body (a dict, or the text if it was not JSON), as v0.5's ControllerError.
        url: the daemon address and path of the request (v0.5's ControllerError attribute).
    """

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        code: Optional[str] = None,
        server_message: Optional[str] = None,
        request: Optional[str] = None,
        body: Any = None,
        url: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.server_message = server_message
        self.request = request
        self.body = body
        self.url = url

    def __str__(self) -> str:
        return self.message


ControllerError = ForkdError
"""forkd v0.5's name for errors from the daemon; code that catches it keeps working."""


class InvalidArgumentError(ForkdError):
    """400/415/422: the daemon rejected the request's content; or the SDK rejected an argument before sending."""


class AuthenticationError(ForkdError):
    """401/403: missing or wrong token."""


class NotFoundError(ForkdError):
    """404: no such sandbox, snapshot, file or route."""


class SandboxNotFoundError(NotFoundError):
    """The sandbox itself is gone: killed, or its lifetime ran out."""


class ConflictError(ForkdError):
    """409: the resource is in a state that forbids the call (tag exists, snapshot not bootable, in use...)."""


class PayloadTooLargeError(ForkdError):
    """413: the request or its answer is larger than the daemon moves in one call."""


class _RetryLater(ForkdError):
    def __init__(self, message: str, *, retry_after: Optional[float] = None, **context: Any) -> None:
        super().__init__(message, **context)
        #: Seconds to wait before retrying, from the daemon's Retry-After header, if it sent one.
        self.retry_after = retry_after


class RateLimitError(_RetryLater):
    """429: admission control refused the call for now (``retry_after`` says when to retry)."""


class ServerError(ForkdError):
    """500: the daemon failed internally."""


class NotImplementedError(ForkdError, builtins.NotImplementedError):  # noqa: A001 - the builtin's name, on purpose
    """501: the daemon does not implement this (yet), or a v0.5 feature flag asked for something not built."""


class UnavailableError(_RetryLater):
    """502/503: the daemon (or a sandbox) cannot serve the call now."""


class ConnectionError(UnavailableError, builtins.ConnectionError):  # noqa: A001
    """The daemon could not be reached, or the connection dropped before the answer was complete.

    ``daemon_reachable`` says what a follow-up health check found: False = nothing answers at that address;
    True = the daemon is up, so the request itself was cut; None = not checked. ``errno_name`` is the system error
    (``ENOENT``, ``ECONNREFUSED``, ``EACCES``, ...), if any.
    """

    def __init__(
        self,
        message: str,
        *,
        daemon_reachable: Optional[bool] = None,
        errno_name: Optional[str] = None,
        **context: Any,
    ) -> None:
        super().__init__(message, **context)
        self.daemon_reachable = daemon_reachable
        self.errno_name = errno_name


class TimeoutError(ForkdError, builtins.TimeoutError):  # noqa: A001
    """A deadline passed: the SDK's ``request_timeout``, a command's ``timeout`` backstop, or the daemon's (504).

    ``setting`` names the option whose deadline fired.
    """

    def __init__(self, message: str, *, setting: Optional[str] = None, **context: Any) -> None:
        super().__init__(message, **context)
        self.setting = setting


class CancelledError(ForkdError):
    """The call's :class:`~forkd.CancelToken` was cancelled; ``reason`` is what was passed to ``cancel()``."""

    def __init__(self, message: str, *, reason: Any = None, **context: Any) -> None:
        super().__init__(message, **context)
        self.reason = reason


class CommandExitError(ForkdError):
    """Raised by ``sandbox.commands.run`` when the command exits non-zero, is killed or runs past its timeout.

    Carries the whole result: ``exit_code`` (128+N when signal N killed it), ``stdout``, ``stderr``, ``signal``,
    ``timed_out``.
    """

    def __init__(
        self,
        command: str,
        *,
        exit_code: int,
        stdout: str,
        stderr: str,
        signal: Optional[str] = None,
        timed_out: bool = False,
    ) -> None:
        if timed_out:
            how = "was killed after running past its timeout (pass a larger `timeout`, 0 disables it)"
        elif signal:
            how = f"was killed by {signal} (exit code {exit_code})"
        else:
            how = f"exited with code {exit_code}"
        tail = _last_line(stderr)
        super().__init__(f"command {command} {how}" + (f": {tail}" if tail else ""))
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr
        self.signal = signal
        self.timed_out = timed_out


# ---------------------------------------------------------------------------------------------------------------
# status -> class

#: The daemon's error codes (its catalogue, src/common/limits.ts) and their statuses, for errors inside a stream.
STATUS_OF_CODE: Mapping[str, int] = _limits.ERROR_CODES


def error_from_response(
    status: int,
    body: bytes,
    *,
    request: str,
    url: str,
    retry_after: Optional[str] = None,
    token_source: Optional[str] = None,
) -> ForkdError:
    """Maps a non-2xx answer from the daemon to the error class of its status family."""
    parsed, server_message, code = _parse_error_body(body)
    shown = server_message or f"HTTP {status}"
    where = f"(HTTP {status} from {request})"
    context: Dict[str, Any] = {
        "status": status,
        "code": code,
        "server_message": server_message or None,
        "request": request,
        "body": parsed,
        "url": url,
    }
    retry = parse_retry_after(retry_after)
    retry_hint = "" if retry is None else f"; retry after {retry:g} s"
    if status in (400, 415, 422):
        return InvalidArgumentError(f"{shown} {where}", **context)
    if status in (401, 403):
        if token_source is None:
            fix = "no token was sent: set FORKD_TOKEN or the `token` argument to a line of the daemon's --token-file"
        else:
            fix = f"the token from {token_source} was refused: set it to a line of the daemon's --token-file"
        return AuthenticationError(f"{shown} {where}; {fix}", **context)
    if status == 404:
        return NotFoundError(f"{shown} {where}", **context)
    if status == 409:
        return ConflictError(f"{shown} {where}", **context)
    if status == 413:
        return PayloadTooLargeError(
            f"{shown} {where}; the request or its answer is larger than the daemon moves in one call: send less",
            **context,
        )
    if status == 429:
        return RateLimitError(f"{shown} {where}{retry_hint}", retry_after=retry, **context)
    if status == 501:
        return NotImplementedError(f"{shown} {where}; this daemon does not implement it yet", **context)
    if status in (502, 503):
        return UnavailableError(f"{shown} {where}{retry_hint}", retry_after=retry, **context)
    if status in (408, 504):
        return TimeoutError(f"{shown} {where}; the daemon's own deadline passed", **context)
    if status >= 500:
        return ServerError(f"{shown} {where}", **context)
    return ForkdError(f"{shown} {where}", **context)


def _parse_error_body(body: bytes) -> "tuple[Any, str, Optional[str]]":
    """The daemon answers errors as ``{"error": "...", "code": "..."}``; anything else is shown as text."""
    text = body[:4096].decode("utf-8", errors="replace").strip()
    if not text:
        return {}, "", None
    try:
        parsed = json.loads(text)
    except ValueError:
        return text, text.split("\n", 1)[0], None
    if isinstance(parsed, dict):
        message = parsed.get("error") if isinstance(parsed.get("error"), str) else parsed.get("message")
        code = parsed.get("code") if isinstance(parsed.get("code"), str) else None
        if isinstance(message, str) and message:
            return parsed, message, code
    return parsed, text.split("\n", 1)[0], None


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """Retry-After is delay-seconds or an HTTP date; returns seconds."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _last_line(text: str) -> str:
    lines = text.rstrip().split("\n")
    line = lines[-1] if lines else ""
    return line if len(line) <= 200 else line[:200] + "…"
