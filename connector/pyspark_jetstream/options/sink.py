"""The sink's options (``df.write`` / ``df.writeStream`` to a stream or, with ``bucket``, to a KV bucket)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import OptionError
from ..protocol.kv import BucketSettings
from ..protocol.stream_rules import StreamRequest, StreamSettings
from ..protocol.ttl import ALLOWED_TTL
from . import kv
from .connection import CONNECTION_OPTIONS, ConnectionOptions, api_prefix, connection_from
from .spec import (
    CATALOG_TABLE_HINT,
    OptionSpec,
    as_fields,
    parse_bool,
    parse_choice,
    parse_duration_seconds,
    parse_int_range,
    parse_name,
    parse_stream_name,
    parse_subject,
    parse_subject_filters,
    parse_table,
    parse_ttl_option,
    user_keys,
)


def parse_write_id(raw: str) -> str:
    text = raw.strip()
    if not re.fullmatch(r"[-_=a-zA-Z0-9]{1,200}", text):
        raise ValueError(raw)
    return text


SINK_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("stream", None, "Expected a stream name without whitespace, '.', '*', '>', '/' or '\\'.",
               "Target stream. When set, every publish carries `Nats-Expected-Stream` and the stream is checked "
               "at query start (see `ensureStream`).", parse_stream_name),
    OptionSpec("subject", None, "Expected a publish subject without wildcards or whitespace, such as 'orders.new'.",
               "Subject for rows without a `subject` column (or whose `subject` is null).", parse_subject),
    OptionSpec("defaultTtl", None, ALLOWED_TTL,
               "TTL for rows whose `ttl` is null; a row's own `ttl` overrides it.", parse_ttl_option),
    OptionSpec("preserveExpiry", "false", "Expected 'true' or 'false'.",
               "Take each row's TTL from `expires_at` (remaining lifetime, rounded up to whole seconds); "
               "rows already expired are counted and not published.", parse_bool),
    OptionSpec("ensureStream", "validate", "Expected one of 'validate', 'create', 'update'.",
               "`validate`: the stream must exist and allow TTLs when rows can carry one; `create`: create it "
               "when missing; `update`: also enable AllowMsgTTL / set SubjectDeleteMarkerTTL on an existing stream.",
               parse_choice("validate", "create", "update")),
    OptionSpec("idempotent", "true", "Expected 'true' or 'false'.",
               "Give rows without `msg_id` a deterministic `Nats-Msg-Id` (the run, and the source message and "
               "content, or the partition and row: see Guarantees) so that retries and restarts are de-duplicated "
               "by the server.", parse_bool),
    OptionSpec("writeId", None, "Expected letters, digits, '-', '_' or '=' (at most 200).",
               "Batch writes: a stable id of this write (e.g. the scheduler's run id). A retried `save()` with the "
               "same id gives every row the id it had and stores nothing twice, however late it runs (see "
               "[Guarantees](#guarantees)). Default: a new id per `save()`.", parse_write_id),
    OptionSpec("sinkState", "SPARK_JETSTREAM_SINK", "Expected a KV bucket name (letters, digits, '-' and '_'), "
               "or 'none'.",
               "KV bucket where the sink records, per micro-batch (and per `writeId`), where the target stood "
               "before it published, so that a replay later than the duplicate window publishes only what is "
               "missing; created when missing. `none`: exactly-once only within the duplicate window.",
               lambda raw: None if raw.strip().lower() == "none" else parse_name(raw)),
    OptionSpec("sinkState.ttl", "168h", "Expected a duration of at least 1m, such as '168h'.",
               "How long the sink's records live (the state bucket's MaxAge when the sink creates it): a replay "
               "or a `writeId` retry later than this may store rows again.", parse_duration_seconds(60.0)),
    OptionSpec("order", "subject", "Expected 'subject' or 'none'.",
               "`subject`: each subject's (each key's) rows are published in their source order: a task publishes "
               "rows that carry the source's `stream` and `seq` in `seq` order, and a write whose rows come straight "
               "from a read split into several sequence ranges is refused before it publishes (add "
               "`.repartition(n, \"subject\")`). `none`: rows are published as they come. See "
               "[Splits](source.md#splits-order-per-subject).", parse_choice("subject", "none")),
    OptionSpec("order.maxBufferBytes", "268435456", "Expected an integer from 1048576 (1 MiB) up.",
               "With `order=subject`: the rows (Arrow bytes) a write task holds in memory to put them in source "
               "order, about its peak memory for them (measured: 1.01 to 1.10 times it); beyond it, they are "
               "spilled as a sorted run to a file under Spark's local directories, and the runs are merged. See "
               "[Order: memory and spill](#order-memory-and-spill).",
               parse_int_range(1 << 20)),
    OptionSpec("maxPendingAcks", "4096", "Expected an integer from 1 to 1000000.",
               "How many publishes may await their PubAck at once.", parse_int_range(1, 1_000_000)),
    OptionSpec("ackTimeout", "30s", "Expected a duration of at least 1s, such as '30s'.",
               "Fail the task when no PubAck arrives for this long while publishes are outstanding.",
               parse_duration_seconds(1.0)),
    OptionSpec("publish.mode", "auto", "Expected one of 'auto', 'batched', 'acked'.",
               "How rows are published to a stream or bucket. `batched`: in fast-ingest batches (nats-server "
               "2.14.3+, a stream with `allow_batched`; one batch per task, a flow ack every "
               "few hundred rows instead of a PubAck per row); a write that cannot use them fails at start saying "
               "why. `acked`: every row awaits its own PubAck. `auto`: batched where the target allows it, else "
               "acked (the driver logs why once). See [Publish modes](#publish-modes).",
               parse_choice("auto", "batched", "acked")),
    OptionSpec("deadLetterSubject", None, "Expected a publish subject without wildcards, captured by a stream.",
               "Rows rejected by the server or by client-side validation are published here (original subject "
               "and data, headers naming the error) instead of failing the write.", parse_subject),
    OptionSpec("allowRollup", "false", "Expected 'true' or 'false'.",
               "Allow a `Nats-Rollup` header in the `headers` column (it purges other messages).", parse_bool),
    OptionSpec("stream.subjects", None, "Expected comma-separated subjects, wildcards allowed, such as 'orders.>'.",
               "Subjects of a stream created by `ensureStream=create` (default: the `subject` option).",
               parse_subject_filters),
    OptionSpec("stream.storage", "file", "Expected 'file' or 'memory'.",
               "Storage of a created stream.", parse_choice("file", "memory")),
    OptionSpec("stream.replicas", "1", "Expected an integer from 1 to 5.",
               "Replicas of a created stream.", parse_int_range(1, 5)),
    OptionSpec("stream.maxAge", "0", "Expected a duration such as '24h', or 0 for unlimited.",
               "MaxAge of a created stream.", parse_duration_seconds(0.0)),
    OptionSpec("stream.maxMsgsPerSubject", "-1", "Expected an integer >= -1 (-1 for unlimited).",
               "MaxMsgsPerSubject of a created stream.", parse_int_range(-1)),
    OptionSpec("stream.duplicateWindow", "2m", "Expected a duration of at least 1s, such as '2m'.",
               "Duplicate window of a created stream: how long `Nats-Msg-Id` de-duplication lasts.",
               parse_duration_seconds(1.0)),
    OptionSpec("stream.subjectDeleteMarkerTtl", None, "Expected a duration of at least 1s, such as '15m' (ADR-43 minimum).",
               "SubjectDeleteMarkerTTL for `create`/`update`: the server places a `MaxAge` marker when the last "
               "message of a subject expires.", parse_duration_seconds(1.0)),
)


@dataclass(frozen=True)
class SinkOptions:
    """A write's options, parsed and checked (:func:`parse_sink_options`)."""

    connection: ConnectionOptions
    stream: str | None
    subject: str | None
    default_ttl: str | None
    preserve_expiry: bool
    ensure_stream: str
    idempotent: bool
    max_pending_acks: int
    ack_timeout: float
    dead_letter_subject: str | None
    allow_rollup: bool
    stream_settings: StreamSettings
    api_prefix: str = "$JS.API"  # where JetStream API requests go (options 'domain' / 'apiPrefix')
    bucket: str | None = None  # a KV bucket instead of a stream (KV_SINK_OPTIONS)
    ensure_bucket: str = "validate"
    bucket_settings: BucketSettings | None = None
    write_id: str | None = None  # a batch write's stable id (option 'writeId')
    state_bucket: str | None = "SPARK_JETSTREAM_SINK"  # where replays find what was stored (None: off)
    state_ttl: float = 7 * 86400.0
    sequence_by: str | None = None  # a KV write's ordering column (option 'sequenceBy', sink/reduce/sequencer.py)
    order: str = "subject"  # 'subject': each subject's rows in source order (sink/order/decide.py); 'none'
    order_max_buffer_bytes: int = 1 << 28
    publish_mode: str = "auto"  # 'auto' | 'batched' | 'acked' (option 'publish.mode', sink/plan/publish_mode.py)

    @property
    def stream_request(self) -> StreamRequest:
        """What ``ensureStream`` asks of the target stream, as :mod:`pyspark_jetstream.protocol.stream_rules` takes it."""
        return StreamRequest(self.stream, self.subject, self.ensure_stream, self.stream_settings)


def check_write_has_options(raw: Mapping[str, str]) -> None:
    """A write with no option at all is a catalog table's INSERT whose OPTIONS Spark kept back (see
    :data:`CATALOG_TABLE_HINT`), never a write meant for a default server: refuse it, saying why."""
    if not user_keys(raw):
        raise OptionError("servers", None, CATALOG_TABLE_HINT)


def parse_sink_options(raw: Mapping[str, str], *, elsewhere: Sequence[OptionSpec] = ()) -> SinkOptions:
    """The write's options; ``elsewhere``: the reads' options, named as such when given to a write."""
    values = parse_table(raw, CONNECTION_OPTIONS + SINK_OPTIONS + kv.KV_SINK_OPTIONS, direction="writing",
                         other_direction=elsewhere)
    connection = connection_from(values)
    bucket_settings = kv.bucket_settings(raw, values)
    ensure = values["ensureStream"]
    if ensure in ("create", "update") and values["stream"] is None:
        raise OptionError("stream", None, f"ensureStream={ensure!r} needs the target stream's name in option 'stream'.")
    settings = StreamSettings(**as_fields(values, "subjects", "storage", "replicas", "maxAge", "maxMsgsPerSubject",
                                          "duplicateWindow", "subjectDeleteMarkerTtl", group="stream."))
    if ensure == "create" and settings.subjects is None and values["subject"] is None:
        raise OptionError(
            "stream.subjects", None, "ensureStream='create' needs the subjects of the new stream, e.g. 'orders.>'."
        )
    if (
        values["deadLetterSubject"] is not None
        and values["subject"] is not None
        and values["deadLetterSubject"] == values["subject"]
    ):
        raise OptionError("deadLetterSubject", values["deadLetterSubject"], "It must differ from option 'subject'.")
    return SinkOptions(
        connection=connection, ensure_stream=ensure, stream_settings=settings, bucket_settings=bucket_settings,
        api_prefix=api_prefix(values), state_bucket=values["sinkState"], state_ttl=values["sinkState.ttl"],
        order=values["order"], order_max_buffer_bytes=values["order.maxBufferBytes"],
        publish_mode=values["publish.mode"],
        **as_fields(values, "stream", "subject", "defaultTtl", "preserveExpiry", "idempotent", "writeId",
                    "maxPendingAcks", "ackTimeout", "deadLetterSubject", "allowRollup", "bucket", "ensureBucket",
                    "sequenceBy"))

