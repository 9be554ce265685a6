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
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ..client import jsapi, runtime
from ..errors import DataLossError, JetStreamApiError, StreamConfigError, StreamRecreatedError
from ..logs import get_logger
from ..options import SourceOptions
from .planning import (
    StreamBounds,
    end_seq,
    identity_change,
    initial_seq,
    last_seq_at_or_before,
    lost_range,
    make_offset,
    offset_partitions,
    offset_seq,
    restart_seq,
    split_range,
    waits_for_more,
)

log = get_logger("source")
T = TypeVar("T")

SNAPSHOT_NEXT = "lastPerSubject"
"""In a start offset (``startingOffsets=lastPerSubject``): the next micro-batch is the snapshot."""
SNAPSHOT = "snapshot"
"""In an end offset: this micro-batch read the last message per subject of ``(start, end]``, not the
range; a replay reads the last message per subject up to the same end again."""


@dataclass(frozen=True)
class JetStreamPartition(InputPartition):
    """One Spark task's inclusive sequence range (of the stream created at ``created``, when set:
    the partition checks that it still reads that stream)."""

    stream: str
    index: int
    first: int
    last: int
    created: str | None = None
    max_age: float = 0.0  # the stream's MaxAge (seconds) at planning, for expires_at
    last_per_subject: bool = False  # read the last message of each subject up to ``last`` (a snapshot)


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
                        created=reply.get("created"), max_age=int(reply["config"].get("max_age") or 0) / 1e9)


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


def _plan_partitions(opts: SourceOptions, start: int, end: int, bounds: StreamBounds,
                     num_partitions: int | None = None, check_identity: bool = False) -> list[JetStreamPartition]:
    lost = lost_range(start, end, bounds)
    if lost is not None:
        error = DataLossError(opts.stream, lost[0], lost[1], bounds.first_seq)
        if opts.fail_on_data_loss:
            raise error
        log.warning("%s Going on from sequence %d (failOnDataLoss=false).", error, lost[1] + 1)
        start = lost[1]
    created = bounds.created if check_identity else None
    return [JetStreamPartition(opts.stream, r.index, r.first, r.last, created, bounds.max_age)
            for r in split_range(start, end, num_partitions or opts.num_partitions)]


def _snapshot_partitions(opts: SourceOptions, start: int, end: int, bounds: StreamBounds,
                         check_identity: bool = False) -> list[JetStreamPartition]:
    """``lastPerSubject``: one partition reads the last message of every subject stored at or before ``end``
    (one consumer delivers that set in sequence order; splitting it would make every partition receive
    it all). A subject whose last message came after ``end`` is left to the next micro-batch, which
    reads it as a change."""
    if end <= start:
        return []
    created = bounds.created if check_identity else None
    return [JetStreamPartition(opts.stream, 0, start + 1, end, created, bounds.max_age, last_per_subject=True)]


def _read(opts: SourceOptions, partition: JetStreamPartition) -> Iterator[Any]:
    from .partition_reader import read_partition

    if not isinstance(partition, JetStreamPartition):
        return  # Spark reads one default partition when a batch plan has none: an empty range
    yield from read_partition(opts, partition.stream, partition.first, partition.last, created=partition.created,
                              max_age=partition.max_age, last_per_subject=partition.last_per_subject)


class JetStreamBatchReader(DataSourceReader):
    """``spark.read``: one fixed range, from ``startingOffsets`` to ``endingOffsets``."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        bounds = _bounds(opts)
        self.start = _starting_seq(opts, bounds)
        last = min(_ending_seq(opts, bounds), bounds.last_seq)
        self.end = max(last, self.start)
        # Each partition checks that the stream was not recreated between this plan and its read.
        if opts.starting.kind == "last_per_subject":
            self._partitions = _snapshot_partitions(opts, self.start, self.end, bounds, check_identity=True)
        else:
            self._partitions = _plan_partitions(opts, self.start, self.end, bounds, check_identity=True)

    def partitions(self) -> list[JetStreamPartition]:
        return self._partitions

    def read(self, partition: JetStreamPartition) -> Iterator[Any]:
        return _read(self.opts, partition)


class JetStreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: micro-batches over ``(start.seq, end.seq]``."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._latest: StreamBounds | None = None
        self._planned: tuple[dict, StreamBounds] | None = None  # the last end offset planned, and its facts
        self._target: int | None = None
        self._last_batch = time.monotonic()  # when the last micro-batch was planned (maxTriggerDelay)

    def _offset(self, seq: int, bounds: StreamBounds) -> dict:
        return make_offset(self.opts.stream, seq, self.opts.num_partitions, bounds.created)

    def initialOffset(self) -> dict:
        bounds = _bounds(self.opts)
        offset = self._offset(_starting_seq(self.opts, bounds), bounds)
        if self.opts.starting.kind == "last_per_subject":
            offset[SNAPSHOT_NEXT] = True  # the first micro-batch is the last message per subject
        return offset

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_messages_per_trigger
        return ReadMaxRows(n) if n is not None else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
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
            end = self._offset(max(latest, first), bounds)
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
        end = self._offset(end_seq(first, latest, max_rows), bounds)
        if reset is not None:
            end["reset"] = reset  # this batch reads (reset, end] of the new stream, on replays too
        self._planned = (end, bounds)
        return end

    def reportLatestOffset(self) -> dict | None:
        return None if self._latest is None else self._offset(self._latest.last_seq, self._latest)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = _bounds(self.opts).last_seq

    def partitions(self, start: dict, end: dict) -> list[JetStreamPartition]:
        s, e = offset_seq(start, self.opts.stream), offset_seq(end, self.opts.stream)
        if "reset" in end:
            s = int(end["reset"])  # the batch that follows a recreation of the stream
        if e <= s:
            return []
        # One STREAM.INFO per micro-batch: the facts latestOffset just fetched to plan this very end
        # offset serve here too; a batch planned before a restart (a replay) asks the server again.
        planned = self._planned
        bounds = planned[1] if planned is not None and planned[0] == end else _bounds(self.opts)
        if identity_change(end, bounds) is not None:
            # Planned (and logged) against a stream that has been recreated since: a replay after a crash.
            _recreated(self.opts, end, bounds, "This micro-batch's range belonged to the old stream and is skipped")
            return []
        if end.get(SNAPSHOT):
            return _snapshot_partitions(self.opts, s, e, bounds)
        # A replayed batch is split as its first attempt was: the count is in the logged offset.
        return _plan_partitions(self.opts, s, e, bounds, offset_partitions(end, self.opts.num_partitions))

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
