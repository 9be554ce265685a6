"""The sink's input contract: which columns a write takes, checked once on the driver.

:func:`layout_from_schema` matches the DataFrame's columns (case-insensitively) against what a
stream write or a KV write (option ``bucket``) publishes from, refuses unknown columns and wrong
types with a message that says what to do, and returns an :class:`InputLayout`: the names of the
columns each task reads and how. It travels to the executors in the
:class:`~pyspark_jetstream.sink.plan.sink_plan.SinkPlan`; the encoder (:mod:`.encoder`) only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import SchemaError

INPUT_COLUMNS = ("subject", "data", "headers", "ttl", "expires_at", "msg_id")
"""Columns the sink publishes from (names matched case-insensitively)."""


KV_INPUT_COLUMNS = ("key", "data", "operation", "headers", "ttl", "expires_at", "msg_id", "expected_revision")
"""Columns a KV write (option ``bucket``) takes: the subject is ``$KV.<bucket>.<key>``."""


KAFKA_COLUMNS = {  # Spark's Kafka sink columns -> this sink's
    "value": "'data'",
    "topic": "'subject'",
    "partition": "none: the stream and its subjects decide where a message goes",
}


SOURCE_ONLY_COLUMNS = ("stream", "seq", "timestamp", "marker_reason", "key", "operation")
"""Columns the source produces (``key``/``operation`` for a KV bucket) and the sink does not publish,
so a read DataFrame can be written back; ``stream``/``seq``/``marker_reason`` steer it (module docstring)."""


KV_IGNORED_COLUMNS = ("subject", "stream", "seq", "timestamp", "marker_reason")
"""A bucket read's columns a KV write does not take from (its ``subject`` is the source bucket's; a
``subject`` column without the read's ``stream`` and ``seq`` is refused: the ``key`` decides)."""


@dataclass(frozen=True)
class InputLayout:
    """Which input columns exist (by their name in the DataFrame) and how to read them."""

    subject: str | None = None
    data: str = "data"
    data_is_binary: bool = True
    headers: str | None = None
    headers_multi: bool = False
    ttl: str | None = None
    expires_at: str | None = None
    msg_id: str | None = None
    source_stream: str | None = None  # the source's ``stream`` and ``seq`` columns, when both are there
    source_seq: str | None = None
    source_timestamp: str | None = None  # the source's ``timestamp`` column, beside ``stream`` and ``seq``
    marker_reason: str | None = None  # the source's ``marker_reason`` column (rows set there are skipped)
    key: str | None = None  # KV writes: the key, the operation and the compare-and-set revision
    operation: str | None = None
    expected_revision: str | None = None

    @property
    def as_read(self) -> bool:
        """The rows came from this connector's source (module docstring, "Rows as read")."""
        return self.source_stream is not None

    @property
    def can_carry_ttl(self) -> bool:
        return self.ttl is not None


def layout_from_schema(schema: Any, *, has_default_subject: bool, bucket: bool = False) -> InputLayout:
    """Check a Spark ``StructType`` against the sink's input contract (a KV write's with ``bucket``)."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        MapType,
        ShortType,
        StringType,
        StructType,
        TimestampNTZType,
        TimestampType,
    )

    by_name = _columns_by_name(schema, bucket)

    if "data" not in by_name:
        raise SchemaError("The JetStream sink needs a 'data' column (binary or string; null means an empty payload).")
    data = by_name["data"]
    if isinstance(data.dataType, (StructType, ArrayType, MapType)):
        raise SchemaError(
            f"Column '{data.name}' has type {data.dataType.simpleString()}; expected binary or string. Serialise it "
            f"first, e.g. .withColumn('{data.name}', to_json('{data.name}')), or build it from other columns with "
            f".withColumn('{data.name}', to_json(struct(...))) (pyspark.sql.functions).")
    if not isinstance(data.dataType, (BinaryType, StringType)):
        raise _bad_type(by_name, "data", "binary or string")
    # A source position (the connector's own `stream` and `seq`) makes generated ids content-addressed.
    source_stream, source_seq = by_name.get("stream"), by_name.get("seq")
    has_position = (source_stream is not None and isinstance(source_stream.dataType, StringType)
                    and source_seq is not None and isinstance(source_seq.dataType, (LongType, IntegerType)))

    if bucket:
        subject = None  # $KV.<bucket>.<key>
        kv = _kv_columns(by_name, has_position)
    else:
        subject = _stream_subject(by_name, has_default_subject)
        kv = {"key": None, "operation": None, "expected_revision": None}

    headers = by_name.get("headers")
    multi = False
    if headers is not None:
        t = headers.dataType
        ok_key = isinstance(t, MapType) and isinstance(t.keyType, StringType)
        if ok_key and isinstance(t.valueType, StringType):
            multi = False
        elif ok_key and isinstance(t.valueType, ArrayType) and isinstance(t.valueType.elementType, StringType):
            multi = True
        else:
            raise _bad_type(by_name, "headers", "map<string,string> or map<string,array<string>>")

    ttl = by_name.get("ttl")
    if ttl is not None and not isinstance(ttl.dataType, (StringType, IntegerType, LongType, ShortType)):
        raise _bad_type(by_name, "ttl", "string or integer")
    expires_at = by_name.get("expires_at")
    if expires_at is not None and not isinstance(expires_at.dataType, (TimestampType, TimestampNTZType)):
        raise _bad_type(by_name, "expires_at", "timestamp")
    msg_id = by_name.get("msg_id")
    if msg_id is not None and not isinstance(msg_id.dataType, StringType):
        raise _bad_type(by_name, "msg_id", "string")
    # The source's timestamp tells apart two servers' (or domains') streams of one name in generated ids.
    source_ts = by_name.get("timestamp")
    has_ts = has_position and source_ts is not None and isinstance(source_ts.dataType, (TimestampType,
                                                                                        TimestampNTZType))
    return InputLayout(
        subject=subject.name if subject is not None else None,
        data=data.name,
        data_is_binary=isinstance(data.dataType, BinaryType),
        headers=headers.name if headers is not None else None,
        headers_multi=multi,
        ttl=ttl.name if ttl is not None else None,
        expires_at=expires_at.name if expires_at is not None else None,
        msg_id=msg_id.name if msg_id is not None else None,
        source_stream=source_stream.name if has_position else None,
        source_seq=source_seq.name if has_position else None,
        source_timestamp=source_ts.name if has_ts else None,
        marker_reason=by_name["marker_reason"].name if "marker_reason" in by_name else None,
        **kv,
    )

def _columns_by_name(schema: Any, bucket: bool) -> dict[str, Any]:
    """The schema's fields by lower-cased name; columns differing only in case, or unknown, refused."""
    by_name: dict[str, Any] = {}
    for fld in schema.fields:
        lowered = fld.name.lower()
        if lowered in by_name:
            raise SchemaError(f"Columns '{by_name[lowered].name}' and '{fld.name}' differ only in case; keep one.")
        by_name[lowered] = fld
    accepted, ignored = (KV_INPUT_COLUMNS, KV_IGNORED_COLUMNS) if bucket else (INPUT_COLUMNS, SOURCE_ONLY_COLUMNS)
    unknown = [f.name for f in schema.fields if f.name.lower() not in accepted + ignored]
    if unknown:
        kafka = [f"'{u}' -> {KAFKA_COLUMNS[u.lower()]}" for u in unknown if u.lower() in KAFKA_COLUMNS]
        hint = f" Kafka's sink columns have JetStream names: {'; '.join(kafka)}." if kafka else ""
        target = "a KV bucket ('bucket')" if bucket else "the JetStream sink"
        whose = "ignored in a bucket read's rows" if bucket else "ignored"
        raise SchemaError(
            f"Unknown column(s) {', '.join(repr(u) for u in unknown)} for {target}.{hint} Accepted "
            f"columns: {', '.join(accepted)} (and, {whose}, {', '.join(ignored)}). Select or rename "
            "columns before writing."
        )

    return by_name


def _bad_type(by_name: dict[str, Any], name: str, want: str) -> SchemaError:
    return SchemaError(f"Column '{by_name[name].name}' has type {by_name[name].dataType.simpleString()}; expected {want}.")


def _kv_columns(by_name: dict[str, Any], has_position: bool) -> dict[str, str | None]:
    """A KV write's key, operation and compare-and-set revision columns (by their names in the DataFrame)."""
    from pyspark.sql.types import IntegerType, LongType, ShortType, StringType

    kv: dict[str, str | None] = {"key": None, "operation": None, "expected_revision": None}
    if "key" not in by_name:
        raise SchemaError("A KV write (option 'bucket') needs a 'key' column (string).")
    if "subject" in by_name and not has_position:
        # Only a bucket read's own rows (with its `stream` and `seq`) keep their `$KV.<source>.<key>` subject,
        # ignored; anywhere else a subject column says the user expects it to steer the write.
        raise SchemaError(
            f"Column '{by_name['subject'].name}' is not used by a KV write (option 'bucket'): the 'key' column "
            "decides the subject ($KV.<bucket>.<key>). Drop or rename the column, or put the key in 'key'.")
    for name, types, want in (("key", (StringType,), "string"), ("operation", (StringType,), "string"),
                              ("expected_revision", (LongType, IntegerType, ShortType), "long")):
        if name in by_name:
            if not isinstance(by_name[name].dataType, types):
                raise _bad_type(by_name, name, want)
            kv[name] = by_name[name].name
    return kv


def _stream_subject(by_name: dict[str, Any], has_default_subject: bool) -> Any:
    """A stream write's ``subject`` column (a string), or None where option ``subject`` stands in for it."""
    from pyspark.sql.types import StringType

    subject = by_name.get("subject")
    if subject is not None and not isinstance(subject.dataType, StringType):
        raise _bad_type(by_name, "subject", "string")
    if subject is None and not has_default_subject:
        kafka_key = "key" in by_name and "operation" not in by_name  # a Kafka habit, not a bucket read
        raise SchemaError(
            "Rows need a subject: add a 'subject' column (string) or set the option 'subject'."
            + (" The 'key' column is not one: in JetStream the subject does the job of Kafka's key (rename "
               "it to 'subject'), or write key operations to a KV bucket with the option 'bucket'."
               if kafka_key else ""))
    return subject


@dataclass(frozen=True)
class EncoderConfig:
    default_subject: str | None
    default_ttl: str | None  # already resolved header value, None for no TTL
    preserve_expiry: bool
    expected_stream: str | None
    allow_rollup: bool
    max_payload: int
    bucket: str | None = None  # a KV write: subjects are $KV.<bucket>.<key>, rows are key operations
