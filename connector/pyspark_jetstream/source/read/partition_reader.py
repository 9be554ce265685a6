"""One consumer's read of a partition's sequence range: the thin I/O driver around the ADR-37 engine.

Per partition: an ephemeral AckNone consumer starting at the range's first
sequence (in memory, one replica, a short inactive threshold), one inbox
subscription receiving raw frames (nats_internals.raw_subscribe), and raw
``CONSUMER.MSG.NEXT`` pull requests whose size the :class:`PullEngine` decides.
Batches go to Spark's thread through a queue as raw lists; at most
:data:`~.consume_loop.MAX_BATCHES_AHEAD` wait there, and no pull is sent while they do, so
memory is bounded by ``batchSize`` and the consume buffer, never by the range.

:class:`PartitionReader` holds one read's state and its lifecycle (start, finish, fail, close, the
connection's events); what it does with that state is in one room per responsibility, each a class
it is made of: the consumer's creation and recreation (:mod:`.consumer`), the consume loop that
turns frames into rows (:mod:`.consume_loop`), and deciding that the read is complete
(:mod:`.completion`). :mod:`.partition` runs it from Spark's thread.
"""

from __future__ import annotations

import asyncio
import queue
import time
from typing import Any

from ...client import runtime
from ...client.jsapi import request
from ...client.nats_internals import events_of, raw_unsubscribe
from ...errors import PartitionReadError
from ...logs import get_logger
from ...options import SourceOptions
from ...protocol.pull_engine import PullEngine
from ..columns.rows import BatchBuilder
from ..plan.subject_split import SubjectKeep
from .completion import Completion
from .consume_loop import ConsumeLoop
from .consumer import ConsumerLifecycle
from .range_tracker import RangeTracker

log = get_logger("source")

DONE = object()
"""The item a reader puts on its queue after its last batch."""

OPEN_END = 2**63 - 1
"""The range's last sequence of a snapshot without an end (see ``PartitionReader.open_snapshot``)."""


class PartitionReader(ConsumerLifecycle, ConsumeLoop, Completion):
    """One consumer's read of ``first..last`` on the subjects ``filters`` (none: every subject)."""

    def __init__(self, opts: SourceOptions, stream: str, first: int, last: int | None, out: queue.Queue,
                 max_age: float = 0.0, last_per_subject: bool = False, filters: tuple[str, ...] = (),
                 from_earliest: bool = False, expected: tuple[str, ...] | None = None,
                 keep: SubjectKeep | None = None) -> None:
        self.opts = opts
        self.stream = stream
        self.first = first
        # A snapshot (startingOffsets=lastPerSubject, kv.view=latest): the last message of each subject up
        # to ``last``, from a last-per-subject consumer; a bucket's deleted and purged keys are left out.
        # Without ``last`` (an open snapshot), each subject's first delivery is its value: the consumer
        # delivers the last message of each subject as the server holds it when it is created, then what
        # comes after; a subject whose last message was replaced before delivery (history 1) comes with
        # its newer one later. The read ends once every subject listed for it was taken (``expected``), or
        # when nothing more is pending. So a key written while the read runs is read at a value it held
        # meanwhile, never dropped for being newer than a plan, and never read twice.
        self.open_snapshot = last is None
        self.expected: set[bytes] | None = None if expected is None else {e.encode() for e in expected}
        self.taken: set[bytes] = set()
        self.snapshot_resets = 0  # consumers recreated because listed subjects were not delivered
        last = OPEN_END if last is None else last
        self.last = last
        self.out = out
        self.filters = filters
        # Messages this consumer's filters match beyond what the partition reads: those of the subjects other
        # partitions own (a split by subject whose partition owns more groups than the server filters well),
        # or beyond the user's filters (which overlapped, so the consumer got a cover of them): subject_split.
        self.keep = keep
        self.from_earliest = from_earliest  # the start is whatever the stream holds: nothing below it is lost
        self.last_per_subject = last_per_subject
        # A snapshot with an end (a streaming query's first micro-batch): the consumer's set, then, should its
        # replica have held less than the range when it was created, every change after the set up to the end
        # (see ``_to_changes``). ``set_left``: deliveries of the set still to come (the consumer's num_pending
        # when created counts them); None once the read is a read of changes, or for other reads.
        self.set_left: int | None = None
        self.max_age = max_age
        self.builder = BatchBuilder(stream, include_markers=opts.include_markers, kv_bucket=opts.key_bucket,
                                    max_age=max_age, drop_removed_keys=last_per_subject and opts.bucket is not None,
                                    columns=opts.columns)
        self.engine = PullEngine(opts.consume, range_left=last - first + 1, now=time.monotonic())
        self.range = RangeTracker(first, last, time.monotonic())
        self._batch_size = opts.batch_size
        self.ahead = 0
        self.done = False
        self.resetting = False
        self.consumer: str | None = None
        self.nc: Any = None
        self.sub: Any = None
        self.watchdog: asyncio.Task | None = None
        self.tasks: set[asyncio.Task] = set()
        self.confirming = False  # a leader check of "nothing pending" is under way
        self.starting: Any = None  # the future of start(), kept by read_partition

    @property
    def last_sseq(self) -> int:
        """The last stream sequence taken: what every error message names."""
        return self.range.last_sseq

    @property
    def last_progress(self) -> float:
        return self.range.last_progress

    # ---------------------------------------------------------------- lifecycle

    def _track(self, coro: Any) -> asyncio.Task:
        """Run ``coro`` on the loop, keeping a reference until it ends; an exception fails the partition
        (nothing started here is fire-and-forget: a failed send must not vanish until a heartbeat)."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and self.nc is not None and self.nc.is_closed:
            self.on_closed(events_of(self.nc).close_cause())  # the close is the cause, whichever path saw it first
        elif exc is not None:
            self._fail(PartitionReadError(
                f"Reading stream '{self.stream}' sequences {self.first}..{self.last} failed after sequence "
                f"{self.last_sseq}: {type(exc).__name__}: {exc}"
            ))

    async def start(self) -> None:
        try:
            self.nc = await runtime.connection(self.opts.connection)
            events_of(self.nc).listeners.add(self)
            self.watchdog = self._track(self._watch())
        except Exception as exc:
            self._fail(exc)
            return
        await self._create_consumer_retrying(self.first)

    def _delete_consumer(self, name: str | None) -> None:
        if name is None or self.nc is None or self.nc.is_closed:
            return

        async def delete() -> None:
            try:
                await request(self.nc, f"CONSUMER.DELETE.{self.stream}.{name}", timeout=5,
                              prefix=self.opts.api_prefix)
            except Exception:  # it is ephemeral: the inactive threshold reaps it anyway
                log.debug("could not delete consumer %s", name)

        self._track(delete())

    async def close(self) -> None:
        """Release everything; safe to call more than once (also on early generator exit)."""
        self.done = True
        if self.watchdog is not None:
            self.watchdog.cancel()
        if self.nc is not None:
            events_of(self.nc).listeners.discard(self)
            if self.sub is not None:
                try:
                    await raw_unsubscribe(self.nc, self.sub)
                except Exception:
                    log.debug("unsubscribe failed", exc_info=True)
                self.sub = None
        self._delete_consumer(self.consumer)
        self.consumer = None

    def _finish(self) -> None:
        if self.done:
            return
        self.done = True
        if len(self.builder):
            self.out.put(self.builder.take())
        self.out.put(DONE)
        self._track(self.close())

    def _fail(self, exc: BaseException) -> None:
        if self.done:
            return
        self.done = True
        self.out.put(exc)
        self._track(self.close())

    # ---------------------------------------------------------------- connection events

    def on_disconnected(self) -> None:
        self.engine.on_disconnect()

    def on_closed(self, cause: str) -> None:
        self._fail(PartitionReadError(
            f"Reading stream '{self.stream}' sequences {self.first}..{self.last} failed after sequence "
            f"{self.last_sseq}: the NATS connection was closed ({cause})."
        ))

    def on_reconnected(self) -> None:
        """Recreate the consumer from the last delivered sequence + 1 (nats.go's ordered consumer does):
        deliveries lost with the old connection may include the range's last message, which a mere
        re-pull would wait for until ``consume.maxWait``."""
        self.engine.on_reconnect(time.monotonic())
        self.range.touch(time.monotonic())
        self._schedule_reset("reconnected; deliveries in flight may have been lost")
