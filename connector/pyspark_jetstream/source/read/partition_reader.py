"""Reading one partition's sequence range: the thin I/O driver around the ADR-37 engine.

Per partition: an ephemeral AckNone consumer starting at the range's first
sequence (in memory, one replica, a short inactive threshold), one inbox
subscription receiving raw frames (nats_internals.raw_subscribe), and raw
``CONSUMER.MSG.NEXT`` pull requests whose size the :class:`PullEngine` decides.
Batches go to Spark's thread through a queue as raw lists; at most
:data:`MAX_BATCHES_AHEAD` wait there, and no pull is sent while they do, so
memory is bounded by ``batchSize`` and the consume buffer, never by the range.
Spark's thread builds the Arrow batch: nothing but list appends runs inside
nats-py's read loop, and a frame handler never raises into it (a message it
cannot take fails the partition, naming the stream and the sequence).

The partition ends when it delivered the range's last sequence, when the
consumer reports nothing pending (the range's tail may have been deleted), or
when it sees a sequence past the range. In a cluster the consumer (one replica)
may sit on a follower that is still catching up, whose pending count says
nothing of what the leader already holds: there, "nothing pending" before the
range's end is believed only once the stream's leader confirms that no
sequence of the rest of the range is left (``STREAM.MSG.GET`` is answered by
the leader); otherwise the partition keeps pulling while the replica catches up. A snapshot with an end (a
streaming ``lastPerSubject``'s first micro-batch) is held to its end the same way: its consumer's set is its
replica's, and a replica that held less than the range goes on with the changes after that set up to the end
(``_to_changes``; issue #33, item 5). Consumer-sequence gaps (messages lost
in flight), a deleted or vanished consumer and reconnects recreate the
consumer from the last delivered sequence + 1, as nats.go's ordered consumer
does; ``consume.maxWait`` without progress ends the partition with an error.
"""

from __future__ import annotations

import asyncio
import queue
import time
import uuid
from collections.abc import Iterator
from typing import Any

from ... import task_notes
from ...client import runtime
from ...client.jsapi import (
    ERR_MAXIMUM_CONSUMERS,
    is_transient,
    last_message_of_subject,
    next_message,
    request,
    retry_delays,
    stream_info,
    stream_subjects,
)
from ...client.nats_internals import events_of, is_clustered, raw_subscribe, raw_unsubscribe, send_raw
from ...errors import (
    DataLossError,
    JetStreamApiError,
    PartitionReadError,
    StreamConfigError,
    StreamRecreatedError,
)
from ...logs import get_logger
from ...options import SourceOptions
from ...protocol.ack_subject import fast_fields
from ...protocol.frames import pub_frame
from ...protocol.headers import PENDING_BYTES, PENDING_MESSAGES, parse_headers, parse_status
from ...protocol.pull_engine import Outcome, PullEngine
from ..columns.rows import BatchBuilder, RawBatch
from ..plan.subject_split import ALL, SubjectKeep, consumers_for, sequence_consumer
from .range_tracker import RangeTracker, Step

log = get_logger("source")

_GAP, _PAST_END, _TAKE, _TAKE_LAST, _TAKE_DRAINED, _TAKEN_BEFORE = (
    Step.GAP, Step.PAST_END, Step.TAKE, Step.TAKE_LAST, Step.TAKE_DRAINED, Step.TAKEN_BEFORE)
_monotonic = time.monotonic

MAX_BATCHES_AHEAD = 2
WAIT_GRACE = 10.0
"""Seconds past ``consume.maxWait`` after which Spark's thread stops waiting for a
reader that neither delivered nor failed (a backstop: the reader's own watchdog
fails the partition at ``consume.maxWait``)."""
_ACK_PREFIX = b"$JS.ACK."
_DONE = object()


def _int_header(headers: dict[str, list[str]], name: str) -> int | None:
    values = headers.get(name)
    try:
        return int(values[-1]) if values else None
    except ValueError:
        return None


MAX_SNAPSHOT_RESETS = 10
"""Consumers an open snapshot recreates for subjects the leader holds but no consumer delivered."""

OPEN_END = 2**63 - 1
"""The range's last sequence of a snapshot without an end (see ``PartitionReader.open_snapshot``)."""


class PartitionReader:
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
        self.builder = BatchBuilder(stream, include_markers=opts.include_markers, kv_bucket=opts.bucket,
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

    async def _create_consumer(self, start_seq: int) -> None:
        """A consumer from ``start_seq``, with a fresh inbox so that no frame of an
        earlier consumer (late messages, statuses of old pulls) can reach this one."""
        if self.sub is not None:
            old, self.sub = self.sub, None
            await raw_unsubscribe(self.nc, old)
        self.inbox = self.nc.new_inbox()
        sub = await raw_subscribe(self.nc, self.inbox, self._on_frame, self._on_frames)
        if self.done:  # closed while subscribing: close() did not see this subscription
            await raw_unsubscribe(self.nc, sub)
            return
        self.sub = sub
        name = f"sparkjs_{uuid.uuid4().hex[:20]}"
        config: dict[str, Any] = {
            "name": name,
            "deliver_policy": "by_start_sequence",
            "opt_start_seq": start_seq,
            "ack_policy": "none",
            "mem_storage": True,
            "num_replicas": 1,
            "inactive_threshold": int(max(2 * self.opts.consume.expires, 30) * 1e9),
        }
        filters = self.filters
        if self.last_per_subject:
            # The server delivers the last message of each subject in sequence order, then what follows;
            # it needs a filter. A recreated consumer delivers the set again: the tracker skips what was taken.
            del config["opt_start_seq"]
            config["deliver_policy"] = "last_per_subject"
            filters = filters or (">",)
        if filters:
            config["filter_subjects"] = list(filters)
        reply = await request(self.nc, f"CONSUMER.CREATE.{self.stream}.{name}",
                              {"stream_name": self.stream, "config": config}, prefix=self.opts.api_prefix)
        if self.done:  # closed while the consumer was being created: close() did not know its name
            self._delete_consumer(name)
            return
        self.consumer = name
        self.range.consumer_created()
        self.engine.reset_pending()
        self.pull_subject = f"{self.opts.api_prefix}.CONSUMER.MSG.NEXT.{self.stream}.{name}"
        if not self.last_per_subject and not self.from_earliest and self._lost_below_first_seq(start_seq, reply):
            return
        if self.last_per_subject and not self.open_snapshot:
            self.set_left = int(reply.get("num_pending", 0))
        if reply.get("num_pending", 0) == 0:
            self._nothing_pending()  # the range's tail was deleted or filtered, or a replica lags
        else:
            self._maybe_pull()

    def _lost_below_first_seq(self, start_seq: int, reply: dict[str, Any]) -> bool:
        """Apply ``failOnDataLoss`` when the server moved the new consumer past ``start_seq``.

        A consumer asked to start below the stream's first sequence starts at the
        first sequence without a word (``delivered.stream_seq`` is one below where it
        starts), so limits, MaxAge or a purge that removed the head of the range
        after planning would be skipped silently. Filtered-out sequences never move
        the start, so they are not reported. True when the partition ended here.
        """
        delivered = (reply.get("delivered") or {}).get("stream_seq")
        lost = self.range.lost_range(start_seq, None if delivered is None else int(delivered))
        if lost is None:
            return False
        _, lost_last, moved_to = lost
        error = DataLossError(self.stream, start_seq, lost_last, moved_to)
        if self.opts.fail_on_data_loss:
            self._fail(error)
            return True
        log.warning("%s Going on from sequence %d (failOnDataLoss=false).", error, lost_last + 1)
        skipped = self.range.skip_to(lost_last)
        if self.engine.range_left is not None:
            self.engine.range_left = max(self.engine.range_left - skipped, 0)
        if self.range.complete:
            self._finish()
            return True
        return False

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
        self.out.put(_DONE)
        self._track(self.close())

    def _fail(self, exc: BaseException) -> None:
        if self.done:
            return
        self.done = True
        self.out.put(exc)
        self._track(self.close())

    # ---------------------------------------------------------------- pulls

    def _maybe_pull(self) -> None:
        if self.done or self.resetting or self.ahead >= MAX_BATCHES_AHEAD or self.consumer is None:
            return
        request_ = self.engine.next_pull()
        if request_ is None:
            return
        self.engine.on_pull_sent(request_)
        body = request_.to_json()
        frame = pub_frame(self.pull_subject, self.inbox, body)
        self._track(send_raw(self.nc, frame))

    def batch_consumed(self) -> None:
        """Called (on the loop) when Spark's thread took a batch: room for more pulls."""
        self.ahead -= 1
        self._maybe_pull()

    def _emit(self) -> None:
        self.ahead += 1
        self.out.put(self.builder.take())

    # ---------------------------------------------------------------- frames

    def _on_frame(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """Called by nats-py's parser for a frame on the inbox: must never raise into it."""
        self._on_frames(((subject, reply, data, headers),))

    def _on_frames(self, frames: Any) -> None:
        """Called with the frames on the inbox that one socket read brought, in order (the fast frame
        path of nats_internals): must never raise into it.

        The hot path (the loop thread is the read's bottleneck): a message taken mid-range is
        appended and counted here, and the engine is told of those messages at once, before any
        other step and at the end; the next pull is decided once, after the run."""
        if self.done:
            return
        subject = reply = b""
        now = _monotonic()
        engine, tracker, builder, batch_size = self.engine, self.range, self.builder, self._batch_size
        bytes_mode = engine.config.bytes_mode
        snapshot = self.open_snapshot
        ranged = self.set_left is not None  # the whole run goes message by message: the builder may change
        keeps = self.keep.keeps if self.keep is not None else None
        count = size = advance = 0
        try:
            for subject, reply, data, headers in frames:
                if self.done:
                    break
                if not reply.startswith(_ACK_PREFIX):
                    if headers is not None:
                        engine.on_messages(count, size, advance, now)
                        count = size = advance = 0
                        self._on_status(headers)
                    continue
                sseq, dseq, ts, pending = fast_fields(reply)
                if self.resetting:
                    continue
                step, moved = tracker.on_message(sseq, dseq, pending, now)
                if snapshot and step is not _GAP:
                    engine.on_messages(count, size, advance, now)
                    count = size = advance = 0
                    self._on_snapshot_message(subject, reply, data, headers, sseq, ts, pending, moved, now)
                    continue
                if ranged and step is not _GAP:
                    engine.on_messages(count, size, advance, now)
                    count = size = advance = 0
                    self._on_set_message(step, moved, subject, reply, data, headers, sseq, dseq, ts, pending, now)
                    continue
                if step is _TAKE:
                    count += 1
                    advance += moved
                    if bytes_mode:
                        size += len(subject) + len(reply) + len(data) + (len(headers) if headers else 0)
                    if keeps is None or keeps(subject):
                        builder.add(subject, data, headers, sseq, ts)
                        if len(builder.seqs) >= batch_size:
                            self._emit()
                    continue
                engine.on_messages(count, size, advance, now)
                count = size = advance = 0
                self._on_step(step, moved, subject, reply, data, headers, sseq, dseq, ts, pending, now)
            engine.on_messages(count, size, advance, now)
            count = 0
            self._maybe_pull()
        except Exception as exc:  # one bad frame fails this partition, never the shared connection
            engine.on_messages(count, size, advance, now)
            log.debug("frame handler failed", exc_info=True)
            self._fail(PartitionReadError(
                f"Reading stream '{self.stream}' sequences {self.first}..{self.last} failed after sequence "
                f"{self.last_sseq}: a frame on subject {subject[:200]!r} with reply {reply[:200]!r} could not be "
                f"read ({type(exc).__name__}: {exc})."
            ))

    def _on_step(self, step: Any, advance: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None,
                 sseq: int, dseq: int, ts: int, pending: int, now: float) -> None:
        """A message whose step is not the common one (:meth:`_on_frames` took those)."""
        if step is _GAP:  # deliveries were lost (e.g. during a reconnect)
            self._schedule_reset(f"consumer sequence jumped from {self.range.last_dseq} to {dseq}")
            return
        if step is _PAST_END:
            self._finish()
            return
        self.engine.on_message(len(subject) + len(reply) + len(data) + (len(headers) if headers else 0), advance, now)
        if step is _TAKEN_BEFORE:
            if pending == 0:
                self._nothing_pending()
            return
        if self.keep is None or self.keep.keeps(subject):
            builder = self.builder
            builder.add(subject, data, headers, sseq, ts)
            if len(builder) >= self._batch_size:
                self._emit()
        if step is _TAKE_LAST:
            self._finish()
        elif step is _TAKE_DRAINED:
            self._nothing_pending()

    def _on_set_message(self, step: Any, advance: int, subject: bytes, reply: bytes, data: bytes,
                        headers: bytes | None, sseq: int, dseq: int, ts: int, pending: int, now: float) -> None:
        """A delivery of a snapshot with an end (see ``set_left``). The consumer delivers its set, the last
        message of each subject as its replica held them when it was created, in sequence order, then every
        message after that: past the end on a replica that held the range, so such a message ends the read.
        One inside the range means that the replica held less than the range (it was catching up): the read
        goes on as a read of changes up to the end."""
        if self.set_left:
            self.set_left -= 1
        elif self.set_left is not None and step is not _PAST_END and step is not _TAKEN_BEFORE:
            self._to_changes(f"its consumer delivered sequence {sseq} of the range after its set", sseq - advance)
        self._on_step(step, advance, subject, reply, data, headers, sseq, dseq, ts, pending, now)

    def _to_changes(self, why: str, after: int) -> None:
        """Read the rest of a snapshot's range as changes: the set delivered so far is the one of a replica that
        held the stream up to some sequence before the end; every message after it up to the end follows it,
        deletes and purges of a bucket's keys included (as a KV watch started there would deliver them), so a
        job that applies the rows in order ends with the stream's state at the end. A consumer recreated
        from here on (a gap, a reconnect) is an ordinary one from the next sequence."""
        if self.set_left is None:
            return
        log.warning("stream %s: the snapshot's consumer sits on a replica that held less of the stream than the "
                    "snapshot's range (..%d): its replica lags (%s). Its set ends at sequence %d; every change after it "
                    "up to the end is read too.", self.stream, self.last, why, after)
        self.set_left = None
        self.last_per_subject = False
        if len(self.builder):
            self._emit()  # built with the snapshot's rule: deleted keys left out
        self.builder = BatchBuilder(self.stream, include_markers=self.opts.include_markers, kv_bucket=self.opts.bucket,
                                    max_age=self.max_age, columns=self.opts.columns)

    def _on_snapshot_message(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None, sseq: int,
                             ts: int, pending: int, advance: int, now: float) -> None:
        """A delivery of an open snapshot's consumer (see ``open_snapshot``)."""
        if self.done:
            return
        self.engine.on_message(len(subject) + len(reply) + len(data) + (len(headers) if headers else 0), advance, now)
        if subject not in self.taken and (self.keep is None or self.keep.keeps(subject)):
            self.taken.add(subject)
            self.builder.add(subject, data, headers, sseq, ts)
            if len(self.builder) >= self._batch_size:
                self._emit()
            if self.expected is not None:
                self.expected.discard(subject)
        if self.expected is not None and not self.expected:
            self._finish()
        elif pending == 0:
            self._nothing_pending()

    async def _confirm_snapshot(self) -> None:
        """The subjects listed for this snapshot that were not delivered: those the leader no longer holds
        (a subject purged meanwhile) are not waited for; for the others the consumer is recreated, and
        the new one delivers their last messages (what was taken is skipped)."""
        assert self.expected is not None
        asked = sorted(self.expected)
        try:
            present = {s for s in asked
                       if await last_message_of_subject(self.nc, self.stream, s.decode(), self.opts.api_prefix)}
        finally:
            self.confirming = False
        if self.done:
            return
        self.expected.difference_update(set(asked) - present)
        if not self.expected:
            self._finish()
            return
        self.snapshot_resets += 1
        if self.snapshot_resets > MAX_SNAPSHOT_RESETS:
            missing = ", ".join(sorted(s.decode() for s in self.expected)[:5])
            self._fail(PartitionReadError(
                f"Reading the last message of each subject of stream '{self.stream}' failed: the server's "
                f"consumers reported nothing pending {MAX_SNAPSHOT_RESETS} times while it still holds {missing}"
                f"{' ...' if len(self.expected) > 5 else ''}. Check the stream's replicas (a lagging one?)."))
            return
        await asyncio.sleep(min(0.05 * (self.snapshot_resets - 1), 1.0))
        self._schedule_reset(f"{len(self.expected)} subjects listed for the snapshot were not delivered "
                             f"(the consumer reported nothing pending)")

    def _nothing_pending(self) -> None:
        """The consumer says nothing is pending before the range's end."""
        if self.open_snapshot and self.expected:
            # nats-server's pending count of a last-per-subject consumer can reach 0 one message early when
            # a subject's last message is replaced before it is delivered (seen under a writer): the
            # subjects still expected are confirmed with the leader, never dropped on that count alone.
            if not self.confirming:
                self.confirming = True
                self._track(self._confirm_snapshot())
            return
        # An open snapshot's set is the consumer's replica's, as a KV watch's is: there is no range to confirm.
        # One with an end is confirmed as a range is: its consumer's replica may hold less than the range.
        if self.range.complete or self.open_snapshot or not is_clustered(self.nc):
            self._finish()
            return
        if not self.confirming:
            self.confirming = True
            self._track(self._confirm_end())
        self._maybe_pull()

    async def _confirm_end(self) -> None:
        """Finish only if the stream's leader holds no sequence of the rest of the range."""
        after = self.last_sseq
        try:
            message = await next_message(self.nc, self.stream, after + 1, self.filters, self.opts.api_prefix)
        finally:
            self.confirming = False
        if self.done or self.last_sseq > after:
            return  # the partition moved on meanwhile
        if message is None or message.seq > self.last:
            self._finish()
            return
        if self.set_left is not None:
            self._to_changes(f"it reported nothing pending after sequence {after}, and the stream's leader holds "
                             f"sequence {message.seq}", after)
            self._maybe_pull()
            return
        log.warning("stream %s: the consumer's replica reports nothing pending after sequence %d, but the stream's "
                    "leader holds sequence %d of the range (..%d); waiting for the replica to catch up",
                    self.stream, after, message.seq, self.last)

    def _on_status(self, block: bytes) -> None:
        code, description = parse_status(block)
        headers = parse_headers(block)
        verdict = self.engine.on_status(
            code, description, _int_header(headers, PENDING_MESSAGES),
            _int_header(headers, PENDING_BYTES), time.monotonic(),
        )
        if verdict.outcome is Outcome.RECREATE:
            self._schedule_reset(f"the consumer is gone ({code} {description or 'no responders'})")
            return
        if verdict.outcome is Outcome.FAIL:
            self._fail(PartitionReadError(
                f"Reading stream '{self.stream}' sequences {self.first}..{self.last} failed: the server answered "
                f"the pull request with {code} {description}."
            ))
            return
        if verdict.outcome is Outcome.TOO_LARGE:
            self.resetting = True  # no more pulls or messages; the error follows the lookup below
            self._track(self._fail_too_large())
            return
        if verdict.outcome in (Outcome.WARN, Outcome.REPULL):
            log.warning("stream %s: pull request ended with %s %s", self.stream, code, description)
        self._maybe_pull()

    async def _fail_too_large(self) -> None:
        """Fail naming the message that no pull within ``consume.maxBytes`` can fetch."""
        budget = self.opts.consume.max_bytes
        what = f"the next message after sequence {self.last_sseq}"
        try:
            message = await next_message(self.nc, self.stream, self.last_sseq + 1, self.filters,
                                         self.opts.api_prefix)
            if message is not None:
                what = f"the message at sequence {message.seq} is {message.size} bytes (subject, headers and data)"
        except Exception as exc:  # the lookup only improves the message
            log.debug("looking up the oversized message failed: %s", exc)
        self._fail(PartitionReadError(
            f"Reading stream '{self.stream}' sequences {self.first}..{self.last} cannot go on: {what}, and the "
            f"server counts its ack subject too; that is more than option 'consume.maxBytes' ({budget} bytes) "
            "lets one pull request carry. Raise 'consume.maxBytes' above the message size."
        ))

    # ---------------------------------------------------------------- recovery

    def _schedule_reset(self, why: str) -> None:
        if self.resetting or self.done:
            return
        self.resetting = True
        old, self.consumer = self.consumer, None
        self._delete_consumer(old)
        log.warning("stream %s: recreating the partition's consumer from sequence %d: %s",
                    self.stream, self.last_sseq + 1, why)
        self._track(self._reset())

    async def _reset(self) -> None:
        await self._create_consumer_retrying(self.range.next_seq)

    async def _create_consumer_retrying(self, start_seq: int) -> None:
        """Create the consumer, asking again with backoff while the failure is
        transient (a clustered stream between leaders, a node gone), for at most
        ``consume.maxWait`` without progress."""
        delays = retry_delays()
        while not self.done:
            try:
                self.resetting = False
                await self._create_consumer(start_seq)
                return
            except Exception as exc:
                if isinstance(exc, JetStreamApiError) and exc.err_code == ERR_MAXIMUM_CONSUMERS:
                    self._fail(PartitionReadError(
                        f"Reading stream '{self.stream}' sequences {self.first}..{self.last} needs a consumer, and "
                        f"the stream's consumer limit (max_consumers) is reached: {exc.description}. Each partition "
                        "of a read holds one consumer while it reads: lower the option 'numPartitions', or raise "
                        "the stream's max_consumers."))
                    return
                if not is_transient(exc):
                    self._fail(exc)
                    return
                self.resetting = True
                if self.range.stalled(time.monotonic(), self.opts.max_wait):
                    self._fail(self.stalled_error(f"the consumer could not be created: {exc}"))
                    return
                log.warning("stream %s: creating the consumer from sequence %d failed (%s); retrying",
                            self.stream, start_seq, exc)
                await asyncio.sleep(next(delays))

    def stalled_error(self, why: str) -> PartitionReadError:
        return PartitionReadError(
            f"Reading stream '{self.stream}' sequences {self.first}..{self.last} made no progress for "
            f"{self.opts.max_wait:g}s after sequence {self.last_sseq} ({why}). Check the server; raise the "
            "option 'consume.maxWait' if it is only slow."
        )

    async def _watch(self) -> None:
        interval = min(0.5, self.opts.consume.idle_heartbeat / 2)
        while not self.done:
            await asyncio.sleep(interval)
            now = time.monotonic()
            if self.engine.heartbeat_missed(now):
                log.warning("stream %s: missed heartbeats; pulling again", self.stream)
                self._maybe_pull()
            if not self.resetting and self.ahead == 0 and self.range.stalled(now, self.opts.max_wait):
                self._fail(self.stalled_error("no message, heartbeat or status"))

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


async def _resolve(opts: SourceOptions, stream: str, first: int, last: int | None, created: str | None,
                   last_per_subject: bool, split: tuple[int | None, int] | None,
                   index: int) -> tuple[int | None, list[tuple[tuple[str, ...], SubjectKeep | None]]] | None:
    """What a partition settles when it runs, from one ``STREAM.INFO`` (with the subjects listed for a
    split by subject): that the stream is still the one planned, the end of a read without one (the
    stream's last sequence now; a snapshot's consumers decide their own), and the filter subjects of
    each consumer it runs. None when the partition has nothing to read (a recreated stream whose
    range is skipped, ``failOnDataLoss=false``): each with the :class:`~..plan.subject_split.SubjectKeep` that
    keeps its messages when the server does not filter them exactly (:func:`~..plan.subject_split.consumers_for`)."""
    depth, parts = split if split is not None else (ALL, 1)
    listing = split is not None and depth != ALL
    if not listing and created is None and (last is not None or last_per_subject):
        if split is None:
            return last, [sequence_consumer(opts.filter_subjects)]
        return last, consumers_for((), depth, parts, index, opts.filter_subjects, by_owner=not last_per_subject)
    nc = await runtime.connection(opts.connection)
    delays = retry_delays()
    deadline = time.monotonic() + opts.max_wait
    while True:
        try:
            if listing:
                info, subjects = await stream_subjects(nc, stream, opts.filter_subjects, opts.api_prefix)
            else:
                info, subjects = await stream_info(nc, stream, opts.api_prefix), []
            break
        except Exception as exc:
            delay = next(delays)
            if not is_transient(exc) or time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)
    where = f"sequences {first}..{last}" if last is not None else f"sequences from {first} on"
    if info is None:
        raise StreamConfigError(f"Stream '{stream}' was deleted after this read was planned ({where} were to be "
                                "read). Check the option 'stream'.")
    if created is not None and info.get("created") != created:
        error = StreamRecreatedError(stream, first - 1, created, int(info["state"]["last_seq"]), info.get("created"))
        if opts.fail_on_data_loss:
            raise error
        log.warning("%s %s of the old stream are skipped (failOnDataLoss=false).", error, where.capitalize())
        return None
    if last is None and not last_per_subject:
        last = int(info["state"].get("last_seq", 0))
    if split is None:
        return last, [sequence_consumer(opts.filter_subjects)]
    return last, consumers_for(subjects, depth, parts, index, opts.filter_subjects, by_owner=not last_per_subject)


def _literal(filters: tuple[str, ...]) -> tuple[str, ...] | None:
    """The subjects an open snapshot's consumer must deliver once each before it is complete: its filters,
    when they name subjects (a split by literal subject); None for wildcard filters."""
    return None if any("*" in f or ">" in f for f in filters) else filters


def read_partition(opts: SourceOptions, stream: str, first: int, last: int | None,
                   created: str | None = None, max_age: float = 0.0, last_per_subject: bool = False,
                   split: tuple[int | None, int] | None = None, index: int = 0,
                   from_earliest: bool = False, count: int = 1, keys: tuple[str, ...] | None = None,
                   up_to: int | None = None) -> Iterator[Any]:
    """Yield the partition's RecordBatches on Spark's thread while the loop thread reads: its
    consumers one after the other (a split by subject with more groups than one consumer's filters
    reads them in chunks; a subject is in one chunk, so its order holds). First, a note for a write
    in the same task (:mod:`~pyspark_jetstream.task_notes`): how this read was split. ``keys``: a
    snapshot of these literal subjects of a bucket, read by direct get (:mod:`.key_reader`) at sequence
    ``up_to``."""
    kind = "snapshot" if last_per_subject else "sequence" if split is None else "subject"
    task_notes.leave(task_notes.ReadNote(stream, kind, count, index))
    if last is not None and last < first:
        return  # a range past the data (the read has as many partitions as it is split into)
    resolved = runtime.run(_resolve(opts, stream, first, last, created, last_per_subject, split, index),
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
        expected = _literal(filters) if last is None and last_per_subject else None
        yield from _read_consumer(opts, stream, first, last, max_age, last_per_subject, filters, from_earliest,
                                  expected, keep)


def _read_consumer(opts: SourceOptions, stream: str, first: int, last: int | None, max_age: float,
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
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            loop.call_soon_threadsafe(reader.batch_consumed)
            yield build_batch(item)
    finally:
        if not reader.done:
            runtime.run(reader.close(), timeout=30)
