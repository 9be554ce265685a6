"""The per-row publisher's window: the frames it has in flight and the events around them.

Three parts work on it: the :class:`~.publisher.Publisher` that sends, the PubAck loop of :mod:`.acks`
that settles, and the ordered recovery of :mod:`.recovery` that resends and moves. Each holds this
object and uses its fields, rather than reaching into the publisher's private state (issue #54).
"""

from __future__ import annotations

import asyncio
import time

from ...logs import get_logger

log = get_logger("sink")


def clock() -> float:
    """The clock the per-row publisher's waits are kept by: the running event loop's (``time.monotonic`` on a
    real loop; the fault-schedule harness runs it on virtual time), or ``time.monotonic`` outside a loop."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


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
        self.last_progress = clock()
        self.prefix_len = 0  # of the reply subjects, ``<inbox>.``: a PubAck's token follows it
        self.eases = 0  # how many times frames left the window (answers came)
        self._quiet: tuple[float, int] | None = None  # since when, and at which ease, answers stopped (said so)

    def quiet(self, why: str, target: str) -> None:
        """No answer (a 503 while a leader is elected, or silence): one WARNING per outage, not per resend."""
        if self._quiet is None:
            self._quiet = (clock(), self.eases)
            log.warning("JetStream sink: %s did not answer (%s); publishing again for up to %gs (option "
                        "'ackTimeout')", target, why, self.ack_timeout)

    def check_answers(self, target: str) -> None:
        """After :meth:`quiet`: one INFO once answers come again, with how long they took."""
        if self._quiet is not None and self.eases > self._quiet[1]:
            log.info("JetStream sink: %s answers again, after %.1fs", target, clock() - self._quiet[0])
            self._quiet = None

    def eased(self) -> None:
        """Frames left the window: progress; room once it is down to ``low_water``; done once it is empty."""
        self.last_progress = clock()
        self.eases += 1
        left = len(self.inflight)
        if left <= self.low_water:
            self.room.set()
        if left == 0:
            self.done.set()
