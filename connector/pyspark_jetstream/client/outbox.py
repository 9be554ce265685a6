"""A publisher's frames on their way through nats-py's write buffer, taken back when the publisher fails."""

from __future__ import annotations

from typing import Any

from .nats_internals import discard_pending, send_raw, still_pending


class Outbox:
    """What one publisher hands to a connection (:func:`send_raw`), remembered until nats-py has written
    it. While the connection is down nats-py keeps such frames and writes them after the reconnect, long
    after a task that failed meanwhile: :meth:`take_back` drops them, so that a failed write sends
    nothing afterwards."""

    def __init__(self, nc: Any) -> None:
        self._nc = nc
        self._unwritten: list[bytes] = []

    async def send(self, buffer: bytes) -> None:
        if self._unwritten:
            self._unwritten = still_pending(self._nc, self._unwritten)
        self._unwritten.append(buffer)
        await send_raw(self._nc, buffer)

    def take_back(self) -> int:
        """Drop what nats-py still holds of this outbox's frames; how many were dropped."""
        unwritten, self._unwritten = self._unwritten, []
        if not unwritten or self._nc.is_closed:
            return 0
        return discard_pending(self._nc, unwritten)
