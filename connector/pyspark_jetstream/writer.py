"""The Spark-facing sink: thin writer classes around :func:`write_partition`.

Everything decided once per query (options, input layout, stream checks, the
server's max_payload) is in :class:`SinkPlan`, made on the driver and pickled
to the executors. A task turns its Arrow batches into frames (sink_encoder),
publishes them through a :class:`~pyspark_jetstream.publisher.Publisher` and
returns a :class:`SinkCommitMessage` with its counts, which the driver logs.

Exactly-once: each row without its own ``msg_id`` gets a deterministic
``Nats-Msg-Id`` (:class:`~pyspark_jetstream.sink_encoder.MsgIds`): derived from
the row's source position when it carries one, else from its task and position.
A retried task or a replayed micro-batch therefore publishes the same ids, and
the server drops the copies that arrive within the stream's duplicate window.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from . import headers as hdrs
from . import runtime
from .errors import PublishError
from .logs import get_logger
from .options import SinkOptions
from .sink_encoder import EncoderConfig, InputLayout, MsgIds, RowRejection, hpub_frame

log = get_logger("sink")

DLQ_ERROR = "Spark-JetStream-Error"
DLQ_ERR_CODE = "Spark-JetStream-Err-Code"
DLQ_SUBJECT = "Spark-JetStream-Original-Subject"
DLQ_ROW = "Spark-JetStream-Row"
DLQ_TTL = "Spark-JetStream-Original-TTL"
DLQ_TRUNCATED = "Spark-JetStream-Truncated"
DLQ_ORIGINAL_SIZE = "Spark-JetStream-Original-Size"
"""Headers of a dead-lettered row: why it was rejected and where it was going, and,
when the row did not fit the server's max_payload beside them, that its payload
was cut and how long it was."""

_DLQ_VALUE_MAX = 1024
"""Longest value of a dead-letter header the connector writes (a subject can be long)."""

_DLQ_DROPPED = {hdrs.TTL.lower(), hdrs.MSG_ID.lower(), hdrs.EXPECTED_STREAM.lower()}


@dataclass(frozen=True)
class SinkPlan:
    options: SinkOptions
    layout: InputLayout
    encoder: EncoderConfig
    run_id: str | None  # fixed on the driver for batch writes; None for streaming


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    partition: int = 0
    published: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    expired: int = 0
    markers_skipped: int = 0


def _escape(value: Any) -> str:
    text = str(value).replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= _DLQ_VALUE_MAX else text[:_DLQ_VALUE_MAX] + "..."


def dead_letter_frame(rejection: RowRejection, dlq_subject: str, reply: str, partition: int,
                      idempotent: bool, max_payload: int, original_headers: bytes = b"") -> bytes:
    """A dead-letter message: the row's data, its valid headers, and headers naming the error.

    Its ``Nats-Msg-Id`` is the row's own id with ``:dlq`` appended, so a replay
    dead-letters a row once. It never exceeds ``max_payload`` (a larger frame makes
    nats-server close the connection): when it would, the row's own headers are
    left out first, then the payload is cut, and ``Spark-JetStream-Truncated`` /
    ``Spark-JetStream-Original-Size`` say so.
    """
    own: list[tuple[str, str]] = []
    if original_headers:
        _, parsed = hdrs.parse_block(original_headers)
        for name, values in parsed.items():
            if name.lower() not in _DLQ_DROPPED:
                own.extend((name, v) for v in values)
    ours: list[tuple[str, str]] = []
    if idempotent and rejection.msg_id is not None:
        ours.append((hdrs.MSG_ID, _escape(f"{rejection.msg_id}:dlq")))
    ours += [
        (DLQ_ERROR, _escape(rejection.reason)),
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


def write_partition(plan: SinkPlan, batches: Iterable[Any]) -> SinkCommitMessage:
    from .publisher import Publisher
    from .sink_encoder import BatchEncoder, parse_hpub_frame

    opts = plan.options
    partition, msg_ids = _task_identity(plan)
    encoder = BatchEncoder(plan.layout, plan.encoder, msg_ids)

    async def open_publisher() -> Publisher:
        nc = await runtime.connection(opts.connection)
        return await Publisher(
            nc, max_pending=opts.max_pending_acks, ack_timeout=opts.ack_timeout, idempotent=opts.idempotent
        ).start()

    async def take_failures(pub: Publisher) -> list:
        taken, pub.failures = pub.failures, []
        return taken

    pub = runtime.run(open_publisher())
    expired = markers_skipped = 0

    def divert(rejections: list[RowRejection], originals: dict[int, bytes] | None = None) -> None:
        if opts.dead_letter_subject is None:
            first = min(rejections, key=lambda r: r.position)
            raise PublishError(subject=first.subject, position=first.position, partition=partition,
                               reason=first.reason, err_code=first.err_code, value=first.value, column=first.column)
        frames = [
            (r.position, dead_letter_frame(r, opts.dead_letter_subject, f"{pub.reply_prefix}d{r.position}",
                                           partition, msg_ids is not None, plan.encoder.max_payload,
                                           (originals or {}).get(r.position, b"")))
            for r in rejections
        ]
        runtime.run(pub.publish(frames, dead_letter=True))

    def settle_server_failures() -> None:
        failures = runtime.run(take_failures(pub))
        if not failures:
            return
        dead = [f for f in failures if f.dead_letter]
        if dead:
            f = dead[0]
            raise PublishError(subject=opts.dead_letter_subject, position=f.position, partition=partition,
                               reason=f"the dead-letter publish was rejected: {f.description}", err_code=f.err_code)
        rejections, originals = [], {}
        for f in failures:
            subject, block, payload = parse_hpub_frame(f.frame)
            _, parsed = hdrs.parse_block(block)
            ttl = (parsed.get(hdrs.TTL) or [None])[0]
            reason = f.description or f"status {f.code}"
            if f.err_code is None:
                reason += f" (status {f.code})"
            rejections.append(RowRejection(f.position, subject, reason, err_code=f.err_code,
                                           status=None if f.err_code is not None else f.code,
                                           payload=payload, ttl=ttl, value=ttl,
                                           msg_id=(parsed.get(hdrs.MSG_ID) or [None])[0]))
            originals[f.position] = block
        divert(rejections, originals)

    finished = False
    try:
        position = 0
        for batch in batches:
            encoded = encoder.encode(batch, position, pub.reply_prefix)
            position += batch.num_rows
            expired += encoded.expired
            markers_skipped += encoded.markers_skipped
            if encoded.rejected:
                divert(encoded.rejected)
            if encoded.frames:
                runtime.run(pub.publish(encoded.frames))
            settle_server_failures()
        runtime.run(pub.drain())
        settle_server_failures()
        runtime.run(pub.drain())  # dead letters sent while settling
        settle_server_failures()
        finished = True
    finally:
        # A failed task leaves nothing behind to be sent after a reconnect.
        runtime.run(pub.close() if finished else pub.abort(), timeout=60)
    message = SinkCommitMessage(partition=partition, published=pub.stored, duplicates=pub.duplicates,
                                dead_lettered=pub.dead_lettered, expired=expired, markers_skipped=markers_skipped)
    log.debug("JetStream sink task finished: %s", message)
    return message


def log_totals(messages: Iterable[Any], batch_id: int | None = None) -> dict[str, int]:
    totals = {"published": 0, "duplicates": 0, "dead_lettered": 0, "expired": 0, "markers_skipped": 0}
    for m in messages:
        if isinstance(m, SinkCommitMessage):
            for key in totals:
                totals[key] += getattr(m, key)
    where = f"batch {batch_id}" if batch_id is not None else "write"
    log.info(
        "JetStream sink %s committed: %d published, %d duplicates dropped by the server, %d dead-lettered, "
        "%d expired before publishing%s",
        where, totals["published"], totals["duplicates"], totals["dead_lettered"], totals["expired"],
        f", {totals['markers_skipped']} delete markers skipped" if totals["markers_skipped"] else "",
    )
    return totals


class JetStreamBatchWriter(DataSourceArrowWriter):
    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        return write_partition(self.plan, iterator)

    def commit(self, messages: list[Any]) -> None:
        log_totals(messages)

    def abort(self, messages: list[Any]) -> None:
        log.warning("JetStream batch write aborted; rows already stored stay in the stream (ids are idempotent).")


class JetStreamStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        return write_partition(self.plan, iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        log_totals(messages, batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:
        log.warning("JetStream micro-batch %s aborted; its replay re-publishes the same msg ids.", batchId)
