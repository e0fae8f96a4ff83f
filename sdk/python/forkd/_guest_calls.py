"""The :class:`~forkd.Controller`'s calls into a sandbox's guest: commands (buffered and streamed), Python, files."""

from __future__ import annotations

import base64
import json
from typing import Any, Dict, Iterable, Iterator, Mapping, Optional, Sequence, Union

from . import _limits
from ._controller_base import (
    ControllerBase,
    GUEST_WORK_GRACE,
    MAX_GUEST_TIMEOUT,
    Stdin,
    STDIN_FRAME_BYTES,
    StreamedStdin,
    _ms,
    _required,
    _sandbox,
)
from ._transport import CallScope, QueryValue, Request, open_stream
from .cancel import CancelToken
from .errors import InvalidArgumentError
from .exec_stream import ExecStream
from .settings import DEFAULT_COMMAND_TIMEOUT, check_duration

__all__ = ["GuestCalls"]


class GuestCalls(ControllerBase):
    """``/v1/sandboxes/:id/exec``, ``/exec/stream``, ``/eval`` and ``/files...``"""

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
        request = Request("POST", _sandbox(sandbox_id, "/eval"), json=body, has_json=True)
        if timeout is None:
            return self._object(request, request_timeout, cancel)
        return self._object(
            request, self._guest_work_deadline(timeout, request_timeout), cancel, deadline_setting="timeout_secs"
        )

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
        request = Request("GET", _sandbox(sandbox_id, "/files/list"), query={"path": _required(path, "path")})
        return self._object(request, request_timeout, cancel)

    def stat_file(
        self,
        sandbox_id: str,
        path: str,
        *,
        request_timeout: Optional[float] = None,
        cancel: Optional[CancelToken] = None,
    ) -> Dict[str, Any]:
        """``GET /v1/sandboxes/:id/files/stat``: FileInfo ``{"name", "type", "size", "mode", "mtime_ms", ...}``."""
        request = Request("GET", _sandbox(sandbox_id, "/files/stat"), query={"path": _required(path, "path")})
        return self._object(request, request_timeout, cancel)

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
