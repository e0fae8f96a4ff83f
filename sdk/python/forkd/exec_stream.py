"""The streamed exec answer (``POST /v1/sandboxes/:id/exec/stream``, NDJSON) as typed events.

Output chunks arrive as they happen, then one exit event. A ``{"type": "error"}`` line raises the error class of
its code; a stream that ends without an exit is a dropped connection.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Dict, Iterator, Literal, Optional, Type, Union

from . import _limits
from ._transport import OpenStream
from .errors import STATUS_OF_CODE, ForkdError, error_from_response

__all__ = ["OutputEvent", "ExitEvent", "ExecEvent", "ExecStream"]

#: One NDJSON line of the answer, at most (an output chunk is at most 64 KiB, base64 in JSON).
MAX_EVENT_LINE_BYTES = _limits.MAX_STREAM_RECORD_BYTES


@dataclass(frozen=True)
class OutputEvent:
    """A piece of the command's output, exactly the bytes it wrote."""

    type: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True)
class ExitEvent:
    """The command ended."""

    #: The exit status; 128+N when signal N killed the process.
    exit_code: int
    #: The signal that killed it (e.g. "SIGKILL"), or None.
    signal: Optional[str]
    #: It was killed because it ran past its timeout.
    timed_out: bool
    duration_ms: Optional[float]
    type: Literal["exit"] = "exit"


ExecEvent = Union[OutputEvent, ExitEvent]


class ExecStream:
    """Iterates a running command's events; closing it (or leaving its ``with`` block early) kills the command.

    >>> with controller.exec_stream(sandbox_id, ["ping", "-c", "3", "127.0.0.1"]) as events:
    ...     for event in events:
    ...         if event.type == "stdout":
    ...             sys.stdout.buffer.write(event.data)
    ...         elif event.type == "exit":
    ...             print("exit", event.exit_code)
    """

    def __init__(self, stream: OpenStream, what: str) -> None:
        self._stream = stream
        self._what = what
        self._lines = stream.lines(MAX_EVENT_LINE_BYTES)
        #: The exit event, once the command ended.
        self.exit: Optional[ExitEvent] = None
        self._closed = False

    def __iter__(self) -> Iterator[ExecEvent]:
        return self

    def __next__(self) -> ExecEvent:
        if self._closed:
            raise StopIteration
        try:
            for line in self._lines:
                if not line.strip():
                    continue
                event = self._decode(line)
                if event is None:
                    continue
                if isinstance(event, ExitEvent):
                    self.exit = event
                    self.close()
                return event
        except BaseException:
            self.close()
            raise
        self.close()
        if self.exit is None:
            raise self._stream.failure(EOFError(f"the stream of {self._what} ended before its exit"))
        raise StopIteration

    def close(self) -> None:
        """Disconnects; a command still running is killed by the daemon. Idempotent."""
        if not self._closed:
            self._closed = True
            self._stream.close()

    def __enter__(self) -> "ExecStream":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        self.close()

    def _decode(self, line: bytes) -> Optional[ExecEvent]:
        try:
            record: Any = json.loads(line)
        except ValueError:
            raise ForkdError(f"the exec stream of {self._what} carried a line that is not JSON: {line[:200]!r}")
        if not isinstance(record, dict):
            return None
        kind = record.get("type")
        if kind in ("stdout", "stderr"):
            data = record.get("data")
            if not isinstance(data, str):
                raise ForkdError(f"an output record of the exec stream carries no data: {str(record)[:200]}")
            return OutputEvent(type="stdout" if kind == "stdout" else "stderr", data=base64.b64decode(data))
        if kind == "exit":
            exit_code = record.get("exit_code")
            signal = record.get("signal")
            duration = record.get("duration_ms")
            return ExitEvent(
                exit_code=exit_code if isinstance(exit_code, int) else 255,
                signal=signal if isinstance(signal, str) else None,
                timed_out=record.get("timed_out") is True,
                duration_ms=float(duration) if isinstance(duration, (int, float)) else None,
            )
        if kind == "error":
            code = record.get("code") if isinstance(record.get("code"), str) else "internal"
            message = record.get("error") if isinstance(record.get("error"), str) else json.dumps(record)
            body: Dict[str, Any] = {"error": message, "code": code}
            raise error_from_response(
                STATUS_OF_CODE.get(str(code), 500),
                json.dumps(body).encode(),
                request=self._what,
                url=self._what,
            )
        return None  # "started", or a kind a newer daemon added
