"""Option ``sequenceBy``'s pure parts (sink/reduce/sequencer.py): the header's values, the comparison, the per-key
reduction across a task's batches, the encoder's row choice, and the checks made before a write starts."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from pyspark_jetstream.errors import OptionError
from pyspark_jetstream.options import parse_sink_options
from pyspark_jetstream.protocol import headers as hdrs
from pyspark_jetstream.sink.encode.encoder import BatchEncoder
from pyspark_jetstream.sink.encode.layout import EncoderConfig, layout_from_schema
from pyspark_jetstream.sink.encode.msg_ids import MsgIds
from pyspark_jetstream.sink.encode.rows import RowChoice
from pyspark_jetstream.sink.plan.sink_plan import plan_sink
from pyspark_jetstream.sink.reduce import sequencer as sq

UTC = dt.timezone.utc

ORDERED = {
    sq.INT: [-(2**63), -1000, -5, 0, 7, 42, 100, 2**63 - 1],
    sq.TS: [pa.array([d], pa.timestamp("us", tz="UTC")) for d in (
        dt.datetime(1900, 1, 1, tzinfo=UTC), dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        dt.datetime(1970, 1, 1, tzinfo=UTC), dt.datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        dt.datetime(2026, 1, 1, 0, 1, tzinfo=UTC))],
    sq.DATE: [pa.array([d], pa.date32()) for d in (dt.date(1, 1, 1), dt.date(1969, 12, 31), dt.date(1970, 1, 1),
                                                    dt.date(2026, 11, 25))],
    sq.STR: ["", "\n", " ", "%", "%20", "A", "Z", "a", "a\r\nb", "a b", "ab", "z", "é", "€", "𝄞"],
}


def plain(tag, values):
    return [sq.header_values(tag, v)[0] for v in values] if tag in (sq.TS, sq.DATE) else values


@pytest.mark.parametrize("tag", list(ORDERED))
def test_encoded_values_order_as_the_values_do_and_read_back(tag):
    values = plain(tag, ORDERED[tag])
    assert values == sorted(values)
    texts = [sq.encode_value(tag, v) for v in values]
    for text in texts:
        assert text.startswith(f"{tag}:")
        hdrs.check_header_value(hdrs.SEQUENCE, text)  # one line, no CR/LF
        assert text == text.strip()  # clients trim header values: nothing to lose
    assert [sq.parse_value(t) for t in texts] == [(tag, v) for v in values]
    for older, newer in zip(values, values[1:], strict=False):
        assert sq.is_newer(tag, newer, sq.encode_value(tag, older))
        assert not sq.is_newer(tag, older, sq.encode_value(tag, newer))
        assert not sq.is_newer(tag, older, sq.encode_value(tag, older))  # equal: the stored row stays


def test_arrow_order_of_strings_is_the_comparisons_order():
    values = ORDERED[sq.STR]
    arrow = pa.array(list(reversed(values)))
    assert arrow.take(pa.compute.sort_indices(arrow)).to_pylist() == sorted(values)


def test_timestamps_of_any_unit_and_zone_are_microseconds_since_the_epoch():
    moment = dt.datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)
    micros = 1767225601000000
    assert sq.header_values(sq.TS, pa.array([moment], pa.timestamp("us", tz="UTC"))) == [micros]
    assert sq.header_values(sq.TS, pa.array([moment], pa.timestamp("ns", tz="Europe/Paris"))) == [micros]
    assert sq.header_values(sq.TS, pa.array([moment.replace(tzinfo=None)], pa.timestamp("us"))) == [micros]
    assert sq.header_values(sq.DATE, pa.array([dt.date(1970, 1, 11)], pa.date32())) == [10]


def test_a_missing_header_is_older_and_another_type_or_garbage_is_an_error():
    assert sq.is_newer(sq.INT, -(2**63), None)
    with pytest.raises(sq.SequenceMismatch, match="timestamp.*integer"):
        sq.is_newer(sq.INT, 1, "ts:5")
    for text in ("42", "int:", "int:x", "float:1", ""):
        with pytest.raises(sq.SequenceMismatch, match="unreadable"):
            sq.is_newer(sq.INT, 1, text)


def test_newest_per_key_takes_the_greatest_value_and_on_a_tie_the_later_position():
    keys = pa.array(["b", "a", "b", "a", "c", "a", "b"])
    values = pa.array([5, 1, 9, 3, 0, 3, 9])
    positions = pa.array([0, 1, 2, 3, 4, 5, 6], pa.int64())
    assert sq.newest_per_key(keys, values, positions).to_pylist() == [5, 6, 4]  # a: 3 at 5 > 3 at 3; b: 9 at 6
    assert sq.newest_per_key(pa.array([], pa.string()), pa.array([], pa.int64()),
                             pa.array([], pa.int64())).to_pylist() == []


def batch(keys, values, markers=None):
    columns = {"key": pa.array(keys, pa.string()), "data": pa.array([f"d{i}" for i in range(len(keys))]),
               "n": pa.array(values, pa.int64())}
    if markers is not None:
        columns["marker_reason"] = pa.array(markers, pa.string())
    return pa.RecordBatch.from_pydict(columns)


def test_the_reduction_keeps_the_newest_row_per_key_across_batches_and_their_positions():
    r = sq.Reduction("key", "n")
    r.reduce(batch(["a", "b", "a"], [3, 1, 2]), 0)
    r.reduce(batch(["c", "c"], [1, 1]), 3)  # nothing newest left here after the next batch
    r.reduce(batch(["b", "c", "a"], [1, 2, 3]), 5)
    kept, newest, superseded = r.take()
    assert newest == [(7, "a", 3), (5, "b", 1), (6, "c", 2)]  # ties (a: 3 = 3, b: 1 = 1): the later position
    assert [(k.first, k.newest) for k in kept] == [(5, [0, 1, 2])]
    assert superseded == 8 - 3
    assert r.take() == ([], [], 0)  # started over


def test_rows_without_a_key_or_marked_pass_through_and_rows_without_a_value_are_set_apart():
    r = sq.Reduction("key", "n", "marker_reason")
    r.reduce(batch([None, "a", "a", "b"], [1, None, 2, 5], [None, None, None, "MaxAge"]), 10)
    kept, newest, superseded = r.take()
    assert newest == [(12, "a", 2)]
    assert [(k.first, k.newest, k.passthrough, k.null_sequence) for k in kept] == [(10, [2], [0, 3], [1])]
    assert superseded == 0


def test_the_reduction_is_full_past_its_keys_or_rows():
    r = sq.Reduction("key", "n", max_keys=3, max_rows=100)
    r.reduce(batch(["a", "b", "c"], [1, 1, 1]), 0)
    assert not r.full
    r.reduce(batch(["d"], [1]), 3)
    assert r.full
    r = sq.Reduction("key", "n", max_keys=10, max_rows=4)
    r.reduce(batch(["a", "b", "c"], [1, 1, 1]), 0)
    r.reduce(batch(["a", "b"], [0, 0]), 3)  # older: the batch is not kept
    assert not r.full
    r.reduce(batch(["a", "b"], [5, 5]), 5)
    assert r.full  # 5 rows kept: both batches hold a newest row


KV_SCHEMA = StructType([StructField("key", StringType()), StructField("data", StringType()),
                        StructField("operation", StringType()), StructField("n", LongType())])


def encoder(msg_ids=None):
    layout = layout_from_schema(StructType(KV_SCHEMA.fields[:3]), has_default_subject=False, bucket=True)
    return BatchEncoder(layout, EncoderConfig(None, None, False, None, False, 1 << 20, bucket="B"), msg_ids)


def test_the_encoder_publishes_the_chosen_rows_at_their_positions_with_their_header_lines():
    rows = pa.RecordBatch.from_pydict({"key": ["a", "b", "a", "c"], "data": ["1", "2", "3", "4"],
                                       "operation": [None, None, "DEL", None]})
    out = encoder(MsgIds("run", 7)).encode(rows, 100, "_R.", choice=RowChoice(
        {2: "Spark-JetStream-Sequence: int:3\r\nNats-Expected-Last-Subject-Sequence: 0\r\n", 3: ""},
        {1: (None, "no value", "n")}))
    assert [(f[0], f[2], f[4]) for f in out.frames] == [(102, "$KV.B.a", "run:7:102"), (103, "$KV.B.c", "run:7:103")]
    block = (b"NATS/1.0\r\nKV-Operation: DEL\r\nSpark-JetStream-Sequence: int:3\r\n"
             b"Nats-Expected-Last-Subject-Sequence: 0\r\nNats-Msg-Id: run:7:102\r\n\r\n")
    assert out.frames[0][1] == b"HPUB $KV.B.a _R.102 %d %d\r\n%s\r\n" % (len(block), len(block), block)
    assert [(r.position, r.reason, r.column, r.msg_id, r.payload) for r in out.rejected] == [
        (101, "no value", "n", "run:7:101", b"2")]
    # Without a choice every row is published, with the same ids and positions.
    assert [(f[0], f[4]) for f in encoder(MsgIds("run", 7)).encode(rows, 100, "_R.").frames] == [
        (100, "run:7:100"), (101, "run:7:101"), (102, "run:7:102"), (103, "run:7:103")]


def test_a_bucket_copy_publishes_the_options_sequence_line_only():
    """A bucket read's row carries its source's Spark-JetStream-Sequence in 'headers': the copy's block holds the
    option's line alone, so a look-up (which keeps a header's last value) reads the target's order (issue #33)."""
    from pyspark.sql.types import ArrayType, MapType

    read = StructType([StructField("key", StringType()), StructField("data", StringType()),
                       StructField("operation", StringType()), StructField("subject", StringType()),
                       StructField("stream", StringType()), StructField("seq", LongType()),
                       StructField("headers", MapType(StringType(), ArrayType(StringType())))])
    layout = layout_from_schema(read, has_default_subject=False, bucket=True)
    enc = BatchEncoder(layout, EncoderConfig(None, None, False, None, False, 1 << 20, bucket="B"), None)
    rows = pa.RecordBatch.from_pydict({
        "key": ["a"], "data": ["1"], "operation": ["PUT"], "subject": ["$KV.A.a"], "stream": ["KV_A"], "seq": [3],
        "headers": pa.array([[("Spark-JetStream-Sequence", ["int:100"])]],
                            pa.map_(pa.string(), pa.list_(pa.string())))})
    out = enc.encode(rows, 0, "_R.", choice=RowChoice({0: f"{hdrs.SEQUENCE}: int:3\r\n"}))
    assert out.rejected == []
    block = b"NATS/1.0\r\nSpark-JetStream-Sequence: int:3\r\n\r\n"
    assert out.frames[0][1] == b"HPUB $KV.B.a _R.0 %d %d\r\n%s1\r\n" % (len(block), len(block) + 1, block)


OPTIONS = {"servers": "nats://127.0.0.1:1", "bucket": "B", "sequenceBy": "n"}


def test_sequence_by_needs_a_bucket():
    with pytest.raises(OptionError, match=r"'sequenceBy'.*'w'.*set 'bucket' too"):
        parse_sink_options({"servers": "nats://x:4222", "stream": "S", "sequenceBy": "w"})
    assert parse_sink_options(OPTIONS).sequence_by == "n"


@pytest.mark.parametrize("field, message", [
    (StructField("m", LongType()), r"no column 'n'; the columns are key, data, m"),
    (StructField("n", DoubleType()), r"Column 'n' has type double; it must be byte, short, int, long, timestamp"),
    (StructField("n", BooleanType()), r"type boolean"),
])
def test_the_sequence_column_must_exist_with_a_supported_type(field, message):
    schema = StructType(KV_SCHEMA.fields[:2] + [field])
    with pytest.raises(OptionError, match=r"'sequenceBy'.*'n'.*" + message):
        plan_sink(OPTIONS, schema, overwrite=False, streaming=False)


def test_sequence_by_refuses_an_expected_revision_column():
    schema = StructType(KV_SCHEMA.fields + [StructField("expected_revision", LongType())])
    with pytest.raises(OptionError, match=r"'sequenceBy'.*compare-and-set.*'expected_revision'"):
        plan_sink(OPTIONS, schema, overwrite=False, streaming=False)


@pytest.mark.parametrize("data_type, tag", [
    (ByteType(), sq.INT), (IntegerType(), sq.INT), (LongType(), sq.INT), (TimestampType(), sq.TS),
    (TimestampNTZType(), sq.TS), (DateType(), sq.DATE), (StringType(), sq.STR), (DoubleType(), None),
])
def test_supported_types(data_type, tag):
    assert sq.spark_tag(data_type) == tag


def test_the_sequence_column_is_matched_in_any_case_and_left_out_of_the_published_columns():
    name, tag, schema = sq.sequence_column(KV_SCHEMA, "N")
    assert (name, tag, [f.name for f in schema.fields]) == ("n", sq.INT, ["key", "data", "operation"])
    read = StructType(KV_SCHEMA.fields[:3] + [StructField("seq", LongType())])  # a bucket read's own column stays
    assert sq.sequence_column(read, "seq")[2] is read
