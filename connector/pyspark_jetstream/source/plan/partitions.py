"""The partitions a read is cut into: sequence ranges, or groups of subjects, each a Spark task.

From the range a plan settled (:mod:`.offsets`) and the stream's facts (:mod:`.stream_facts`):
contiguous sequence ranges, padded to the read's partition count (a write fed straight from the
read sees the same split at one message as at a million), or every partition reading ``(start, end]``
of the subjects it owns (:mod:`.subject_split`). ``failOnDataLoss`` decides here what the driver does
when sequences were removed before they were read, or the stream was recreated since an offset was
planned. A :class:`JetStreamPartition` is what Spark pickles to the executor.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from ...errors import DataLossError, StreamRecreatedError
from ...logs import get_logger
from ...options import SourceOptions
from .offsets import SeqRange, StreamBounds, lost_range, split_range
from .subject_split import ALL

log = get_logger("source")


@dataclass(frozen=True)
class JetStreamPartition(InputPartition):
    """One Spark task's read: an inclusive sequence range (of the stream created at ``created``, when
    set: the partition checks that it still reads that stream).

    ``split`` is ``(depth, partitions)`` for a read split by subject (``source/plan/subject_split.py``): the
    task reads the subjects whose group it owns, listed when it runs; ``None`` for a sequence range
    read with the option ``subjects``' filters. ``last=None`` leaves the end to the task: the stream's
    last sequence when it runs (the last range of a batch read without an explicit end, so that
    every run reads current data), or, for a snapshot, the last message of each subject when its
    consumer is created."""

    stream: str
    index: int
    first: int
    last: int | None
    created: str | None = None
    max_age: float = 0.0  # the stream's MaxAge (seconds) at planning, for expires_at
    last_per_subject: bool = False  # read the last message of each subject up to ``last`` (a snapshot)
    split: tuple[int | None, int] | None = None
    from_earliest: bool = False  # the start is "whatever the stream holds": nothing below it is lost
    count: int = 1  # how many partitions the read has (the sink's order check: task_notes)
    keys: tuple[str, ...] | None = None  # a snapshot of these literal subjects, read by direct get (option 'keys')
    up_to: int | None = None  # with ``keys``: the sequence every chunk reads the keys at (the planned end)


def check_recreated(opts: SourceOptions, offset: dict, bounds: StreamBounds, going_on: str) -> None:
    """A stream recreated since ``offset`` was planned: fail, or warn and go on (``failOnDataLoss``)."""
    error = StreamRecreatedError(opts.stream, int(offset["seq"]), offset.get("created"), bounds.last_seq,
                                 bounds.created)
    if opts.fail_on_data_loss:
        raise error
    log.warning("%s %s (failOnDataLoss=false).", error, going_on)


def check_loss(opts: SourceOptions, start: int, end: int, bounds: StreamBounds) -> int:
    """``start``, moved past sequences removed before they were read when ``failOnDataLoss`` allows."""
    lost = lost_range(start, end, bounds)
    if lost is None:
        return start
    error = DataLossError(opts.stream, lost[0], lost[1], bounds.first_seq)
    if opts.fail_on_data_loss:
        raise error
    log.warning("%s Going on from sequence %d (failOnDataLoss=false).", error, lost[1] + 1)
    return lost[1]


def plan_partitions(opts: SourceOptions, start: int, end: int | None, bounds: StreamBounds,
                     num_partitions: int | None = None, *, depth: int | None | bool = False,
                     snapshot: bool = False, from_earliest: bool = False,
                     ranges: int | None = None) -> list[JetStreamPartition]:
    """The partitions of ``(start, end]`` (``end=None``: up to the stream's end when each task runs).

    ``depth=False``: contiguous sequence ranges (with ``end=None``, the last one open); otherwise split
    by subject with that grouping: every partition reads ``(start, end]`` of the subjects it owns. A
    snapshot reads the last message of each subject (``last_per_subject``). Each partition checks the
    stream's identity when it runs."""
    parts = num_partitions or opts.num_partitions
    if not snapshot:
        start = check_loss(opts, start, end if end is not None else max(bounds.last_seq, start), bounds)
    if end is not None and end <= start:
        return []
    if depth is False:
        # ``open_end``: the ranges split what the stream holds now, and the last one reads on to the
        # stream's last sequence when its task runs (every run of a batch read sees current data).
        cut = split_range(start, max(end if end is not None else bounds.last_seq, start), min(ranges or parts, parts))
        if not cut:  # nothing yet: one open range, for the runs to come
            cut = [SeqRange(0, start + 1, start)]
        # Only the first range starts where the stream does ("earliest"); the others start at a planned sequence.
        planned = [JetStreamPartition(opts.stream, r.index, r.first,
                                      None if end is None and r is cut[-1] else r.last, bounds.created,
                                      bounds.max_age, from_earliest=from_earliest and r.index == 0, count=parts)
                   for r in cut]
        # As many partitions as the read is split into, whatever the data: a write fed straight from the read
        # then sees the same split at one message as at a million (the order guard, sink/order/decide.py, is a
        # property of the query, not of how much a batch holds). The ranges past the data are empty.
        after = (end if end is not None else max(bounds.last_seq, start)) + 1
        return planned + [JetStreamPartition(opts.stream, i, after, after - 1, bounds.created, bounds.max_age,
                                             count=parts) for i in range(len(planned), parts)]
    if depth == ALL:
        parts = 1  # one group: one partition, whatever the count
    return [JetStreamPartition(opts.stream, i, start + 1, end, bounds.created, bounds.max_age, snapshot,
                               (depth, parts), from_earliest, parts) for i in range(parts)]


KEYS_PER_REQUEST = 1024
"""Keys a partition asks for in one batched direct get (``protocol.direct_get.MULTI_LAST_MAX``)."""


def plan_key_partitions(opts: SourceOptions, subjects: tuple[str, ...], start: int, bounds: StreamBounds,
                        end: int | None = None) -> list[JetStreamPartition]:
    """The latest view of literal ``subjects`` (a bucket's keys), read by batched direct gets: as many
    partitions as the keys fill requests of :data:`KEYS_PER_REQUEST`, at most the read's count.

    Without an ``end`` (a latest view takes none), each task reads its keys as they are when it runs:
    Spark plans a view's or DataFrame's partitions once and runs them for every later query, so a
    sequence fixed here would answer every later lookup with the value of the moment the view was
    made. (A task reading several requests' worth asks them all at one sequence: ``read_keys``.)"""
    chunks_wanted = max(1, min(opts.num_partitions, -(-len(subjects) // KEYS_PER_REQUEST)))
    per = -(-len(subjects) // chunks_wanted)
    chunks = [subjects[i:i + per] for i in range(0, len(subjects), per)]
    return [JetStreamPartition(opts.stream, i, start + 1, None, bounds.created, bounds.max_age, True, None, True,
                               len(chunks), keys=chunk, up_to=end)
            for i, chunk in enumerate(chunks)]
