"""Raw messages -> Arrow batches of the source schema; status parsing."""

from pyspark_jetstream.partition_reader import parse_status
from pyspark_jetstream.source_rows import BatchBuilder, arrow_schema, parse_headers

TS = 1_795_300_244_041_189_227


def test_batch_has_the_declared_schema_and_values():
    b = BatchBuilder("S")
    b.add(b"a.b", b"x", None, 5, TS)
    b.add(b"a.c", b"", b"NATS/1.0\r\nX: 1\r\nX: 2\r\nNats-TTL: 90s\r\n\r\n", 7, TS + 1000)
    batch = b.build()
    assert batch.schema == arrow_schema(False)
    rows = batch.to_pylist()
    assert rows[0]["subject"] == "a.b" and rows[0]["headers"] is None and rows[0]["ttl"] is None
    assert rows[0]["seq"] == 5 and rows[0]["stream"] == "S"
    assert rows[0]["timestamp"].timestamp() * 1e6 == TS // 1000
    assert rows[1]["headers"] == [("X", ["1", "2"]), ("Nats-TTL", ["90s"])]
    assert rows[1]["ttl"] == "90s"
    assert (rows[1]["expires_at"] - rows[1]["timestamp"]).total_seconds() == 90
    assert len(b) == 0  # reset after build


def test_never_and_invalid_ttls_have_no_expiry():
    b = BatchBuilder("S")
    b.add(b"a", b"", b"NATS/1.0\r\nNats-TTL: never\r\n\r\n", 1, TS)
    b.add(b"a", b"", b"NATS/1.0\r\nNats-TTL: 1.9s\r\n\r\n", 2, TS)
    rows = b.build().to_pylist()
    assert rows[0]["ttl"] == "never" and rows[0]["expires_at"] is None
    assert (rows[1]["expires_at"] - rows[1]["timestamp"]).total_seconds() == 1  # the server truncates


def test_markers_are_kept_or_dropped():
    marker = b"NATS/1.0\r\nNats-Marker-Reason: MaxAge\r\nNats-TTL: 2s\r\nNats-Rollup: sub\r\n\r\n"
    keep = BatchBuilder("S")
    assert keep.add(b"a", b"", marker, 3, TS)
    assert keep.build().to_pylist()[0]["marker_reason"] == "MaxAge"
    drop = BatchBuilder("S", include_markers=False)
    assert not drop.add(b"a", b"", marker, 3, TS) and len(drop) == 0


def test_kv_columns():
    b = BatchBuilder("KV_cfg", kv_bucket="cfg")
    b.add(b"$KV.cfg.a.b", b"1", None, 1, TS)
    b.add(b"$KV.cfg.x", b"", b"NATS/1.0\r\nKV-Operation: DEL\r\n\r\n", 2, TS)
    rows = b.build().to_pylist()
    assert [(r["key"], r["operation"]) for r in rows] == [("a.b", "PUT"), ("x", "DEL")]


def test_odd_headers_and_binary_payloads_come_through():
    b = BatchBuilder("S")
    b.add(b"a", b"\xff\x00\xfe", b"NATS/1.0\r\nEmpty:\r\nStatus-Like: 503\r\n\r\n", 1, TS)
    row = b.build().to_pylist()[0]
    assert row["data"] == b"\xff\x00\xfe"
    assert dict(row["headers"]) == {"Empty": [""], "Status-Like": ["503"]}
    assert parse_headers(b"NATS/1.0\r\n\r\n") == {}


def test_parse_status_lines():
    assert parse_status(b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 7\r\nNats-Pending-Bytes: 0\r\n\r\n") == (
        408, "Request Timeout", {"Nats-Pending-Messages": "7", "Nats-Pending-Bytes": "0"})
    assert parse_status(b"NATS/1.0 503\r\n\r\n") == (503, "", {})
    assert parse_status(b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 4\r\n\r\n")[:2] == (100, "Idle Heartbeat")
