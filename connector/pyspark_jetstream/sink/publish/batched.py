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

The task's encoder makes its frames whole for the task's first batch (:attr:`reply_form`: that batch's
head, the row's batch sequence and the append operation), so that nearly all go out as they are; any
other frame (a row after one skipped, a batch after a refusal, message 1 and the commit, whose
operations differ) is cut around its reply subject and made again for its batch.

The batch stays open from the task's first slice to :meth:`drain`, which commits it: a batch per slice
cost the server an idle round trip or two at every slice (the last PubAck awaited, then message 1
alone), 10 to 25% of a 2,048-row slice's time (docs/architecture.md, "Fast-ingest writes").
:meth:`publish` returns once at most ``maxPendingAcks`` rows of the batch are not known stored, so the
task encodes its next slice while this one is sent. A refused row ends its batch (``fail`` mode: nothing
after it is stored); it becomes an :class:`~.acks.AckFailure` as a per-row refusal would
(task/refusals.py settles it), and the rows after it, with the rows sent before it whose fate was not
told, go on in a new batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from ...client.fast_publisher import FastPublisher, Feed, TooManyBatches
from ...logs import get_logger
from ...protocol import fast_ingest as fi
from ...protocol.batch_frames import cut_frame
from ...protocol.subjects import subject_matches
from ..encode.frames import ReplyForm
from .acks import AckFailure
from .row_publisher import RowPublisher

_FRAME, _SUBJECT, _MSG_ID = itemgetter(1), itemgetter(2), itemgetter(4)  # of the OutFrame layout

CACHE = 4096
"""Subjects whose place (in the target stream or not) is remembered per task."""

log = get_logger("sink")
_said_busy: set[str] = set()


def reframed(frames: Sequence[tuple], reply: ReplyForm) -> list[tuple]:
    """``frames`` (OutFrame layout) made again with ``reply``: for the per-row publisher, whose PubAcks
    come to ``<inbox>.<position>``."""
    out = []
    for sent in frames:
        before, after, _ = cut_frame(sent[1])
        out.append((sent[0], b"".join((before, reply.of(sent[0]).encode(), after, b"\r\n")), *sent[2:]))
    return out


async def cancel_and_wait(job: asyncio.Task, every: float = 0.1) -> None:
    """Cancel ``job`` and wait for its end, cancelling again until it ends: on Python 3.10 and 3.11 an
    ``asyncio.wait_for`` inside it swallows a cancellation that lands as its inner future completes
    (cpython#86296, fixed in 3.12), and the batch would go on. ``asyncio.wait`` neither raises the job's
    error nor absorbs the caller's cancellation."""
    while not job.done():
        job.cancel()
        await asyncio.wait({job}, timeout=every)
    if not job.cancelled():
        job.exception()  # retrieved: the task failed for its own reason, which its caller already has


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


class BatchedPublisher(RowPublisher):
    """Publishes a task's slices in fast-ingest batches (module docstring). ``acked``: the per-row
    publisher, started; ``subjects``: the target stream's subjects (empty: every row is the target's)."""

    def __init__(self, nc: Any, acked: Any, *, subjects: Sequence[str] = (), ack_timeout: float = 30.0,
                 target: str = "the target stream", fast: FastPublisher | None = None) -> None:
        self.target = target
        self.acked = acked
        # ``fast``: one on another transport (the fault-schedule harness, tests/unit/fast_ingest_model.py).
        # The flow asked for fits the room: a flow ack (every ``flow`` rows at most) must come before the task's
        # unacknowledged rows fill ``maxPendingAcks``, or both wait for ever (maxPendingAcks 256 against the
        # server's 500 hung a write; issue #56's subscriber test).
        flow = max(1, min(fi.MAX_FLOW, acked.low_water))
        self._fast = fast if fast is not None else FastPublisher(nc, ack_timeout=ack_timeout, give_way=True,
                                                                 flow=min(500, flow))
        self.per_row = False  # the stream had no room for another batch: a PubAck per row from then on
        self._target = TargetSubjects(subjects) if subjects else None
        self._job: asyncio.Task | None = None
        self._feed = Feed()
        self._whole: Feed | None = None  # the feed whose first batch the encoder's frames are made for
        self._reply_form = acked.reply_form
        self.room = 2 * acked.low_water
        """Rows of the batch not known stored that :meth:`publish` leaves in flight (``maxPendingAcks``)."""
        self._failures: list[AckFailure] = []
        self._stored = 0  # rows the batches stored (duplicates the server dropped included)
        self._duplicates = 0  # of which known to be duplicates (FastIngestResult.duplicates)
        self._batches = 0
        self.resent = 0

    async def start(self) -> BatchedPublisher:
        await self._fast.start()
        self._reply_form = ReplyForm(self._fast.head_for_frames(), f".{fi.OP_APPEND}.{fi.SUFFIX}", 1)
        return self

    # ------------------------------------------------------------- what the task reads

    @property
    def reply_prefix(self) -> str:
        return self.acked.reply_prefix

    @property
    def reply_form(self) -> ReplyForm:
        """The reply subject the task's encoder makes frames with: the task's first batch's head, the
        row's batch sequence (its position + 1) and the append operation."""
        return self._reply_form

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
    def batches(self) -> int:
        return self._batches

    def moved_copy(self, sent: tuple) -> tuple:
        return self.acked.moved_copy(sent)  # a retry that moves rows publishes with a PubAck per row

    async def delete_stored(self, seqs: list[int]) -> int:
        return await self.acked.delete_stored(seqs)

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
        if self.per_row:
            await self._per_row(frames)
            return
        if self._target is not None:
            target = self._target  # asked once per distinct subject (a C-level set), then per row if one is out
            outside = [] if all(map(target.__contains__, set(map(_SUBJECT, frames)))) else \
                [sent for sent in frames if sent[2] not in target]
            if outside:
                frames = [sent for sent in frames if sent[2] in target]
                await self.acked.publish(reframed(outside, self.acked.reply_form))
        if not frames:
            return
        if self.per_row:  # fell back while the rows outside the target were sent
            await self._per_row(frames)
            return
        feed = self._open_feed()
        # Frames made for this feed's batch go as they are; any other is cut around its reply (cut_frame).
        whole = feed is self._whole and self._whole_frames(feed, frames)
        prepared = list(map(_FRAME, frames)) if whole else [cut_frame(sent[1]) for sent in frames]
        feed.add(prepared, list(map(_SUBJECT, frames)), list(map(_MSG_ID, frames)), frames)
        await self._wait_room(feed)

    def _whole_frames(self, feed: Feed, frames: list[tuple]) -> bool:
        """Whether ``frames`` go out as they are in ``feed``'s first batch: made with :attr:`reply_form`
        (the encoder makes a slice's frames alike, so its first and last say) for positions that are their
        feed positions (contiguous, from the feed's end), so that each reply names the row's batch
        sequence."""
        first, last, end = frames[0], frames[-1], feed.end
        if first[0] != end or last[0] != end + len(frames) - 1:
            return False
        form = self._reply_form
        return all(sent[1].startswith(f"HPUB {sent[2]} {form.of(sent[0])} ".encode()) for sent in (first, last))

    def _open_feed(self) -> Feed:
        """The feed of the batch under way, or a new one (the first rows, or rows after a drain)."""
        if self._job is not None and self._job.done():
            job, self._job = self._job, None
            job.result()  # raises what ended it
        if self._job is None:
            self._feed = Feed()
            if self._whole is None:
                self._whole = self._feed
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

    async def _per_row(self, frames: list[tuple]) -> None:
        """After the fall-back: the feed's rest handed over first (the job ending), then ``frames``."""
        job, self._job = self._job, None
        if job is not None:
            await job  # raises what ended it
        await self.acked.publish(reframed(frames, self.acked.reply_form))

    async def _fall_back(self, feed: Feed, position: int, target: str) -> None:
        """The stream has as many open batches as it allows (429/10211; nats-server's
        ``max_inflight_per_stream`` is 1,000 by default): the task's rows from ``position`` on, and every
        later one, go with a PubAck per row instead of waiting for room. Said once per stream and executor."""
        self.per_row = True
        feed.close()  # nothing more is added: publish() takes the per-row path from now on
        if target not in _said_busy:
            _said_busy.add(target)
            log.warning("JetStream sink: %s has as many open fast-ingest batches as it allows (429/10211); tasks "
                        "that find no room publish with a PubAck per row (raise the server's "
                        "jetstream.limits.batch.max_inflight_per_stream, or write with fewer tasks)", target)
        rest = feed.tags[position - feed.offset:]
        if rest:
            await self.acked.publish(reframed(rest, self.acked.reply_form))

    async def _run(self, feed: Feed) -> None:
        """``feed`` in batches: one, unless the server refuses a row (see the module docstring)."""
        start = 0
        while True:
            try:
                result = await self._fast.publish_feed(feed, start)
            except TooManyBatches as busy:
                self._stored += busy.stored
                self._duplicates += busy.duplicates
                await self._fall_back(feed, busy.position, self.target)
                return
            self._stored += result.stored
            self._duplicates += result.duplicates
            self._batches += result.batches
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
            await cancel_and_wait(job)
        await self._fast.abort()
        await self.acked.abort()

    async def close(self) -> None:
        job, self._job = self._job, None
        if job is not None:
            await cancel_and_wait(job)
        await self._fast.close()
        await self.acked.close()
