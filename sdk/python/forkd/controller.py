"""Controller: the daemon's REST API as methods.

The method set, argument names and return shapes are forkd v0.5's Python ``Controller`` (``list_snapshots``,
``spawn_sandboxes``, ``branch_sandbox``, ``exec_command``, ``eval_code``, ``ping_sandbox``, ``kill_sandbox``, ...):
results are the wire's JSON documents as dicts (docs/api.md), so code written for v0.5 runs unmodified. Beyond
v0.5: snapshot info/diff/compact and delete with cascade/force, files, streamed exec, lifetimes, kill-many, per-call
timeouts and cancellation.

Every method takes the keyword-only per-call options ``request_timeout`` (seconds for this HTTP exchange, 0 = none)
and ``cancel`` (a :class:`~forkd.CancelToken`).
"""

from __future__ import annotations

from ._controller_base import (
    DEFAULT_SNAPSHOT_TIMEOUT,
    MAX_GUEST_TIMEOUT,
    BranchMode,
    Stdin,
    StreamedStdin,
)
from ._guest_calls import GuestCalls
from ._sandbox_calls import SandboxCalls
from ._snapshot_calls import SnapshotCalls

__all__ = ["Controller", "BranchMode", "DEFAULT_SNAPSHOT_TIMEOUT", "MAX_GUEST_TIMEOUT", "Stdin", "StreamedStdin"]


class Controller(SnapshotCalls, SandboxCalls, GuestCalls):
    """Client of the forkd daemon's REST API.

    Args:
        url: the daemon's address: ``unix:/path/to/forkd.sock``, ``http://host:port`` or ``https://host:port``.
            Default: ``$FORKD_URL``, then the daemon's Unix socket ``unix:/run/forkd/forkd.sock``.
        token: bearer token (a line of the daemon's ``--token-file``), needed over TCP. Default: ``$FORKD_TOKEN``.
        timeout: seconds one HTTP exchange may take (v0.5's name; 0 disables). Default 60.
        base_url: forkd v0.5's name for ``url``.
        headers: extra HTTP headers sent with every request.
        ssl_context: for an ``https://`` daemon with a private CA, e.g.
            ``ssl.create_default_context(cafile="ca.pem")``.
        env: where ``FORKD_URL``/``FORKD_TOKEN`` are read (default ``os.environ``).

    A bad setting raises :class:`~forkd.InvalidArgumentError` at once, naming where it came from.
    """
