"""A Spark task's read of one partition: its consumers one after the other, batches built on Spark's thread.

:func:`read_partition` is what an executor runs for a planned partition: it leaves a note for a
write in the same task (:mod:`~pyspark_jetstream.task_notes`), settles what the partition reads
(:mod:`.ownership`), then runs a :class:`~.partition_reader.PartitionReader` per consumer on the
loop thread (or, for a few keys of a bucket, batched direct gets: :mod:`.key_reader`) and yields
the Arrow batches it builds from their raw lists. Every wait has a deadline.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from typing import Any

from ... import task_notes
from ...client import runtime
from ...errors import PartitionReadError
from ...options import SourceOptions
from ..columns.rows import RawBatch
from ..plan.subject_split import SubjectKeep
from .ownership import listed_subjects, resolve
from .partition_reader import DONE, PartitionReader

WAIT_GRACE = 10.0
"""Seconds past ``consume.maxWait`` after which Spark's thread stops waiting for a
reader that neither delivered nor failed (a backstop: the reader's own watchdog
fails the partition at ``consume.maxWait``)."""


def build_batch(raw: RawBatch) -> Any:
    """The Arrow batch of ``raw``; a failure names the stream, the sequence and the cause.

    Building is total for everything a server delivers (see :mod:`..columns.rows`),
    so this is the last line of defence, not a code path anyone should meet.
    """
    try:
        return raw.build()
    except Exception as exc:
        seq = next((raw.seqs[i] for i in range(len(raw)) if not _builds(raw.row(i))), None)
        where = f"sequence {seq}" if seq is not None else f"sequences {raw.seqs[0]}..{raw.seqs[-1]}"
        raise PartitionReadError(
            f"Reading stream '{raw.stream}' failed at {where}: the message cannot be turned into a row "
            f"({type(exc).__name__}: {exc})."
        ) from None


def _builds(raw: RawBatch) -> bool:
    try:
        raw.build()
        return True
    except Exception:
        return False


def read_partition(opts: SourceOptions, stream: str, first: int, last: int | None,
                   created: str | None = None, max_age: float = 0.0, last_per_subject: bool = False,
                   split: tuple[int | None, int] | None = None, index: int = 0,
                   from_earliest: bool = False, count: int = 1, keys: tuple[str, ...] | None = None,
                   up_to: int | None = None) -> Iterator[Any]:
    """Yield the partition's RecordBatches on Spark's thread while the loop thread reads: its
    consumers one after the other (a split by subject with more groups than one consumer's filters
    reads them in chunks; a subject is in one chunk, so its order holds). First, a note for a write
    in the same task (:mod:`~pyspark_jetstream.task_notes`): how this read was split (held until the read
    ends; a note that cannot be left fails the read, as the sink's order guard cannot decide without it). ``keys``: a
    snapshot of these literal subjects of a bucket, read by direct get (:mod:`.key_reader`) at sequence
    ``up_to``."""
    kind = "snapshot" if last_per_subject else "sequence" if split is None else "subject"
    held = task_notes.leave(task_notes.ReadNote(stream, kind, count, index))  # or fails: the guard fails closed
    try:
        yield from _read_partition(opts, stream, first, last, created, max_age, last_per_subject, split, index,
                                   from_earliest, keys, up_to)
    finally:
        held.release()


def _read_partition(opts: SourceOptions, stream: str, first: int, last: int | None, created: str | None,
                    max_age: float, last_per_subject: bool, split: tuple[int | None, int] | None, index: int,
                    from_earliest: bool, keys: tuple[str, ...] | None, up_to: int | None) -> Iterator[Any]:
    """:func:`read_partition` once its note is left."""
    if last is not None and last < first:
        return  # a range past the data (the read has as many partitions as it is split into)
    resolved = runtime.run(resolve(opts, stream, first, last, created, last_per_subject, split, index),
                           timeout=opts.max_wait + opts.connection.connect_timeout * 3 + 30)
    if resolved is None:
        return
    if keys is not None:
        from .key_reader import read_keys

        yield from read_keys(opts, stream, keys, max_age, up_to)
        return
    last, consumers = resolved
    if last is not None and last < first:
        return
    for filters, keep in consumers:
        expected = listed_subjects(filters) if last is None and last_per_subject else None
        yield from read_consumer(opts, stream, first, last, max_age, last_per_subject, filters, from_earliest,
                                  expected, keep)


def read_consumer(opts: SourceOptions, stream: str, first: int, last: int | None, max_age: float,
                  last_per_subject: bool, filters: tuple[str, ...], from_earliest: bool,
                  expected: tuple[str, ...] | None = None, keep: SubjectKeep | None = None) -> Iterator[Any]:
    """One consumer's batches. Every wait has a deadline: the reader fails itself after
    ``consume.maxWait`` without progress, and this thread gives up :data:`WAIT_GRACE` seconds later
    should the reader neither deliver nor fail."""
    out: queue.Queue = queue.Queue()
    reader = PartitionReader(opts, stream, first, last, out, max_age, last_per_subject, filters, from_earliest,
                             expected, keep)
    loop = runtime.loop()
    reader.starting = runtime.submit(reader.start())  # kept referenced: the loop holds its tasks weakly
    poll = min(5.0, opts.max_wait)
    last_item = time.monotonic()
    try:
        while True:
            try:
                item = out.get(timeout=poll)
            except queue.Empty:
                now = time.monotonic()
                limit = opts.max_wait + WAIT_GRACE
                if now - last_item > limit and now - reader.last_progress > limit:
                    raise reader.stalled_error("the reader neither delivered nor failed") from None
                continue
            last_item = time.monotonic()
            if item is DONE:
                return
            if isinstance(item, BaseException):
                raise item
            loop.call_soon_threadsafe(reader.batch_consumed)
            yield build_batch(item)
    finally:
        if not reader.done:
            runtime.run(reader.close(), timeout=30)
