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
    TimestampType,
)

from pyspark_jetstream import spark_api
from pyspark_jetstream.errors import OptionError
from pyspark_jetstream.progress import lag, parse_offset
from pyspark_jetstream.sink.row_batches import arrow_schema_of, row_batches

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
