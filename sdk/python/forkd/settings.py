"""Connection settings: where the daemon is, how to authenticate, how long to wait.

Each setting resolves per call -> client -> environment (``FORKD_URL``, ``FORKD_TOKEN``) -> default, exactly as the
TypeScript SDK resolves them, and a bad value is reported with the name of the place it came from. The
environment is read when a client is made (and when a call needs it), never at import.

Durations in the Python SDK are seconds (floats), like the standard library and forkd v0.5's Python SDK; ``0``
disables the limit it sets.
"""

from __future__ import annotations

import math
import os
import re
import ssl
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Tuple
from urllib.parse import urlsplit

from . import _limits
from .errors import InvalidArgumentError

__all__ = [
    "DEFAULT_DAEMON_URL",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_SANDBOX_TIMEOUT",
    "DEFAULT_COMMAND_TIMEOUT",
    "DaemonAddress",
    "Settings",
    "resolve_settings",
    "parse_daemon_url",
]

# The defaults come from forkd's one table of limits (src/common/limits.ts, generated into _limits.py), in seconds.

#: The daemon's Unix socket (``forkd daemon``'s default).
DEFAULT_DAEMON_URL = _limits.DEFAULT_DAEMON_URL
#: One HTTP exchange with the daemon, in seconds; distinct from a sandbox's lifetime and a command's timeout.
DEFAULT_REQUEST_TIMEOUT = _limits.DEFAULT_REQUEST_TIMEOUT_MS / 1000
#: Like the SDKs agents already use: a ``Sandbox`` nobody extends dies after five minutes.
DEFAULT_SANDBOX_TIMEOUT = _limits.SDK_SANDBOX_TIMEOUT_MS / 1000
#: A command (or a ``run_code`` evaluation) that runs longer is killed in the guest.
DEFAULT_COMMAND_TIMEOUT = _limits.DEFAULT_COMMAND_TIMEOUT_MS / 1000
#: The largest duration accepted, in seconds (the TypeScript SDK's 2^31-1 ms).
MAX_DURATION = (2**31 - 1) / 1000

_TOKEN_PATTERN = re.compile(r"^[\x21-\x7e]+$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_HINT = "use unix:/path/to/forkd.sock, http://host:port or https://host:port"


@dataclass(frozen=True)
class DaemonAddress:
    """A parsed daemon address: a Unix socket, or TCP (``http``/``https``) with an optional base path."""

    kind: str  # "unix" | "tcp"
    display: str
    socket_path: Optional[str] = None
    scheme: Optional[str] = None  # "http" | "https"
    host: Optional[str] = None
    port: Optional[int] = None
    base_path: str = ""


@dataclass(frozen=True)
class Settings:
    """The settings one call uses."""

    address: DaemonAddress
    #: Where the address came from, named in error messages ("the `url` argument", "FORKD_URL", ...).
    address_source: str
    token: Optional[str]
    token_source: str
    #: Seconds; 0 = no deadline.
    request_timeout: float
    headers: Dict[str, str] = field(default_factory=dict)
    ssl_context: Optional[ssl.SSLContext] = None


def resolve_settings(
    *,
    url: Optional[str] = None,
    token: Optional[str] = None,
    request_timeout: Optional[float] = None,
    headers: Optional[Mapping[str, str]] = None,
    ssl_context: Optional[ssl.SSLContext] = None,
    env: Optional[Mapping[str, str]] = None,
    call_token: Optional[str] = None,
    call_request_timeout: Optional[float] = None,
    call_headers: Optional[Mapping[str, str]] = None,
) -> Settings:
    """Resolves one call's settings: ``call_*`` wins over the client's, which win over the environment."""
    environment = os.environ if env is None else env
    address_value, address_source = _pick(
        (url, "the `url` argument"),
        (_non_empty(environment.get(_limits.DAEMON_URL_ENV)), _limits.DAEMON_URL_ENV),
        (DEFAULT_DAEMON_URL, "the default address"),
    )
    token_value, token_source = _pick(
        (call_token, "the call's `token` argument"),
        (token, "the `token` argument"),
        (_non_empty(environment.get(_limits.DAEMON_TOKEN_ENV)), _limits.DAEMON_TOKEN_ENV),
        (None, "nothing (no token set)"),
    )
    if token_value is not None:
        _check_token(token_value, token_source)
    timeout = call_request_timeout if call_request_timeout is not None else request_timeout
    timeout = DEFAULT_REQUEST_TIMEOUT if timeout is None else timeout
    check_duration(timeout, "request_timeout")
    merged = {**(headers or {}), **(call_headers or {})}
    for name, value in merged.items():
        _check_header(name, value)
    assert address_value is not None
    return Settings(
        address=parse_daemon_url(address_value, address_source),
        address_source=address_source,
        token=token_value,
        token_source=token_source,
        request_timeout=float(timeout),
        headers=merged,
        ssl_context=ssl_context,
    )


def parse_daemon_url(url: str, source: str = "the `url` argument") -> DaemonAddress:
    """Parses ``unix:/path``, ``unix:///path``, ``http://host:port[/prefix]`` or ``https://...``."""
    if not isinstance(url, str):
        raise InvalidArgumentError(f"{source} must be a string, got {type(url).__name__}")
    if url.startswith("unix:"):
        socket_path = url[len("unix:") :]
        if socket_path.startswith("///"):
            socket_path = socket_path[2:]
        if not socket_path.startswith("/") or "\0" in socket_path:
            raise InvalidArgumentError(
                f"{source} is {url!r}: a unix socket path must be absolute; {_HINT}"
            )
        return DaemonAddress(kind="unix", display=f"unix:{socket_path}", socket_path=socket_path)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise InvalidArgumentError(f"{source} is {url!r}, which is not a daemon address; {_HINT}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        scheme = f"{parts.scheme}:" if parts.scheme else "none"
        raise InvalidArgumentError(f"{source} is {url!r}: unsupported scheme {scheme}; {_HINT}")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise InvalidArgumentError(
            f"{source} is {url!r}: no credentials, query or fragment in the address (pass the token with the "
            "`token` argument or FORKD_TOKEN)"
        )
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    base_path = parts.path.rstrip("/")
    return DaemonAddress(
        kind="tcp",
        display=f"{parts.scheme}://{parts.netloc}{base_path}",
        scheme=parts.scheme,
        host=parts.hostname,
        port=port,
        base_path=base_path,
    )


def check_duration(value: object, name: str) -> float:
    """Durations are seconds from 0 (no limit) to ~24.8 days; returns it as a float."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or value > MAX_DURATION
    ):
        raise InvalidArgumentError(
            f"{name} must be a number of seconds from 0 (no limit) to {MAX_DURATION:g}, got {value!r}"
        )
    return float(value)


def _check_token(token: str, source: str) -> None:
    if not isinstance(token, str) or not _TOKEN_PATTERN.match(token):
        raise InvalidArgumentError(
            f"the token from {source} is empty or contains spaces, control or non-ASCII characters; pass the "
            "daemon's token exactly (trailing newline removed)"
        )


def _check_header(name: str, value: str) -> None:
    if not _HEADER_NAME.match(name) or any(c in str(value) for c in "\r\n\0"):
        raise InvalidArgumentError(f"header {name!r} has an invalid name or value (check the `headers` argument)")


def _non_empty(value: Optional[str]) -> Optional[str]:
    if value is None or value.strip() == "":
        return None
    return value.strip()


def _pick(*candidates: Tuple[Optional[str], str]) -> Tuple[Optional[str], str]:
    for value, source in candidates:
        if value is not None:
            return value, source
    return candidates[-1]
