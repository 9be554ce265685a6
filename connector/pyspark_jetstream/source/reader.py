"""The Spark-facing source: thin reader classes around planning and the partition reader.

Driver side (one long-lived Python process per query): offsets and read limits
come from :mod:`planning`, stream facts from one cached connection. Executor
side: :func:`partition_reader.read_partition` yields Arrow batches.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from ..client import jsapi, runtime
from ..errors import DataLossError, JetStreamApiError, OptionError, StreamConfigError, StreamRecreatedError
from ..logs import get_logger
from ..options import SourceOptions
from ..protocol.subjects import intersect
from ..spark_api import (
    AVAILABLE_NOW_BASES,
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    require_admission_control,
)
from .planning import (
    SPLIT_SUBJECT,
    SeqRange,
    StreamBounds,
    end_seq,
    identity_change,
    initial_seq,
    last_seq_at_or_before,
    lost_range,
    make_offset,
    offset_partitions,
    offset_seq,
    offset_split,
    restart_seq,
    split_range,
    stores_other_subjects,
    waits_for_more,
)
from .subject_split import ALL, MAX_GROUPS, choose_depth, needs_listing

log = get_logger("source")
T = TypeVar("T")

SNAPSHOT_NEXT = "lastPerSubject"
"""In a start offset (``startingOffsets=lastPerSubject``): the next micro-batch is the snapshot."""
SNAPSHOT = "snapshot"
"""In an end offset: this micro-batch read the last message per subject of ``(start, end]``, not the
range; a replay reads the last message per subject up to the same end again."""


@dataclass(frozen=True)
class JetStreamPartition(InputPartition):
    """One Spark task's read: an inclusive sequence range (of the stream created at ``created``, when
    set: the partition checks that it still reads that stream).

    ``split`` is ``(depth, partitions)`` for a read split by subject (``source/subject_split.py``): the
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
    keys: tuple[str, ...] | None = None  # a snapshot of these literal subjects, read by direct get (pushdown)
    up_to: int | None = None  # with ``keys``: the sequence every chunk reads the keys at (the planned end)


def _ask_server(opts: SourceOptions, call: Callable[[], Coroutine[Any, Any, T]], what: str) -> T:
    """Run a driver-side API call, asking again while the failure is transient.

    A streaming query plans every micro-batch with a STREAM.INFO; a server restart
    or a leader election leaves that request unanswered (408) or without responders
    (503) for a few seconds. Failing the query there would force a restart from the
    checkpoint for what the partitions themselves ride through, so the driver keeps
    asking with backoff, for at most ``consume.maxWait``, like a partition does.
    """
    deadline = time.monotonic() + opts.max_wait
    delays = jsapi.retry_delays()
    while True:
        try:
            return runtime.run(call(), timeout=opts.connection.connect_timeout * 3 + 30)
        except JetStreamApiError as exc:
            if not jsapi.is_transient(exc):
                raise
            delay = next(delays)
            if time.monotonic() + delay > deadline:
                raise JetStreamApiError(
                    exc.api, exc.code, exc.err_code,
                    f"{exc.description}; still failing after {opts.max_wait:g}s of retries (raise the option "
                    "'consume.maxWait' to wait longer for the server)",
                ) from None
            log.warning("%s failed (%s); asking again in %.2fs", what, exc, delay)
            time.sleep(delay)


def _bounds(opts: SourceOptions) -> StreamBounds:
    async def info() -> dict | None:
        nc = await runtime.connection(opts.connection)
        return await jsapi.stream_info(nc, opts.stream, opts.api_prefix)

    reply = _ask_server(opts, info, f"Stream info of '{opts.stream}'")
    if reply is None:
        what = f"KV bucket '{opts.bucket}' (stream {opts.stream})" if opts.bucket else f"Stream '{opts.stream}'"
        raise StreamConfigError(f"{what} does not exist. Check the option '{'bucket' if opts.bucket else 'stream'}'.")
    if str(reply["config"].get("retention", "limits")).lower() == "workqueue":
        raise StreamConfigError(
            f"Stream '{opts.stream}' has WorkQueue retention: a message is removed once it is acknowledged, so a "
            "reader would have to remove what it reads, and a replayed micro-batch or a retried task could not "
            f"read it again (no exactly-once, and the stream's own consumers would lose it). Mirror it into a "
            f"Limits stream and read the mirror, e.g. `nats stream add {opts.stream}_COPY --mirror {opts.stream}`."
        )
    state = reply["state"]
    return StreamBounds(first_seq=int(state.get("first_seq", 0)), last_seq=int(state.get("last_seq", 0)),
                        created=reply.get("created"), max_age=int(reply["config"].get("max_age") or 0) / 1e9,
                        num_subjects=int(state.get("num_subjects") or 0),
                        subjects=tuple(reply["config"].get("subjects") or ()),
                        stores_others=stores_other_subjects(reply["config"]),
                        allow_direct=bool(reply["config"].get("allow_direct")))


def _check_filters(opts: SourceOptions, bounds: StreamBounds) -> None:
    """Option ``subjects``: each filter must be able to match a subject the stream takes; one that
    cannot (a typo, a bare key on a bucket) would read nothing, and a streaming query nothing forever.
    A stream that stores subjects its config does not name (a mirror, one with sources or a subject
    transform: :func:`~.planning.stores_other_subjects`) is not checked, and a filter matching a message
    the stream still holds (of subjects it took before its config changed) is kept."""
    if not opts.subjects or not bounds.subjects or bounds.stores_others:
        return
    dead = [f for f in opts.subjects if not any(intersect(f, s) is not None for s in bounds.subjects)]
    if not dead:
        return

    async def held() -> bool:
        nc = await runtime.connection(opts.connection)
        return await jsapi.next_message(nc, opts.stream, 1, tuple(dead), opts.api_prefix) is not None

    if _ask_server(opts, held, "The lookup of messages on the option 'subjects'"):
        return
    what = f"KV bucket '{opts.bucket}'" if opts.bucket else f"stream '{opts.stream}'"
    hint = (f" A bucket's subjects are '$KV.{opts.bucket}.<key>': filter keys as "
            f"'{', '.join(f'$KV.{opts.bucket}.{d}' for d in dead)}'." if opts.bucket else "")
    raise OptionError("subjects", ",".join(opts.subjects),
                      f"{', '.join(repr(d) for d in dead)} cannot match any subject of {what}, which takes "
                      f"{', '.join(bounds.subjects)}: nothing would be read.{hint}")


def _recreated(opts: SourceOptions, offset: dict, bounds: StreamBounds, going_on: str) -> None:
    """A stream recreated since ``offset`` was planned: fail, or warn and go on (``failOnDataLoss``)."""
    error = StreamRecreatedError(opts.stream, int(offset["seq"]), offset.get("created"), bounds.last_seq,
                                 bounds.created)
    if opts.fail_on_data_loss:
        raise error
    log.warning("%s %s (failOnDataLoss=false).", error, going_on)


def _ending_seq(opts: SourceOptions, bounds: StreamBounds) -> int:
    """The last sequence of a batch read: ``endingOffsets``, or per ``endingTimestamp`` the last
    message stored at or before that time (found as ``startingTimestamp``'s first one is). Times
    compare at Spark's precision, the microsecond: a message stored within the microsecond the
    option names (its ``timestamp`` column shows that microsecond) is read."""
    if opts.ending_timestamp is None:
        return bounds.last_seq if opts.ending_seq is None else opts.ending_seq
    after = opts.ending_timestamp + dt.timedelta(microseconds=1)

    async def lookup() -> int | None:
        nc = await runtime.connection(opts.connection)
        return await jsapi.first_seq_at_or_after(nc, opts.stream, after, opts.api_prefix)

    return last_seq_at_or_before(_ask_server(opts, lookup, "The end-time lookup"), bounds)


def _starting_seq(opts: SourceOptions, bounds: StreamBounds) -> int:
    start = opts.starting
    if start.kind == "timestamp":
        async def lookup() -> int | None:
            nc = await runtime.connection(opts.connection)
            return await jsapi.first_seq_at_or_after(nc, opts.stream, start.value, opts.api_prefix)

        return initial_seq("timestamp", bounds, timestamp_seq=_ask_server(opts, lookup, "The start-time lookup"))
    return initial_seq(start.kind, bounds, sequence=start.value)


def _split_depth(opts: SourceOptions, bounds: StreamBounds, partitions: int) -> int | None:
    """How a read split by subject groups its subjects (``subject_split.choose_depth``); the subjects
    are listed only when there are more than literal filters carry."""
    listed: list[str] = []
    if bounds.num_subjects > MAX_GROUPS and partitions > 1:
        # More subjects than one listing page: listing them all would cost the planning (and every
        # partition) time that grows with the stream's subjects. One partition reads them, in order.
        log.warning("stream %s: its %d subjects are more than a split by subject lists (%d); one partition reads "
                    "them all (a copy keeps its order through a shuffle instead: docs/source.md, 'Splits').",
                    opts.stream, bounds.num_subjects, MAX_GROUPS)
        return ALL
    if needs_listing(bounds.num_subjects, partitions):
        async def listing() -> list[str]:
            nc = await runtime.connection(opts.connection)
            return (await jsapi.stream_subjects(nc, opts.stream, opts.filter_subjects, opts.api_prefix))[1]

        listed = _ask_server(opts, listing, f"Listing the subjects of '{opts.stream}'")
    depth = choose_depth(len(listed) or bounds.num_subjects, partitions, listed)
    if depth == ALL and partitions > 1 and bounds.num_subjects > 1:
        log.warning("stream %s: its %d subjects cannot be grouped into consumer filters for %d partitions; one "
                    "partition reads them all to keep each subject's order (option split='sequence' reads in "
                    "parallel without that order).", opts.stream, bounds.num_subjects, partitions)
    return depth


def _check_loss(opts: SourceOptions, start: int, end: int, bounds: StreamBounds) -> int:
    """``start``, moved past sequences removed before they were read when ``failOnDataLoss`` allows."""
    lost = lost_range(start, end, bounds)
    if lost is None:
        return start
    error = DataLossError(opts.stream, lost[0], lost[1], bounds.first_seq)
    if opts.fail_on_data_loss:
        raise error
    log.warning("%s Going on from sequence %d (failOnDataLoss=false).", error, lost[1] + 1)
    return lost[1]


def _plan_partitions(opts: SourceOptions, start: int, end: int | None, bounds: StreamBounds,
                     num_partitions: int | None = None, *, depth: int | None | bool = False,
                     snapshot: bool = False, from_earliest: bool = False) -> list[JetStreamPartition]:
    """The partitions of ``(start, end]`` (``end=None``: up to the stream's end when each task runs).

    ``depth=False``: contiguous sequence ranges (with ``end=None``, the last one open); otherwise split
    by subject with that grouping: every partition reads ``(start, end]`` of the subjects it owns. A
    snapshot reads the last message of each subject (``last_per_subject``). Each partition checks the
    stream's identity when it runs."""
    parts = num_partitions or opts.num_partitions
    if not snapshot:
        start = _check_loss(opts, start, end if end is not None else max(bounds.last_seq, start), bounds)
    if end is not None and end <= start:
        return []
    if depth is False:
        # ``open_end``: the ranges split what the stream holds now, and the last one reads on to the
        # stream's last sequence when its task runs (every run of a batch read sees current data).
        ranges = split_range(start, max(end if end is not None else bounds.last_seq, start), parts)
        if not ranges:  # nothing yet: one open range, for the runs to come
            ranges = [SeqRange(0, start + 1, start)]
        # Only the first range starts where the stream does ("earliest"); the others start at a planned sequence.
        planned = [JetStreamPartition(opts.stream, r.index, r.first,
                                      None if end is None and r is ranges[-1] else r.last, bounds.created,
                                      bounds.max_age, from_earliest=from_earliest and r.index == 0, count=parts)
                   for r in ranges]
        # As many partitions as the read is split into, whatever the data: a write fed straight from the read
        # then sees the same split at one message as at a million (the order guard, sink/ordering.py, is a
        # property of the query, not of how much a batch holds). The ranges past the data are empty.
        after = (end if end is not None else max(bounds.last_seq, start)) + 1
        return planned + [JetStreamPartition(opts.stream, i, after, after - 1, bounds.created, bounds.max_age,
                                             count=parts) for i in range(len(planned), parts)]
    if depth == ALL:
        parts = 1  # one group: one partition, whatever the count
    return [JetStreamPartition(opts.stream, i, start + 1, end, bounds.created, bounds.max_age, snapshot,
                               (depth, parts), from_earliest, parts) for i in range(parts)]


def _read(opts: SourceOptions, partition: JetStreamPartition) -> Iterator[Any]:
    from .partition_reader import read_partition

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
        self.opts = opts
        self.bounds = bounds = _bounds(opts)
        _check_filters(opts, bounds)
        self.start = _starting_seq(opts, bounds)
        explicit_end = opts.ending_seq is not None or opts.ending_timestamp is not None
        self.snapshot = opts.starting.kind == "last_per_subject"
        end: int | None = None
        if explicit_end:
            end = min(_ending_seq(opts, bounds), bounds.last_seq)
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
        by_subject = opts.split == "subject" or self.snapshot
        depth = _split_depth(opts, self.bounds, opts.num_partitions) if by_subject else False
        return _plan_partitions(opts, self.start, self.end, self.bounds, depth=depth, snapshot=self.snapshot,
                                from_earliest=opts.starting.kind in ("earliest", "last_per_subject"))

    def partitions(self) -> list[JetStreamPartition]:
        if self._partitions is None:
            self._partitions = self._plan()
        return self._partitions

    def read(self, partition: JetStreamPartition) -> Iterator[Any]:
        return _read(self.opts, partition)


def _keeps_subject_split(opts: SourceOptions, start: dict) -> bool:
    """Whether a streaming query resumed from ``start`` (its checkpoint's last end offset) keeps reading split
    by subject: the offset records that split (releases before 0.2.0 split by subject by default, and
    their copies need no shuffle to keep each subject's order), and the user has not chosen a split.
    Without this, such a job would stop at its first micro-batch after the upgrade (a copy straight from
    a read split by sequence is refused)."""
    return not opts.split_given and opts.split != "subject" and start.get("split") == SPLIT_SUBJECT


def _require_server(opts: SourceOptions, needed: tuple[int, int], option: str, value: str, what: str) -> None:
    """Refuse, when the query starts, an option the connected nats-server is too old for."""
    async def version() -> tuple[int, int, int] | None:
        return jsapi.server_version(await runtime.connection(opts.connection))

    have = _ask_server(opts, version, "Connecting")
    if have is not None and have[:2] < needed:
        raise OptionError(option, value, f"It needs nats-server {needed[0]}.{needed[1]} or newer ({what}); the "
                                         f"server is {'.'.join(map(str, have))}. Upgrade the server, or remove the "
                                         "option.")


def _recreated_between(start: dict, end: dict) -> bool:
    """Whether ``start`` and ``end`` were planned against different streams of the same name."""
    before, after = start.get("created"), end.get("created")
    return before is not None and after is not None and before != after


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
            _require_server(opts, (2, 14), "bookmarkConsumer", opts.bookmark_consumer,
                            "the consumer reset API that moves the bookmark")
        self.opts = opts
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
            end["depth"] = _split_depth(self.opts, bounds, self.opts.num_partitions)
        return end

    def initialOffset(self) -> dict:
        bounds = _bounds(self.opts)
        _check_filters(self.opts, bounds)
        offset = self._offset(_starting_seq(self.opts, bounds), bounds)
        if self.opts.starting.kind == "last_per_subject":
            offset[SNAPSHOT_NEXT] = True  # the first micro-batch is the last message per subject
        return offset

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_messages_per_trigger
        return ReadMaxRows(n) if n is not None else ReadAllAvailable()

    _kept_subject_split = False
    """The query's checkpoint was written by a release whose default split was by subject, and the option
    'split' is not given: its micro-batches go on split by subject (:func:`_keeps_subject_split`)."""

    def _keep_checkpoints_split(self, start: dict) -> None:
        if not self._kept_subject_split and _keeps_subject_split(self.opts, start):
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
        self._keep_checkpoints_split(start)
        bounds = _bounds(self.opts)
        self._latest = bounds
        first = offset_seq(start, self.opts.stream)
        reset = None
        if identity_change(start, bounds) is not None:
            reset = restart_seq(bounds)
            _recreated(self.opts, start, bounds, f"Reading the new stream from sequence {reset + 1}")
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
        bounds = _bounds(self.opts)
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
            self._latest = _bounds(self.opts)
        return self._offset(self._latest.last_seq, self._latest)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = _bounds(self.opts).last_seq

    def partitions(self, start: dict, end: dict) -> list[JetStreamPartition]:
        s, e = offset_seq(start, self.opts.stream), offset_seq(end, self.opts.stream)
        if "reset" in end:
            s = int(end["reset"])  # the batch that follows a recreation of the stream
        # Planned without the start (PySpark < 4.2): the stream may have been recreated since the last batch.
        recreated = "reset" not in end and _recreated_between(start, end)
        if e <= s and not recreated:
            return []
        # One STREAM.INFO per micro-batch: the facts latestOffset just fetched to plan this very end
        # offset serve here too; a batch planned before a restart (a replay) asks the server again.
        planned = self._planned
        bounds = planned[1] if planned is not None and planned[0] == end else _bounds(self.opts)
        if identity_change(end, bounds) is not None:
            # Planned (and logged) against a stream that has been recreated since: a replay after a crash.
            _recreated(self.opts, end, bounds, "This micro-batch's range belonged to the old stream and is skipped")
            return []
        # A replayed batch is split as its first attempt was: the count and the grouping are in the logged offset.
        by_subject, depth = offset_split(end)
        self._keep_checkpoints_split(start)
        if not by_subject and self._kept_subject_split and not end.get(SNAPSHOT):
            # Planned without the start (PySpark < 4.2, whose latestOffset does not see the checkpoint): the
            # split the checkpoint records, decided the same way on a replay (same start).
            by_subject, depth = True, _split_depth(self.opts, bounds, offset_partitions(end, self.opts.num_partitions))
        snapshot = bool(end.get(SNAPSHOT))
        if recreated:
            s = restart_seq(bounds)
            _recreated(self.opts, start, bounds, f"Reading the new stream from sequence {s + 1}")
            if e <= s:
                return []
        elif start.get(SNAPSHOT_NEXT) and not snapshot and "reset" not in end:
            # lastPerSubject's first micro-batch, planned without the start (PySpark < 4.2): the snapshot. Any
            # split reads each subject's last message once, so a replay may choose its own.
            snapshot = True
            if not by_subject:
                by_subject, depth = True, _split_depth(self.opts, bounds, self.opts.num_partitions)
        elif snapshot and not by_subject:
            by_subject, depth = True, ALL  # a snapshot checkpointed before splits: one partition, as then
        return _plan_partitions(self.opts, s, e, bounds, offset_partitions(end, self.opts.num_partitions),
                                depth=depth if by_subject else False, snapshot=snapshot)

    def read(self, partition: JetStreamPartition) -> Iterator[Any]:
        return _read(self.opts, partition)

    def commit(self, end: dict) -> None:
        name = self.opts.bookmark_consumer
        if name is None:
            return
        next_seq = offset_seq(end, self.opts.stream) + 1

        async def move() -> None:
            nc = await runtime.connection(self.opts.connection)
            await jsapi.move_bookmark(nc, self.opts.stream, name, next_seq, self.opts.filter_subjects,
                                      self.opts.api_prefix)

        try:
            runtime.run(move(), timeout=30)
        except Exception as exc:  # the bookmark is for monitoring only; the checkpoint is the truth
            log.warning("Could not move bookmark consumer %s to sequence %d: %s", name, next_seq, exc)

    def stop(self) -> None:
        pass
