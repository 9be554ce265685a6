"""Raw messages -> Arrow batches of the source schema; status parsing."""

from pyspark_jetstream.protocol.headers import parse_headers, parse_status
from pyspark_jetstream.source.columns.rows import BatchBuilder, arrow_schema

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


def test_markers_are_kept_or_dropped_by_the_parsed_header_name():
    marker = b"NATS/1.0\r\nNats-Marker-Reason: MaxAge\r\nNats-TTL: 2s\r\nNats-Rollup: sub\r\n\r\n"
    look_alikes = [b"NATS/1.0\r\nX-Nats-Marker-Reason: none\r\n\r\n",
                   b"NATS/1.0\r\nX-Note: Nats-Marker-Reason: MaxAge\r\n\r\n"]
    keep = BatchBuilder("S")
    keep.add(b"a", b"", marker, 3, TS)
    assert keep.build().to_pylist()[0]["marker_reason"] == "MaxAge"
    drop = BatchBuilder("S", include_markers=False)
    drop.add(b"a", b"x", look_alikes[0], 1, TS)
    drop.add(b"a", b"", marker, 2, TS)
    drop.add(b"a", b"y", look_alikes[1], 3, TS)
    rows = drop.build().to_pylist()
    assert [(r["seq"], r["marker_reason"]) for r in rows] == [(1, None), (3, None)]


def test_expiry_is_the_earlier_of_ttl_and_max_age_and_never_is_exempt():
    b = BatchBuilder("S", max_age=5.0)
    b.add(b"a", b"", None, 1, TS)  # no TTL: MaxAge
    b.add(b"a", b"", b"NATS/1.0\r\nNats-TTL: 60s\r\n\r\n", 2, TS)  # MaxAge wins over a longer TTL
    b.add(b"a", b"", b"NATS/1.0\r\nNats-TTL: 2\r\n\r\n", 3, TS)  # a shorter TTL wins
    b.add(b"a", b"", b"NATS/1.0\r\nNats-TTL: never\r\n\r\n", 4, TS)  # exempt from MaxAge
    b.add(b"a", b"", b"NATS/1.0\r\nX: 1\r\n\r\n", 5, TS)  # headers, no TTL: MaxAge
    rows = b.build().to_pylist()
    left = [None if r["expires_at"] is None else (r["expires_at"] - r["timestamp"]).total_seconds() for r in rows]
    assert left == [5, 5, 2, None, 5]
    assert [r["ttl"] for r in rows] == [None, "60s", "2", "never", None]  # as stored, always


def test_kv_columns():
    b = BatchBuilder("KV_cfg", kv_bucket="cfg")
    b.add(b"$KV.cfg.a.b", b"1", None, 1, TS)
    b.add(b"$KV.cfg.x", b"", b"NATS/1.0\r\nKV-Operation: DEL\r\n\r\n", 2, TS)
    rows = b.build().to_pylist()
    assert [(r["key"], r["operation"]) for r in rows] == [("a.b", "PUT"), ("x", "DEL")]


def test_kv_server_markers_map_to_operations_as_kv_watchers_do():
    b = BatchBuilder("KV_cfg", kv_bucket="cfg")
    for seq, reason in enumerate(["MaxAge", "Purge", "Remove"], start=1):
        b.add(b"$KV.cfg.k", b"", f"NATS/1.0\r\nNats-Marker-Reason: {reason}\r\nNats-TTL: 1s\r\n\r\n".encode(), seq, TS)
    rows = b.build().to_pylist()
    assert [(r["operation"], r["marker_reason"]) for r in rows] == [("PURGE", "MaxAge"), ("PURGE", "Purge"),
                                                                     ("DEL", "Remove")]


def test_odd_headers_and_binary_payloads_come_through():
    b = BatchBuilder("S")
    b.add(b"a", b"\xff\x00\xfe", b"NATS/1.0\r\nEmpty:\r\nStatus-Like: 503\r\n\r\n", 1, TS)
    row = b.build().to_pylist()[0]
    assert row["data"] == b"\xff\x00\xfe"
    assert dict(row["headers"]) == {"Empty": [""], "Status-Like": ["503"]}
    assert parse_headers(b"NATS/1.0\r\n\r\n") == {}


def test_parse_status_lines():
    block = b"NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 7\r\nNats-Pending-Bytes: 0\r\n\r\n"
    assert parse_status(block) == (408, "Request Timeout")
    assert parse_headers(block) == {"Nats-Pending-Messages": ["7"], "Nats-Pending-Bytes": ["0"]}
    assert parse_status(b"NATS/1.0 503\r\n\r\n") == (503, "") and parse_headers(b"NATS/1.0 503\r\n\r\n") == {}
    assert parse_status(b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 4\r\n\r\n")[:2] == (100, "Idle Heartbeat")
