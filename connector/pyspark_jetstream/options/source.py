"""The source's options (``spark.read`` / ``spark.readStream`` of a stream or a KV bucket)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from ..errors import OptionError
from ..protocol.kv import is_valid_key_filter
from ..protocol.pull_engine import ConsumeConfig, InvalidConsumeConfig
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
    parse_subject_filters,
    parse_table,
    raw_value,
    user_keys,
)


class StartingPosition(NamedTuple):
    """Where a read starts: ``kind`` is 'earliest', 'latest', 'sequence' (``value`` the first
    sequence read) or 'timestamp' (``value`` a UTC datetime)."""

    kind: str
    value: Any = None


def parse_starting_offsets(raw: str) -> StartingPosition:
    text = raw.strip().lower()
    if text in ("earliest", "latest"):
        return StartingPosition(text)
    if text == "lastpersubject":
        return StartingPosition("last_per_subject")
    if text.isdigit() and int(text) >= 1:
        return StartingPosition("sequence", int(text))
    raise ValueError(raw)


def parse_ending_offsets(raw: str) -> int | None:
    text = raw.strip().lower()
    if text == "latest":
        return None
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError(raw)


def parse_timestamp(raw: str):
    """ISO-8601 with a zone, or epoch milliseconds, as a UTC datetime. A time without a zone is
    refused rather than guessed: UTC, the driver's zone and Spark's session zone would each read it
    differently, and a wrong guess moves the read by hours without a word."""
    import datetime as dt

    text = raw.strip()
    if re.fullmatch(r"\d{1,16}", text):
        return dt.datetime.fromtimestamp(int(text) / 1000, tz=dt.timezone.utc)
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(raw)
    return value.astimezone(dt.timezone.utc)


_TIMESTAMP_ALLOWED = ("Expected an ISO-8601 time with its zone, such as '2026-01-31T12:00:00Z', or epoch "
                      "milliseconds; a time without a zone is ambiguous: append 'Z' for UTC or an offset such as "
                      "'+02:00'.")


def _default_partitions() -> str:
    return str(os.cpu_count() or 2)


SOURCE_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("stream", None, "Expected a stream name without whitespace, '.', '*', '>', '/' or '\\'.",
               "Stream to read (required unless `bucket` is set).", parse_stream_name),
    OptionSpec("subjects", None, "Expected comma-separated subjects, wildcards allowed, such as 'orders.>,refunds.*'.",
               "Only read messages on these subjects (consumer filter subjects). Default: all.", parse_subject_filters),
    OptionSpec("bucket", None, "Expected a KV bucket name (letters, digits, '-' and '_').",
               "Read a KV bucket's change log (stream `KV_<bucket>`); adds the columns `key` and `operation`.",
               parse_name),
    OptionSpec("keys", None, "Expected comma-separated keys of the bucket, the KV wildcards '*' and '>' allowed, such "
               "as 'user42,device.*'.",
               "With `bucket`: read only these keys (a key, or a filter with `*` and `>` as nats-py's `keys()` and "
               "`watch` take it). The latest view of literal keys reads them by batched direct gets, the change "
               "log through a consumer filtered to them: a lookup costs what its keys hold, not what the bucket "
               "holds. A read's own option, so it narrows that read only (SQL: a view or `WITH (...)` per "
               "lookup, see [SQL and Spark Connect](sql-and-connect.md#fast-lookups)).",
               str),
    OptionSpec("startingOffsets", None, "Expected 'earliest', 'latest', 'lastPerSubject' or a stream sequence >= 1 "
               "(inclusive).",
               "Where a new query starts: `earliest`, `latest`, an inclusive stream sequence, or `lastPerSubject`: "
               "the last message of each subject (of each key, live keys only, for a bucket) first, then every "
               "change after it, as a KV watch delivers. Default: `latest` for streaming, `earliest` for batch. "
               "Ignored when the checkpoint has an offset.",
               parse_starting_offsets),
    OptionSpec("kv.view", "changes", "Expected 'changes' or 'latest'.",
               "Batch reads of a bucket: `changes`, the change log (every put, delete and purge); `latest`, the "
               "bucket's current state: one row per live key, as `nats kv ls` and `get` show it.",
               parse_choice("changes", "latest")),
    OptionSpec("startingTimestamp", None, _TIMESTAMP_ALLOWED,
               "Start at the first message stored at or after this time (instead of `startingOffsets`).",
               parse_timestamp),
    OptionSpec("endingOffsets", "latest", "Expected 'latest' or a stream sequence >= 1 (inclusive).",
               "Batch reads only: the last sequence to read, inclusive.", parse_ending_offsets),
    OptionSpec("endingTimestamp", None, _TIMESTAMP_ALLOWED,
               "Batch reads only: end at the last message stored at or before this time (instead of "
               "`endingOffsets`).", parse_timestamp),
    OptionSpec("maxMessagesPerTrigger", None, "Expected an integer >= 1.",
               "Streaming: at most this many sequences per micro-batch (Spark's ReadMaxRows). PySpark 4.2+ (refused "
               "at start before: see [Compatibility](#compatibility)).", parse_int_range(1)),
    OptionSpec("minMessagesPerTrigger", None, "Expected an integer >= 1.",
               "Streaming: a micro-batch waits until at least this many new sequences are there, or until "
               "`maxTriggerDelay` has passed (Kafka's `minOffsetsPerTrigger`). `availableNow` reads what is there. "
               "PySpark 4.2+ (refused at start before).",
               parse_int_range(1)),
    OptionSpec("maxTriggerDelay", "15m", "Expected a duration of at least 1s, such as '15m'.",
               "Streaming, with `minMessagesPerTrigger`: the longest a micro-batch waits for that many sequences.",
               parse_duration_seconds(1.0)),
    OptionSpec("numPartitions", None, "Expected an integer from 1 to 10000.",
               "Spark partitions per read (see `split`). Default: 1 for a streaming read (a stream is one log, "
               "as a Kafka topic of one partition: a copy straight from it keeps each subject's order), the "
               "driver host's core count for a batch read. The count is recorded with each offset, so a "
               "replayed micro-batch is split exactly as its first attempt was.", parse_int_range(1, 10_000)),
    OptionSpec("split", "sequence", "Expected 'sequence' or 'subject'.",
               "How a read is split into partitions. `sequence`: contiguous sequence ranges, each message "
               "delivered once, whatever the subjects; a copy keeps each subject's order through "
               "`.repartition(n, \"subject\")` before the write (the sink refuses a copy without it). `subject`: "
               "each subject's messages are read by one partition, so a copy needs no shuffle, at the price of "
               "the server's work (with many subjects, every partition reads the whole range). See "
               "[Splits](#splits-order-per-subject).",
               parse_choice("sequence", "subject")),
    OptionSpec("failOnDataLoss", "true", "Expected 'true' or 'false'.",
               "Fail when planned sequences were removed from the stream before being read (limits, purge, TTL); "
               "`false` logs a warning with the range and goes on.", parse_bool),
    OptionSpec("bookmarkConsumer", None, "Expected a consumer name (letters, digits, '-' and '_').",
               "Streaming: a durable AckNone consumer of this name is moved to each committed offset, so NATS "
               "tools show the query's progress and lag. Spark's checkpoint stays the source of truth. nats-server "
               "2.14+ (refused at start before).", parse_name),
    OptionSpec("includeMarkers", "true", "Expected 'true' or 'false'.",
               "Keep the delete markers the server places (`marker_reason` set); `false` drops them.", parse_bool),
    OptionSpec("includeHeaders", "true", "Expected 'true' or 'false'.",
               "Include the `headers` column (as Spark's Kafka source names it). `false` leaves it out of the "
               "schema, and the read builds no header map (the columns derived from headers, `ttl`, "
               "`expires_at`, `marker_reason`, a bucket's `operation`, are still there): a read of data the sink "
               "wrote (every message has headers) at the speed of header-less data. A schema given with "
               "`.schema(...)` does the same for any set of columns. See [Columns](#columns-and-headers).",
               parse_bool),
    OptionSpec("batchSize", "10000", "Expected an integer from 1 to 1000000.",
               "Rows per Arrow batch handed to Spark; with the consume buffer it bounds a partition's memory.",
               parse_int_range(1, 1_000_000)),
    OptionSpec("consume.maxMessages", None, "Expected an integer >= 1.",
               "ADR-37 buffer size in messages (default 10000); exclusive with `consume.maxBytes`.", parse_int_range(1)),
    OptionSpec("consume.maxBytes", None, "Expected an integer >= 1.",
               "ADR-37 buffer size in bytes; exclusive with `consume.maxMessages`.", parse_int_range(1)),
    OptionSpec("consume.thresholdMessages", None, "Expected an integer >= 0.",
               "Pull again when fewer messages than this are pending (default 50% of the buffer).", parse_int_range(0)),
    OptionSpec("consume.thresholdBytes", None, "Expected an integer >= 0.",
               "Bytes mode: pull again when fewer bytes than this are pending (default 50%).", parse_int_range(0)),
    OptionSpec("consume.expires", "30s", "Expected a duration of at least 1s, such as '30s'.",
               "Lifetime of each pull request.", parse_duration_seconds(1.0)),
    OptionSpec("consume.idleHeartbeat", None, "Expected a duration from 500ms to 30s, at most half of consume.expires.",
               "Server heartbeat interval; two missed heartbeats trigger a re-pull (default: half of "
               "`consume.expires`, at most 30s).", parse_duration_seconds(0.5)),
    OptionSpec("consume.maxWait", "60s", "Expected a duration of at least 1s, such as '60s'.",
               "Give up a partition with a clear error after this long without progress (server gone, consumer "
               "lost and not recreatable); the driver's planning requests are retried for as long.",
               parse_duration_seconds(1.0)),
)


@dataclass(frozen=True)
class SourceOptions:
    """A read's options, parsed and checked (:func:`parse_source_options`)."""

    connection: ConnectionOptions
    stream: str
    subjects: tuple[str, ...] | None
    bucket: str | None
    starting: StartingPosition
    ending_seq: int | None
    ending_timestamp: Any  # a UTC datetime, or None
    max_messages_per_trigger: int | None
    min_messages_per_trigger: int | None
    max_trigger_delay: float
    num_partitions: int
    split: str
    fail_on_data_loss: bool
    bookmark_consumer: str | None
    include_markers: bool
    batch_size: int
    consume: Any  # pull_engine.ConsumeConfig
    max_wait: float
    api_prefix: str = "$JS.API"  # where JetStream API requests go (options 'domain' / 'apiPrefix')
    split_given: bool = False  # the option 'split' was given (else a checkpoint's recorded split is kept)
    include_headers: bool = True
    columns: tuple[str, ...] | None = None  # the read's columns, in order (None: every column of the schema)
    keys: tuple[str, ...] | None = None  # option 'keys': the bucket's keys (or key filters) read; ``subjects`` holds them
    origin: str | None = None
    """The bucket whose name the keys' subjects carry when it is not ``bucket``: a bucket that mirrors another
    holds the origin's subjects, ``$KV.<origin>.<key>`` (found on the driver: :meth:`mirroring`)."""

    @property
    def key_bucket(self) -> str | None:
        """The bucket name in the subjects of this read's keys (``$KV.<key_bucket>.<key>``)."""
        return self.origin or self.bucket

    def mirroring(self, origin: str) -> SourceOptions:
        """These options for a bucket that mirrors ``origin``: its filters and the subjects of option ``keys``
        name the origin's subjects."""
        if self.bucket is None or origin == self.key_bucket:
            return self
        subjects = self.subjects
        if self.keys is not None:
            subjects = tuple(f"$KV.{origin}.{key}" for key in self.keys)
        return replace(self, origin=origin, subjects=subjects)

    @property
    def literal_keys(self) -> tuple[str, ...] | None:
        """The subjects of option ``keys`` when none is a wildcard (a latest view reads them by direct get)."""
        if self.keys is None or any(t in ("*", ">") for k in self.keys for t in k.split(".")):
            return None
        return self.subjects

    @property
    def filter_subjects(self) -> tuple[str, ...]:
        if self.subjects:
            return self.subjects
        if self.bucket:
            return (f"$KV.{self.key_bucket}.>",)
        return ()


def _check_read_bounds(raw: Mapping[str, str], values: dict[str, Any], given: set[str],
                       starting: StartingPosition) -> None:
    """A batch read's end must not lie before its start, and a latest view takes no end (the state as of
    an earlier point is not what the last message of each key says). Ends are batch-only, so a read
    that sets one is a batch read already at ``load()``."""
    ending = next((name for name in ("endingOffsets", "endingTimestamp") if name.lower() in given), None)
    if ending is None:
        return
    if starting.kind == "last_per_subject":
        view = "kv.view='latest'" if values["kv.view"] == "latest" else "startingOffsets='lastPerSubject'"
        raise OptionError(ending, raw_value(raw, ending),
                          f"{view} reads the current value of each {'key' if values['bucket'] else 'subject'}; it "
                          "takes no end. For the state as of a sequence or a time, read the change log up to it "
                          "(kv.view='changes' or startingOffsets='earliest', with this option) and keep each "
                          "key's last row (a window ordered by 'seq').")
    if starting.kind == "latest":
        raise OptionError("startingOffsets", "latest", "A batch read from 'latest' reads nothing (it starts after "
                          "the last message); use 'earliest', a sequence or 'startingTimestamp', or "
                          "spark.readStream for messages still to come.")
    end_seq, end_time = values["endingOffsets"], values["endingTimestamp"]
    if starting.kind == "sequence" and end_seq is not None and end_seq < starting.value:
        raise OptionError("endingOffsets", raw_value(raw, "endingOffsets"),
                          f"It is before 'startingOffsets' ({starting.value}): the end must be at or after the start.")
    if starting.kind == "timestamp" and end_time is not None and end_time < starting.value:
        raise OptionError("endingTimestamp", raw_value(raw, "endingTimestamp"),
                          f"It is before 'startingTimestamp' ({raw_value(raw, 'startingTimestamp')}): the end must "
                          "be at or after the start.")


def _keys(raw: Mapping[str, str], values: dict[str, Any]) -> tuple[str, ...] | None:
    """Option ``keys``: a bucket's keys or key filters, each checked, in the order given, repeats dropped."""
    text = values["keys"]
    if text is None:
        return None
    if values["bucket"] is None:
        raise OptionError("keys", text, "It applies to KV buckets: set 'bucket' (for a stream, the option 'subjects' "
                          "reads only the subjects it names).")
    if values["subjects"] is not None:
        raise OptionError("keys", text, "Set either 'keys' or 'subjects', not both: a bucket's keys are its "
                          f"subjects '$KV.{values['bucket']}.<key>'.")
    keys = tuple(dict.fromkeys(k.strip() for k in text.split(",")))
    for key in keys:
        if not is_valid_key_filter(key):
            raise OptionError("keys", text, f"'{key}' is not a valid key of a bucket: a key is letters, digits and "
                              "'-', '/', '_', '=', in tokens separated by '.' (no empty token, no blank); a token "
                              "may be '*' (any one token) or, last, '>' (the rest).")
    return keys


def parse_source_options(raw: Mapping[str, str], *, streaming: bool | None,
                         elsewhere: Sequence[OptionSpec] = ()) -> SourceOptions:
    """The read's options; ``streaming=None`` when Spark has not said yet whether the read is a
    batch or a streaming one (``load()``): the checks of one kind only are then left for later.
    ``elsewhere``: the writes' options, named as such when given to a read."""
    values = parse_table(raw, CONNECTION_OPTIONS + SOURCE_OPTIONS, direction="reading", other_direction=elsewhere)
    given = {k.lower() for k in raw}
    connection = connection_from(values)
    if values["bucket"] is not None and values["stream"] is not None:
        raise OptionError("bucket", values["bucket"], "Set either 'stream' or 'bucket', not both.")
    if values["bucket"] is None and values["stream"] is None:
        raise OptionError("stream", None, "Name the stream to read in option 'stream' (or a KV bucket in 'bucket')."
                          + ("" if user_keys(raw) else " " + CATALOG_TABLE_HINT))
    stream = values["stream"] or f"KV_{values['bucket']}"
    keys = _keys(raw, values)
    if values["startingOffsets"] is not None and values["startingTimestamp"] is not None:
        raise OptionError("startingTimestamp", raw_value(raw, "startingTimestamp"),
                          "Set either 'startingOffsets' or 'startingTimestamp', not both.")
    if values["startingTimestamp"] is not None:
        starting = StartingPosition("timestamp", values["startingTimestamp"])
    elif values["startingOffsets"] is not None:
        starting = values["startingOffsets"]
    else:
        starting = StartingPosition("latest" if streaming else "earliest")
    if values["kv.view"] == "latest":
        if values["bucket"] is None:
            raise OptionError("kv.view", "latest", "It applies to KV buckets: set 'bucket' (for a stream, "
                              "startingOffsets='lastPerSubject' reads the last message per subject).")
        if streaming:
            raise OptionError("kv.view", "latest", "It applies to batch reads; a streaming read of the current "
                              "state, then every change, is startingOffsets='lastPerSubject'.")
        for name in ("startingOffsets", "startingTimestamp"):
            if name.lower() in given:
                raise OptionError(name, raw_value(raw, name), "kv.view='latest' reads the current state; it takes "
                                  "no starting position.")
        starting = StartingPosition("last_per_subject")
    for name in ("endingOffsets", "endingTimestamp"):
        if streaming and name.lower() in given:
            raise OptionError(name, raw_value(raw, name), "It applies to batch reads only (spark.read).")
    if "endingoffsets" in given and values["endingTimestamp"] is not None:
        raise OptionError("endingTimestamp", raw_value(raw, "endingTimestamp"),
                          "Set either 'endingOffsets' or 'endingTimestamp', not both.")
    _check_read_bounds(raw, values, given, starting)
    if "maxtriggerdelay" in given and values["minMessagesPerTrigger"] is None:
        raise OptionError("maxTriggerDelay", raw_value(raw, "maxTriggerDelay"),
                          "It applies with 'minMessagesPerTrigger' only.")
    if values["minMessagesPerTrigger"] is not None and values["maxMessagesPerTrigger"] is not None \
            and values["minMessagesPerTrigger"] > values["maxMessagesPerTrigger"]:
        raise OptionError("minMessagesPerTrigger", str(values["minMessagesPerTrigger"]),
                          f"It must not exceed 'maxMessagesPerTrigger' ({values['maxMessagesPerTrigger']}).")
    for name in ("maxMessagesPerTrigger", "minMessagesPerTrigger", "maxTriggerDelay", "bookmarkConsumer"):
        if streaming is False and name.lower() in given:
            raise OptionError(name, values[name], "It applies to streaming reads only (spark.readStream).")
    try:
        consume = ConsumeConfig.build(
            max_messages=values["consume.maxMessages"],
            max_bytes=values["consume.maxBytes"],
            threshold_messages=values["consume.thresholdMessages"],
            threshold_bytes=values["consume.thresholdBytes"],
            expires=values["consume.expires"],
            idle_heartbeat=values["consume.idleHeartbeat"],
        )
    except InvalidConsumeConfig as exc:
        raise OptionError(exc.option, raw.get(exc.option, values.get(exc.option)), f"Expected {exc}.") from None
    return SourceOptions(
        connection=connection, stream=stream, starting=starting, consume=consume, api_prefix=api_prefix(values),
        ending_seq=values["endingOffsets"], max_wait=values["consume.maxWait"], keys=keys,
        num_partitions=values["numPartitions"] or (1 if streaming else int(_default_partitions())), split_given="split" in given,
        subjects=values["subjects"] if keys is None else tuple(f"$KV.{values['bucket']}.{k}" for k in keys),
        **as_fields(values, "bucket", "endingTimestamp", "maxMessagesPerTrigger", "minMessagesPerTrigger",
                    "maxTriggerDelay", "split", "failOnDataLoss", "bookmarkConsumer", "includeMarkers", "batchSize",
                    "includeHeaders"))
