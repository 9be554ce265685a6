"""The per-row publisher's window: the frames it has in flight and the events around them.

Three parts work on it: the :class:`~.publisher.Publisher` that sends, the PubAck loop of :mod:`.acks`
that settles, and the ordered recovery of :mod:`.recovery` that resends and moves. Each holds this
object and uses its fields, rather than reaching into the publisher's private state (issue #54).
"""

from __future__ import annotations

import asyncio
import time


class Window:
    """Frames in flight (``inflight``: reply token -> the frame, OutFrame layout), at most ``max_pending``;
    ``room`` is set once they are down to ``low_water``, ``done`` once none is left; ``first_503``: when each
    frame was first answered 503 (resent until ``ack_timeout`` in a cluster, ``retry_503``);
    ``send_error``: why sending failed, once it has; ``last_progress``: when a frame last left the window."""

    def __init__(self, max_pending: int, ack_timeout: float, retry_503: bool) -> None:
        self.max_pending = max_pending
        # Refill at half the window (like ADR-37's threshold); 0 for a window of 1. The task encodes in
        # slices of this size.
        self.low_water = max_pending // 2
        self.ack_timeout = ack_timeout
        self.retry_503 = retry_503  # 503 means "between leaders" only where there are leaders to elect
        self.inflight: dict[str, tuple] = {}
        self.first_503: dict[str, float] = {}
        self.room = asyncio.Event()
        self.room.set()
        self.done = asyncio.Event()
        self.done.set()
        self.send_error: BaseException | None = None
        self.last_progress = time.monotonic()
        self.prefix_len = 0  # of the reply subjects, ``<inbox>.``: a PubAck's token follows it

    def eased(self) -> None:
        """Frames left the window: progress; room once it is down to ``low_water``; done once it is empty."""
        self.last_progress = time.monotonic()
        left = len(self.inflight)
        if left <= self.low_water:
            self.room.set()
        if left == 0:
            self.done.set()
