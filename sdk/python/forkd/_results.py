"""What the ``Sandbox`` calls return: a command's result, a cell's result and its error, a file's entry."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Optional

__all__ = ["CommandResult", "ExecutionError", "CodeResult", "EntryInfo"]


@dataclass
class CommandResult:
    """What a command did. ``exit_code`` is 128+N when signal N killed it."""

    exit_code: int
    stdout: str
    stderr: str
    signal: Optional[str] = None
    timed_out: bool = False


@dataclass
class ExecutionError:
    """A Python exception raised by ``run_code`` (field names as in E2B's code interpreter)."""

    #: Exception class, e.g. "ZeroDivisionError".
    name: str
    #: Its message.
    value: str
    traceback: str


@dataclass
class CodeResult:
    """``run_code``'s answer. Python errors do not raise: they are in ``error``; SDK and daemon errors raise."""

    #: ``repr()`` of the code's trailing expression, or None.
    result: Optional[str]
    stdout: str
    stderr: str
    error: Optional[ExecutionError]


@dataclass
class EntryInfo:
    """A file or directory in the sandbox."""

    name: str
    #: Absolute path in the sandbox.
    path: str
    type: str  # "file" | "dir" | "symlink" | "other"
    size: int
    #: Permission bits, e.g. 0o644.
    mode: int
    modified_time: Optional[datetime]
    symlink_target: Optional[str]
