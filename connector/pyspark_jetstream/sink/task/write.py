"""A task's write: its batches through the stages, in the order a row passes them.

Everything decided once per query (options, input layout, stream checks, the server's max_payload)
is in the :class:`~pyspark_jetstream.sink.plan.sink_plan.SinkPlan`, made on the driver and pickled to
the executors. A task's batch is ordered (:mod:`~pyspark_jetstream.sink.order`) or, with
``sequenceBy``, reduced to each key's newest row (:mod:`~pyspark_jetstream.sink.reduce`); then, a slice
at a time, encoded into frames (:mod:`~pyspark_jetstream.sink.encode`), stripped of the rows an earlier
attempt stored (:mod:`~pyspark_jetstream.sink.records`), published with every PubAck awaited
(:mod:`~pyspark_jetstream.sink.publish`), and what was refused is diverted (:mod:`.dead_letters`,
:mod:`.refusals`). The task returns a :class:`~.commit.SinkCommitMessage` with its counts.

Exactly-once: each row without its own ``msg_id`` (null or empty) gets a deterministic
``Nats-Msg-Id`` (:class:`~pyspark_jetstream.sink.encode.msg_ids.MsgIds`): derived from the row's
source position and content when it carries a position (``<run>:<stream>.<seq>:<digest>``), else from
its task and position. A retried task or a replayed micro-batch therefore publishes the same ids, and
the server drops the copies that arrive within the stream's duplicate window. Rows no content tells
apart, in different tasks, share an id: the server keeps one, and the commit log line counts the
others among the duplicates (never silently).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...client import runtime
from ...logs import get_logger
from ...protocol import kv
from ..encode.encoder import BatchEncoder
from ..encode.rows import RowChoice, RowRejection
from ..order.input_batches import sound
from ..order.stage import OrderStage
from ..plan.sink_plan import SinkPlan
from ..publish.batched import BatchedPublisher
from ..publish.publisher import Publisher
from ..publish.retry_order import RetryMoves
from ..publish.row_publisher import RowPublisher
from ..records.attempt import ReplayRecords
from ..reduce.sequenced_write import SequencedWrite
from .commit import SinkCommitMessage, describe_target
from .dead_letters import dead_letters, first_refusal
from .identity import query_of_task, retried_attempt, task_identity
from .key_barrier import KeyBarrier
from .refusals import Refusals

log = get_logger("sink")

MIN_SLICE = 1024
"""The fewest rows :meth:`WriteTask.write` encodes at once (below, encoding's fixed cost per call shows)."""


def slices(batch: Any, step: int) -> list[Any]:
    """``batch`` as consecutive slices of at most ``step`` rows (zero-copy); encoded one after the
    other with running positions they give the whole batch's frames (tests/unit/test_sink_frames.py)."""
    if batch.num_rows <= step:
        return [batch]
    return [batch.slice(offset, step) for offset in range(0, batch.num_rows, step)]


def open_publisher(opts: Any, move_base: int, after_retry: bool = False,
                   batched_to: tuple[str, ...] | None = None) -> RowPublisher:
    """The task's publisher on the executor's shared connection; with ``order=subject`` its ordered recovery
    repairs a subject's order after a leader change (publish/recovery.py), and in a retried attempt
    (``after_retry``) moves the rows its predecessor stored ahead of a missing one and checks that a duplicate
    PubAck names a copy that is still there, or one its moved copy stands for (publish/moves.py). ``batched_to``: the target stream's subjects, to publish in
    fast-ingest batches (publish/batched.py: a batch stores a prefix of its rows, so there is nothing to
    repair or move)."""
    target = kv.stream_name(opts.bucket) if opts.bucket is not None else opts.stream
    ordered = target if opts.order == "subject" and batched_to is None else None

    async def opened() -> RowPublisher:
        nc = await runtime.connection(opts.connection)
        pub = await Publisher(
            nc, max_pending=opts.max_pending_acks, ack_timeout=opts.ack_timeout, idempotent=opts.idempotent,
            ordered_stream=ordered, api_prefix=opts.api_prefix, bucket=opts.bucket is not None,
            move_base=move_base, after_retry=after_retry,
            target=f"stream '{target}'" if target else "the target stream",
        ).start()
        if batched_to is None:
            return pub
        return await BatchedPublisher(nc, pub, subjects=batched_to, ack_timeout=opts.ack_timeout,
                                      target=f"stream '{target}'" if target else "the target stream").start()

    return runtime.run(opened())


_said_why: set[str] = set()


def batched_subjects(plan: SinkPlan, moves_rows: bool) -> tuple[str, ...] | None:
    """The target's subjects when this task publishes in fast-ingest batches (option 'publish.mode'), else
    None. A replay that may move rows an earlier attempt stored past a missing one (publish/retry_order.py)
    needs each row's stream sequence: it publishes with a PubAck per row, and says so once per executor."""
    mode = plan.publish
    if not mode.batched:
        return None
    if moves_rows:
        if mode.target not in _said_why:
            _said_why.add(mode.target or "")
            log.info("JetStream sink: a replay to %s publishes with a PubAck per row, not in fast-ingest batches: "
                     "it may move rows an earlier attempt stored, which needs each row's stream sequence",
                     mode.target)
        return None
    return mode.subjects


class WriteTask:
    """One Spark task's write, shaped like Spark's ``KafkaWriteTask``: :meth:`write` each batch (order or
    reduce, then :meth:`publish` it in slices: encode, skip what is stored, send), :meth:`divert` the rows
    refused (to the dead-letter subject, or fail the task naming the first), :meth:`settle` what the server
    refused, :meth:`finish` (drain, settle, drain the dead letters), and always :meth:`close`. Every frame in
    flight keeps its subject, TTL and id beside it (:class:`~pyspark_jetstream.sink.encode.frames.OutFrame`),
    so settling parses nothing."""

    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan
        self.opts = opts = plan.options
        self.partition, self.msg_ids = task_identity(plan)
        self.query_id, self.query_name = query_of_task()
        self.encoder = BatchEncoder(plan.layout, plan.encoder, self.msg_ids)
        self.position = 0  # of the next row in this task
        self.expired = self.markers_skipped = 0
        self.records = ReplayRecords(plan, self.msg_ids, self.partition).begin()
        attempt = self.records.attempt
        self.retry = None  # a replay with order=subject: rows stored past a missing one move (retry_order)
        if attempt is not None and attempt.replay and opts.order == "subject":
            self.retry = RetryMoves(attempt.stored, attempt.deny_delete, self.records.attempt_id,
                                    opts.bucket is not None)
        self.ordering = OrderStage(plan, describe_target(opts))
        self.reduction = SequencedWrite(self) if plan.sequence is not None else None  # option 'sequenceBy'
        move_base, after_retry = self.retry.move_base if self.retry is not None else 0, False
        batched_to = batched_subjects(plan, self.retry is not None)
        checked = opts.order == "subject" and opts.idempotent and plan.sequence is None and batched_to is None
        if self.retry is None and checked:
            move_base, after_retry = retried_attempt()  # no replay records: its PubAcks tell (publish/recovery.py)
        elif self.retry is not None and checked:
            after_retry = True  # a duplicate of a row the records did not find: its copy may be gone (moves.py)
        self.pub = open_publisher(opts, move_base, after_retry, batched_to=batched_to)
        self.refusals = Refusals(self)
        # A bucket write's checked rows wait for their key's earlier rows (key_barrier.py); sequenceBy
        # writes a key once per task and settles its own compare-and-set refusals.
        self.barrier = KeyBarrier() if opts.bucket is not None and plan.sequence is None else None

    def write(self, batch: Any) -> None:
        """One input batch through the stages: reduced per key (``sequenceBy``: :meth:`finish` publishes the
        newest rows), or ordered (held, with ``order=subject``, when it came through a shuffle: :meth:`finish`
        publishes it in source order), else published now in slices of the window's refill size (half of it;
        at least :data:`MIN_SLICE` rows).

        Encoding holds the GIL, and with it the loop thread that takes the PubAcks and refills the
        window: a whole Arrow batch (10k rows) takes longer to encode than the server needs to store
        half a window, so the server would wait for every batch. Slices of about the refill size keep
        it fed (measured: 1 task, 200k x 100 B, 150k rows/s with 10k-row batches, 175k with 2k)."""
        if self.reduction is not None:
            self.reduction.reduce(batch, self.position)
            self.position += batch.num_rows
            return
        if self.ordering.order(batch):
            for part in slices(batch, max(MIN_SLICE, self.pub.low_water)):
                self._publish_slice(part)

    def _publish_slice(self, batch: Any) -> None:
        first = self.position
        self.position += batch.num_rows
        self.publish(batch, first)
        self.settle()

    def publish(self, batch: Any, first: int, choice: RowChoice | None = None) -> None:
        """Encode ``batch`` (its first row at task position ``first``; ``choice``: which rows to publish
        and which to refuse) and publish what an earlier attempt did not store, without settling: the
        caller settles (``sequenceBy`` must see a compare-and-set refusal first)."""
        frames = self.skip_stored(self.encode(batch, first, choice))
        if not frames:
            return
        if self.barrier is None:
            runtime.run(self.pub.publish(frames))
            return
        for i, run in enumerate(self.barrier.runs(frames)):
            if i:
                self.drain()  # the key's earlier rows stored (or settled) before this one is checked
            if run:
                runtime.run(self.pub.publish(list(run)))

    def drain(self) -> None:
        """Every row sent so far has its PubAck and its refusal settled (creates put again, dead letters,
        rows answered "not yet" sent again: each drained and settled in turn)."""
        runtime.run(self.pub.drain())
        while self.settle():
            runtime.run(self.pub.drain())
        if self.barrier is not None:
            self.barrier.drained()

    def encode(self, batch: Any, first: int, choice: RowChoice | None = None) -> list[tuple]:
        """``batch``'s frames; its rows refused diverted, its expired rows and delete markers counted."""
        encoded = self.encoder.encode(batch, first, self.pub.reply_form, choice=choice)
        self.expired += encoded.expired
        self.markers_skipped += encoded.markers_skipped
        if encoded.rejected:
            self.divert(encoded.rejected)
        return encoded.frames

    def skip_stored(self, frames: list[tuple]) -> list[tuple]:
        """``frames`` but what an earlier attempt of the run stored (records/attempt.py); a replay with
        ``order=subject`` moves the rows it stored past a missing one behind it (publish/retry_order.py)."""
        if self.retry is not None and frames:
            return self.retry.in_order_behind(frames, self.records.already, self.records.superseded, self.pub)
        return self.records.not_stored(frames)

    def divert(self, rejections: list[RowRejection], originals: dict[int, bytes] | None = None) -> None:
        """Publish dead letters for ``rejections`` (``originals``: the header blocks they were sent
        with), or fail the task naming the first when no dead-letter subject is set."""
        subject = self.opts.dead_letter_subject
        if subject is None:
            raise first_refusal(rejections, self.partition)
        frames = dead_letters(rejections, subject, self.pub.reply_prefix, self.partition, self.msg_ids is not None,
                              self.plan.encoder.max_payload, originals)
        runtime.run(self.pub.publish(frames, dead_letter=True))

    def settle(self) -> bool:
        """What the server refused since the last call, settled (task/refusals.py); whether anything was
        published meanwhile (that :meth:`finish` drains)."""
        return self.refusals.settle()

    def finish(self) -> SinkCommitMessage:
        if self.reduction is not None:
            self.reduction.flush()
        if self.opts.order == "subject" and self.reduction is None:
            self.ordering.check_at_end()
        held = self.ordering.release()
        if held is not None:
            try:
                for batch in held.batches(max(MIN_SLICE, self.pub.low_water)):
                    self._publish_slice(batch)
            finally:
                held.close()
        self.drain()
        self._delete_stale()
        if self.pub.moves_finished or self.pub.restored:
            log.warning("JetStream sink: partition %d finished %d moves an earlier attempt cut short (old copies "
                        "deleted) and published again %d rows whose copy such a move had deleted",
                        self.partition, self.pub.moves_finished, self.pub.restored)
        self.records.end(finished=True)
        return self._commit_message()

    def _delete_stale(self) -> None:
        """Delete the copies that moved rows left ahead of a missing one, now that every new copy has its
        PubAck (publish/retry_order.py)."""
        retry = self.retry
        seqs = retry.take_stale() if retry is not None else []
        if not seqs:
            return
        refused = runtime.run(self.pub.delete_stored(seqs), timeout=max(60.0, self.opts.ack_timeout * 2))
        retry.left_in_place += refused
        log.info("JetStream sink: partition %d moved %d rows stored by an earlier attempt of run %s behind a row of "
                 "their subject it had left missing (%d old copies deleted)", self.partition, retry.moved,
                 self.msg_ids.run if self.msg_ids is not None else "?", len(seqs) - refused)

    def _commit_message(self) -> SinkCommitMessage:
        pub, retry, sequenced, ordering = self.pub, self.retry, self.reduction, self.ordering
        already_stored = self.records.already_stored + self.refusals.already_stored
        if retry is not None:
            already_stored += retry.already_stored
        return SinkCommitMessage(partition=self.partition, published=pub.stored, duplicates=pub.duplicates,
                                 dead_lettered=pub.dead_lettered, expired=self.expired,
                                 markers_skipped=self.markers_skipped, already_stored=already_stored,
                                 older_in_write=sequenced.older_in_write if sequenced else 0,
                                 older_than_stored=sequenced.older_than_stored if sequenced else 0,
                                 out_of_order=ordering.out_of_order, subjects=ordering.sample,
                                 reordered=pub.reordered + (retry.moved if retry else 0),
                                 left_out_of_order=pub.left_out_of_order + (retry.left_in_place if retry else 0),
                                 unpositioned=ordering.unpositioned or 0, batches=pub.batches,
                                 run=self.msg_ids.run if self.msg_ids is not None else None,
                                 query_id=self.query_id, query_name=self.query_name)

    def close(self, failed: bool) -> None:
        self.records.end(finished=False)
        self.ordering.close()
        # A failed task leaves nothing behind to be sent after a reconnect.
        runtime.run(self.pub.abort() if failed else self.pub.close(), timeout=60)


def write_partition(plan: SinkPlan, batches: Iterable[Any]) -> SinkCommitMessage:
    task = WriteTask(plan)
    failed = True
    try:
        for batch in sound(batches):  # PySpark 4.0/4.1 send empty arrays pyarrow can misread (input_batches)
            task.write(batch)
        message = task.finish()
        failed = False
    finally:
        task.close(failed)
    log.debug("JetStream sink task finished: %s", message)
    return message


