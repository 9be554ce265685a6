"""Rows to Arrow batches, for the one write path that is given rows: streaming writes on PySpark 4.0.

**Why.** The sink encodes Arrow batches column by column (:mod:`.encoder`). PySpark 4.1 hands a
streaming writer Arrow batches (``DataSourceStreamArrowWriter``); 4.0 has only the row writer, so
its rows are gathered into batches of the write's own schema here (Spark's ``to_arrow_schema``),
and everything after that is the same code on every version.

Values come as PySpark makes them (``ArrowTableToRowsConversion``), and each is converted by its
field's Arrow type, at any depth: ``Row`` for a struct (turned into a dict), ``bytearray`` for
binary, ``dict`` for a map, and a naive ``datetime`` for both kinds of timestamp:

* a ``timestamp`` (an Arrow timestamp with a zone) comes in the worker's local time: it is made
  aware, so Arrow stores the instant;
* a ``timestamp_ntz`` (an Arrow timestamp without one) comes as its wall-clock time: it is kept as
  is, the value 4.1's Arrow batches hold (an NTZ ``expires_at`` or ``sequenceBy`` is then read as
  UTC on every version, whatever the worker's ``TZ``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator
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


Convert = Callable[[Any], Any]


def _local_time(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.astimezone(dt.timezone.utc)  # naive: the local time PySpark made of the instant
    return value


def _converter(arrow_type: Any) -> Convert | None:
    """What makes a PySpark value of ``arrow_type`` an Arrow one; None when it is one already."""
    import pyarrow as pa

    if pa.types.is_timestamp(arrow_type):
        return _local_time if arrow_type.tz is not None else None  # without a zone: the wall clock, as is
    if pa.types.is_struct(arrow_type):
        fields = [(field.name, _converter(field.type)) for field in arrow_type]

        def struct(value: Any) -> Any:  # a Row (its values in the field order) or a dict, as a dict
            if value is None:
                return None
            values = [value.get(name) for name, _ in fields] if isinstance(value, dict) else value
            return {name: v if convert is None or v is None else convert(v)
                    for (name, convert), v in zip(fields, values, strict=True)}

        return struct
    if pa.types.is_map(arrow_type):
        key, item = _converter(arrow_type.key_type), _converter(arrow_type.item_type)
        if key is None and item is None:
            return None

        def mapping(value: Any) -> Any:
            if value is None:
                return None
            pairs = value.items() if isinstance(value, dict) else value
            return [(k if key is None or k is None else key(k), v if item is None or v is None else item(v))
                    for k, v in pairs]

        return mapping
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
        element = _converter(arrow_type.value_type)
        if element is None:
            return None
        return lambda value: None if value is None else [None if v is None else element(v) for v in value]
    return None


def _batch(rows: list[Any], schema: Any, converters: list[Convert | None]) -> Any:
    import pyarrow as pa

    columns = list(zip(*rows, strict=True))
    arrays = [pa.array(column if convert is None else [None if v is None else convert(v) for v in column],
                       type=field.type)
              for column, field, convert in zip(columns, schema, converters, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def row_batches(rows: Iterable[Any], schema: Any, size: int = BATCH_ROWS) -> Iterator[Any]:
    """``rows`` (tuples in the order of ``schema``, a ``pyarrow.Schema``) as RecordBatches of ``size``."""
    converters = [_converter(field.type) for field in schema]
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield _batch(chunk, schema, converters)
            chunk = []
    if chunk:
        yield _batch(chunk, schema, converters)
