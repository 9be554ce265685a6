"""A connection's events, fanned out to the readers and publishers using it (public nats-py API only).

Kept apart from :mod:`.nats_internals` (which owns nats-py's private internals and re-exports these
names): ``ConnectionEvents`` reads only ``Client.last_error`` and ``Client.is_closed``, and is given
the ``-ERR`` lines :class:`~.nats_internals.FastFrames` takes off the wire.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

CLOSE_POLL = 0.25
"""Seconds between checks that a connection nats-py closed was reported (:meth:`ConnectionEvents.watch`)."""


@dataclass(frozen=True)
class PermissionViolation:
    """A server's ``Permissions Violation`` -ERR. ``exact``: ``text`` is as the server wrote it
    (taken from the wire by :class:`FastFrames`); else it is nats-py's lower-cased copy, the
    only one left when nats-py's own parser read the line."""

    text: str
    exact: bool

    def names(self, subject: str) -> bool:
        """Whether the violation is about ``subject``. Subjects are case-sensitive: one for
        ``"Orders.x"`` is not one for ``"orders.x"``; only a lower-cased text is matched without case."""
        if self.exact:
            return f'"{subject}"' in self.text
        return f'"{subject.lower()}"' in self.text


class ConnectionEvents:
    """Fan-out of a connection's events to the readers and publishers using it.

    Permission violations matter most: the server answers a refused publish with
    an asynchronous ``-ERR`` and nothing on the reply subject, so without this a
    refused write would only surface as a PubAck timeout.
    """

    def __init__(self) -> None:
        self.listeners: set[Any] = set()
        self.permission_errors: list[PermissionViolation] = []
        self._err_lines: list[str] = []  # -ERR texts as the server wrote them, not yet matched
        self.client: Any = None  # the connection, once it is up (for the cause of a close)
        self.closed_reported = False
        self.close_watcher: asyncio.Task | None = None

    def note_err_line(self, text: str) -> None:
        """An -ERR text as it came off the wire, before nats-py lower-cases it (:class:`FastFrames`)."""
        self._err_lines = self._err_lines[-99:] + [text]

    def _as_written(self, lowered: str) -> PermissionViolation:
        for k in range(len(self._err_lines) - 1, -1, -1):
            if self._err_lines[k].lower() == lowered:
                return PermissionViolation(self._err_lines.pop(k), exact=True)
        return PermissionViolation(lowered, exact=False)

    def on_error(self, exc: BaseException) -> None:
        text = str(exc)
        if "permissions violation" not in text.lower():
            return
        violation = self._as_written(text.removeprefix("nats: "))
        self.permission_errors = self.permission_errors[-99:] + [violation]
        for listener in list(self.listeners):
            handler = getattr(listener, "on_permission_error", None)
            if handler is not None:
                handler(violation)

    def permission_error_for(self, subject: str) -> str | None:
        """The last recorded violation that names ``subject`` (case-sensitive, see
        :meth:`PermissionViolation.names`), if any."""
        for violation in reversed(self.permission_errors):
            if violation.names(subject):
                return violation.text
        return None

    async def disconnected(self) -> None:
        for listener in list(self.listeners):
            if hasattr(listener, "on_disconnected"):
                listener.on_disconnected()

    async def reconnected(self) -> None:
        for listener in list(self.listeners):
            if hasattr(listener, "on_reconnected"):
                listener.on_reconnected()

    def close_cause(self) -> str:
        """Why the connection closed for good, as nats-py recorded it (a server -ERR, say)."""
        error = getattr(self.client, "last_error", None)
        if error is None:
            return "the connection was closed"
        return str(error).removeprefix("nats: ") or type(error).__name__

    async def closed(self) -> None:
        """nats-py gave the connection up (a server -ERR such as 'Maximum Payload Violation',
        or close()): nothing waiting on it can complete, so every listener fails at once."""
        if self.closed_reported:
            return
        self.closed_reported = True
        cause = self.close_cause()
        for listener in list(self.listeners):
            if hasattr(listener, "on_closed"):
                listener.on_closed(cause)

    def callbacks(self) -> dict[str, Callable[[], Awaitable[None]]]:
        return {"disconnected_cb": self.disconnected, "reconnected_cb": self.reconnected, "closed_cb": self.closed}

    def watch(self, client: Any) -> None:
        """Report the close of ``client`` even when nats-py's ``closed_cb`` never comes.

        nats-py marks the client CLOSED first and calls ``closed_cb`` last; in
        between it writes what is still buffered, and on a socket the server has
        already reset that write raises, ending the close task with the callbacks
        never called (seen with 'Maximum Payload Violation' under load). Readers
        and publishers would then wait for their own deadlines and blame the
        server. This watcher checks the status every :data:`CLOSE_POLL` seconds.
        """
        self.client = client

        async def watch() -> None:
            while not client.is_closed:
                await asyncio.sleep(CLOSE_POLL)
            await self.closed()

        self.close_watcher = asyncio.ensure_future(watch())
