"""The source's output schema and the Arrow batches built from raw messages, free of I/O.

Per message the hot path only appends bytes and ints to lists; decoding,
header parsing and timestamp arithmetic happen once per batch, column-wise
where pyarrow can do it.
"""

from __future__ import annotations

from typing import Any

from .ttl import InvalidTtl, server_ttl_seconds

SOURCE_SCHEMA_DDL = (
    "subject string, data binary, headers map<string, array<string>>, stream string, seq long, "
    "timestamp timestamp, ttl string, expires_at timestamp, marker_reason string"
)
KV_SCHEMA_DDL = SOURCE_SCHEMA_DDL + ", key string, operation string"

_MARKER = b"Nats-Marker-Reason:"


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


def parse_headers(block: bytes) -> dict[str, list[str]]:
    """Headers of a stored message's ``NATS/1.0`` block, repeated keys kept in order."""
    out: dict[str, list[str]] = {}
    text = block.decode("utf-8", "replace")
    for line in text.split("\r\n")[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            continue
        out.setdefault(name.strip(), []).append(value.strip())
    return out


class BatchBuilder:
    """Accumulates one partition's messages and cuts them into RecordBatches."""

    def __init__(self, stream: str, *, include_markers: bool = True, kv_bucket: str | None = None) -> None:
        self.stream = stream
        self.include_markers = include_markers
        self.kv_prefix = f"$KV.{kv_bucket}." if kv_bucket else None
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

    def add(self, subject: bytes, data: bytes, headers: bytes | None, seq: int, ts_ns: int) -> bool:
        """Append one message; False when it is a marker and markers are excluded."""
        if headers is not None and not self.include_markers and _MARKER in headers:
            return False
        self.subjects.append(subject)
        self.datas.append(data)
        self.header_blocks.append(headers)
        self.seqs.append(seq)
        self.times.append(ts_ns)
        return True

    def build(self) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(self.seqs)
        ts_type = pa.timestamp("us", tz="UTC")
        times_us = pc.divide(pa.array(self.times, pa.int64()), 1000)
        headers: list[Any] = [None] * n
        ttls: list[str | None] = [None] * n
        expires: list[int | None] = [None] * n
        markers: list[str | None] = [None] * n
        ops: list[str | None] = ["PUT"] * n if self.kv_prefix else []
        ttl_seconds: dict[str, int | None] = {}  # TTL values repeat; parse each once per batch
        for i, block in enumerate(self.header_blocks):
            if block is None:
                continue
            parsed = parse_headers(block)
            if not parsed:
                continue
            headers[i] = list(parsed.items())
            ttl = parsed.get("Nats-TTL")
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
                if seconds and seconds > 0:
                    expires[i] = self.times[i] // 1000 + seconds * 1_000_000
            marker = parsed.get("Nats-Marker-Reason")
            if marker:
                markers[i] = marker[0]
            if self.kv_prefix and parsed.get("KV-Operation"):
                ops[i] = parsed["KV-Operation"][0]
        columns = [
            pa.array(self.subjects, pa.binary()).cast(pa.string()),
            pa.array(self.datas, pa.binary()),
            pa.array(headers, self.schema.field("headers").type),
            pa.array([self.stream] * n, pa.string()),
            pa.array(self.seqs, pa.int64()),
            times_us.cast(ts_type),
            pa.array(ttls, pa.string()),
            pa.array(expires, pa.int64()).cast(ts_type),
            pa.array(markers, pa.string()),
        ]
        if self.kv_prefix:
            cut = len(self.kv_prefix)
            columns.append(pa.array([s[cut:] for s in self.subjects], pa.binary()).cast(pa.string()))
            columns.append(pa.array(ops, pa.string()))
        self._reset()
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)
