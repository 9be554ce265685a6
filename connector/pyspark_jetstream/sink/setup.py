"""Driver-side preparation of a write: everything checked before a row is published."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from ..client import runtime
from ..errors import JetStreamConnectorError, OptionError
from ..options import parse_sink_options
from . import stream_admin
from .encoder import EncoderConfig, layout_from_schema
from .writer import SinkPlan


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
    layout = layout_from_schema(schema, has_default_subject=opts.subject is not None, bucket=opts.bucket is not None)
    if opts.preserve_expiry and layout.expires_at is None:
        raise OptionError("preserveExpiry", "true", "It needs an 'expires_at' timestamp column; add one or set it to false.")
    needs_ttl = layout.can_carry_ttl or opts.default_ttl is not None or opts.preserve_expiry

    async def check() -> tuple[int, tuple[str, ...] | None]:
        nc = await runtime.connection(opts.connection)
        subjects = None
        if opts.bucket is not None:
            await stream_admin.ensure_bucket(nc, opts, needs_ttl, may_purge=layout.operation is not None)
        elif opts.stream is not None:
            config = await stream_admin.ensure_stream(nc, opts, needs_ttl)
            subjects = tuple(config.get("subjects") or ())
        elif opts.subject is not None and needs_ttl:
            await stream_admin.check_capturing_stream(nc, opts.subject, opts.api_prefix)
        if opts.dead_letter_subject is not None:
            await stream_admin.check_dead_letter_subject(nc, opts.dead_letter_subject, opts.api_prefix)
        return nc.max_payload, subjects

    max_payload, stream_subjects = runtime.run(check(), timeout=opts.connection.connect_timeout * 3 + 30)
    encoder = EncoderConfig(
        default_subject=opts.subject,
        default_ttl=opts.default_ttl,
        preserve_expiry=opts.preserve_expiry,
        expected_stream=opts.stream,
        allow_rollup=opts.allow_rollup,
        max_payload=max_payload,
        bucket=opts.bucket,
    )
    run_id = None if streaming else f"w{uuid.uuid4().hex}"
    return SinkPlan(options=opts, layout=layout, encoder=encoder, run_id=run_id, stream_subjects=stream_subjects)
