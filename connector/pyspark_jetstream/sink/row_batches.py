"""Rows to Arrow batches, for the one write path that is given rows: streaming writes on PySpark 4.0.

**Why.** The sink encodes Arrow batches column by column (:mod:`.encoder`). PySpark 4.1 hands a
streaming writer Arrow batches (``DataSourceStreamArrowWriter``); 4.0 has only the row writer, so
its rows are gathered into batches of the write's own schema here (Spark's ``to_arrow_schema``),
and everything after that is the same code on every version.

Values come as PySpark makes them: ``Row`` for a struct (turned into a dict), a naive ``datetime``
in the worker's local time for a timestamp (made aware, so Arrow stores the right instant),
``bytearray`` for binary, ``dict`` for a map.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from typing import Any

BATCH_ROWS = 10_000
"""Rows per Arrow batch: the size PySpark's Arrow writers hand over (``maxRecordsPerBatch``)."""


def arrow_schema_of(schema: Any) -> Any:
    """The pyarrow schema of a Spark ``StructType``, timestamps in UTC (PySpark's converter takes
    ``timestamp_utc`` up to 4.1 and ``timezone`` from 4.2 on)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(schema, timezone="UTC")
    except TypeError:
        return to_arrow_schema(schema, timestamp_utc=True)


def _value(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.astimezone(dt.timezone.utc)  # naive: the local time PySpark made of the instant
    if hasattr(value, "asDict"):
        return {k: _value(v) for k, v in value.asDict(recursive=False).items()}
    if isinstance(value, list):
        return [_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _value(v) for k, v in value.items()}
    return value


def _batch(rows: list[Any], schema: Any) -> Any:
    import pyarrow as pa

    columns = list(zip(*rows, strict=True))
    arrays = [pa.array([_value(v) for v in column], type=field.type)
              for column, field in zip(columns, schema, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def row_batches(rows: Iterable[Any], schema: Any, size: int = BATCH_ROWS) -> Iterator[Any]:
    """``rows`` (tuples in the order of ``schema``, a ``pyarrow.Schema``) as RecordBatches of ``size``."""
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield _batch(chunk, schema)
            chunk = []
    if chunk:
        yield _batch(chunk, schema)
