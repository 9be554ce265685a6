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

from ..protocol.headers import KV_OPERATION, MARKER_REASON, TTL, parse_headers
from ..protocol.ttl import InvalidTtl, server_ttl_seconds

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
                 max_age: float = 0.0, drop_removed_keys: bool = False) -> None:
        self.stream = stream
        self.include_markers = include_markers
        self.drop_removed_keys = drop_removed_keys  # a bucket's current state: DEL and PURGE rows left out
        self.kv_prefix = f"$KV.{kv_bucket}." if kv_bucket else None
        self.max_age_us = int(max_age * 1_000_000)
        self.schema = arrow_schema(kv_bucket is not None)
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
        max_age_us = cfg.max_age_us
        n = len(self.seqs)
        ts_type = pa.timestamp("us", tz="UTC")
        times_us = pc.divide(pa.array(self.times, pa.int64()), 1000)
        headers: list[Any] = [None] * n
        ttls: list[str | None] = [None] * n
        # The server removes a message by age at the earlier of timestamp + TTL and timestamp + MaxAge;
        # only a 'never' TTL exempts it from MaxAge.
        expires: list[int | None] = [t // 1000 + max_age_us for t in self.times] if max_age_us else [None] * n
        markers: list[str | None] = [None] * n
        ops: list[str | None] = ["PUT"] * n if kv_prefix else []
        ttl_seconds: dict[str, int | None] = {}  # TTL values repeat; parse each once per batch
        for i, block in enumerate(self.header_blocks):
            if block is None:
                continue
            parsed = parse_headers(block)
            if not parsed:
                continue
            headers[i] = list(parsed.items())
            ttl = parsed.get(TTL)
            if ttl:
                ttls[i] = ttl[0]
                if ttl[0] in ttl_seconds:
                    seconds = ttl_seconds[ttl[0]]
                else:
                    try:
                        seconds = server_ttl_seconds(ttl[0])
                    except InvalidTtl:
                        seconds = None
                    ttl_seconds[ttl[0]] = seconds
                if seconds == -1:
                    expires[i] = None  # never
                elif seconds and seconds > 0:
                    by_ttl = self.times[i] // 1000 + seconds * 1_000_000
                    expires[i] = by_ttl if expires[i] is None else min(expires[i], by_ttl)
            marker = parsed.get(MARKER_REASON)
            if marker:
                markers[i] = marker[0]
            if kv_prefix:
                operation = parsed.get(KV_OPERATION)
                if operation:
                    ops[i] = operation[0]
                elif marker:
                    ops[i] = KV_OPERATION_OF_MARKER.get(marker[0])  # null for a reason not known here
        expires = [e if e is None or e <= MAX_TIMESTAMP_US else None for e in expires]
        columns = [
            _strings(self.subjects),
            pa.array(self.datas, pa.binary()),
            pa.array(headers, cfg.schema.field("headers").type),
            pa.array([self.stream] * n, pa.string()),
            pa.array(self.seqs, pa.int64()),
            times_us.cast(ts_type),
            pa.array(ttls, pa.string()),
            pa.array(expires, pa.int64()).cast(ts_type),
            pa.array(markers, pa.string()),
        ]
        if kv_prefix:
            cut = len(kv_prefix)
            columns.append(_strings([s[cut:] for s in self.subjects]))
            columns.append(pa.array(ops, pa.string()))
        batch = pa.RecordBatch.from_arrays(columns, schema=cfg.schema)
        if not cfg.include_markers and any(m is not None for m in markers):
            # Decided on the parsed header name only: a look-alike name or value is not a marker.
            batch = batch.filter(pa.array([m is None for m in markers]))
        if cfg.drop_removed_keys and kv_prefix:
            # A deleted or purged key (a server marker included) is not part of the bucket's state.
            batch = batch.filter(pc.invert(pc.is_in(batch.column("operation"), pa.array(["DEL", "PURGE"]))))
        return batch
