"""Checking a streaming write before its query starts (issue #56, point 5).

PySpark 4.0 to 4.3 run a Python sink's code first when the query's first micro-batch with data runs,
not at ``start()`` (probed on 4.3.0: ``start()`` returns, and the data source is made and its
``streamWriter`` called only then; a query on an idle stream can wait hours for it). So a misspelled
sink option fails then. :func:`check_write` runs the same checks on the driver when the user calls it,
before ``start()``: the options, the columns and the target, as the first micro-batch would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def check_write(df_or_schema: Any, options: Mapping[str, str], *, streaming: bool = True) -> None:
    """Check a write's ``options`` against ``df_or_schema`` (a DataFrame or its ``StructType``) and the target
    now, as the sink will when Spark first runs it: an unknown or invalid option raises an
    :class:`~pyspark_jetstream.errors.OptionError` naming it, a missing column or target stream a
    :class:`~pyspark_jetstream.errors.JetStreamConnectorError`. It connects to the servers in ``options``;
    with ``ensureStream=create`` it creates the target as the first micro-batch would. Nothing is published."""
    from pyspark.sql.types import StructType

    from .options import check_write_has_options
    from .sink.plan.sink_plan import plan_sink

    schema = df_or_schema if isinstance(df_or_schema, StructType) else df_or_schema.schema
    given = {str(key).lower(): str(value) for key, value in options.items()}  # as Spark hands them over
    check_write_has_options(given)
    plan_sink(given, schema, overwrite=False, streaming=streaming)
