"""Pure parts of the version support: the rows-to-Arrow path of PySpark 4.0's streaming writes, the
progress offsets in both forms, and the refusal of read limits without admission control."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from pyspark_jetstream import spark_api
from pyspark_jetstream.errors import OptionError
from pyspark_jetstream.progress import lag, parse_offset
from pyspark_jetstream.sink.encode.row_batches import arrow_schema_of, row_batches
from pyspark_jetstream.sink.reduce import sequencer

SCHEMA = StructType([
    StructField("subject", StringType()), StructField("data", BinaryType()),
    StructField("headers", MapType(StringType(), ArrayType(StringType()))), StructField("seq", LongType()),
    StructField("timestamp", TimestampType()), StructField("meta", StructType([StructField("k", StringType())])),
])


@pytest.fixture
def local_zone_not_utc(monkeypatch):
    """A worker whose local time is not UTC: PySpark's naive timestamps are then off by hours if read as UTC."""
    import time

    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_rows_become_arrow_batches_of_the_writes_schema_with_every_value_kept(local_zone_not_utc):
    instant = dt.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=dt.timezone.utc)
    local = instant.astimezone().replace(tzinfo=None)  # what PySpark hands a writer: naive local time
    rows = [Row("a.1", bytearray(b"x"), {"H": ["1", "2"]}, 7, local, Row(k="v")),
            Row(None, None, None, None, None, None)] * 3
    batches = list(row_batches(rows, arrow_schema_of(SCHEMA), size=4))
    assert [b.num_rows for b in batches] == [4, 2]
    table = pa.Table.from_batches(batches)
    assert table.schema == arrow_schema_of(SCHEMA)
    first = table.slice(0, 1).to_pylist()[0]
    assert first == {"subject": "a.1", "data": b"x", "headers": [("H", ["1", "2"])], "seq": 7,
                     "timestamp": instant, "meta": {"k": "v"}}
    assert table.slice(1, 1).to_pylist()[0] == dict.fromkeys(SCHEMA.names)


ZONED = StructType([
    StructField("ts", TimestampType()), StructField("ntz", TimestampNTZType()),
    StructField("inner", StructType([StructField("ts", TimestampType()), StructField("ntz", TimestampNTZType())])),
    StructField("ntzs", ArrayType(TimestampNTZType())), StructField("tss", ArrayType(TimestampType())),
    StructField("by_key", MapType(StringType(), TimestampNTZType())),
    StructField("inners", ArrayType(StructType([StructField("ntz", TimestampNTZType())]))),
])
SESSION_ZONE = "Europe/Berlin"
"""The Spark session's zone: the JVM hands Python a ``timestamp`` column in it, an instant all the same."""


def jvm_batch() -> pa.RecordBatch:
    """The Arrow batch Spark's JVM sends a Python writer's worker for a DataFrame of ``ZONED``: what
    PySpark 4.1 gives a ``DataSourceStreamArrowWriter`` as is, and what 4.0 turns into rows."""
    berlin = __import__("zoneinfo").ZoneInfo(SESSION_ZONE)
    instant = dt.datetime(2026, 3, 8, 7, 30, 0, 250, tzinfo=dt.timezone.utc)  # New York's clocks go forward
    wall = dt.datetime(2026, 3, 8, 2, 30, 0, 250)  # a wall-clock time New York skips, Kolkata's has no DST
    late = dt.datetime(2026, 10, 25, 2, 30)  # Berlin's clocks go back: twice a wall-clock time there
    ts, ntz = pa.timestamp("us", tz=SESSION_ZONE), pa.timestamp("us")
    schema = pa.schema([
        ("ts", ts), ("ntz", ntz), ("inner", pa.struct([("ts", ts), ("ntz", ntz)])), ("ntzs", pa.list_(ntz)),
        ("tss", pa.list_(ts)), ("by_key", pa.map_(pa.string(), ntz)), ("inners", pa.list_(pa.struct([("ntz", ntz)]))),
    ])
    rows = [
        (instant.astimezone(berlin), wall, {"ts": instant, "ntz": wall}, [wall, None, late], [instant, None],
         [("k", wall), ("n", None)], [{"ntz": late}, None]),
        (None, late, {"ts": None, "ntz": None}, [], None, None, None),
        (None,) * 7,
    ]
    return pa.RecordBatch.from_pylist([dict(zip(schema.names, row, strict=True)) for row in rows], schema=schema)


def pyspark_4_0_rows(batch: pa.RecordBatch, schema: StructType) -> list[Row]:
    """The rows PySpark 4.0's worker gives a streaming ``DataSourceStreamWriter`` for ``batch``
    (``pyspark/sql/worker/write_into_data_source.py``: each column's ``to_pylist``, then PySpark's own
    converter per field, the one that makes a ``timestamp`` naive local time and keeps a ``timestamp_ntz``)."""
    from pyspark.sql.conversion import ArrowTableToRowsConversion

    converters = [ArrowTableToRowsConversion._create_converter(f.dataType) for f in schema.fields]
    columns = [column.to_pylist() for column in batch.columns]
    make = Row(*schema.names)
    return [make(*(convert(column[i]) for convert, column in zip(converters, columns, strict=True)))
            for i in range(batch.num_rows)]


@pytest.mark.parametrize("zone", ["America/New_York", "Asia/Kolkata"])
def test_rows_in_any_worker_zone_give_the_arrow_values_of_the_arrow_path(monkeypatch, zone):
    """A ``timestamp`` is the same instant and a ``timestamp_ntz`` the same wall-clock time, at any
    depth, as in the batch PySpark 4.1+ hands the writer: so an NTZ ``expires_at`` or ``sequenceBy``
    column means on 4.0 what it means on 4.1 (its wall-clock time read as UTC)."""
    import time

    expected = jvm_batch()
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        rows = pyspark_4_0_rows(expected, ZONED)
        assert rows[0].ntz == dt.datetime(2026, 3, 8, 2, 30, 0, 250)  # what PySpark 4.0 hands the writer
        assert rows[0].ts != rows[0].ntz.replace(hour=7)  # a timestamp comes in the worker's local time
        got = pa.Table.from_batches(list(row_batches(rows, arrow_schema_of(ZONED))))
    finally:
        monkeypatch.undo()
        time.tzset()
    assert got.schema == arrow_schema_of(ZONED)
    # Aware datetimes compare as instants (the session zone's and UTC's alike), naive ones as wall-clock
    # times, and an aware one never equals a naive one.
    assert got.to_pylist() == expected.to_pylist()
    for name in ("ts", "ntz"):  # the stored numbers themselves: microseconds since the epoch, NTZ's as UTC
        assert got.column(name).cast(pa.int64()).to_pylist() == expected.column(name).cast(pa.int64()).to_pylist()
    assert sequencer.header_values(sequencer.TS, got.column("ntz").combine_chunks())[:2] == [
        1772937000000250, 1792895400000000]  # 2026-03-08T02:30:00.000250Z and 2026-10-25T02:30:00Z


def test_no_rows_no_batches():
    assert list(row_batches([], arrow_schema_of(SCHEMA))) == []


@pytest.mark.parametrize("text", ['{"stream": "S", "seq": 70}', "{'stream': 'S', 'seq': 70}"])
def test_progress_offsets_read_as_json_and_as_a_python_repr(text):
    assert parse_offset(text) == {"stream": "S", "seq": 70}
    assert lag({"latestOffset": text.replace("70", "95"), "endOffset": text}) == 25


@pytest.mark.parametrize("missing", [None, "null", "None"])
def test_a_missing_offset_gives_no_lag(missing):
    assert parse_offset(missing) is None
    assert lag({"latestOffset": missing, "endOffset": '{"seq": 3}'}) is None


def test_read_limits_are_refused_without_admission_control_naming_the_option_and_version(monkeypatch):
    monkeypatch.setattr(spark_api, "ADMISSION_CONTROL", False)
    monkeypatch.setattr(spark_api, "VERSION_TEXT", "4.0.5")
    spark_api.require_admission_control(None, None)  # nothing asked: nothing refused
    with pytest.raises(OptionError, match=r"option 'minMessagesPerTrigger': '5'\. Limiting micro-batches needs "
                                          r"PySpark 4\.2 or newer .* this is PySpark 4\.0\.5"):
        spark_api.require_admission_control(None, 5)
    monkeypatch.setattr(spark_api, "ADMISSION_CONTROL", True)
    spark_api.require_admission_control(10, 5)
