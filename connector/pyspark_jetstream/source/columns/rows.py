"""The source's output schema and the Arrow batches built from raw messages, free of I/O.

Per message the hot path only appends bytes and ints to lists (:meth:`BatchBuilder.add`,
on the I/O loop); :meth:`BatchBuilder.take` hands those lists over as a
:class:`RawBatch`, and :meth:`RawBatch.build` decodes, parses headers and does
the timestamp arithmetic once per batch on Spark's task thread, column-wise
where pyarrow can do it. Building never runs inside nats-py's read loop, so no
message can break the shared connection.

Building is total: whatever bytes the server delivers become a row.

* Bytes that are not UTF-8 in a subject (or a KV key) or in a header block are
  replaced by U+FFFD; ``data`` is binary and kept as it is.
* ``expires_at`` is null when the expiry falls after 9999-12-31T23:59:59.999999Z,
  the end of Spark's timestamp range (``Nats-TTL: 9999999999999`` is about
  317,000 years); ``ttl`` keeps the header as stored.
"""

from __future__ import annotations

from typing import Any

from ...protocol.headers import KV_OPERATION, MARKER_REASON, TTL
from ...protocol.ttl import InvalidTtl, server_ttl_seconds
from . import header_columns


def pa_schema(fields: list[Any]) -> Any:
    import pyarrow as pa

    return pa.schema(fields)

SOURCE_SCHEMA_DDL = (
    "subject string, data binary, headers map<string, array<string>>, stream string, seq long, "
    "timestamp timestamp, ttl string, expires_at timestamp, marker_reason string"
)
KV_SCHEMA_DDL = SOURCE_SCHEMA_DDL + ", key string, operation string"

MAX_TIMESTAMP_US = 253_402_300_799_999_999
"""9999-12-31T23:59:59.999999Z in microseconds: the last instant Spark's timestamp type holds."""


def arrow_schema(kv: bool):
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    fields = [
        ("subject", pa.string()), ("data", pa.binary()), ("headers", pa.map_(pa.string(), pa.list_(pa.string()))),
        ("stream", pa.string()), ("seq", pa.int64()), ("timestamp", ts), ("ttl", pa.string()), ("expires_at", ts),
        ("marker_reason", pa.string()),
    ]
    if kv:
        fields += [("key", pa.string()), ("operation", pa.string())]
    return pa.schema(fields)


class BatchBuilder:
    """Accumulates one partition's messages; :meth:`take` hands them over as a :class:`RawBatch`.

    ``max_age`` is the stream's MaxAge in seconds (0: none) as planned: ``expires_at`` is the
    time the server removes a message by age, the earlier of its TTL and MaxAge.
    """

    def __init__(self, stream: str, *, include_markers: bool = True, kv_bucket: str | None = None,
                 max_age: float = 0.0, drop_removed_keys: bool = False,
                 columns: tuple[str, ...] | None = None) -> None:
        self.stream = stream
        self.include_markers = include_markers
        self.drop_removed_keys = drop_removed_keys  # a bucket's current state: DEL and PURGE rows left out
        self.kv_prefix = f"$KV.{kv_bucket}." if kv_bucket else None
        self.max_age_us = int(max_age * 1_000_000)
        full = arrow_schema(kv_bucket is not None)
        self.map_type = full.field("headers").type
        # The read's columns (source/columns/selection.py), in order: only those are built.
        self.schema = full if columns is None else pa_schema([full.field(name) for name in columns])
        # A stream's read looks up no KV-Operation (one scan of every block fewer without the map).
        self.derived = _DERIVED if kv_bucket is not None else (TTL, MARKER_REASON)
        self.needs_headers = (not include_markers or drop_removed_keys
                              or any(name in self.schema.names for name in _FROM_HEADERS))
        self._reset()

    def _reset(self) -> None:
        self.subjects: list[bytes] = []
        self.datas: list[bytes] = []
        self.header_blocks: list[bytes | None] = []
        self.seqs: list[int] = []
        self.times: list[int] = []

    def __len__(self) -> int:
        return len(self.seqs)

    def add(self, subject: bytes, data: bytes, headers: bytes | None, seq: int, ts_ns: int) -> None:
        """Append one message (markers too: ``includeMarkers=false`` drops them once headers are parsed)."""
        self.subjects.append(subject)
        self.datas.append(data)
        self.header_blocks.append(headers)
        self.seqs.append(seq)
        self.times.append(ts_ns)

    def extend(self, subjects: Any, datas: Any, headers: Any, seqs: list[int], times: list[int]) -> None:
        """Append messages given column by column (a run of deliveries taken at once)."""
        self.subjects.extend(subjects)
        self.datas.extend(datas)
        self.header_blocks.extend(headers)
        self.seqs.extend(seqs)
        self.times.extend(times)

    def take(self) -> RawBatch:
        """The messages added so far, as plain lists (cheap: no decoding); the builder starts over."""
        raw = RawBatch(self, self.subjects, self.datas, self.header_blocks, self.seqs, self.times)
        self._reset()
        return raw

    def build(self) -> Any:
        """``take().build()``: the messages added so far as one RecordBatch."""
        return self.take().build()


def _strings(values: list[bytes]) -> Any:
    """A string column from raw bytes; bytes that are not UTF-8 become U+FFFD."""
    import pyarrow as pa

    try:
        return pa.array(values, pa.binary()).cast(pa.string())
    except (pa.ArrowInvalid, UnicodeDecodeError):
        return pa.array([v.decode("utf-8", "replace") for v in values], pa.string())


KV_OPERATION_OF_MARKER = {"MaxAge": "PURGE", "Purge": "PURGE", "Remove": "DEL"}
"""How a KV reader sees a server-placed marker (nats-py's and nats.js's KV watchers map them so)."""

_DERIVED = (TTL, MARKER_REASON, KV_OPERATION)
"""The headers columns are derived from (their first value)."""
_FROM_HEADERS = ("headers", "ttl", "expires_at", "marker_reason", "operation")
"""The columns built from a message's header block (``expires_at`` from its TTL)."""

_MAX_TTL_S = MAX_TIMESTAMP_US // 1_000_000 + 1
"""A TTL this long already ends past Spark's timestamp range: longer ones are cut to it before the
microsecond arithmetic, which would overflow int64 (``Nats-TTL: 9999999999999``)."""


def _expiry(ttls: Any, times_us: Any, max_age_us: int) -> Any:
    """``expires_at`` in microseconds: the earlier of timestamp + TTL (as the server applies it) and
    timestamp + MaxAge; a ``never`` TTL is exempt from MaxAge; null past Spark's timestamp range.
    Each distinct TTL value is parsed once (values repeat)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    distinct = pc.unique(ttls.drop_null())
    seconds = []
    for value in distinct.to_pylist():
        try:
            s = server_ttl_seconds(value)
        except InvalidTtl:
            s = None
        seconds.append(None if s is None or s == 0 else min(s, _MAX_TTL_S))
    ttl_s = pc.take(pa.array(seconds, pa.int64()), pc.index_in(ttls, value_set=distinct))
    by_age = pc.add(times_us, max_age_us) if max_age_us else pa.nulls(len(ttls), pa.int64())
    null = pa.scalar(None, pa.int64())
    by_ttl = pc.if_else(pc.greater(ttl_s, 0), pc.add(times_us, pc.multiply(ttl_s, 1_000_000)), null)
    expires = pc.min_element_wise(by_ttl, by_age)  # nulls skipped: whichever applies
    expires = pc.if_else(pc.equal(ttl_s, -1), null, expires)  # never: exempt from MaxAge too
    expires = pc.if_else(pc.is_null(ttl_s), by_age, expires)  # no TTL, or one the server ignores
    return pc.if_else(pc.greater(expires, MAX_TIMESTAMP_US), null, expires)


class RawBatch:
    """One batch's messages as the I/O loop received them, built into Arrow on Spark's thread."""

    __slots__ = ("config", "stream", "subjects", "datas", "header_blocks", "seqs", "times")

    def __init__(self, config: BatchBuilder, subjects: list[bytes], datas: list[bytes],
                 header_blocks: list[bytes | None], seqs: list[int], times: list[int]) -> None:
        self.config = config  # stream, KV prefix, schema, markers, MaxAge: read only
        self.stream = config.stream
        self.subjects = subjects
        self.datas = datas
        self.header_blocks = header_blocks
        self.seqs = seqs
        self.times = times

    def __len__(self) -> int:
        return len(self.seqs)

    def row(self, i: int) -> RawBatch:
        """Message ``i`` alone (to find which message a failed build choked on)."""
        return RawBatch(self.config, self.subjects[i:i + 1], self.datas[i:i + 1], self.header_blocks[i:i + 1],
                        self.seqs[i:i + 1], self.times[i:i + 1])

    def build(self) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        cfg = self.config
        kv_prefix = cfg.kv_prefix
        n = len(self.seqs)
        ts_type = pa.timestamp("us", tz="UTC")
        wanted = cfg.schema.names
        times_us = pc.divide(pa.array(self.times, pa.int64()), 1000)
        if cfg.needs_headers:
            decoded = header_columns.decode(self.header_blocks, cfg.map_type, cfg.derived,
                                            want_map="headers" in wanted)
        else:  # no column comes from a header, and no row is left out by one: the blocks are not read
            decoded = header_columns.HeaderColumns(None, {name: pa.nulls(n, pa.string()) for name in cfg.derived})
        ttls = decoded.first[TTL]
        markers = decoded.first[MARKER_REASON]
        ops = None
        if kv_prefix:
            # KV-Operation, else what a KV watcher makes of a server marker (null for a reason not
            # known here), else a put.
            of_marker = pc.take(pa.array(list(KV_OPERATION_OF_MARKER.values()), pa.string()),
                                pc.index_in(markers, value_set=pa.array(list(KV_OPERATION_OF_MARKER), pa.string())))
            ops = pc.coalesce(decoded.first[KV_OPERATION],
                              pc.if_else(pc.is_null(markers), pa.scalar("PUT"), of_marker))
        make = {
            "subject": lambda: _strings(self.subjects),
            "data": lambda: pa.array(self.datas, pa.binary()),
            "headers": lambda: decoded.headers,
            "stream": lambda: pa.array([self.stream] * n, pa.string()),
            "seq": lambda: pa.array(self.seqs, pa.int64()),
            "timestamp": lambda: times_us.cast(ts_type),
            "ttl": lambda: ttls,
            "expires_at": lambda: _expiry(ttls, times_us, cfg.max_age_us).cast(ts_type),
            "marker_reason": lambda: markers,
            "key": lambda: _strings([s[len(kv_prefix):] for s in self.subjects]),
            "operation": lambda: ops,
        }
        batch = pa.RecordBatch.from_arrays([make[name]() for name in wanted], schema=cfg.schema)
        if not cfg.include_markers and markers.null_count < n:
            # Decided on the parsed header name only: a look-alike name or value is not a marker.
            batch = batch.filter(pc.is_null(markers))
            ops = ops.filter(pc.is_null(markers)) if ops is not None else None
        if cfg.drop_removed_keys and ops is not None:
            # A deleted or purged key (a server marker included) is not part of the bucket's state.
            batch = batch.filter(pc.invert(pc.is_in(ops, pa.array(["DEL", "PURGE"]))))
        return batch
