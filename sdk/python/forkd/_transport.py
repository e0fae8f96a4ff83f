"""HTTP to the daemon over its Unix socket or TCP/TLS (http.client), one connection per call.

Every failure becomes a :class:`~forkd.ForkdError`; a dropped connection is followed by a health check so the error
says whether the daemon is up. A call's deadline and its :class:`~forkd.CancelToken` are enforced by shutting the
call's socket down from a timer or the cancelling thread, which wakes a reader blocked in ``recv``.
"""

from __future__ import annotations

import errno
import http.client
import json
import socket
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Union
from urllib.parse import quote, urlencode

from ._version import __version__
from .cancel import CancelToken
from .errors import (
    CancelledError,
    ConnectionError,
    ForkdError,
    PayloadTooLargeError,
    TimeoutError,
    error_from_response,
)
from . import _limits
from .settings import Settings

#: Larger answers than this are refused rather than buffered (the daemon's own limits are far lower).
MAX_RESPONSE_BYTES = _limits.MAX_RESPONSE_BYTES
#: The health check after a dropped connection, in seconds.
HEALTH_CHECK_TIMEOUT = _limits.HEALTH_CHECK_TIMEOUT_MS / 1000
#: How long connecting may take at most (the call's own deadline may be shorter).
CONNECT_TIMEOUT = 30.0

_UNREACHABLE = {
    errno.ENOENT: "ENOENT",
    errno.ECONNREFUSED: "ECONNREFUSED",
    errno.EACCES: "EACCES",
    errno.EPERM: "EPERM",
    errno.EHOSTUNREACH: "EHOSTUNREACH",
    errno.ENETUNREACH: "ENETUNREACH",
    errno.ETIMEDOUT: "ETIMEDOUT",
    errno.ENOTSOCK: "ENOTSOCK",
}

QueryValue = Union[str, int, bool, None]


def path_of(template: str, *values: str) -> str:
    """Fills ``{}`` placeholders in a route with percent-encoded values (a value never adds a path segment)."""
    return template.format(*(quote(v, safe="") for v in values))


@dataclass
class Request:
    method: str
    path: str
    query: Optional[Mapping[str, QueryValue]] = None
    #: Sent as application/json.
    json: Any = None
    has_json: bool = False
    #: Sent as is, with ``content_type`` (default application/octet-stream).
    body: Optional[bytes] = None
    #: Sent chunked while the response is read (full duplex); never re-sent.
    body_stream: Optional[Iterable[bytes]] = None
    content_type: Optional[str] = None
    accept: str = "application/json"
    max_response_bytes: int = MAX_RESPONSE_BYTES
    #: Deadline of the whole exchange in seconds instead of ``request_timeout`` (0 = none).
    deadline: Optional[float] = None
    #: The option named when the deadline fires.
    deadline_setting: str = "request_timeout"
    #: How the request is named when its deadline fires.
    deadline_what: Optional[str] = None

    @property
    def described(self) -> str:
        return f"{self.method} {self.path}"


@dataclass
class Response:
    status: int
    headers: Dict[str, str]
    body: bytes = field(repr=False)


class CallScope:
    """One call's cancellation: the caller's token merged with named deadlines; shuts the call's socket down."""

    def __init__(self, cancel: Optional[CancelToken] = None) -> None:
        self._lock = threading.Lock()
        self._sockets: List[socket.socket] = []
        self._timers: List[threading.Timer] = []
        self.failure: Optional[ForkdError] = None
        self._unsubscribe: Callable[[], None] = lambda: None
        if cancel is not None:
            token = cancel
            self._unsubscribe = token._subscribe(lambda: self.fail(_cancelled(token)))

    def deadline(self, seconds: float, setting: str, what: str) -> Callable[[], None]:
        """Fails the call with a TimeoutError naming ``setting`` after ``seconds`` (0 = never); returns a canceller."""
        if seconds <= 0:
            return lambda: None
        error = TimeoutError(
            f"{what} did not finish within {setting}={seconds:g} s; pass a larger `{setting}` (0 disables it)",
            setting=setting,
        )
        timer = threading.Timer(seconds, self.fail, args=(error,))
        timer.daemon = True
        with self._lock:
            self._timers.append(timer)
        timer.start()
        return timer.cancel

    def fail(self, error: ForkdError) -> None:
        with self._lock:
            if self.failure is not None:
                return
            self.failure = error
            sockets = list(self._sockets)
        for sock in sockets:
            _shutdown(sock)

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            failed = self.failure is not None
        if failed:
            _shutdown(sock)

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def close(self) -> None:
        self._unsubscribe()
        with self._lock:
            timers, self._timers = self._timers, []
            self._sockets = []
        for timer in timers:
            timer.cancel()


def _cancelled(token: CancelToken) -> CancelledError:
    reason = token.reason
    return CancelledError("the call was cancelled" + ("" if reason is None else f": {reason}"), reason=reason)


def _cut_short(response: http.client.HTTPResponse) -> bool:
    """True if the body ended before its Content-Length (read1 then returns b'' instead of raising)."""
    remaining = response.length
    return isinstance(remaining, int) and remaining > 0


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _connection(settings: Settings, connect_timeout: float) -> http.client.HTTPConnection:
    address = settings.address
    if address.kind == "unix":
        assert address.socket_path is not None
        return _UnixHTTPConnection(address.socket_path, connect_timeout)
    assert address.host is not None
    if address.scheme == "https":
        context = settings.ssl_context or ssl.create_default_context()
        return http.client.HTTPSConnection(address.host, address.port, timeout=connect_timeout, context=context)
    return http.client.HTTPConnection(address.host, address.port, timeout=connect_timeout)


def _headers(settings: Settings, request: Request) -> Dict[str, str]:
    headers = {"User-Agent": f"forkd-python/{__version__}", "Accept": request.accept}
    if settings.token is not None:
        headers["Authorization"] = f"Bearer {settings.token}"
    headers.update(settings.headers)
    return headers


def _target(settings: Settings, request: Request) -> str:
    target = settings.address.base_path + request.path
    if request.query:
        pairs = [
            (k, ("true" if v else "false") if isinstance(v, bool) else str(v))
            for k, v in request.query.items()
            if v is not None
        ]
        if pairs:
            target += "?" + urlencode(pairs)
    return target


def _open(
    settings: Settings, request: Request, scope: CallScope
) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Sends the request and waits for the response's headers. The caller closes the connection."""
    scope.check()
    deadline = settings.request_timeout if request.deadline is None else request.deadline
    conn = _connection(settings, deadline if 0 < deadline < CONNECT_TIMEOUT else CONNECT_TIMEOUT)
    try:
        try:
            conn.connect()
        except (OSError, ssl.SSLError) as err:
            raise scope.failure or _connect_failure(settings, request, err) from err
        assert conn.sock is not None
        # From here deadlines and cancellation are the scope's (it shuts the socket down); a blocked read waits.
        conn.sock.settimeout(None)
        scope.attach(conn.sock)
        headers = _headers(settings, request)
        payload: Optional[bytes] = None
        if request.has_json:
            payload = json.dumps(request.json).encode("utf-8")
            headers["Content-Type"] = "application/json"
        elif request.body is not None:
            payload = request.body
            headers["Content-Type"] = request.content_type or "application/octet-stream"
        writer: Optional[threading.Thread] = None
        try:
            if request.body_stream is not None:
                headers["Content-Type"] = request.content_type or "application/octet-stream"
                headers["Transfer-Encoding"] = "chunked"
                conn.putrequest(request.method, _target(settings, request), skip_accept_encoding=True)
                for name, value in headers.items():
                    conn.putheader(name, value)
                conn.endheaders()
                writer = threading.Thread(
                    target=_write_chunks, args=(conn, request.body_stream), name="forkd-request-body", daemon=True
                )
                writer.start()
            else:
                conn.request(request.method, _target(settings, request), body=payload, headers=headers)
            response = conn.getresponse()
        except (OSError, http.client.HTTPException) as err:
            raise scope.failure or _dropped(settings, request, err) from err
        return conn, response
    except BaseException:
        conn.close()
        raise


def _write_chunks(conn: http.client.HTTPConnection, chunks: Iterable[bytes]) -> None:
    """Writes a chunked request body while the caller reads the response; stops quietly if the peer is gone."""
    try:
        for chunk in chunks:
            if chunk:
                conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        conn.send(b"0\r\n\r\n")
    except OSError:
        pass


def _read_body(
    response: http.client.HTTPResponse, limit: int, settings: Settings, request: Request, scope: CallScope
) -> bytes:
    parts: List[bytes] = []
    size = 0
    try:
        while True:
            chunk = response.read1(1 << 16)
            if not chunk:
                if _cut_short(response):
                    raise http.client.IncompleteRead(b"")
                break
            size += len(chunk)
            if size > limit:
                raise PayloadTooLargeError(
                    f"the answer to {request.described} is larger than {limit} bytes (pass a larger `max_bytes`)",
                    request=request.described,
                )
            parts.append(chunk)
    except (OSError, http.client.HTTPException) as err:
        raise scope.failure or _dropped(settings, request, err) from err
    scope.check()
    return b"".join(parts)


def _response_error(
    settings: Settings, request: Request, response: http.client.HTTPResponse, body: bytes
) -> ForkdError:
    return error_from_response(
        response.status,
        body,
        request=request.described,
        url=settings.address.display + request.path,
        retry_after=response.getheader("Retry-After"),
        token_source=None if settings.token is None else settings.token_source,
    )


def exchange(settings: Settings, request: Request, cancel: Optional[CancelToken] = None) -> Response:
    """Sends ``request`` and buffers the answer; a non-2xx answer raises the error class of its status family."""
    scope = CallScope(cancel)
    deadline = settings.request_timeout if request.deadline is None else request.deadline
    scope.deadline(deadline, request.deadline_setting, request.deadline_what or request.described)
    try:
        conn, response = _open(settings, request, scope)
        try:
            body = _read_body(response, request.max_response_bytes, settings, request, scope)
            if not 200 <= response.status <= 299:
                raise _response_error(settings, request, response, body)
            return Response(response.status, {k.lower(): v for k, v in response.getheaders()}, body)
        finally:
            conn.close()
    finally:
        scope.close()


class OpenStream:
    """A response whose headers arrived and whose body is read as it comes (NDJSON lines)."""

    def __init__(
        self,
        conn: http.client.HTTPConnection,
        response: http.client.HTTPResponse,
        scope: CallScope,
        settings: Settings,
        request: Request,
    ) -> None:
        self._conn = conn
        self._response = response
        self.scope = scope
        self._settings = settings
        self._request = request
        self._pending = b""
        self._eof = False

    def lines(self, max_line_bytes: int) -> Iterator[bytes]:
        """Yields each complete line (without its newline); a final unterminated line too."""
        while True:
            newline = self._pending.find(b"\n")
            while newline >= 0:
                line, self._pending = self._pending[:newline], self._pending[newline + 1 :]
                yield line
                newline = self._pending.find(b"\n")
            if self._eof:
                if self._pending:
                    line, self._pending = self._pending, b""
                    yield line
                return
            if len(self._pending) > max_line_bytes:
                raise ForkdError(
                    f"a line of the answer to {self._request.described} is longer than {max_line_bytes} bytes"
                )
            try:
                chunk = self._response.read1(1 << 16)
            except (OSError, http.client.HTTPException) as err:
                raise self.failure(err) from err
            if not chunk:
                self._eof = True
            self._pending += chunk

    def chunks(self) -> Iterator[bytes]:
        """The body's bytes as they arrive; raises if the connection drops before the end."""
        while True:
            try:
                chunk = self._response.read1(1 << 16)
            except (OSError, http.client.HTTPException) as err:
                raise self.failure(err) from err
            if not chunk:
                self.scope.check()
                if _cut_short(self._response):
                    raise self.failure(http.client.IncompleteRead(b""))
                return
            yield chunk

    def header(self, name: str) -> Optional[str]:
        return self._response.getheader(name)

    def failure(self, err: BaseException) -> ForkdError:
        """What to raise for a read that failed: the scope's reason (deadline, cancel) or a dropped connection."""
        return self.scope.failure or _dropped(self._settings, self._request, err)

    def close(self) -> None:
        """Closes the connection (for an exec stream: the daemon then kills the command in the guest)."""
        try:
            if self._conn.sock is not None:
                _shutdown(self._conn.sock)
        finally:
            self._conn.close()
            self.scope.close()


def open_stream(settings: Settings, request: Request, scope: CallScope) -> OpenStream:
    """Sends ``request`` and returns the open response once its headers arrived; non-2xx answers raise."""
    conn, response = _open(settings, request, scope)
    if not 200 <= response.status <= 299:
        try:
            body = _read_body(response, 64 * 1024, settings, request, scope)
        finally:
            conn.close()
        raise _response_error(settings, request, response, body)
    return OpenStream(conn, response, scope, settings, request)


def is_daemon_reachable(settings: Settings) -> bool:
    """GET /healthz with a short deadline: True if the daemon answers 200. Never raises."""
    try:
        exchange(settings, Request("GET", "/healthz", deadline=HEALTH_CHECK_TIMEOUT, deadline_setting="health check"))
        return True
    except ForkdError:
        return False


def _errno_name(err: BaseException) -> Optional[str]:
    number = getattr(err, "errno", None)
    if isinstance(number, int):
        return errno.errorcode.get(number)
    return None


def _connect_failure(settings: Settings, request: Request, err: BaseException) -> ForkdError:
    if isinstance(err, ssl.SSLError):
        return ConnectionError(
            f"TLS with the daemon at {settings.address.display} failed ({err}); if it uses a private CA, pass "
            "ssl_context=ssl.create_default_context(cafile=...)",
            request=request.described,
            errno_name=None,
        )
    if isinstance(err, socket.gaierror):
        return ConnectionError(
            f"cannot resolve the host of {settings.address.display} (from {settings.address_source}); set "
            "FORKD_URL or the `url` argument to the daemon's address",
            request=request.described,
            daemon_reachable=False,
            errno_name="EAI_NONAME",
        )
    number = getattr(err, "errno", None)
    if isinstance(err, socket.timeout) or number in _UNREACHABLE:
        name = "ETIMEDOUT" if isinstance(err, socket.timeout) else _UNREACHABLE[number]  # type: ignore[index]
        return ConnectionError(
            f"{_unreachable_reason(settings, name)} ({request.described})",
            request=request.described,
            daemon_reachable=False,
            errno_name=name,
        )
    return _dropped(settings, request, err, probe=False)


def _dropped(settings: Settings, request: Request, err: BaseException, probe: bool = True) -> ForkdError:
    reachable = is_daemon_reachable(settings) if probe else None
    if reachable is None:
        state = "the daemon's state is unknown"
    elif reachable:
        state = "the daemon is still up (its /healthz answers), so the request itself was cut"
    else:
        state = f"the daemon at {settings.address.display} is unreachable now (stopped, crashed or restarting?)"
    detail = str(err) or type(err).__name__
    return ConnectionError(
        f"the connection to the daemon dropped during {request.described} ({detail}); {state}",
        request=request.described,
        daemon_reachable=reachable,
        errno_name=_errno_name(err),
    )


def _unreachable_reason(settings: Settings, name: str) -> str:
    address = settings.address
    source = f"from {settings.address_source}"
    change = "set FORKD_URL or the `url` argument to the daemon's address"
    if address.kind == "unix":
        path = address.socket_path
        if name == "ENOENT":
            return (
                f"no forkd daemon socket at {path} ({source}): is `forkd daemon` running? If it listens elsewhere, "
                f"{change}"
            )
        if name == "ECONNREFUSED":
            return (
                f"nothing accepts connections on {path} ({source}): the daemon that made it is gone; start "
                f"`forkd daemon` or {change}"
            )
        if name in ("EACCES", "EPERM"):
            return (
                f"permission denied on the daemon socket {path} ({source}): run as root or as a member of the "
                "socket's group"
            )
        return f"cannot connect to {path} ({source}): {name}; {change}"
    if name == "ECONNREFUSED":
        return f"nothing listens at {address.display} ({source}): is `forkd daemon --bind ...` running? Otherwise {change}"
    return f"cannot reach the daemon at {address.display} ({source}): {name}; {change}"
