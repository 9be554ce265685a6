"""Turning the sink's input rows into NATS ``HPUB`` frames, free of I/O.

:func:`layout_from_schema` checks the DataFrame's columns once on the driver;
:class:`BatchEncoder` then turns each Arrow ``RecordBatch`` into ready-to-send
frames, one per row, plus the rows it refused and the rows already expired.
Per-row work is kept to string building: columns are materialised once per
batch and validated subjects are cached, because subjects repeat.

Header precedence per row (each is validated like the column it stands for):

* TTL: ``expires_at`` (with ``preserveExpiry``) > ``ttl`` column > a ``Nats-TTL``
  entry in ``headers`` > option ``defaultTtl``. A zero TTL means no header.
* Msg id: ``msg_id`` column > a ``Nats-Msg-Id`` entry in ``headers`` > the
  deterministic id (option ``idempotent``), see :class:`MsgIds`. An empty id is
  no id (it falls through, as a null does).

**Rows as read.** A DataFrame that carries the source's ``stream`` and ``seq``
columns holds rows as this connector read them, and its ``headers`` are what the
server stored, including headers the server or the original publisher's client
owns. From such rows the sink leaves out every header named ``Nats-*`` (NATS
reserves the prefix for headers the server acts on or writes: expected-stream and
expected-sequence checks, markers, roll-ups, message ids, TTLs, counters, batches,
schedules), because re-sending them would be refused or would change what the
server does; their effect travels in the ``ttl`` and ``msg_id`` columns. With
``allowRollup`` a ``Nats-Rollup`` is kept (a copy that re-applies roll-ups, such
as KV purges). Delete markers (``marker_reason`` set) are skipped and counted:
null the column to write them as ordinary rows. Rows without the source's
columns are the user's own and their headers are checked as such.

**The sequence header is the option's.** ``Spark-JetStream-Sequence``
(:data:`~pyspark_jetstream.protocol.headers.SEQUENCE`) holds a KV value's order for
option ``sequenceBy`` (sink/sequencer.py), and only the option writes it. From rows
as read it is left out, like the ``Nats-*`` headers: a copy of a bucket written with
the option would otherwise carry the source's values into the target, after the
option's own line, and a look-up keeps the last; the target would compare with the
source's order (older rows win, newer ones are skipped, another type fails). In the
user's own rows it is refused, in any case (``int:9223372036854775807`` would pin a
key against every writer with the option). Both hold with or without the option on
this write: a target written without it may be written with it later.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import operator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ...errors import SchemaError
from ...protocol import headers as hdrs
from ...protocol import kv
from ...protocol.frames import hpub_frame
from ...protocol.headers import MSG_ID, TTL
from ...protocol.subjects import is_receivable_subject
from ...protocol.ttl import InvalidTtl, TtlResolver, remaining_ttl_seconds

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

_MAX_SHOWN = 120


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

    def bad_type(name: str, want: str) -> SchemaError:
        return SchemaError(f"Column '{by_name[name].name}' has type {by_name[name].dataType.simpleString()}; expected {want}.")

    if "data" not in by_name:
        raise SchemaError("The JetStream sink needs a 'data' column (binary or string; null means an empty payload).")
    data = by_name["data"]
    if isinstance(data.dataType, (StructType, ArrayType, MapType)):
        raise SchemaError(
            f"Column '{data.name}' has type {data.dataType.simpleString()}; expected binary or string. Serialise it "
            f"first, e.g. .withColumn('{data.name}', to_json('{data.name}')), or build it from other columns with "
            f".withColumn('{data.name}', to_json(struct(...))) (pyspark.sql.functions).")
    if not isinstance(data.dataType, (BinaryType, StringType)):
        raise bad_type("data", "binary or string")
    # A source position (the connector's own `stream` and `seq`) makes generated ids content-addressed.
    source_stream, source_seq = by_name.get("stream"), by_name.get("seq")
    has_position = (source_stream is not None and isinstance(source_stream.dataType, StringType)
                    and source_seq is not None and isinstance(source_seq.dataType, (LongType, IntegerType)))

    kv: dict[str, str | None] = {"key": None, "operation": None, "expected_revision": None}
    if bucket:
        subject = None  # $KV.<bucket>.<key>
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
                    raise bad_type(name, want)
                kv[name] = by_name[name].name
    else:
        subject = by_name.get("subject")
        if subject is not None and not isinstance(subject.dataType, StringType):
            raise bad_type("subject", "string")
        if subject is None and not has_default_subject:
            kafka_key = "key" in by_name and "operation" not in by_name  # a Kafka habit, not a bucket read
            raise SchemaError(
                "Rows need a subject: add a 'subject' column (string) or set the option 'subject'."
                + (" The 'key' column is not one: in JetStream the subject does the job of Kafka's key (rename "
                   "it to 'subject'), or write key operations to a KV bucket with the option 'bucket'."
                   if kafka_key else ""))

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
            raise bad_type("headers", "map<string,string> or map<string,array<string>>")

    ttl = by_name.get("ttl")
    if ttl is not None and not isinstance(ttl.dataType, (StringType, IntegerType, LongType, ShortType)):
        raise bad_type("ttl", "string or integer")
    expires_at = by_name.get("expires_at")
    if expires_at is not None and not isinstance(expires_at.dataType, (TimestampType, TimestampNTZType)):
        raise bad_type("expires_at", "timestamp")
    msg_id = by_name.get("msg_id")
    if msg_id is not None and not isinstance(msg_id.dataType, StringType):
        raise bad_type("msg_id", "string")
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


@dataclass(frozen=True)
class EncoderConfig:
    default_subject: str | None
    default_ttl: str | None  # already resolved header value, None for no TTL
    preserve_expiry: bool
    expected_stream: str | None
    allow_rollup: bool
    max_payload: int
    bucket: str | None = None  # a KV write: subjects are $KV.<bucket>.<key>, rows are key operations


CONTENT_SEEN_MAX = 1 << 19
"""Content digests a task remembers to count repeats (about 50 MB); past this it starts over (:class:`MsgIds`)."""


class MsgIds:
    """The deterministic ``Nats-Msg-Id`` of each row of one task (option ``idempotent``).

    ``run`` is ``<queryId>:<batchId>`` for a streaming micro-batch (both survive a
    restart from the checkpoint) or a driver-made ``w<uuid>`` for a batch write.

    * Rows that carry a source position (this connector's ``stream`` and ``seq``
      columns, as every stream-to-stream copy does) get
      ``<run>:<stream>.<seq>:<digest>``, content-addressed: ``digest`` is 16 hex
      digits of a BLAKE2b hash (stable across processes, unlike ``hash()``) of
      what the row publishes and of its source message: the subject (a KV write's
      key, operation and expected revision), the data, the ``headers``, ``ttl``
      and ``expires_at`` columns when present, and the source's ``timestamp``
      when present (two servers' or domains' streams of one name hold different
      messages at the same ``seq``; their timestamps differ). So a replay gives
      every row the id it had, however the rows are split into tasks or whichever
      messages expired in between, and rows made from one message by any plan
      (a union, a join that fans it out into rows in different tasks, an
      ``explode``) get distinct ids as long as they differ in any of these.
    * Rows identical in all of that (``df.union(df)``) are told apart only inside
      one task, by an occurrence count: the second and later get ``.<k>``
      appended (k = 1, 2, ...), wherever they are in the task (the task counts
      up to :data:`CONTENT_SEEN_MAX` ids, then starts over). Identical rows in
      different tasks share an id: the server stores one, and the others show in
      the commit log line's "duplicates dropped by the server" count.
    * Other rows get ``<run>:<partition>:<position>``: stable as long as a replay
      gives the task the same rows in the same order (Spark's own sources and this
      connector's source, whose split is recorded with each offset, do).

    The shapes cannot collide: a stream name has no ``.``, a position is digits.
    """

    def __init__(self, run: str, partition: int) -> None:
        self.run = run
        self.partition = partition
        self._positional = f"{run}:{partition}:"
        self._seen: set[str] = set()  # the digests of (stream, seq, content) given out in this task
        self._repeats: dict[str, int] = {}

    def positional(self, position: int) -> str:
        return f"{self._positional}{position}"

    def content_prefix(self) -> str:
        """What every content id of this task starts with; ``<stream>.<seq>:`` follows."""
        return f"{self.run}:"

    def contents(self, prefixes: list[str | None], keys: list[bytes]) -> list[str | None]:
        """The content ids of rows whose ``<run>:<stream>.<seq>:`` is ``prefixes`` (None: no full
        position, left None for a positional id) and whose hashed bytes are ``keys`` (the
        encoder's, which begin with the stream and seq). Without repeats (the usual case) this is
        done by C loops (map, set); a batch with a repeat or a missing position takes a Python loop."""
        digests = list(map(_HEX, map(_DIGEST, keys)))
        seen = self._seen
        fresh = set(digests)
        if len(fresh) == len(digests) and seen.isdisjoint(fresh) and None not in prefixes:
            if len(seen) + len(fresh) > CONTENT_SEEN_MAX:
                seen.clear()
                self._repeats.clear()
            seen.update(fresh)
            return list(map(operator.add, prefixes, digests))
        repeats = self._repeats
        out: list[str | None] = []
        for prefix, digest in zip(prefixes, digests, strict=True):
            if prefix is None:
                out.append(None)
            elif digest in seen:
                k = repeats.get(digest, 0) + 1
                repeats[digest] = k
                out.append(f"{prefix}{digest}.{k}")
            else:
                if len(seen) >= CONTENT_SEEN_MAX:
                    seen.clear()
                    repeats.clear()
                seen.add(digest)
                out.append(prefix + digest)
        return out


_DIGEST = functools.partial(hashlib.blake2b, digest_size=8)
"""A content id's hash: BLAKE2b, 8 bytes (16 hex digits); stable across processes, unlike ``hash()``."""
_HEX = operator.methodcaller("hexdigest")


@dataclass(frozen=True)
class RowRejection:
    """A row the connector refused before publishing (or the server refused)."""

    position: int
    subject: str | None
    reason: str
    column: str | None = None
    value: Any = None
    err_code: int | None = None
    payload: bytes = b""
    ttl: str | None = None
    status: int | None = None  # a status-only refusal (503 no stream, 403 permissions), no err_code
    msg_id: str | None = None  # the id the row was (or would have been) published with


class OutFrame(NamedTuple):
    """One encoded row on its way out, with what settling a refusal needs beside the frame
    (so that nothing is parsed back out of it). The encoder builds plain tuples of this layout
    (a NamedTuple costs about 0.5 us more per row); refusal paths view them through this class."""

    position: int
    frame: bytes
    subject: str
    ttl: str | None
    msg_id: str | None
    header_len: int
    payload_len: int

    @property
    def header_block(self) -> bytes:
        end = len(self.frame) - 2 - self.payload_len
        return self.frame[end - self.header_len:end]

    @property
    def payload(self) -> bytes:
        return self.frame[len(self.frame) - 2 - self.payload_len:len(self.frame) - 2]


@dataclass(frozen=True)
class RowChoice:
    """Which rows of a batch :meth:`BatchEncoder.encode` publishes, for a caller that picked them
    (option ``sequenceBy``, sink/sequencer.py): ``publish`` maps a row index to header lines added to
    its block (``"Name: value\r\n"`` each, already checked); ``refuse`` maps a row index to a refusal
    the caller made (subject, reason, column). Every other row is left out, after the ids are
    generated, so the ids and positions of the rows published are those of the whole batch."""

    publish: dict[int, str]
    refuse: dict[int, tuple[str | None, str, str | None]] = field(default_factory=dict)


@dataclass
class EncodedBatch:
    frames: list[tuple] = field(default_factory=list)  # OutFrame layout
    rejected: list[RowRejection] = field(default_factory=list)
    expired: int = 0
    markers_skipped: int = 0


def shown(value: Any) -> Any:
    """A value as it may appear in an error message: bounded in length."""
    text = repr(value)
    return value if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "...'"


class _Columns:
    """A batch's columns as Python lists, each materialised once, on first use."""

    def __init__(self, encoder: BatchEncoder, batch: Any, n: int) -> None:
        self.batch, self.n = batch, n
        lay = encoder.layout
        self.subjects: list[Any] = self.column(lay.subject)
        self.markers = self.column(lay.marker_reason)
        self.headers = self.column(lay.headers)
        self._data_name = lay.data
        self._datas: list[Any] | None = None  # made on first use: the column-wise frames do not need it
        self._binary = lay.data_is_binary

    def column(self, name: str | None) -> list[Any]:
        if name is None:
            return [None] * self.n
        return self.arrow(name).to_pylist()

    def arrow(self, name: str) -> Any:
        return self.batch.column(self.batch.schema.get_field_index(name))

    def payload(self, i: int) -> bytes:
        if self._datas is None:
            self._datas = self.column(self._data_name)
        data = self._datas[i]
        return b"" if data is None else (data if self._binary else data.encode())

    def payloads(self, live: list[int]) -> Any:
        """The payloads of rows ``live`` as an Arrow large_binary array (a null is empty)."""
        import pyarrow as pa

        column = self.arrow(self._data_name)
        if len(live) < self.n:
            column = column.take(pa.array(live, pa.int64()))
        return column.cast(pa.large_binary()).fill_null(b"")


class BatchEncoder:
    """Encodes the rows of one Spark partition, batch after batch."""

    def __init__(self, layout: InputLayout, config: EncoderConfig, msg_ids: MsgIds | None) -> None:
        self.layout = layout
        self.config = config
        self.msg_ids = msg_ids
        self._valid_subjects: dict[str, bool] = {}
        self._resolve_ttl = TtlResolver()
        self.columnar = True  # frames of batches without user headers or KV operations built column-wise
        stream = config.expected_stream
        self._tail = f"{hdrs.EXPECTED_STREAM}: {stream}\r\n\r\n" if stream else "\r\n"

    def _subject_ok(self, subject: str) -> bool:
        ok = self._valid_subjects.get(subject)
        if ok is None:
            ok = is_receivable_subject(subject)
            if len(self._valid_subjects) < 100_000:
                self._valid_subjects[subject] = ok
        return ok

    def encode(self, batch: Any, first_position: int, reply_prefix: str, now: dt.datetime | None = None,
               choice: RowChoice | None = None) -> EncodedBatch:
        """The batch's frames, refused rows (in row order) and counts.

        Named steps, each over the rows still in play (``live``, row indices): delete
        markers out, ids generated, subjects, headers, TTLs, message ids, frames. A row
        refused by a step is out of the later ones, so each row reports the first
        problem in that order.
        """
        n = batch.num_rows
        out = EncodedBatch()
        rows = _Columns(self, batch, n)
        live = self._without_markers(rows, out)
        generated = self._generated_ids(rows, live, first_position)
        if choice is not None:
            live = self._chosen(rows, live, first_position, generated, choice, out)
        live = self._subjects(rows, live, first_position, generated, out)
        ops, live = self._operations(rows, live, first_position, generated, out)
        pairs, header_ttls, header_ids, live = self._headers(rows, live, first_position, generated, out)
        ttl_headers, live = self._ttls(rows, live, first_position, generated, header_ttls, now, out, ops)
        msg_ids, live = self._msg_ids(rows, live, first_position, generated, header_ids, out)
        if ops is None and not pairs and self.columnar and choice is None:
            self._common_frames(rows, live, first_position, reply_prefix, ttl_headers, msg_ids, out)
        else:
            self._frames(rows, live, first_position, reply_prefix, pairs, ttl_headers, msg_ids, out, ops,
                         choice.publish if choice is not None else None)
        if len(out.rejected) > 1:
            out.rejected.sort(key=lambda r: r.position)
        return out

    # ---------------------------------------------------------------- steps

    @staticmethod
    def _without_markers(rows: _Columns, out: EncodedBatch) -> list[int]:
        """Delete markers the server placed are not data to copy: skipped and counted."""
        markers = rows.markers
        live = [i for i in range(rows.n) if markers[i] is None]
        out.markers_skipped += rows.n - len(live)
        return live

    def _generated_ids(self, rows: _Columns, live: list[int], first: int) -> list[str | None]:
        """The deterministic id of every row in play (option ``idempotent``), in row order: a content
        id counts repeats across the task's rows, so it is made before any row is refused."""
        ids = self.msg_ids
        generated: list[str | None] = [None] * rows.n
        if ids is None:
            return generated
        lay = self.layout
        positional = ids.positional
        if lay.source_stream is None:
            for i in live:
                generated[i] = positional(first + i)
            return generated
        import pyarrow as pa
        import pyarrow.compute as pc

        stream, seq = rows.arrow(lay.source_stream), rows.arrow(lay.source_seq).cast(pa.string())
        prefixes = pc.binary_join_element_wise(ids.content_prefix(), stream, ".", seq, ":", "").to_pylist()
        keys = self._content_keys(rows, stream, seq)  # (a null position gives no content id: never read)
        if len(live) == rows.n:
            made = ids.contents(prefixes, keys)
            if None not in made:
                return made
        else:
            made = ids.contents([prefixes[i] for i in live], [keys[i] for i in live])
        for i, msg_id in zip(live, made, strict=True):
            generated[i] = msg_id if msg_id is not None else positional(first + i)
        return generated

    def _content_keys(self, rows: _Columns, stream: Any, seq: Any) -> list[bytes]:
        """Per row, the bytes a content id hashes (:class:`MsgIds`), joined column-wise by Arrow: the
        source position, then every published column the input has (the layout fixes which, for
        every row of the query; the headers as their entries joined), text ones after their length,
        the data last."""
        import pyarrow as pa
        import pyarrow.compute as pc

        lay, binary = self.layout, pa.binary()
        parts = [stream.cast(binary), seq.cast(binary)]
        for name in (lay.source_timestamp, lay.expires_at, lay.expected_revision):  # numbers
            if name is not None:
                column = rows.arrow(name)
                if pa.types.is_timestamp(column.type):
                    column = column.cast(pa.int64())
                parts.append(column.cast(pa.string()).cast(binary))
        texts = [rows.arrow(name).cast(pa.string()) for name in (lay.subject, lay.key, lay.operation, lay.ttl)
                 if name is not None]
        if lay.headers is not None:
            entries = rows.arrow(lay.headers)  # map<string, string | array<string>>, as entries
            offsets = entries.offsets  # a slice's map keeps the whole batch's entries: take its own
            low = offsets[0].as_py()
            count = offsets[len(offsets) - 1].as_py() - low
            keys, values = entries.keys.slice(low, count), entries.items.slice(low, count)
            if lay.headers_multi:
                values = pc.binary_join(values, "\x03")
            entry = pc.binary_join_element_wise(keys, values, "\x01", null_handling="replace", null_replacement="")
            per_row = pa.ListArray.from_arrays(pc.subtract(offsets, pa.scalar(low, offsets.type)), entry)
            texts.append(pc.binary_join(per_row, "\x02"))
        for text in texts:
            parts += [pc.utf8_length(text).cast(pa.string()).cast(binary), text.cast(binary)]
        parts.append(rows.arrow(lay.data).cast(binary))
        return pc.binary_join_element_wise(*parts, pa.scalar(b"\0", binary), null_handling="replace",
                                           null_replacement="").to_pylist()

    @staticmethod
    def _chosen(rows: _Columns, live: list[int], first: int, generated: list[str | None], choice: RowChoice,
                out: EncodedBatch) -> list[int]:
        """The rows the caller chose (:class:`RowChoice`); its refusals reported as the encoder's own."""
        for i in live:
            if i in choice.refuse:
                subject, reason, column = choice.refuse[i]
                out.rejected.append(RowRejection(first + i, subject, reason, column, None, payload=rows.payload(i),
                                                 msg_id=generated[i]))
        return [i for i in live if i in choice.publish]

    def _subjects(self, rows: _Columns, live: list[int], first: int, generated: list[str | None],
                  out: EncodedBatch) -> list[int]:
        """Each row's subject (its own, else option ``subject``), a valid publish subject; for a KV
        write, ``$KV.<bucket>.<key>`` of a valid key."""
        if self.config.bucket is not None:
            return self._kv_subjects(rows, live, first, generated, out)
        subjects, default = rows.subjects, self.config.default_subject
        kept = []
        for i in live:
            subject = subjects[i] or default
            if subject is None:
                out.rejected.append(RowRejection(
                    first + i, None, "the row has no subject and the option 'subject' is not set", "subject", None,
                    payload=rows.payload(i), msg_id=generated[i]))
            elif not self._subject_ok(subject):
                out.rejected.append(RowRejection(
                    first + i, subject, "not a valid publish subject (empty, an ASCII space, tab, CR, LF, FF or VT, a "
                    "wildcard or an empty token)",
                    "subject", shown(subject), payload=rows.payload(i), msg_id=generated[i]))
            else:
                subjects[i] = subject
                kept.append(i)
        return kept

    def _kv_subjects(self, rows: _Columns, live: list[int], first: int, generated: list[str | None],
                     out: EncodedBatch) -> list[int]:
        keys, subjects = rows.column(self.layout.key), rows.subjects
        prefix = kv.subject_prefix(self.config.bucket)
        kept = []
        for i in live:
            key = keys[i]
            if key is None or not kv.is_valid_key(key):
                out.rejected.append(RowRejection(
                    first + i, None if key is None else f"{prefix}{key}",
                    "not a valid KV key (letters, digits and '-/_=.', not starting or ending with '.')"
                    if key is not None else "the row has no key", "key", shown(key), payload=rows.payload(i),
                    msg_id=generated[i]))
                continue
            subjects[i] = f"{prefix}{key}"
            kept.append(i)
        return kept

    def _operations(self, rows: _Columns, live: list[int], first: int, generated: list[str | None],
                    out: EncodedBatch) -> tuple[list[Any] | None, list[int]]:
        """A KV write's operation per row (``PUT`` when null) and its compare-and-set revision, as the
        header lines they add (``kv.OPERATION_HEADERS``); None for a stream write."""
        if self.config.bucket is None:
            return None, live
        given, revisions = rows.column(self.layout.operation), rows.column(self.layout.expected_revision)
        ops: list[Any] = [None] * rows.n
        kept = []
        for i in live:
            op = kv.parse_operation(given[i])
            if op is None:
                out.rejected.append(RowRejection(
                    first + i, rows.subjects[i], "unknown KV operation; expected PUT (or null), DEL or PURGE",
                    "operation", shown(given[i]), payload=rows.payload(i), msg_id=generated[i]))
                continue
            revision = revisions[i]
            if revision is not None and revision < 0:
                out.rejected.append(RowRejection(
                    first + i, rows.subjects[i], "expected_revision must be >= 0 (0: only if the key does not exist)",
                    "expected_revision", revision, payload=rows.payload(i), msg_id=generated[i]))
                continue
            ops[i] = (op, None if revision is None else f"{hdrs.EXPECTED_LAST_SUBJECT_SEQUENCE}: {revision}\r\n")
            kept.append(i)
        return ops, kept

    def _headers(self, rows: _Columns, live: list[int], first: int, generated: list[str | None],
                 out: EncodedBatch) -> tuple[dict[int, list[tuple[str, str]]], dict[int, Any], dict[int, Any], list[int]]:
        """Each row's user headers, checked; a ``Nats-TTL`` or ``Nats-Msg-Id`` among them set aside."""
        headers_col = rows.headers
        pairs: dict[int, list[tuple[str, str]]] = {}
        header_ttls: dict[int, Any] = {}
        header_ids: dict[int, Any] = {}
        if self.layout.headers is None:
            return pairs, header_ttls, header_ids, live
        kept = []
        for i in live:
            row_headers = headers_col[i]
            if row_headers:
                row_pairs: list[tuple[str, str]] = []
                try:
                    ttl, msg_id = self._user_headers(row_headers, row_pairs)
                except (hdrs.InvalidHeader, InvalidTtl) as exc:
                    out.rejected.append(RowRejection(first + i, rows.subjects[i], str(exc), "headers",
                                                     shown(row_headers), payload=rows.payload(i),
                                                     msg_id=generated[i]))
                    continue
                if row_pairs:
                    pairs[i] = row_pairs
                if ttl is not None:
                    header_ttls[i] = ttl
                if msg_id is not None:
                    header_ids[i] = msg_id
            kept.append(i)
        return pairs, header_ttls, header_ids, kept

    def _ttls(self, rows: _Columns, live: list[int], first: int, generated: list[str | None],
              header_ttls: dict[int, Any], now: dt.datetime | None, out: EncodedBatch,
              ops: list[Any] | None = None) -> tuple[list[Any], list[int]]:
        """Each row's ``Nats-TTL`` value by precedence (module docstring); expired rows counted, not sent.
        KV writes: ``defaultTtl`` is for PUT rows; a PURGE tombstone expires only by its own TTL; a DEL
        row takes none (a TTL given on one is refused: use PURGE, as nats-py says)."""
        cfg = self.config
        ttl_headers: list[Any] = [cfg.default_ttl] * rows.n
        if ops is not None and cfg.default_ttl is not None:
            for i in live:
                if ops[i][0] != kv.PUT:
                    ttl_headers[i] = None
        ttls = rows.column(self.layout.ttl)
        expires = rows.column(self.layout.expires_at) if cfg.preserve_expiry else None
        if expires is not None and now is None:
            now = dt.datetime.now(dt.timezone.utc)
        if expires is None and self.layout.ttl is None and not header_ttls:
            return ttl_headers, live  # every row takes the default
        kept = []
        for i in live:
            if ops is not None and ops[i][0] == kv.DEL:
                own = ttls[i] if ttls[i] is not None else header_ttls.get(i)
                try:
                    resolved = None if own is None else self._resolve_ttl(own)
                except InvalidTtl:
                    resolved = own
                if resolved is not None:
                    out.rejected.append(RowRejection(
                        first + i, rows.subjects[i], "a DEL row cannot carry a TTL (nats-py ignores one); to make a "
                        "key's tombstone expire, write operation PURGE with that ttl",
                        self.layout.ttl if ttls[i] is not None else self.layout.headers, shown(own),
                        payload=rows.payload(i), ttl=str(own), msg_id=generated[i]))
                    continue
                kept.append(i)
                continue
            expiry = expires[i] if expires is not None else None
            if expiry is not None:
                if expiry.tzinfo is None:
                    expiry = expiry.replace(tzinfo=dt.timezone.utc)
                left = remaining_ttl_seconds(expiry, now)
                if left <= 0:
                    out.expired += 1
                    continue
                ttl_headers[i] = str(left)
                kept.append(i)
                continue
            value, column = ttls[i], self.layout.ttl
            if value is None and i in header_ttls:
                value, column = header_ttls[i], self.layout.headers
            if value is not None:
                try:
                    ttl_headers[i] = self._resolve_ttl(value)
                except InvalidTtl as exc:
                    # The refused value travels as the dead letter's Spark-JetStream-Original-TTL too.
                    out.rejected.append(RowRejection(
                        first + i, rows.subjects[i], f"{exc.reason}. Allowed: whole seconds, a Go duration of at "
                        "least 1s ('90s', '1h30m'), 'never', or 0 for none", column, shown(value),
                        payload=rows.payload(i), ttl=str(value), msg_id=generated[i]))
                    continue
            kept.append(i)
        return ttl_headers, kept

    def _msg_ids(self, rows: _Columns, live: list[int], first: int, generated: list[str | None],
                 header_ids: dict[int, Any], out: EncodedBatch) -> tuple[list[str | None], list[int]]:
        """Each row's ``Nats-Msg-Id``: the ``msg_id`` column, else a header, else the generated one."""
        if self.layout.msg_id is None and not header_ids:
            return generated, live
        own = rows.column(self.layout.msg_id)
        msg_ids = list(generated)
        kept = []
        for i in live:
            msg_id = own[i] or header_ids.get(i) or None  # an empty id is no id: the generated one stands
            if msg_id is not None:
                if "\r" in msg_id or "\n" in msg_id:
                    out.rejected.append(RowRejection(first + i, rows.subjects[i], "msg_id contains CR or LF",
                                                     "msg_id", shown(msg_id), payload=rows.payload(i),
                                                     msg_id=generated[i]))
                    continue
                msg_ids[i] = msg_id
            kept.append(i)
        return msg_ids, kept

    def _frames(self, rows: _Columns, live: list[int], first: int, reply_prefix: str,
                pairs: dict[int, list[tuple[str, str]]], ttl_headers: list[Any], msg_ids: list[str | None],
                out: EncodedBatch, ops: list[Any] | None = None, extra: dict[int, str] | None = None) -> None:
        """The header block and the ``HPUB`` frame of each row left, within the server's max_payload.
        A KV DEL or PURGE is an empty message with its operation's headers, as nats-py sends it.
        ``extra``: header lines a caller adds per row (:class:`RowChoice`)."""
        tail, max_payload = self._tail, self.config.max_payload
        subjects, frames = rows.subjects, out.frames
        for i in live:
            payload = rows.payload(i)
            msg_id, ttl = msg_ids[i], ttl_headers[i]
            head = "NATS/1.0\r\n"
            if ops is not None:
                op, expected = ops[i]
                if op != kv.PUT:
                    payload = b""
                    head += kv.OPERATION_HEADERS[op]
                if expected is not None:
                    head += expected
            if extra is not None:
                head += extra.get(i, "")
            if msg_id:
                head += f"{MSG_ID}: {msg_id}\r\n"
            if ttl is not None:
                head += f"{TTL}: {ttl}\r\n"
            for name, value in pairs.get(i, ()):
                head += f"{name}: {value}\r\n"
            block = (head + tail).encode()
            total = len(block) + len(payload)
            pos = first + i
            if total > max_payload:
                out.rejected.append(_too_large(pos, subjects[i], total, max_payload, payload, msg_id))
                continue
            # OutFrame's layout, as a plain tuple (the hot path; see OutFrame).
            frames.append((pos, hpub_frame(subjects[i], f"{reply_prefix}{pos}", block, payload), subjects[i], ttl,
                           msg_id, len(block), len(payload)))

    def _common_frames(self, rows: _Columns, live: list[int], first: int, reply_prefix: str,
                       ttl_headers: list[Any], msg_ids: list[str | None], out: EncodedBatch) -> None:
        """:meth:`_frames` for a batch whose header blocks are only ``Nats-Msg-Id``, ``Nats-TTL`` and
        the expected stream: every frame joined by Arrow in one pass per part instead of a few
        string operations per row in Python. Byte for byte the same frames (the differential test
        in tests/unit/test_sink_frames.py)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if not live:
            return
        binary = pa.large_binary()
        join = pc.binary_join_element_wise
        subjects_col, max_payload = rows.subjects, self.config.max_payload
        subjects = [subjects_col[i] for i in live]
        ids = [msg_ids[i] for i in live]
        ttls = [ttl_headers[i] for i in live]
        positions = [first + i for i in live] if first else live

        def text(values: list[Any]) -> Any:
            return pa.array(values, pa.string()).cast(binary)

        def lit(value: bytes) -> Any:
            return pa.scalar(value, binary)

        crlf, space, empty = lit(b"\r\n"), lit(b" "), lit(b"")

        id_line = join(lit(b"Nats-Msg-Id: "), text([v or None for v in ids]), crlf, empty)  # null: no line
        ttl_line = join(lit(b"Nats-TTL: "), text(ttls), crlf, empty)
        block = join(lit(b"NATS/1.0\r\n"), id_line, ttl_line, lit(self._tail.encode()), empty,
                     null_handling="replace", null_replacement="")
        payload = rows.payloads(live)
        hlen = pc.binary_length(block)
        plen = pc.binary_length(payload)
        total = pc.add(hlen, plen)
        line = join(lit(b"HPUB "), text(subjects), space, lit(reply_prefix.encode()),
                    pa.array(positions, pa.int64()).cast(pa.string()).cast(binary), space,
                    hlen.cast(pa.string()).cast(binary), space, total.cast(pa.string()).cast(binary), crlf, empty)
        frames = join(line, block, payload, crlf, empty).to_pylist()
        hlens, plens = hlen.to_pylist(), plen.to_pylist()
        if pc.any(pc.greater(total, max_payload)).as_py():
            totals = total.to_pylist()
            for k in [k for k, t in enumerate(totals) if t > max_payload]:
                i = live[k]
                out.rejected.append(_too_large(first + i, subjects[k], totals[k], max_payload, rows.payload(i), ids[k]))
            kept = [k for k, t in enumerate(totals) if t <= max_payload]
            out.frames.extend((positions[k], frames[k], subjects[k], ttls[k], ids[k], hlens[k], plens[k]) for k in kept)
            return
        # OutFrame's layout, as plain tuples.
        out.frames.extend(zip(positions, frames, subjects, ttls, ids, hlens, plens, strict=True))

    def _user_headers(self, row_headers: list[tuple[str, Any]], pairs: list[tuple[str, str]]) -> tuple[Any, Any]:
        ttl = msg_id = None
        allow_rollup = self.config.allow_rollup
        as_read = self.layout.as_read
        for name, value in row_headers:
            lowered = name.lower() if isinstance(name, str) else None
            values = value if self.layout.headers_multi else [value]
            if values is None:
                continue
            if as_read and lowered is not None and lowered.startswith(hdrs.RESERVED_PREFIX) and not (
                    allow_rollup and lowered == hdrs.ROLLUP.lower()):
                continue  # owned by the server or the original publisher (module docstring)
            if lowered == _SEQUENCE:
                if as_read:
                    continue  # the source's order, not the target's (module docstring)
                raise hdrs.InvalidHeader(f"header {name!r} is set by the option 'sequenceBy' (a KV value's order); "
                                         "a row cannot set it")
            if self.config.bucket is not None and lowered == _KV_OPERATION:
                if as_read:
                    continue  # the 'operation' column carries it
                raise hdrs.InvalidHeader(f"header {name!r} is set by the 'operation' column (PUT, DEL or PURGE)")
            if lowered == "nats-ttl":
                if ttl is not None:
                    raise hdrs.InvalidHeader("the headers carry Nats-TTL twice (in different cases)")
                ttl = _single(name, values)
                continue
            if lowered == "nats-msg-id":
                if msg_id is not None:
                    raise hdrs.InvalidHeader("the headers carry Nats-Msg-Id twice (in different cases)")
                msg_id = hdrs.check_header_value(name, _single(name, values))
                continue
            hdrs.check_header_name(name, allow_rollup=allow_rollup)
            for v in values:
                if v is None:
                    continue
                pairs.append((name, hdrs.check_header_value(name, v)))
        return ttl, msg_id


_KV_OPERATION = hdrs.KV_OPERATION.lower()
_SEQUENCE = hdrs.SEQUENCE.lower()


def _too_large(position: int, subject: str, total: int, max_payload: int, payload: bytes,
               msg_id: str | None) -> RowRejection:
    return RowRejection(position, subject, f"the message is {total} bytes (headers and data), more than the "
                        f"server's max_payload of {max_payload}", "data", f"<{len(payload)} bytes>",
                        payload=payload, msg_id=msg_id)


def _single(name: str, values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    if len(present) > 1:
        raise hdrs.InvalidHeader(f"header {name!r} has {len(present)} values; it takes one")
    return present[0] if present else None
