"""A task's rows published in fast-ingest batches (option ``publish.mode``, issue #48).

:class:`BatchedPublisher` offers what a write task uses of
:class:`~pyspark_jetstream.sink.publish.publisher.Publisher` (``publish``, ``drain``, ``abort``,
``close``, ``reply_prefix``, ``low_water``, the counters and ``failures``), so that the task picks
one or the other. It is composed of two publishers:

- a :class:`~pyspark_jetstream.client.fast_publisher.FastPublisher` on the target stream: the task's
  rows go in one batch in ``fail`` mode (a :class:`~pyspark_jetstream.client.fast_publisher.Feed` the
  task's slices are added to), resent from the last flow ack after a gap, a leader change or an unknown
  batch, with the same ``Nats-Msg-Id`` s;
- the per-row :class:`Publisher` for dead letters (another stream) and for rows whose subject the
  target does not capture (the server refuses them as it would any, a batch would stop on them).

Frames come encoded as for the per-row path (reply ``<inbox>.<position>``); each is cut around its
reply subject once, and every batch names its own. The batch stays open from the task's first slice to
:meth:`drain`, which commits it: a batch per slice cost the server an idle round trip or two at every
slice (the last PubAck awaited, then message 1 alone), 10 to 25% of a 2,048-row slice's time
(docs/architecture.md, "Fast-ingest writes"). :meth:`publish` returns once at most ``maxPendingAcks``
rows of the batch are not known stored, so the task encodes its next slice while this one is sent. A
refused row ends its batch (``fail`` mode: nothing after it is stored); it becomes an
:class:`~.acks.AckFailure` as a per-row refusal would (task/refusals.py settles it), and the rows after
it, with the rows sent before it whose fate was not told, go on in a new batch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from ...client.fast_publisher import FastPublisher, Feed
from ...protocol.subjects import subject_matches
from .acks import AckFailure

CACHE = 4096
"""Subjects whose place (in the target stream or not) is remembered per task."""


def cut(frames: Sequence[tuple]) -> tuple[list[tuple[bytes, bytes, bytes]], list[str], list[str | None]]:
    """Each frame (``HPUB <subject> <reply> <hlen> <total>\\r\\n...``, the OutFrame layout) as
    ``(before the reply, after it, b"")`` for :meth:`FastPublisher.publish_prepared`; with its subject
    and message id. A subject and a reply hold no space, so two searches find the reply."""
    prepared, subjects, ids = [], [], []
    for sent in frames:
        frame = sent[1]
        start = frame.index(b" ", 5) + 1
        end = frame.index(b" ", start)
        prepared.append((frame[:start], frame[end:-2], b""))
        subjects.append(sent[2])
        ids.append(sent[4])
    return prepared, subjects, ids


class TargetSubjects:
    """Whether a subject is captured by the target stream (its subjects as checked at start)."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(patterns)
        self._known: dict[str, bool] = {}

    def __contains__(self, subject: str) -> bool:
        known = self._known.get(subject)
        if known is None:
            known = any(subject_matches(p, subject) for p in self.patterns)
            if len(self._known) >= CACHE:
                self._known.clear()
            self._known[subject] = known
        return known


class BatchedPublisher:
    """Publishes a task's slices in fast-ingest batches (module docstring). ``acked``: the per-row
    publisher, started; ``subjects``: the target stream's subjects (empty: every row is the target's)."""

    def __init__(self, nc: Any, acked: Any, *, subjects: Sequence[str] = (), ack_timeout: float = 30.0) -> None:
        self._nc = nc
        self.acked = acked
        self._fast = FastPublisher(nc, ack_timeout=ack_timeout)
        self._target = TargetSubjects(subjects) if subjects else None
        self._job: asyncio.Task | None = None
        self._feed = Feed()
        self.room = 2 * acked.low_water
        """Rows of the batch not known stored that :meth:`publish` leaves in flight (``maxPendingAcks``)."""
        self._failures: list[AckFailure] = []
        self._stored = 0  # rows the batches stored (duplicates the server dropped included)
        self._duplicates = 0  # of which known to be duplicates (FastIngestResult.duplicates)
        self.batches = 0
        self.resent = 0

    async def start(self) -> BatchedPublisher:
        await self._fast.start()
        return self

    # ------------------------------------------------------------- what the task reads

    @property
    def reply_prefix(self) -> str:
        return self.acked.reply_prefix

    @property
    def low_water(self) -> int:
        return self.acked.low_water

    @property
    def stored(self) -> int:
        return self._stored - self._duplicates + self.acked.stored

    @property
    def duplicates(self) -> int:
        return self._duplicates + self.acked.duplicates

    @property
    def dead_lettered(self) -> int:
        return self.acked.dead_lettered

    @property
    def reordered(self) -> int:
        return self.acked.reordered

    @property
    def left_out_of_order(self) -> int:
        return self.acked.left_out_of_order

    @property
    def moves_finished(self) -> int:
        """Moves a retry finished (publish/moves.py): only the per-row path moves rows; batches never do."""
        return self.acked.moves_finished

    @property
    def restored(self) -> int:
        return self.acked.restored

    @property
    def failures(self) -> list[AckFailure]:
        return self._failures + self.acked.failures

    @failures.setter
    def failures(self, value: list[AckFailure]) -> None:
        self._failures, self.acked.failures = list(value), []

    # ------------------------------------------------------------- publishing

    async def publish(self, frames: list[tuple], *, dead_letter: bool = False) -> None:
        """Add ``frames`` (OutFrame layout) to the task's batch, then wait until at most ``maxPendingAcks``
        of its rows are not known stored; dead letters and rows outside the target stream take the
        per-row publisher."""
        if dead_letter:
            await self.acked.publish(frames, dead_letter=True)
            return
        if self._target is not None:
            target = self._target
            outside = [sent for sent in frames if sent[2] not in target]
            if outside:
                frames = [sent for sent in frames if sent[2] in target]
                await self.acked.publish(outside)
        if not frames:
            return
        feed = self._open_feed()
        prepared, subjects, ids = cut(frames)
        feed.add(prepared, subjects, ids, frames)
        await self._wait_room(feed)

    def _open_feed(self) -> Feed:
        """The feed of the batch under way, or a new one (the first rows, or rows after a drain)."""
        if self._job is not None and self._job.done():
            job, self._job = self._job, None
            job.result()  # raises what ended it
        if self._job is None:
            self._feed = Feed()
            self._job = asyncio.ensure_future(self._run(self._feed))
        return self._feed

    async def _wait_room(self, feed: Feed) -> None:
        """Until at most ``room`` rows of ``feed`` are not known stored, or the batch ends (raising what
        ended it). The batch's own deadlines bound the wait."""
        fast, job = self._fast, self._job
        while feed.end - fast.stored_upto > self.room and not job.done():
            fast.progress.clear()
            waiter = asyncio.ensure_future(fast.progress.wait())
            try:
                await asyncio.wait((job, waiter), return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        if job.done():
            self._job = None
            job.result()

    async def _run(self, feed: Feed) -> None:
        """``feed`` in batches: one, unless the server refuses a row (see the module docstring)."""
        start = 0
        while True:
            result = await self._fast.publish_feed(feed, start)
            self._stored += result.stored
            self._duplicates += result.duplicates
            self.batches += result.batches
            self.resent += result.resent
            refused = result.refused
            if refused is None:
                return
            sent = feed.remove(refused.position)
            self._failures.append(AckFailure(sent[0], sent, refused.code, refused.err_code, refused.description,
                                             False))
            # Rows before it not told stored (no final PubAck came) go again: their ids drop any copy.
            start += result.stored

    async def drain(self) -> None:
        """Commit the task's batch and wait for its end, and for every per-row publish to have its PubAck."""
        job, self._job = self._job, None
        if job is not None:
            self._feed.close()
            await job  # raises what ended it
        await self.acked.drain()

    async def abort(self) -> None:
        job, self._job = self._job, None
        if job is not None:
            job.cancel()
            with contextlib.suppress(BaseException):
                await job
        await self._fast.close()
        await self.acked.abort()

    async def close(self) -> None:
        await self.abort()
