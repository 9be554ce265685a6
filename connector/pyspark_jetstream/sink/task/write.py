"""The Spark-facing sink: thin writer classes around :func:`write_partition`.

Everything decided once per query (options, input layout, stream checks, the
server's max_payload) is in :class:`SinkPlan`, made on the driver and pickled
to the executors. A task turns its Arrow batches into frames (:mod:`.encoder`),
publishes them through a :class:`~pyspark_jetstream.sink.publisher.Publisher` and
returns a :class:`SinkCommitMessage` with its counts, which the driver logs.

Exactly-once: each row without its own ``msg_id`` (null or empty) gets a
deterministic ``Nats-Msg-Id`` (:class:`~pyspark_jetstream.sink.encoder.MsgIds`):
derived from the row's source position and content when it carries a position
(``<run>:<stream>.<seq>:<digest>``), else from its task and position. A retried
task or a replayed micro-batch therefore publishes the same ids, and the server
drops the copies that arrive within the stream's duplicate window. Rows no
content tells apart, in different tasks, share an id: the server keeps one, and
the commit log line counts the others among the duplicates (never silently).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from ...client import jsapi, runtime
from ...errors import PublishError
from ...logs import get_logger
from ...protocol import headers as hdrs
from ...protocol import kv
from ...protocol.frames import hpub_frame
from ...protocol.headers import (
    DLQ_ERR_CODE,
    DLQ_ERROR,
    DLQ_ORIGINAL_SIZE,
    DLQ_ROW,
    DLQ_SUBJECT,
    DLQ_TRUNCATED,
    DLQ_TTL,
)
from ..encode.frames import OutFrame
from ..encode.msg_ids import MsgIds
from ..encode.rows import RowChoice, RowRejection
from ..plan.sink_plan import SinkPlan
from .commit import SinkCommitMessage, describe_target

log = get_logger("sink")

"""Headers of a dead-lettered row: why it was rejected and where it was going, and,
when the row did not fit the server's max_payload beside them, that its payload
was cut and how long it was."""

_DLQ_VALUE_MAX = 1024
"""Longest value of a dead-letter header the connector writes (a subject can be long)."""


def _escape(value: Any) -> str:
    text = str(value).replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= _DLQ_VALUE_MAX else text[:_DLQ_VALUE_MAX] + "..."


def dead_letter_frame(rejection: RowRejection, dlq_subject: str, reply: str, partition: int,
                      idempotent: bool, max_payload: int, original_headers: bytes = b"") -> bytes:
    """A dead-letter message: the row's data, its valid headers (none of NATS's ``Nats-*``), and headers
    naming the error: the reason with the column and value the connector refused (as PublishError
    names them), and the row's TTL as sent, or as given when it was the TTL that was refused.

    Its ``Nats-Msg-Id`` is the row's own id with ``:dlq`` appended, so a replay
    dead-letters a row once. It never exceeds ``max_payload`` (a larger frame makes
    nats-server close the connection): when it would, the row's own headers are
    left out first, then the payload is cut, and ``Spark-JetStream-Truncated`` /
    ``Spark-JetStream-Original-Size`` say so.
    """
    own: list[tuple[str, str]] = []
    if original_headers:
        parsed = hdrs.parse_headers(original_headers)
        for name, values in parsed.items():
            # Every Nats-* header steers the server (TTL, id, expected stream or last subject sequence,
            # roll-up): on the dead-letter subject it would be refused or purge other dead letters.
            if not name.lower().startswith(hdrs.RESERVED_PREFIX):
                own.extend((name, v) for v in values)
    ours: list[tuple[str, str]] = []
    if idempotent and rejection.msg_id is not None:
        ours.append((hdrs.MSG_ID, _escape(f"{rejection.msg_id}:dlq")))
    error = rejection.reason
    if rejection.column is not None:  # as PublishError names them: what the user must fix
        error += f"; column '{rejection.column}' value {rejection.value!r}"
    ours += [
        (DLQ_ERROR, _escape(error)),
        (DLQ_ERR_CODE, str(rejection.err_code) if rejection.err_code is not None
         else f"status {rejection.status}" if rejection.status is not None else "client"),
        (DLQ_SUBJECT, _escape(rejection.subject)),
        (DLQ_ROW, f"{partition}:{rejection.position}"),
    ]
    if rejection.ttl is not None:
        ours.append((DLQ_TTL, _escape(rejection.ttl)))
    payload = rejection.payload
    block = hdrs.encode_block(own + ours)
    if len(block) + len(payload) > max_payload:
        cut = ours + [(DLQ_TRUNCATED, "true"), (DLQ_ORIGINAL_SIZE, str(len(payload)))]
        block = hdrs.encode_block(own + cut)
        if len(block) > max_payload // 2:  # the row's own headers are what is too large
            block = hdrs.encode_block(cut)
        if len(block) > max_payload:  # a tiny max_payload: keep only what locates the row
            block = hdrs.encode_block([p for p in cut if p[0] in (DLQ_ERR_CODE, DLQ_ROW, DLQ_TRUNCATED,
                                                                  DLQ_ORIGINAL_SIZE)])
        if len(block) > max_payload:
            raise PublishError(subject=rejection.subject, position=rejection.position, partition=partition,
                               reason=f"{rejection.reason}; its dead letter cannot fit the server's max_payload of "
                               f"{max_payload} bytes", err_code=rejection.err_code)
        payload = payload[:max_payload - len(block)]
    return hpub_frame(dlq_subject, reply, block, payload)


def _task_identity(plan: SinkPlan) -> tuple[int, MsgIds | None]:
    """(partition id, msg-id generator) for the running task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    if not plan.options.idempotent:
        return partition, None
    run_id = plan.run_id
    if run_id is None:
        query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
        batch_id = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        run_id = f"{query_id}:{batch_id}"
    return partition, MsgIds(run_id, partition)


def _query_of_task() -> tuple[str | None, str | None]:
    """(id, name) of the streaming query running this task, or (None, None) for a batch write.

    Spark sets the id as the local property ``sql.streaming.queryId`` and has no property for the
    name (``sql.streaming.queryName`` does not exist, checked on Spark 4.3); the name is the first
    line of the job description it sets for each micro-batch (``<name>\\nid = <id>\\nrunId = ...``,
    an empty first line for an unnamed query)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
    if not query_id:
        return None, None
    lines = (ctx.getLocalProperty("spark.job.description") or "").split("\n")
    name = lines[0] if len(lines) > 1 and lines[1] == f"id = {query_id}" and lines[0] else None
    return query_id, name


MIN_SLICE = 1024
"""The fewest rows :meth:`WriteTask.publish` encodes at once (below, encoding's fixed cost per call shows)."""


def slices(batch: Any, step: int) -> list[Any]:
    """``batch`` as consecutive slices of at most ``step`` rows (zero-copy); encoded one after the
    other with running positions they give the whole batch's frames (tests/unit/test_sink_frames.py)."""
    if batch.num_rows <= step:
        return [batch]
    return [batch.slice(offset, step) for offset in range(0, batch.num_rows, step)]


class WriteTask:
    """One Spark task's write, shaped like Spark's ``KafkaWriteTask``: :meth:`publish` each
    batch, :meth:`divert` the rows refused (to the dead-letter subject, or fail the task naming
    the first), :meth:`settle` what the server refused, :meth:`finish` (drain, settle, drain the
    dead letters), and always :meth:`close`. Every frame in flight keeps its subject, TTL and id
    beside it (:class:`~pyspark_jetstream.sink.encoder.OutFrame`), so settling parses nothing."""

    def __init__(self, plan: SinkPlan) -> None:
        from ..encode.encoder import BatchEncoder
        from ..publish.publisher import Publisher

        self.plan = plan
        self.opts = opts = plan.options
        self.partition, self.msg_ids = _task_identity(plan)
        self.query_id, self.query_name = _query_of_task()
        self.encoder = BatchEncoder(plan.layout, plan.encoder, self.msg_ids)
        self.position = 0  # of the next row in this task
        self.expired = self.markers_skipped = self.already_stored = 0
        self.recreated: set[int] = set()  # positions of KV creates put again after a tombstone (once each)
        self._streams_near: dict[str, list[tuple[str, list[str]]] | None] = {}  # see _where_subjects_go
        self.retry_order = None  # a replay with order=subject: rows stored past a missing one move (retry_order)
        self.move_base = 0  # ... numbering this attempt's moved copies apart from its predecessors'
        self.deny_delete = False
        self.stale: list[tuple[int, tuple[int, ...]]] = []  # (position, copies to delete once it is stored)
        self.refused: set[int] = set()  # positions the server refused (their stale copies stay)
        self.moved = self.left_in_place = 0  # rows moved behind a missing one; ... that could not be moved
        self.already = self._replayed()
        self.sequenced = None  # option 'sequenceBy': rows are reduced per key first (sequenced_write)
        self.order = None  # order=none, rows as read: where a subject's source order arrived broken (order_check)
        self.undecided = opts.order == "subject" and plan.sequence is None  # see _decide_order
        self.held = None  # order=subject, rows that came through a shuffle: held and sorted (ordering.SortedRows)
        self.notes: list = []  # order=subject: what the reads of this task left (task_notes), checked again at the end
        self.unpositioned: int | None = None  # order=subject, rows of unknown order published as they came: counted
        self.sample = None  # ... and a sample of their subjects, for the driver (ordering.SubjectSample)
        layout = plan.layout
        if layout.as_read and layout.source_seq is not None and plan.sequence is None and opts.order == "none":
            from ..order.order_check import OrderCheck

            self.order = OrderCheck(layout.key if opts.bucket is not None else layout.subject,
                                    layout.source_stream, layout.source_seq)
        if plan.sequence is not None:
            from ..reduce.sequenced_write import SequencedWrite

            self.sequenced = SequencedWrite(self)

        target = kv.stream_name(opts.bucket) if opts.bucket is not None else opts.stream
        ordered = target if opts.order == "subject" else None  # repaired after a leader change (sink/reorder)

        async def open_publisher() -> Publisher:
            nc = await runtime.connection(opts.connection)
            return await Publisher(
                nc, max_pending=opts.max_pending_acks, ack_timeout=opts.ack_timeout, idempotent=opts.idempotent,
                ordered_stream=ordered, api_prefix=opts.api_prefix, bucket=opts.bucket is not None,
                move_base=self.move_base,
            ).start()

        self.pub = runtime.run(open_publisher())

    def _replayed(self) -> Any:
        """The ids an earlier attempt of this run already stored in the target (``replay_guard``); the
        record of this attempt is then renewed while the task publishes (:meth:`_end_guard` ends it)."""
        guard = self.plan.guard
        self._guard_beat = self._guard_record = self.superseded = None
        if guard is None or self.msg_ids is None:
            return {}
        from pyspark import TaskContext

        from ..records import replay_guard

        ctx = TaskContext.get()
        # The task attempt, not the stage and attempt number: a stage Spark resubmits (a lost shuffle
        # output) runs its tasks again with attemptNumber 0 (issue #33).
        attempt_id = f"{guard.token}/{ctx.taskAttemptId() if ctx is not None else 0}"
        retried = ctx is not None and ctx.attemptNumber() > 0

        async def begin() -> replay_guard.Attempt:
            nc = await runtime.connection(self.opts.connection)
            return await replay_guard.begin(nc, guard, self.msg_ids.run, self.partition, attempt_id, retried)

        attempt = runtime.run(begin(), timeout=300)
        if attempt.replay:
            first, end = attempt.window or (attempt.after, attempt.after)
            log.info("JetStream sink: run %s partition %d replays; %d of its ids are in stream %s already (read "
                     "%d messages, sequences %d..%d)", self.msg_ids.run, self.partition, len(attempt.stored),
                     guard.target_stream, attempt.scanned, first + 1, end)
        self.guard_scanned = attempt.scanned
        self._guard_record = attempt.record
        self.superseded = attempt.superseded if attempt.superseded else None
        if attempt.replay and self.opts.order == "subject":
            import hashlib

            from ..publish.retry_order import RetryOrder

            self.retry_order = RetryOrder(attempt.stored)
            self.deny_delete = attempt.deny_delete
            # :o<number> of this attempt's moved copies, apart from its predecessors' (whose ids the server
            # may still remember) and from the rounds of its own leader-change repairs (publisher).
            self.move_base = int(hashlib.sha256(attempt_id.encode()).hexdigest()[:10], 16) * 1000

        async def beat() -> None:
            nc = await runtime.connection(self.opts.connection)
            await replay_guard.heartbeat(nc, guard, self.msg_ids.run, self.partition, attempt.record)

        if attempt.record is not None:
            self._guard_beat = runtime.submit(beat())
        return attempt.stored

    def _end_guard(self, finished: bool) -> None:
        """Stop renewing this attempt's record; when every PubAck came, mark it done (its messages are
        all at or before the target's last sequence now: a replay reads no further)."""
        beat, self._guard_beat = getattr(self, "_guard_beat", None), None
        if beat is not None:
            beat.cancel()
        record = getattr(self, "_guard_record", None)
        if not finished or record is None:
            return
        from ..records import replay_guard

        async def done() -> None:
            nc = await runtime.connection(self.opts.connection)
            await replay_guard.finished(nc, self.plan.guard, self.msg_ids.run, self.partition, record)

        try:
            runtime.run(done(), timeout=30)
        except Exception as exc:  # the record stays: a replay then bounds this attempt by its last heartbeat
            log.warning("Could not mark the replay record of run %s partition %d done: %s", self.msg_ids.run,
                        self.partition, exc)

    def publish(self, batch: Any) -> None:
        """Encode and publish ``batch`` in slices of the window's refill size (half of it; at least
        :data:`MIN_SLICE` rows).

        Encoding holds the GIL, and with it the loop thread that takes the PubAcks and refills the
        window: a whole Arrow batch (10k rows) takes longer to encode than the server needs to store
        half a window, so the server would wait for every batch. Slices of about the refill size keep
        it fed (measured: 1 task, 200k x 100 B, 150k rows/s with 10k-row batches, 175k with 2k).

        With ``sequenceBy`` the batch is only reduced here; :meth:`finish` publishes (sequenced_write). With
        ``order=subject``, rows that came through a shuffle are held and published in source order by
        :meth:`finish` (ordering)."""
        if self.sequenced is not None:
            self.sequenced.add(batch, self.position)
            self.position += batch.num_rows
            return
        if self.undecided:
            self._decide_order()
        if self.held is not None:
            self.sample = self.sample.merged(self._subjects_of(batch))
            self.held.add(batch)
            return
        if self.order is not None:
            self.order.add(batch)
        if self.unpositioned is not None:
            self.unpositioned += batch.num_rows
        self._publish_sliced(batch)

    def _publish_sliced(self, batch: Any) -> None:
        for part in slices(batch, max(MIN_SLICE, self.pub.low_water)):
            self._publish(part)

    def _decide_order(self) -> None:
        """``order=subject``, at the task's first rows: refuse rows that come straight from a read split by
        sequence ranges, publish rows straight from an ordered read as they come, hold and sort the rest
        (sink/ordering.py)."""
        from ... import task_notes
        from ..order.decide import SORT, SortedRows, SubjectSample

        self.undecided = False
        self.notes = task_notes.take()
        mode = self._decide(self.notes, ended=False)
        if mode == SORT:
            self.held = SortedRows(self.plan.layout.source_seq, self.opts.order_max_buffer_bytes)
            self.sample = SubjectSample()
        elif not self.notes:
            # Not straight from a read, and nothing to order by: a copy that dropped 'seq' after its shuffle
            # would lose each subject's order here without a word. The commit line says how many rows.
            self.unpositioned = 0

    def _subjects_of(self, batch: Any) -> Any:
        """The column a row's target subject comes from (a bucket's key), or the default subject."""
        import pyarrow as pa

        layout = self.plan.layout
        column = layout.key if self.opts.bucket is not None else layout.subject
        if column is not None:
            return batch.column(column).cast(pa.string())
        return pa.array([self.opts.subject or ""] * min(batch.num_rows, 1), pa.string())

    def _publish(self, batch: Any) -> None:
        first = self.position
        self.position += batch.num_rows
        self.send(batch, first)
        self.settle()

    def send(self, batch: Any, first: int, choice: RowChoice | None = None) -> None:
        """Encode ``batch`` (its first row at task position ``first``; ``choice``: which rows to publish
        and which to refuse) and publish what an earlier attempt did not store, without settling: the
        caller settles (``sequenceBy`` must see a compare-and-set refusal first)."""
        encoded = self.encoder.encode(batch, first, self.pub.reply_prefix, choice=choice)
        self.expired += encoded.expired
        self.markers_skipped += encoded.markers_skipped
        if encoded.rejected:
            self.divert(encoded.rejected)
        frames = encoded.frames
        if self.retry_order is not None and frames:
            frames = self._in_order_behind(frames)
        elif self.already and frames:
            kept = [f for f in frames if f[4] not in self.already]  # OutFrame.msg_id
            if self.superseded is not None:  # stored, then replaced by later rows of their subject
                kept = [f for f in kept if not self.superseded.covers(f[2], f[4])]  # OutFrame.subject
            self.already_stored += len(frames) - len(kept)
            frames = kept
        if frames:
            runtime.run(self.pub.publish(frames))

    def _in_order_behind(self, frames: list[tuple]) -> list[tuple]:
        """A replay with ``order=subject``: the frames to publish, walked in the task's order
        (:mod:`.retry_order`): a row stored in place is skipped (counted as already stored); from the first
        row of a subject missing on, every row of it is published, the stored ones under this attempt's
        moved id, their old copies deleted once the new ones are stored (:meth:`_delete_stale`). A target
        that refuses deletes keeps them where they are (counted, as the publisher's repair does), and so
        does a compare-and-set row (sent again behind the missing one it would be refused)."""
        from ..publish.moves import is_conditional

        order, superseded, pub = self.retry_order, self.superseded, self.pub
        bucket = self.opts.bucket is not None
        out = []
        for f in frames:
            subject, msg_id = f[2], f[4]  # OutFrame.subject, .msg_id
            if msg_id is None:
                out.append(f)
                continue
            if superseded is not None and msg_id not in self.already and superseded.covers(subject, msg_id):
                self.already_stored += 1  # stored, then replaced by later rows of its subject
                continue
            place = order.place(subject, msg_id)
            if not place.publish:
                self.already_stored += 1
                if place.stale and not self.deny_delete:
                    self.stale.append((-1, place.stale))  # a second copy: its copy in place is stored already
                continue
            if not place.moved:
                out.append(f)
                continue
            if (self.deny_delete and not bucket) or is_conditional(f):
                self.already_stored += 1
                self.left_in_place += 1
                continue
            out.append(pub.moved_copy(f))
            self.moved += 1
            if not self.deny_delete:
                self.stale.append((f[0], place.stale))
        return out

    def _delete_stale(self) -> None:
        """Delete the copies that moved rows left ahead of a missing one, now that every new copy has its
        PubAck (a row the server refused keeps its old copy: never none)."""
        seqs = [seq for position, copies in self.stale if position not in self.refused for seq in copies]
        self.stale = []
        if not seqs:
            return
        refused = runtime.run(self.pub.delete_stored(seqs), timeout=max(60.0, self.opts.ack_timeout * 2))
        self.left_in_place += refused
        log.info("JetStream sink: partition %d moved %d rows stored by an earlier attempt of run %s behind a row of "
                 "their subject it had left missing (%d old copies deleted)", self.partition, self.moved,
                 self.msg_ids.run if self.msg_ids is not None else "?", len(seqs) - refused)

    def divert(self, rejections: list[RowRejection], originals: dict[int, bytes] | None = None) -> None:
        """Publish dead letters for ``rejections`` (``originals``: the header blocks they were sent
        with), or fail the task naming the first when no dead-letter subject is set."""
        opts, pub = self.opts, self.pub
        if opts.dead_letter_subject is None:
            first = min(rejections, key=lambda r: r.position)
            raise PublishError(subject=first.subject, position=first.position, partition=self.partition,
                               reason=first.reason, err_code=first.err_code, value=first.value, column=first.column)
        frames = [
            (r.position, dead_letter_frame(r, opts.dead_letter_subject, f"{pub.reply_prefix}d{r.position}",
                                           self.partition, self.msg_ids is not None, self.plan.encoder.max_payload,
                                           (originals or {}).get(r.position, b"")),
             opts.dead_letter_subject, None, None, 0, 0)  # OutFrame layout; no settling reads the rest
            for r in rejections
        ]
        runtime.run(pub.publish(frames, dead_letter=True))

    def settle(self) -> bool:
        """Turn the publishes the server refused since the last call into dead letters (or a failure);
        a compare-and-set row that an earlier attempt stored is counted as stored (:meth:`stored_before`)
        and a KV ``create`` refused because the key's last entry is a tombstone is put again first
        (:meth:`recreate`). Whether anything was published meanwhile (that :meth:`finish` drains)."""
        async def take() -> list:
            taken, self.pub.failures = self.pub.failures, []
            return taken

        failures = runtime.run(take())
        if not failures:
            return False
        self.refused.update(f.position for f in failures if not f.dead_letter)
        dead = [f for f in failures if f.dead_letter]
        if dead:
            f = dead[0]
            raise PublishError(subject=self.opts.dead_letter_subject, position=f.position, partition=self.partition,
                               reason=f"the dead-letter publish was rejected: {f.description}", err_code=f.err_code)
        failures = self.recreate(self.stored_before(failures))
        if not failures:
            return True
        rejections, originals = [], {}
        for f in failures:
            sent = OutFrame._make(f.sent)
            reason = f.description or f"status {f.code}"
            if f.err_code is None:
                reason += f" (status {f.code})"
                if f.code == 503:
                    reason += self._where_subjects_go(sent.subject)
            rejections.append(RowRejection(f.position, sent.subject, reason, err_code=f.err_code,
                                           status=None if f.err_code is not None else f.code,
                                           payload=sent.payload, ttl=sent.ttl, value=sent.ttl, msg_id=sent.msg_id))
            originals[f.position] = sent.header_block
        self.divert(rejections, originals)
        return True

    def stored_before(self, failures: list) -> list:
        """Compare-and-set rows refused with 10071 whose ``Nats-Msg-Id`` the bucket shows stored (a retry,
        a replay or a resend of a row its first attempt stored: sink/cas_replay.py) are counted among the
        rows already stored, neither failed nor dead-lettered. Returns the failures that stand."""
        candidates = [] if self.opts.bucket is None else [
            f for f in failures if f.err_code == kv.ERR_WRONG_LAST_SEQUENCE and OutFrame._make(f.sent).msg_id]
        if not candidates:
            return failures
        from ..records.cas_replay import stored_already

        stream, prefix = kv.stream_name(self.opts.bucket), self.opts.api_prefix
        rows = [(sent.subject, sent.msg_id, kv.expected_revision_of(sent.header_block))
                for sent in (OutFrame._make(f.sent) for f in candidates)]

        async def look() -> list[bool]:
            nc = await runtime.connection(self.opts.connection)
            return await stored_already(nc, stream, rows, prefix)

        stored = {f.position for f, found in zip(candidates, runtime.run(look()), strict=True) if found}
        if not stored:
            return failures
        self.already_stored += len(stored)
        log.info("JetStream sink: %d compare-and-set rows of partition %d were refused (wrong last sequence) because "
                 "an earlier attempt stored them; counted as stored", len(stored), self.partition)
        return [f for f in failures if f.position not in stored]

    def recreate(self, failures: list) -> list:
        """nats-py's ``kv.create``: a create (``expected_revision`` 0) refused with 10071 is put again,
        once, expecting the key's last revision when that is a DEL or PURGE tombstone (a deleted or
        purged key may be created again). Returns the failures that stand."""
        bucket = self.opts.bucket
        candidates = [] if bucket is None else [
            f for f in failures if f.err_code == kv.ERR_WRONG_LAST_SEQUENCE and f.position not in self.recreated
            and kv.is_create(OutFrame._make(f.sent).header_block)]
        if not candidates:
            return failures
        stream, prefix = kv.stream_name(bucket), self.opts.api_prefix

        async def last_entries() -> list:
            nc = await runtime.connection(self.opts.connection)
            return await asyncio.gather(*(jsapi.last_message_of_subject(nc, stream, f.sent[2], prefix)
                                          for f in candidates))

        frames, retried = [], set()
        for f, last in zip(candidates, runtime.run(last_entries()), strict=True):
            revision = None if last is None else kv.tombstone_revision(*last)
            if revision is None:
                continue  # a live key (or none at all): the refusal stands, as for nats-py
            sent = OutFrame._make(f.sent)
            block = kv.recreate_block(sent.header_block, revision)
            frame = hpub_frame(sent.subject, f"{self.pub.reply_prefix}{f.position}", block, sent.payload)
            frames.append(sent._replace(frame=frame, header_len=len(block)))
            retried.add(f.position)
        self.recreated |= retried
        if frames:
            runtime.run(self.pub.publish([tuple(frame) for frame in frames]))
        return [f for f in failures if f.position not in retried]

    def _where_subjects_go(self, subject: str) -> str:
        """For a row no stream took (503): the subjects of option 'stream', or else the streams that
        capture subjects beside it (one ``STREAM.LIST`` per first token, remembered by the task)."""
        opts = self.opts
        if opts.stream is not None and self.plan.stream_subjects is not None:
            return (f"; stream '{opts.stream}' (option 'stream') captures "
                    f"{', '.join(repr(s) for s in self.plan.stream_subjects) or 'no subjects'}")
        near = f"{subject.split('.', 1)[0]}.>"
        if near not in self._streams_near:
            async def ask() -> list[tuple[str, list[str]]]:
                nc = await runtime.connection(opts.connection)
                return await jsapi.streams_capturing(nc, near, opts.api_prefix)

            try:
                found = runtime.run(ask(), timeout=30)
            except Exception:  # the refusal is reported all the same, without the neighbours
                found = None
            if len(self._streams_near) < 64:
                self._streams_near[near] = found
        found = self._streams_near.get(near)
        if found is None:
            return ""
        if not found:
            return f"; no stream captures any subject under '{near}'"
        shown = "; ".join(f"stream '{name}' captures {', '.join(repr(s) for s in subjects)}"
                          for name, subjects in found[:5])
        return f"; under '{near}': {shown}" + (f" (and {len(found) - 5} more streams)" if len(found) > 5 else "")

    def _check_order_at_end(self) -> None:
        """``order=subject``: with the task's input over, every note of its reads is there; refuse (before
        anything is published) a task that read only some ranges of a read split into several, even one
        that got no row (sink/ordering.py: the guard is a property of the query)."""
        from ... import task_notes

        if self.undecided:  # no row came: nothing was decided
            self.undecided = False
            self.notes = task_notes.take()
        elif self.held is None:
            return
        else:
            self.notes = [*self.notes, *task_notes.take()]
        self._decide(self.notes, ended=True)

    def _decide(self, notes: list, *, ended: bool) -> str:
        """sink/ordering.decide for this task's rows: whether they carry the source's positions."""
        from ..order.decide import decide

        layout = self.plan.layout
        return decide(notes, layout.as_read and layout.source_seq is not None, describe_target(self.opts), ended=ended)

    def finish(self) -> SinkCommitMessage:
        if self.sequenced is not None:
            self.sequenced.flush()
        if self.opts.order == "subject" and self.sequenced is None:
            self._check_order_at_end()
        if self.held is not None:
            held, self.held = self.held, None
            try:
                for batch in held.batches(max(MIN_SLICE, self.pub.low_water)):
                    self._publish(batch)
            finally:
                held.close()
        runtime.run(self.pub.drain())
        while self.settle():  # creates put again, dead letters: drained and settled in turn
            runtime.run(self.pub.drain())
        self._delete_stale()
        self._end_guard(finished=True)
        pub = self.pub
        return SinkCommitMessage(partition=self.partition, published=pub.stored, duplicates=pub.duplicates,
                                 dead_lettered=pub.dead_lettered, expired=self.expired,
                                 markers_skipped=self.markers_skipped, already_stored=self.already_stored,
                                 older_in_write=self.sequenced.older_in_write if self.sequenced else 0,
                                 older_than_stored=self.sequenced.older_than_stored if self.sequenced else 0,
                                 out_of_order=self.order.behind if self.order is not None else 0,
                                 subjects=self.sample, reordered=pub.reordered + self.moved,
                                 left_out_of_order=pub.left_out_of_order + self.left_in_place,
                                 unpositioned=self.unpositioned or 0,
                                 run=self.msg_ids.run if self.msg_ids is not None else None,
                                 query_id=self.query_id, query_name=self.query_name)

    def close(self, failed: bool) -> None:
        self._end_guard(finished=False)
        if self.held is not None:
            self.held.close()  # its spilled runs, if any
        # A failed task leaves nothing behind to be sent after a reconnect.
        runtime.run(self.pub.abort() if failed else self.pub.close(), timeout=60)


def write_partition(plan: SinkPlan, batches: Iterable[Any]) -> SinkCommitMessage:
    from ..order.input_batches import sound

    task = WriteTask(plan)
    failed = True
    try:
        for batch in sound(batches):  # PySpark 4.0/4.1 send empty arrays pyarrow can misread (input_batches)
            task.publish(batch)
        message = task.finish()
        failed = False
    finally:
        task.close(failed)
    log.debug("JetStream sink task finished: %s", message)
    return message


