"""The Spark-facing source: thin reader classes around planning (:mod:`.plan`) and reading (:mod:`.read`).

Driver side (one long-lived Python process per query): Spark asks the readers for offsets and
partitions; the offsets and read limits come from :mod:`.plan.offsets`, the stream's facts from
:mod:`.plan.stream_facts` over one cached connection, the partitions from :mod:`.plan.partitions`.
Executor side: :func:`read_planned` hands a partition to :func:`.read.partition.read_partition`,
which yields Arrow batches.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader

from ..client import jsapi, runtime
from ..errors import OptionError
from ..logs import get_logger
from ..options import SourceOptions
from ..spark_api import (
    AVAILABLE_NOW_BASES,
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    require_admission_control,
)
from .plan.offsets import (
    SNAPSHOT,
    SNAPSHOT_NEXT,
    SPLIT_SUBJECT,
    StreamBounds,
    end_seq,
    identity_change,
    keeps_subject_split,
    make_offset,
    offset_partitions,
    offset_seq,
    offset_split,
    recreated_between,
    restart_seq,
    waits_for_more,
)
from .plan.partitions import JetStreamPartition, check_recreated, plan_key_partitions, plan_partitions
from .plan.stream_facts import (
    check_filters,
    ending_seq,
    few_filtered,
    require_server,
    split_depth,
    starting_seq,
    stream_bounds,
    with_origin,
)
from .plan.subject_split import ALL

log = get_logger("source")



def read_planned(opts: SourceOptions, partition: JetStreamPartition) -> Iterator[Any]:
    from .read.partition import read_partition

    if not isinstance(partition, JetStreamPartition):
        return  # Spark reads one default partition when a batch plan has none: an empty range
    yield from read_partition(opts, partition.stream, partition.first, partition.last, created=partition.created,
                              max_age=partition.max_age, last_per_subject=partition.last_per_subject,
                              split=partition.split, index=partition.index, from_earliest=partition.from_earliest,
                              count=partition.count, keys=partition.keys, up_to=partition.up_to)


class JetStreamBatchReader(DataSourceReader):
    """``spark.read``: from ``startingOffsets`` to ``endingOffsets``.

    An explicit end (``endingOffsets``, ``endingTimestamp``) is fixed here. Without one, the end is
    left to the tasks, so that every run of the same DataFrame (or of a view or table over it: Spark
    plans a Python source's partitions once per DataFrame) reads the data as it is then: split by
    sequence, the ranges share out what the stream holds now and the last one reads on to the
    stream's end when its task runs; split by subject, each partition reads its subjects to the end."""

    _plan_at_once = True
    """Plan the partitions when the reader is made (a reader that takes pushed filters plans once it
    has them: :class:`~.pushdown_reader.JetStreamPushdownReader`)."""

    def __init__(self, opts: SourceOptions) -> None:
        if opts.starting.kind == "latest":
            raise OptionError("startingOffsets", "latest", "A batch read from 'latest' reads nothing (it starts "
                              "after the last message); use 'earliest', a sequence or 'startingTimestamp', or "
                              "spark.readStream for messages still to come.")
        self.opts = opts = with_origin(opts)
        self.bounds = bounds = stream_bounds(opts)
        check_filters(opts, bounds)
        self.start = starting_seq(opts, bounds)
        explicit_end = opts.ending_seq is not None or opts.ending_timestamp is not None
        self.snapshot = opts.starting.kind == "last_per_subject"
        end: int | None = None
        if explicit_end:
            end = min(ending_seq(opts, bounds), bounds.last_seq)
            if end < self.start and opts.ending_timestamp is not None:
                raise OptionError("endingTimestamp", opts.ending_timestamp.isoformat(),
                                  f"The last message stored by then (sequence {end}) is before where the read starts "
                                  f"(sequence {self.start + 1}, from '{_start_option(opts)}'): the end must be "
                                  "at or after the start.")
            end = max(end, self.start)
        self.end = end
        self._partitions: list[JetStreamPartition] | None = self._plan() if self._plan_at_once else None

    def _plan(self) -> list[JetStreamPartition]:
        opts = self.opts
        keys = opts.literal_keys
        if self.snapshot and keys is not None and self.bounds.allow_direct:
            # The latest view of literal keys (option 'keys'): batched direct gets, whatever the bucket holds.
            return plan_key_partitions(opts, keys, self.start, self.bounds, self.end)
        by_subject = opts.split == "subject" or self.snapshot
        depth = split_depth(opts, self.bounds, opts.num_partitions) if by_subject else False
        few = not by_subject and opts.num_partitions > 1 and few_filtered(opts, opts.batch_size)
        return plan_partitions(opts, self.start, self.end, self.bounds, depth=depth, snapshot=self.snapshot,
                                from_earliest=opts.starting.kind in ("earliest", "last_per_subject"),
                                ranges=1 if few else None)

    def partitions(self) -> list[JetStreamPartition]:
        if self._partitions is None:
            self._partitions = self._plan()
        return self._partitions

    def read(self, partition: JetStreamPartition) -> Iterator[Any]:
        return read_planned(self.opts, partition)


def _start_option(opts: SourceOptions) -> str:
    return "startingTimestamp" if opts.starting.kind == "timestamp" else "startingOffsets"


class JetStreamStreamReader(DataSourceStreamReader, *AVAILABLE_NOW_BASES):
    """``spark.readStream``: micro-batches over ``(start.seq, end.seq]``.

    From PySpark 4.2, Spark passes ``latestOffset`` the batch's start and read limit (admission
    control) and offers ``Trigger.AvailableNow``. PySpark 4.0 and 4.1 call ``latestOffset()`` with
    neither (on a new query, even before ``initialOffset``): the end is then the stream's last
    sequence, the read limits are refused when the query starts (``spark_api``), and what needs the
    start (a recreated stream, the first micro-batch of ``lastPerSubject``) is decided in
    :meth:`partitions`, which Spark gives both ends on every version."""

    def __init__(self, opts: SourceOptions) -> None:
        require_admission_control(opts.max_messages_per_trigger, opts.min_messages_per_trigger)
        if opts.bookmark_consumer is not None:
            require_server(opts, (2, 14), "bookmarkConsumer", opts.bookmark_consumer,
                            "the consumer reset API that moves the bookmark")
        self.opts = with_origin(opts)
        self._latest: StreamBounds | None = None
        self._planned: tuple[dict, StreamBounds] | None = None  # the last end offset planned, and its facts
        self._target: int | None = None
        self._last_batch = time.monotonic()  # when the last micro-batch was planned (maxTriggerDelay)

    def _offset(self, seq: int, bounds: StreamBounds) -> dict:
        return make_offset(self.opts.stream, seq, self.opts.num_partitions, bounds.created)

    def _end_offset(self, seq: int, bounds: StreamBounds, first: int, snapshot: bool = False) -> dict:
        """A micro-batch's end offset, with how it is split when it reads anything (``split=subject``,
        or a snapshot): recorded so that a replay splits it the same way."""
        end = self._offset(seq, bounds)
        if seq > first and (self.opts.split == "subject" or snapshot or self._kept_subject_split):
            end["split"] = SPLIT_SUBJECT
            end["depth"] = split_depth(self.opts, bounds, self.opts.num_partitions)
        return end

    def initialOffset(self) -> dict:
        bounds = stream_bounds(self.opts)
        check_filters(self.opts, bounds)
        offset = self._offset(starting_seq(self.opts, bounds), bounds)
        if self.opts.starting.kind == "last_per_subject":
            offset[SNAPSHOT_NEXT] = True  # the first micro-batch is the last message per subject
        return offset

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_messages_per_trigger
        return ReadMaxRows(n) if n is not None else ReadAllAvailable()

    _kept_subject_split = False
    """The query's checkpoint was written by a release whose default split was by subject, and the option
    'split' is not given: its micro-batches go on split by subject (:func:`keeps_subject_split`)."""

    def _keep_checkpoints_split(self, start: dict) -> None:
        if not self._kept_subject_split and keeps_subject_split(self.opts, start):
            self._kept_subject_split = True
            log.warning(
                "stream %s: this query's checkpoint was written with the read split by subject (the default of "
                "releases before 0.2.0), so it goes on reading that way and the job keeps running unchanged. To "
                "move to the faster sequence split (each message delivered once), add `.repartition(n, \"subject\")` "
                "(for a bucket, \"key\") before the write and set the source option split='sequence' (CHANGELOG.md, "
                "'Upgrading to 0.2.0').", self.opts.stream)

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        if start is None:
            return self._latest_without_start()
        # Spark plans a micro-batch once the one before it is committed, and asks at every trigger, idle ones
        # included: ``start`` is committed, so the bookmark follows the query there (issue #56).
        self._bookmark_to(offset_seq(start, self.opts.stream) + 1)
        self._keep_checkpoints_split(start)
        bounds = stream_bounds(self.opts)
        self._latest = bounds
        first = offset_seq(start, self.opts.stream)
        reset = None
        if identity_change(start, bounds) is not None:
            reset = restart_seq(bounds)
            check_recreated(self.opts, start, bounds, f"Reading the new stream from sequence {reset + 1}")
            first = reset
            if self._target is not None:  # an AvailableNow target of the old stream means nothing in the new one
                self._target = bounds.last_seq
        latest = bounds.last_seq if self._target is None else min(bounds.last_seq, self._target)
        if start.get(SNAPSHOT_NEXT) and reset is None:
            # lastPerSubject: the first micro-batch is the snapshot up to the last sequence now, whatever
            # the read limits (a snapshot is not cut by sequences); its end offset says so for replays.
            end = self._end_offset(max(latest, first), bounds, first, snapshot=True)
            end[SNAPSHOT] = True
            self._planned = (end, bounds)
            return end
        if self._target is None and reset is None and self.opts.min_messages_per_trigger is not None:
            now = time.monotonic()
            if waits_for_more(latest - first, self.opts.min_messages_per_trigger, now - self._last_batch,
                              self.opts.max_trigger_delay):
                return start  # no new micro-batch yet (AvailableNow reads what is there)
            if latest > first:
                self._last_batch = now
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if reset is None and end_seq(first, latest, max_rows) <= first:
            return start  # nothing new: the same offset, so Spark plans no batch
        end = self._end_offset(end_seq(first, latest, max_rows), bounds, first)
        if reset is not None:
            end["reset"] = reset  # this batch reads (reset, end] of the new stream, on replays too
        self._planned = (end, bounds)
        return end

    def _latest_without_start(self) -> dict:
        """PySpark < 4.2: everything the stream holds now (Spark plans no batch when it equals the last
        end). The split is recorded as ``_end_offset`` does, so that a replay splits the same way."""
        bounds = stream_bounds(self.opts)
        self._latest = bounds
        planned = self._planned
        if planned is not None and planned[0]["seq"] == bounds.last_seq and planned[1].created == bounds.created:
            return planned[0]  # nothing new since the last poll: the same end, without listing subjects again
        end = self._end_offset(bounds.last_seq, bounds, -1)
        self._planned = (end, bounds)
        return end

    def reportLatestOffset(self) -> dict:
        """The stream's last sequence, for the progress's ``latestOffset`` (the lag); asked of the server when
        ``latestOffset`` has not run yet, so it is never reported as null by this reader. (A batch Spark
        replays from its log after a restart is reported without asking the source at all: null there.)"""
        if self._latest is None:
            self._latest = stream_bounds(self.opts)
        return self._offset(self._latest.last_seq, self._latest)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = stream_bounds(self.opts).last_seq

    def partitions(self, start: dict, end: dict) -> list[JetStreamPartition]:
        s, e = offset_seq(start, self.opts.stream), offset_seq(end, self.opts.stream)
        if "reset" in end:
            s = int(end["reset"])  # the batch that follows a recreation of the stream
        # Planned without the start (PySpark < 4.2): the stream may have been recreated since the last batch.
        recreated = "reset" not in end and recreated_between(start, end)
        if e <= s and not recreated:
            return []
        # One STREAM.INFO per micro-batch: the facts latestOffset just fetched to plan this very end
        # offset serve here too; a batch planned before a restart (a replay) asks the server again.
        planned = self._planned
        bounds = planned[1] if planned is not None and planned[0] == end else stream_bounds(self.opts)
        if identity_change(end, bounds) is not None:
            # Planned (and logged) against a stream that has been recreated since: a replay after a crash.
            check_recreated(self.opts, end, bounds, "This micro-batch's range belonged to the old stream and is skipped")
            return []
        # A replayed batch is split as its first attempt was: the count and the grouping are in the logged offset.
        by_subject, depth = offset_split(end)
        self._keep_checkpoints_split(start)
        if not by_subject and self._kept_subject_split and not end.get(SNAPSHOT):
            # Planned without the start (PySpark < 4.2, whose latestOffset does not see the checkpoint): the
            # split the checkpoint records, decided the same way on a replay (same start).
            by_subject, depth = True, split_depth(self.opts, bounds, offset_partitions(end, self.opts.num_partitions))
        snapshot = bool(end.get(SNAPSHOT))
        if recreated:
            s = restart_seq(bounds)
            check_recreated(self.opts, start, bounds, f"Reading the new stream from sequence {s + 1}")
            if e <= s:
                return []
        elif start.get(SNAPSHOT_NEXT) and not snapshot and "reset" not in end:
            # lastPerSubject's first micro-batch, planned without the start (PySpark < 4.2): the snapshot. Any
            # split reads each subject's last message once, so a replay may choose its own.
            snapshot = True
            if not by_subject:
                by_subject, depth = True, split_depth(self.opts, bounds, self.opts.num_partitions)
        elif snapshot and not by_subject:
            by_subject, depth = True, ALL  # a snapshot checkpointed before splits: one partition, as then
        return plan_partitions(self.opts, s, e, bounds, offset_partitions(end, self.opts.num_partitions),
                                depth=depth if by_subject else False, snapshot=snapshot)

    def read(self, partition: JetStreamPartition) -> Iterator[Any]:
        return read_planned(self.opts, partition)

    def commit(self, end: dict) -> None:
        self._committed = max(self._committed, offset_seq(end, self.opts.stream))
        self._bookmark_to(self._committed + 1)

    _committed = 0  # the highest end offset Spark has committed (commit, or a start latestOffset was given)
    _bookmarked = 0  # the sequence the bookmark consumer was last moved to

    def _bookmark_to(self, next_seq: int) -> None:
        """Move the bookmark consumer (option ``bookmarkConsumer``) to ``next_seq`` when it is ahead of where
        it was: ``nats consumer info`` then shows the query's lag, 0 once it has read everything."""
        name = self.opts.bookmark_consumer
        self._committed = max(self._committed, next_seq - 1)
        if name is None or next_seq <= self._bookmarked:
            return

        async def move() -> None:
            nc = await runtime.connection(self.opts.connection)
            await jsapi.move_bookmark(nc, self.opts.stream, name, next_seq, self.opts.filter_subjects,
                                      self.opts.api_prefix)

        try:
            runtime.run(move(), timeout=30)
            self._bookmarked = next_seq
        except Exception as exc:  # the bookmark is for monitoring only; the checkpoint is the truth
            log.warning("Could not move bookmark consumer %s to sequence %d: %s", name, next_seq, exc)

    def stop(self) -> None:
        """A clean stop: the bookmark at what Spark committed last."""
        self._bookmark_to(self._committed + 1)
