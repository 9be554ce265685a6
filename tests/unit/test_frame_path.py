"""Hostile frames through the partition reader's frame handler into Arrow batches, without a server.

The handler is what nats-py's parser calls for every frame of a partition's inbox.
Whatever bytes arrive, it must not raise (an exception there stops nats-py's read
loop for every partition sharing the connection), and every message must become a
row of the declared schema, or the partition must fail with an error that names
the stream and the sequence.
"""

from __future__ import annotations

import asyncio
import queue

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_jetstream.errors import PartitionReadError
from pyspark_jetstream.options import parse_source_options
from pyspark_jetstream.protocol.ttl import InvalidTtl, server_ttl_seconds
from pyspark_jetstream.source.columns.rows import MAX_TIMESTAMP_US, arrow_schema
from pyspark_jetstream.source.read.partition import build_batch
from pyspark_jetstream.source.read.partition_reader import DONE, PartitionReader

TS = 1_795_300_244_041_189_227
GO_UNITS = ["ns", "us", "µs", "μs", "ms", "s", "m", "h"]
EDGE_TTLS = ["0", "1", "9223372036854775807", "9223372036854775808", "10000000000000000000", "9999999999999",
             "18446744073709551617", "never", "NEVER", "", "-1", "1.5h", "2562047h", "2562048h", "0s", " 5",
             "5 ", "abc", "1d", "+5"]

ttl_values = st.one_of(
    st.sampled_from(EDGE_TTLS),
    st.builds(lambda n, u: f"{n}{u}", st.integers(0, 10**20), st.sampled_from(GO_UNITS)),
    st.integers(0, 2**64).map(str),
    st.text(max_size=12).filter(lambda t: "\r" not in t and "\n" not in t),
)
header_lines = st.one_of(
    ttl_values.map(lambda v: b"Nats-TTL: " + v.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"Nats-Marker-Reason: MaxAge", b"KV-Operation: DEL", b"X: 1", b"X: 2", b"Empty:",
                     b"no colon here", b": no name", b"Nats-TTL:", b"Nats-Msg-Id: a:b:c"]),
    st.binary(max_size=40).filter(lambda b: b"\r\n" not in b),
)
header_blocks = st.one_of(
    st.none(),
    st.lists(header_lines, max_size=6).map(lambda lines: b"NATS/1.0\r\n" + b"".join(x + b"\r\n" for x in lines)
                                           + b"\r\n"),
    st.binary(max_size=60).map(lambda b: b"NATS/1.0\r\n" + b),
)
subjects = st.one_of(st.sampled_from([b"a.b", b"$KV.b.k", b"\xff\xfe.x", b"caf\xc3\xa9", b"\xc3"]),
                     st.binary(min_size=1, max_size=30))
messages = st.lists(st.tuples(subjects, st.binary(max_size=300), header_blocks), min_size=1, max_size=25)


def _ack(seq: int, pending: int) -> bytes:
    return f"$JS.ACK.S.c.1.{seq}.{seq}.{TS + seq}.{pending}".encode()


def _feed(frames: list[tuple[bytes, bytes, bytes, bytes | None]], *, bucket: str | None = None,
          batch_size: int = 7) -> list:
    """Frames through a reader's handler on a running loop; returns what the reader queued."""
    raw = {"batchSize": str(batch_size)}
    raw.update({"bucket": bucket} if bucket else {"stream": "S"})
    opts = parse_source_options(raw, streaming=False)
    out: queue.Queue = queue.Queue()

    async def go() -> None:
        reader = PartitionReader(opts, opts.stream, 1, len(frames), out)
        for subject, reply, data, headers in frames:
            reader._on_frame(subject, reply, data, headers)  # must never raise
        await asyncio.sleep(0)

    asyncio.run(go())
    items = []
    while not out.empty():
        items.append(out.get_nowait())
    return items


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages, st.sampled_from([None, "b"]), st.integers(1, 9))
def test_any_message_becomes_a_row_of_the_declared_schema(msgs, bucket, batch_size):
    n = len(msgs)
    frames = [(subj, _ack(i + 1, n - i - 1), data, hdr) for i, (subj, data, hdr) in enumerate(msgs)]
    items = _feed(frames, bucket=bucket, batch_size=batch_size)
    assert items[-1] is DONE
    batches = [build_batch(raw) for raw in items[:-1]]
    schema = arrow_schema(bucket is not None)
    assert all(b.schema == schema for b in batches)
    table = pa.Table.from_batches(batches, schema)
    assert table.column("seq").to_pylist() == list(range(1, n + 1))
    assert table.column("data").to_pylist() == [data for _, data, _ in msgs]
    assert table.column("subject").to_pylist() == [s.decode("utf-8", "replace") for s, _, _ in msgs]
    for row in table.to_pylist():
        expires = row["expires_at"]
        if row["ttl"] is None or expires is None:
            continue
        # expires_at is set only for a TTL the server honours, and inside Spark's range.
        seconds = server_ttl_seconds(row["ttl"])
        assert seconds is not None and seconds > 0
        micros = (TS + row["seq"]) // 1000 + seconds * 1_000_000
        assert micros <= MAX_TIMESTAMP_US


def test_a_ttl_past_the_timestamp_range_keeps_its_value_and_has_no_expiry():
    hdr = b"NATS/1.0\r\nNats-TTL: 9999999999999\r\n\r\n"
    items = _feed([(b"a", _ack(1, 1), b"x", hdr), (b"a", _ack(2, 0), b"y", b"NATS/1.0\r\nNats-TTL: 60\r\n\r\n")])
    rows = build_batch(items[0]).to_pylist()
    assert rows[0]["ttl"] == "9999999999999" and rows[0]["expires_at"] is None
    assert (rows[1]["expires_at"] - rows[1]["timestamp"]).total_seconds() == 60


def test_a_subject_that_is_not_utf8_is_read_with_replacement_characters():
    items = _feed([(b"bad.\xff\xfe", _ack(1, 0), b"x", None)])
    assert build_batch(items[0]).to_pylist()[0]["subject"] == "bad.\ufffd\ufffd"


def test_a_frame_the_handler_cannot_read_fails_the_partition_not_the_connection():
    items = _feed([(b"a", _ack(1, 1), b"x", None), (b"a", b"$JS.ACK.S.c.1.x.2.2.1", b"y", None)])
    errors = [i for i in items if isinstance(i, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], PartitionReadError)
    text = str(errors[0])
    assert "stream 'S'" in text and "after sequence 1" in text and "$JS.ACK.S.c.1.x" in text


def test_a_batch_that_cannot_be_built_names_its_sequence():
    items = _feed([(b"a", _ack(1, 1), b"x", None), (b"a", _ack(2, 0), b"y", None)])
    raw = items[0]
    raw.times[1] = 1 << 70  # no server sends this; build_batch must still say where it choked
    try:
        build_batch(raw)
    except PartitionReadError as exc:
        assert "stream 'S'" in str(exc) and "sequence 2" in str(exc)
    else:
        raise AssertionError("an unbuildable batch must fail")


def test_edge_ttls_match_the_server_grammar():
    for value in EDGE_TTLS:
        items = _feed([(b"a", _ack(1, 0), b"", f"NATS/1.0\r\nNats-TTL: {value}\r\n\r\n".encode())])
        row = build_batch(items[0]).to_pylist()[0]
        try:
            seconds = server_ttl_seconds(value.strip())
        except InvalidTtl:
            seconds = None
        has_expiry = bool(seconds and seconds > 0 and (TS + 1) // 1000 + seconds * 1_000_000 <= MAX_TIMESTAMP_US)
        assert (row["expires_at"] is not None) == has_expiry, value
