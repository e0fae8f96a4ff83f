"""forkd's Python SDK: a client of the forkd daemon (microVM sandboxes forked copy-on-write from warm snapshots).

- :class:`Sandbox`: one sandbox with E2B-style ergonomics (``Sandbox.create``, ``commands.run`` with line callbacks,
  ``run_code``, ``files``, ``branch``, ``kill``, ``with`` blocks).
- :class:`Controller`: the daemon's REST API as methods, with forkd v0.5's method names, arguments and return shapes
  (``from forkd import Controller`` code written for v0.5 runs unmodified).

Standard library only; talks to the daemon over its Unix socket (default) or TCP/TLS with a token
(``FORKD_URL``, ``FORKD_TOKEN``). Errors are :class:`ForkdError` subclasses. See docs/python-sdk.md.
"""

from ._version import __version__
from .cancel import CancelToken
from .controller import BranchMode, Controller
from .errors import (
    AuthenticationError,
    CancelledError,
    CommandExitError,
    ConflictError,
    ConnectionError,
    ControllerError,
    ForkdError,
    InvalidArgumentError,
    NotFoundError,
    NotImplementedError,
    PayloadTooLargeError,
    RateLimitError,
    SandboxNotFoundError,
    ServerError,
    TimeoutError,
    UnavailableError,
)
from .exec_stream import ExecEvent, ExecStream, ExitEvent, OutputEvent
from .network import NetworkRequest
from .sandbox import CodeResult, CommandResult, Commands, EntryInfo, ExecutionError, Files, Sandbox
from .settings import (
    DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_DAEMON_URL,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_SANDBOX_TIMEOUT,
    Settings,
)

__all__ = [
    "__version__",
    "AuthenticationError",
    "BranchMode",
    "CancelToken",
    "CancelledError",
    "CodeResult",
    "CommandExitError",
    "CommandResult",
    "Commands",
    "ConflictError",
    "ConnectionError",
    "Controller",
    "ControllerError",
    "DEFAULT_COMMAND_TIMEOUT",
    "DEFAULT_DAEMON_URL",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_SANDBOX_TIMEOUT",
    "EntryInfo",
    "ExecEvent",
    "ExecStream",
    "ExecutionError",
    "ExitEvent",
    "Files",
    "ForkdError",
    "InvalidArgumentError",
    "NetworkRequest",
    "NotFoundError",
    "NotImplementedError",
    "OutputEvent",
    "PayloadTooLargeError",
    "RateLimitError",
    "Sandbox",
    "SandboxNotFoundError",
    "ServerError",
    "Settings",
    "TimeoutError",
    "UnavailableError",
]
