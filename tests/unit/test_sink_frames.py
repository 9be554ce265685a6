"""The sink's column-wise frames against its per-row frames: byte for byte, refusals alike.

Random batches of the rows the column-wise path takes (subject, data as binary or
string, ttl as text or seconds, msg_id, with or without ``defaultTtl``, the
expected stream, generated ids, ``preserveExpiry`` and a small ``max_payload``)
are encoded twice, once with ``BatchEncoder.columnar`` off (the column-wise
lane and the Arrow frames off: the per-row steps). Frames, their OutFrame fields
and every refusal must be equal. Batches with user headers must take the per-row
steps; batches the lane takes (stream and KV writes) are checked to be taken.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import random

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pyspark_jetstream.sink.encode.encoder import BatchEncoder
from pyspark_jetstream.sink.encode.frames import Frames, ReplyForm
from pyspark_jetstream.sink.encode.layout import EncoderConfig, layout_from_schema
from pyspark_jetstream.sink.encode.msg_ids import MsgIds

NOW = dt.datetime(2026, 11, 24, 12, 0, tzinfo=dt.timezone.utc)
SUBJECTS = ["orders.eu", "orders.é.1", "a", "bad subject", "x.*", "", None, "k" * 200]
TTLS_TEXT = [None, "1h", "90s", "never", "0", "5", " 30", "1.5h", "bogus", "0.5s", "-1", "1h30m"]
TTLS_INT = [None, 0, 1, 3600, -5, 2**63]
IDS = [None, "", "id-1", "id-é", "dup", "bad\nid"]


def encode_both(columns: dict, spark_fields: list, cfg: EncoderConfig, ids: MsgIds | None, first: int,
                has_default: bool, reply: str | ReplyForm = "_INBOX.r4nd0m."):
    batch = pa.RecordBatch.from_pydict(columns)
    layout = layout_from_schema(StructType(spark_fields), has_default_subject=has_default)
    outs = []
    for columnar in (True, False):
        encoder = BatchEncoder(layout, cfg, MsgIds(ids.run, ids.partition) if ids else None)
        encoder.columnar = columnar
        outs.append(encoder.encode(batch, first, reply, now=NOW))
    return outs


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_column_wise_frames_are_the_per_row_frames(seed):
    rng = random.Random(seed)
    n = rng.randrange(0, 40)
    binary_data = rng.random() < 0.7
    ttl_kind = rng.choice(["none", "text", "int"])
    columns: dict = {"subject": pa.array([rng.choice(SUBJECTS) for _ in range(n)], pa.string())}
    fields = [StructField("subject", StringType())]
    datas = [rng.choice([None, b"", b"x" * rng.randrange(1, 300), "é".encode() * rng.randrange(5)]) for _ in range(n)]
    if binary_data:
        columns["data"] = pa.array(datas, pa.binary())
        fields.append(StructField("data", BinaryType()))
    else:
        columns["data"] = pa.array([None if d is None else d.decode("utf-8", "replace") for d in datas], pa.string())
        fields.append(StructField("data", StringType()))
    if ttl_kind == "text":
        columns["ttl"] = pa.array([rng.choice(TTLS_TEXT) for _ in range(n)], pa.string())
        fields.append(StructField("ttl", StringType()))
    elif ttl_kind == "int":
        columns["ttl"] = pa.array([rng.choice(TTLS_INT[:-1]) for _ in range(n)], pa.int64())
        fields.append(StructField("ttl", LongType()))
    if rng.random() < 0.5:
        columns["msg_id"] = pa.array([rng.choice(IDS) for _ in range(n)], pa.string())
        fields.append(StructField("msg_id", StringType()))
    preserve = rng.random() < 0.3
    if preserve:
        columns["expires_at"] = pa.array(
            [rng.choice([None, NOW - dt.timedelta(seconds=5), NOW + dt.timedelta(seconds=rng.randrange(1, 10**6))])
             for _ in range(n)], pa.timestamp("us", tz="UTC"))
        fields.append(StructField("expires_at", TimestampType()))
    has_default = rng.random() < 0.5
    cfg = EncoderConfig(
        default_subject="fallback.subject" if has_default else None,
        default_ttl=rng.choice([None, "1h", "never", "60"]),
        preserve_expiry=preserve,
        expected_stream=rng.choice([None, "ORDERS"]),
        allow_rollup=False,
        max_payload=rng.choice([1024 * 1024, 200, 330]),
    )
    ids = rng.choice([None, MsgIds("w0123456789abcdef", rng.randrange(4))])
    reply = rng.choice(["_INBOX.r4nd0m.", ReplyForm("_INBOX.r.b7.500.fail.", ".1.$FI", 1)])  # a batch's own
    fast, slow = encode_both(columns, fields, cfg, ids, rng.choice([0, 1, 10_000]), has_default, reply)
    assert fast.frames == slow.frames
    form = ReplyForm(reply) if isinstance(reply, str) else reply
    assert [f[1].split(b" ")[2] for f in fast.frames] == [form.of(f[0]).encode() for f in fast.frames]
    assert [(r.position, r.subject, r.reason, r.column, r.value, r.payload, r.msg_id) for r in fast.rejected] == \
        [(r.position, r.subject, r.reason, r.column, r.value, r.payload, r.msg_id) for r in slow.rejected]
    assert (fast.expired, fast.markers_skipped) == (slow.expired, slow.markers_skipped)


def test_the_column_wise_path_is_taken_for_common_rows_only(monkeypatch):
    calls = []
    original = Frames.columns

    def spy(self, *args):
        calls.append(len(args[0]))
        return original(self, *args)

    monkeypatch.setattr(Frames, "columns", spy)
    cfg = EncoderConfig(default_subject=None, default_ttl="1h", preserve_expiry=False, expected_stream="S",
                        allow_rollup=False, max_payload=1 << 20)
    plain = [StructField("subject", StringType()), StructField("data", BinaryType())]
    columns = {"subject": pa.array(["a", "b"]), "data": pa.array([b"1", b"2"], pa.binary())}
    encode_both(columns, plain, cfg, MsgIds("w1", 0), 0, False)
    assert calls == [2]  # the columnar run (the per-row run does not call it)
    calls.clear()
    with_headers = plain + [StructField("headers", MapType(StringType(), ArrayType(StringType())))]
    columns["headers"] = pa.array([[("X-A", ["1"])], None], pa.map_(pa.string(), pa.list_(pa.string())))
    fast, slow = encode_both(columns, with_headers, cfg, MsgIds("w1", 0), 0, False)
    assert calls == [] and fast.frames == slow.frames and b"X-A: 1\r\n" in fast.frames[0][1]


def test_a_message_of_exactly_max_payload_is_sent_and_one_byte_more_is_refused():
    fields = [StructField("subject", StringType()), StructField("data", BinaryType())]
    columns = {"subject": pa.array(["a.b", "a.b"]), "data": pa.array([b"x" * 50, b"x" * 51], pa.binary())}

    def cfg(max_payload):
        return EncoderConfig(default_subject=None, default_ttl="1h", preserve_expiry=False, expected_stream=None,
                             allow_rollup=False, max_payload=max_payload)

    first, _ = encode_both(columns, fields, cfg(1 << 20), MsgIds("w1", 0), 0, False)
    size = first.frames[0][5] + first.frames[0][6]  # header block and payload of the 50-byte row
    fast, slow = encode_both(columns, fields, cfg(size), MsgIds("w1", 0), 0, False)
    assert fast.frames == slow.frames and [f[0] for f in fast.frames] == [0]
    assert [r.position for r in fast.rejected] == [r.position for r in slow.rejected] == [1]
    assert f"more than the server's max_payload of {size}" in fast.rejected[0].reason


def test_a_batch_encoded_in_slices_gives_the_whole_batchs_frames_refusals_and_ids():
    """The writer encodes each Arrow batch in slices of half the window: running positions and the
    content-addressed ids (one source message exploded into adjacent rows across a slice's edge)
    must come out as if the batch were encoded at once."""
    from pyspark_jetstream.sink.task.write import slices

    n = 2500
    fields = [StructField("subject", StringType()), StructField("data", BinaryType()),
              StructField("ttl", StringType()), StructField("stream", StringType()), StructField("seq", LongType())]
    batch = pa.RecordBatch.from_pydict({
        "subject": pa.array(["bad subject" if i % 401 == 0 else f"o.{i // 3 % 7}" for i in range(n)]),
        "data": pa.array([b"x" * (i // 3 % 50) for i in range(n)], pa.binary()),  # the rows of a seq alike
        "ttl": pa.array([None if i // 3 % 5 else "1h" for i in range(n)]),
        "stream": pa.array(["SRC"] * n), "seq": pa.array([i // 3 for i in range(n)], pa.int64()),  # 1023, 1024: one
    })
    layout = layout_from_schema(StructType(fields), has_default_subject=False)
    cfg = EncoderConfig(default_subject=None, default_ttl=None, preserve_expiry=False, expected_stream="S",
                        allow_rollup=False, max_payload=1 << 20)
    whole = BatchEncoder(layout, cfg, MsgIds("q:7", 1)).encode(batch, 5000, "_INBOX.r.", now=NOW)
    parts = slices(batch, 1024)
    assert [p.num_rows for p in parts] == [1024, 1024, 452]
    assert slices(batch, n) == [batch]
    encoder, position, frames, rejected = BatchEncoder(layout, cfg, MsgIds("q:7", 1)), 5000, [], []
    for part in parts:
        out = encoder.encode(part, position, "_INBOX.r.", now=NOW)
        position += part.num_rows
        frames += out.frames
        rejected += [(r.position, r.subject, r.reason) for r in out.rejected]
    assert frames == whole.frames and len(frames) == n - 7
    assert rejected == [(r.position, r.subject, r.reason) for r in whole.rejected]
    ids = {f[0]: f[4] for f in frames}  # position -> msg id; rows 1023 and 1024 are one message, at the edge
    shown = [ids[5000 + i].split(":") for i in range(1022, 1026)]
    assert [(s[2], s[3][16:]) for s in shown] == [("SRC.340", ".2"), ("SRC.341", ""), ("SRC.341", ".1"),
                                                   ("SRC.341", ".2")]
    assert shown[1][3] == shown[2][3][:16] == shown[3][3][:16]


@contextlib.contextmanager
def lane_taken():
    """What each call of the column-wise lane answered (True: it took the batch), in order."""
    from pyspark_jetstream.sink.encode.column_lane import ColumnLane

    taken: list[bool] = []
    original = ColumnLane.encode

    def spy(self, *args):
        taken.append(original(self, *args))
        return taken[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ColumnLane, "encode", spy)
        yield taken


VALID_SUBJECTS = ["orders.eu", "orders.é.1", "a", "k" * 200, None, ""]  # null and empty: option 'subject'
VALID_TTLS_TEXT = [None, "1h", "90s", "never", "0", "5", " 30", "1h30m"]


def lane_batch(rng: random.Random, n: int) -> tuple[dict, list, bool]:
    """Columns the column-wise lane takes: every row passes (repeated values, as real batches have)."""
    ttl_kind = rng.choice(["none", "text", "int"])
    columns: dict = {"subject": pa.array([rng.choice(VALID_SUBJECTS) for _ in range(n)], pa.string()),
                     "data": pa.array([b"x" * rng.randrange(0, 50) for _ in range(n)], pa.binary())}
    fields = [StructField("subject", StringType()), StructField("data", BinaryType())]
    if ttl_kind == "text":
        columns["ttl"] = pa.array([rng.choice(VALID_TTLS_TEXT) for _ in range(n)], pa.string())
        fields.append(StructField("ttl", StringType()))
    elif ttl_kind == "int":
        columns["ttl"] = pa.array([rng.choice([None, 0, 1, 3600]) for _ in range(n)], pa.int64())
        fields.append(StructField("ttl", LongType()))
    if rng.random() < 0.4:
        columns["msg_id"] = pa.array([rng.choice([None, "", "id-1", "id-é", "dup"]) for _ in range(n)], pa.string())
        fields.append(StructField("msg_id", StringType()))
    if rng.random() < 0.4:  # rows as read: content ids, null markers, null or empty headers
        columns["stream"] = pa.array(["SRC"] * n)
        columns["seq"] = pa.array([rng.choice([None, 1, 2, 3, 7]) for _ in range(n)], pa.int64())
        columns["marker_reason"] = pa.array([None] * n, pa.string())
        columns["headers"] = pa.array([rng.choice([None, []]) for _ in range(n)],
                                      pa.map_(pa.string(), pa.list_(pa.string())))
        fields += [StructField("stream", StringType()), StructField("seq", LongType()),
                   StructField("marker_reason", StringType()),
                   StructField("headers", MapType(StringType(), ArrayType(StringType())))]
    return columns, fields, ttl_kind


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_column_wise_lane_gives_the_per_row_steps_frames(seed):
    """Batches the lane takes (each checked to be taken) against the per-row steps: frames, ids,
    refusals over max_payload, counts; and a content id's repeats counted across batches alike."""
    rng = random.Random(seed)
    has_default = True
    cfg = EncoderConfig(default_subject="fallback.subject", default_ttl=rng.choice([None, "1h", "never", "60"]),
                        preserve_expiry=False, expected_stream=rng.choice([None, "ORDERS"]), allow_rollup=False,
                        max_payload=rng.choice([1024 * 1024, 150, 330]))
    ids = rng.choice([None, MsgIds("w0123456789abcdef", rng.randrange(4))])
    reply = rng.choice(["_INBOX.r4nd0m.", ReplyForm("_INBOX.r.b7.500.fail.", ".1.$FI", 1)])
    columns, fields, _ = lane_batch(rng, rng.randrange(1, 60))
    batch = pa.RecordBatch.from_pydict(columns)
    layout = layout_from_schema(StructType(fields), has_default_subject=has_default)
    outs = []
    first = rng.choice([0, 1, 10_000])
    with lane_taken() as taken:
        for columnar in (True, False):
            encoder = BatchEncoder(layout, cfg, MsgIds(ids.run, ids.partition) if ids else None)
            encoder.columnar = columnar
            outs.append([encoder.encode(batch, first, reply, now=NOW),
                         encoder.encode(batch, first + batch.num_rows, reply, now=NOW)])
    assert taken == [True, True]
    for fast, slow in zip(*outs, strict=True):
        assert fast.frames == slow.frames
        assert [(r.position, r.subject, r.reason, r.payload, r.msg_id) for r in fast.rejected] == \
            [(r.position, r.subject, r.reason, r.payload, r.msg_id) for r in slow.rejected]
        assert (fast.expired, fast.markers_skipped) == (slow.expired, slow.markers_skipped)


def test_the_lane_leaves_a_batch_with_a_row_to_refuse_to_the_per_row_steps():
    """One bad value anywhere (a subject, a TTL, an id with CR or LF, a missing subject without the
    option, a header, a delete marker) and the per-row steps take the whole batch, naming the row."""
    base = {"subject": ["a.b"] * 4, "data": [b"1"] * 4, "ttl": ["1h"] * 4, "msg_id": ["i1", "i2", "i3", "i4"]}
    fields = [StructField("subject", StringType()), StructField("data", BinaryType()),
              StructField("ttl", StringType()), StructField("msg_id", StringType())]
    cfg = EncoderConfig(default_subject=None, default_ttl=None, preserve_expiry=False, expected_stream=None,
                        allow_rollup=False, max_payload=1 << 20)
    layout = layout_from_schema(StructType(fields), has_default_subject=False)
    for column, bad, reason in (("subject", "a b", "not a valid publish subject"), ("subject", None, "has no subject"),
                                ("ttl", "bogus", "Allowed"), ("msg_id", "x\ny", "CR or LF")):
        columns = {k: list(v) for k, v in base.items()}
        columns[column][2] = bad
        out = BatchEncoder(layout, cfg, None).encode(pa.RecordBatch.from_pydict(
            {k: pa.array(v, pa.binary() if k == "data" else pa.string()) for k, v in columns.items()}), 0, "_I.")
        assert [f[0] for f in out.frames] == [0, 1, 3]
        assert [r.position for r in out.rejected] == [2] and reason in out.rejected[0].reason, (column, bad)


KEYS = ["k1", "a.b", "x-y_z=/0", "k" * 100, "é", ".a", "a.", "a b", None]
OPS = [None, "PUT", "DEL", "PURGE", "del", "MERGE"]


def kv_rows(rng: random.Random, n: int, mode: str) -> tuple[dict, list]:
    """A KV write's columns: ``valid`` values only, ``one`` bad value (of a kind the lane must see), or
    ``any`` values."""
    def pick(values: list, good: int) -> object:  # the first ``good`` values pass
        return rng.choice(values[:good] if mode != "any" else values)

    cols: dict = {"key": [pick(KEYS, 4) for _ in range(n)], "data": [b"v" * rng.randrange(0, 60) for _ in range(n)]}
    types = {"key": (pa.string(), StringType()), "data": (pa.binary(), BinaryType())}
    if rng.random() < 0.8:
        cols["operation"], types["operation"] = [pick(OPS, 4) for _ in range(n)], (pa.string(), StringType())
    ops = cols.get("operation", [None] * n)
    ttl_kind = rng.choice(["none", "text", "int"])
    if ttl_kind == "text":  # a DEL row takes no TTL: the valid batches give it none (or "0")
        cols["ttl"] = [rng.choice(TTLS_TEXT if mode == "any" else [None, "0"] if op == "DEL" else TTLS_TEXT[:5])
                       for op in ops]
        types["ttl"] = (pa.string(), StringType())
    elif ttl_kind == "int":
        cols["ttl"] = [rng.choice(TTLS_INT[:-1] if mode == "any" else [None, 0] if op == "DEL" else [None, 0, 1, 3600])
                       for op in ops]
        types["ttl"] = (pa.int64(), LongType())
    if rng.random() < 0.4:
        cols["expected_revision"] = [pick([None, 0, 5, 2**40, -1], 4) for _ in range(n)]
        types["expected_revision"] = (pa.int64(), LongType())
    if rng.random() < 0.3:
        cols["msg_id"], types["msg_id"] = [pick([None, "", "id-1", "x\ny"], 3) for _ in range(n)], (pa.string(),
                                                                                                     StringType())
    if mode == "one":
        row = rng.randrange(n)
        faults = [("key", rng.choice(KEYS[5:]))]
        if "operation" in cols:
            faults.append(("operation", rng.choice(OPS[4:])))
            if "ttl" in cols:
                faults.append(("DEL with a TTL", None))
        if "ttl" in cols:
            faults.append(("ttl", "bogus" if ttl_kind == "text" else -5))
        if "expected_revision" in cols:
            faults.append(("expected_revision", -1))
        if "msg_id" in cols:
            faults.append(("msg_id", "x\ny"))
        name, value = rng.choice(faults)
        if name == "DEL with a TTL":
            cols["operation"][row], cols["ttl"][row] = "DEL", "1h" if ttl_kind == "text" else 60
        else:
            cols[name][row] = value
    columns = {name: pa.array(values, types[name][0]) for name, values in cols.items()}
    return columns, [StructField(name, types[name][1]) for name in cols]


@settings(max_examples=500, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), mode=st.sampled_from(["valid", "one", "any"]))
def test_the_lane_gives_a_bucket_writes_per_row_frames(seed, mode):
    """KV writes (option ``bucket``) through the lane and through the per-row steps: frames (each
    operation's header lines and empty payload, the compare-and-set line, the TTL by operation),
    refusals and counts alike. Valid batches must take the lane; a batch with one bad value must not."""
    rng = random.Random(seed)
    columns, fields = kv_rows(rng, rng.randrange(1, 40), mode)
    cfg = EncoderConfig(default_subject=None, default_ttl=rng.choice([None, "1h", "never"]), preserve_expiry=False,
                        expected_stream=rng.choice([None, "KV_B"]), allow_rollup=False,
                        max_payload=rng.choice([1024 * 1024, 150, 200]), bucket="B")
    ids = rng.choice([None, MsgIds("w0123456789abcdef", 1)])
    batch = pa.RecordBatch.from_pydict(columns)
    layout = layout_from_schema(StructType(fields), has_default_subject=False, bucket=True)
    outs = []
    with lane_taken() as taken:
        for columnar in (True, False):
            encoder = BatchEncoder(layout, cfg, MsgIds(ids.run, ids.partition) if ids else None)
            encoder.columnar = columnar
            outs.append(encoder.encode(batch, 7, "_INBOX.r.", now=NOW))
    fast, slow = outs
    assert fast.frames == slow.frames
    assert [(r.position, r.subject, r.reason, r.column, r.value, r.payload, r.msg_id) for r in fast.rejected] == \
        [(r.position, r.subject, r.reason, r.column, r.value, r.payload, r.msg_id) for r in slow.rejected]
    if mode == "valid":
        assert taken == [True]
    elif mode == "one":
        assert taken == [False] and any("max_payload" not in r.reason for r in slow.rejected)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), bucket=st.booleans())
def test_large_text_and_bytes_columns_encode_as_their_small_forms(seed, bucket):
    """``spark.sql.execution.arrow.useLargeVarTypes`` hands the writer ``large_string`` and ``large_binary``
    columns: the same frames and refusals as ``string`` and ``binary`` ones, in the lane and in the per-row
    steps (Arrow's string kernels take no mix of the two)."""
    rng = random.Random(seed)
    if bucket:
        columns, fields = kv_rows(rng, rng.randrange(1, 30), rng.choice(["valid", "any"]))
        cfg = EncoderConfig(default_subject=None, default_ttl="1h", preserve_expiry=False, expected_stream=None,
                            allow_rollup=False, max_payload=1 << 20, bucket="B")
    else:
        columns, fields, _ = lane_batch(rng, rng.randrange(1, 30))
        cfg = EncoderConfig(default_subject="fb.s", default_ttl="1h", preserve_expiry=False, expected_stream=None,
                            allow_rollup=False, max_payload=1 << 20)
    layout = layout_from_schema(StructType(fields), has_default_subject=not bucket, bucket=bucket)
    small = pa.RecordBatch.from_pydict(columns)
    large = pa.RecordBatch.from_arrays(
        [c.cast(pa.large_string()) if pa.types.is_string(c.type) else
         c.cast(pa.large_binary()) if pa.types.is_binary(c.type) else c for c in small.columns],
        names=small.schema.names)
    for columnar in (True, False):
        outs = []
        for batch in (small, large):
            encoder = BatchEncoder(layout, cfg, MsgIds("w1", 0))
            encoder.columnar = columnar
            out = encoder.encode(batch, 0, "_I.", now=NOW)
            outs.append((out.frames, [(r.position, r.reason, r.payload) for r in out.rejected]))
        assert outs[0] == outs[1]
