"""Cancellation: a token a caller may cancel from any thread while a call that took it is running."""

from __future__ import annotations

import threading
from typing import Any, Callable, List

__all__ = ["CancelToken"]


class CancelToken:
    """Cancels the calls it is passed to (``cancel=token``), from any thread.

    A cancelled call raises :class:`forkd.CancelledError` (with this token's ``reason``); a streamed command is
    disconnected, which makes the daemon kill the process in the guest. A token stays cancelled: calls given it
    afterwards fail at once.

    >>> token = CancelToken()
    >>> threading.Timer(5, token.cancel).start()          # give up after 5 s
    >>> sandbox.commands.run("sleep 60", cancel=token)    # raises CancelledError after ~5 s
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: List[Callable[[], None]] = []
        self._cancelled = False
        self._reason: Any = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def reason(self) -> Any:
        return self._reason

    def cancel(self, reason: Any = None) -> None:
        """Cancels every call using this token (idempotent; the first reason is kept)."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            self._reason = reason
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def _subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Runs ``callback`` on cancellation (at once if already cancelled); returns an unsubscribe function."""
        with self._lock:
            if not self._cancelled:
                self._callbacks.append(callback)

                def unsubscribe() -> None:
                    with self._lock:
                        if callback in self._callbacks:
                            self._callbacks.remove(callback)

                return unsubscribe
        callback()
        return lambda: None
