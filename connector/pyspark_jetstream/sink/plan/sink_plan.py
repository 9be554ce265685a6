"""Driver-side preparation of a write: everything checked before a row is published."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...client import jsapi, runtime
from ...errors import JetStreamApiError, JetStreamConnectorError, OptionError
from ...logs import get_logger
from ...options import SinkOptions, parse_sink_options
from ...protocol import kv
from ...protocol.durability import durability_risks
from ...spark_api import ARROW_STREAM_WRITER
from ..encode.layout import EncoderConfig, InputLayout, layout_from_schema
from ..records import replay_guard
from ..records.replay_guard import GuardPlan
from ..reduce import sequencer
from ..reduce.sequencer import SequencePlan
from . import publish_mode, stream_admin
from .publish_mode import PublishMode

log = get_logger("sink")


@dataclass(frozen=True)
class SinkPlan:
    options: SinkOptions
    layout: InputLayout
    encoder: EncoderConfig
    run_id: str | None  # fixed on the driver for batch writes; None for streaming
    guard: GuardPlan | None = None  # exactly-once past the duplicate window (replay_guard)
    stream_subjects: tuple[str, ...] | None = None  # the subjects of option 'stream', as checked at start
    sequence: SequencePlan | None = None  # option 'sequenceBy' (sink/reduce/sequencer.py)
    row_schema: Any = None  # the input's pyarrow.Schema, where Spark gives the writer rows (row_batches)
    publish: PublishMode = PublishMode()  # fast-ingest batches or a PubAck per row (option 'publish.mode')



def plan_sink(raw_options: Mapping[str, str], schema: Any, *, overwrite: bool, streaming: bool) -> SinkPlan:
    """Parse options, check the columns and the stream (creating or updating it per
    ``ensureStream``); raises before the query runs when anything is off.

    A streaming query in ``complete`` output mode arrives with ``overwrite=True``:
    like Spark's Kafka sink, each micro-batch publishes the whole result table
    (with ``MaxMsgsPerSubject=1`` per key, the stream keeps the latest). A batch
    ``mode("overwrite")`` cannot be honoured, a stream is not replaced by a write."""
    if overwrite and not streaming:
        raise JetStreamConnectorError(
            "The JetStream sink only appends: a stream cannot be overwritten by a write. Use mode('append')."
        )
    opts = parse_sink_options(raw_options)
    row_schema = None
    if streaming and not ARROW_STREAM_WRITER:
        from ..encode.row_batches import arrow_schema_of

        row_schema = arrow_schema_of(schema)  # the rows' own schema, before sequenceBy adds a column
    sequence_column = None
    if opts.sequence_by is not None:
        try:
            sequence_column, sequence_tag, schema = sequencer.sequence_column(schema, opts.sequence_by)
        except ValueError as exc:
            raise OptionError("sequenceBy", opts.sequence_by, str(exc)) from None
    layout = layout_from_schema(schema, has_default_subject=opts.subject is not None, bucket=opts.bucket is not None)
    if sequence_column is not None and layout.expected_revision is not None:
        raise OptionError("sequenceBy", opts.sequence_by, f"It sets each key's compare-and-set revision itself; drop "
                          f"the column '{layout.expected_revision}' (expected_revision) or the option.")
    if opts.preserve_expiry and layout.expires_at is None:
        raise OptionError("preserveExpiry", "true", "It needs an 'expires_at' timestamp column; add one or set it to false.")
    needs_ttl = layout.can_carry_ttl or opts.default_ttl is not None or opts.preserve_expiry

    direct = False
    mode = PublishMode()

    async def check() -> tuple[int, tuple[str, ...] | None]:
        nonlocal direct, mode
        nc = await runtime.connection(opts.connection)
        subjects = None
        if opts.bucket is not None:
            await stream_admin.ensure_bucket(nc, opts, needs_ttl, may_purge=layout.operation is not None)
        elif opts.stream is not None:
            config = await stream_admin.ensure_stream(nc, opts, needs_ttl)
            subjects = tuple(config.get("subjects") or ())
        elif opts.subject is not None and needs_ttl:
            await stream_admin.check_capturing_stream(nc, opts.subject, opts.api_prefix)
        target = kv.stream_name(opts.bucket) if opts.bucket is not None else opts.stream
        info = None
        if target is not None:
            info = await jsapi.stream_info(nc, target, opts.api_prefix)
            direct = bool(((info or {}).get("config") or {}).get("allow_direct"))
            risks = durability_risks(info) if info else []
            if risks:
                log.warning("Stream %s may lose writes the server acknowledged: %s. Exactly-once holds only for "
                            "what the server keeps (see docs/guarantees.md).", target, "; ".join(risks))
        if opts.dead_letter_subject is not None:
            await stream_admin.check_dead_letter_subject(nc, opts.dead_letter_subject, opts.api_prefix)
        mode = publish_mode.decide(nc, opts, (info or {}).get("config"))
        return nc.max_payload, subjects

    guard = _guard_plan(opts, streaming)

    async def state() -> None:
        nc = await runtime.connection(opts.connection)
        await replay_guard.ensure_bucket(nc, guard.bucket, opts.state_ttl, opts.api_prefix)

    max_payload, stream_subjects = runtime.run(check(), timeout=opts.connection.connect_timeout * 3 + 30)
    if guard is not None:
        try:
            runtime.run(state(), timeout=opts.connection.connect_timeout * 3 + 30)
        except JetStreamApiError as exc:
            log.warning("The sink's state bucket %s cannot be used (%s): a replay of a micro-batch (or a retry "
                        "of writeId %s) later than the target's duplicate window may store rows again. Allow this "
                        "user to create and write KV bucket %s, or set option 'sinkState' to a bucket it may use.",
                        guard.bucket, exc, opts.write_id, guard.bucket)
            guard = None
    encoder = EncoderConfig(
        default_subject=opts.subject,
        default_ttl=opts.default_ttl,
        preserve_expiry=opts.preserve_expiry,
        expected_stream=opts.stream,
        allow_rollup=opts.allow_rollup,
        max_payload=max_payload,
        bucket=opts.bucket,
    )
    if streaming:
        run_id = None
    elif opts.write_id is not None:
        run_id = f"wid-{opts.write_id}"  # a retried save() gives every row the id it had
    else:
        run_id = f"w{uuid.uuid4().hex}"
    sequence = None
    if sequence_column is not None:
        sequence = sequencer.SequencePlan(column=sequence_column, tag=sequence_tag, direct=direct)
    return SinkPlan(options=opts, layout=layout, encoder=encoder, run_id=run_id, guard=guard,
                    stream_subjects=stream_subjects, sequence=sequence, row_schema=row_schema, publish=mode)


def _guard_plan(opts: Any, streaming: bool) -> replay_guard.GuardPlan | None:
    """Exactly-once past the duplicate window (``replay_guard``): for micro-batches and for batch writes with
    a ``writeId``, when ids are generated and the target stream is known (``stream`` or ``bucket``)."""
    if opts.write_id is not None and streaming:
        raise OptionError("writeId", opts.write_id, "It applies to batch writes; a streaming query's micro-batches "
                          "are identified by the query id and batch id.")
    if not opts.idempotent or opts.state_bucket is None or not (streaming or opts.write_id is not None):
        return None
    target = kv.stream_name(opts.bucket) if opts.bucket is not None else opts.stream
    if target is None:
        return None
    return replay_guard.GuardPlan(bucket=opts.state_bucket, target_stream=target, token=replay_guard.new_token(),
                                  api_prefix=opts.api_prefix, ack_timeout=opts.ack_timeout)
