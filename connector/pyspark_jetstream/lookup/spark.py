"""``lookup(df, bucket, key, ...)``: a DataFrame's rows joined with a KV bucket's value of each row's key
(issue #55), checked when it is defined and run by ``mapInArrow`` on every PySpark from 4.0 and through
Spark Connect. The work per batch is :mod:`.task`'s."""

from __future__ import annotations

import datetime as dt
from typing import Any

from ..errors import OptionError


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return str(value)


def lookup(df: Any, bucket: str, key: str, **options: Any) -> Any:
    """``df`` with three columns more, what nats-py's ``kv.get(<key>)`` gives for each row's key in ``bucket``:
    ``<prefix>value`` (binary), ``<prefix>revision`` (long) and ``<prefix>created`` (timestamp); nulls for a key
    with no value (missing, deleted, purged, expired), or the row dropped with ``how="inner"``.

    ``key`` names a string column of ``df``. ``options``: the connection options of ``format("jetstream")``
    (``servers``, ``credsFile``, ``domain``, ...) and the lookup's own (``how``, ``prefix``, ``invalidKey``,
    ``cache``, ``cacheMaxRows``, ``cacheTtl``, ``cacheMissing``, ``asOfSequence``, ``asOfTimestamp``,
    ``timeout``: docs/kv.md, "Lookups"). Checked now: an option, the key column or a column name that
    collides raises an :class:`~pyspark_jetstream.errors.OptionError` naming it; the bucket must exist.

    A row's value is the key's value when its batch is looked up (processing time), unless the lookup is
    pinned with ``asOfSequence`` / ``asOfTimestamp`` (batch DataFrames only)."""
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType, TimestampType

    from ..options import parse_lookup_options
    from .fetch import resolve_target
    from .task import LookupTask

    opts = parse_lookup_options({**{name: _text(value) for name, value in options.items()}, "bucket": bucket})
    if key not in df.columns:
        raise OptionError("key", key, f"No such column; the DataFrame has {', '.join(df.columns)}.")
    if not isinstance(df.schema[key].dataType, StringType):
        raise OptionError("key", key, f"The key column must be a string; it is {df.schema[key].dataType.simpleString()}: "
                          f"cast it (F.col('{key}').cast('string')).")
    added = [f"{opts.prefix}value", f"{opts.prefix}revision", f"{opts.prefix}created"]
    clash = sorted(name for name in added if name.lower() in {c.lower() for c in df.columns})  # Spark: any case
    if clash:
        raise OptionError("prefix", opts.prefix, f"The column(s) {', '.join(clash)} exist already: choose another "
                          "prefix.")
    pinned = opts.as_of_sequence is not None or opts.as_of_timestamp is not None
    if pinned and df.isStreaming:
        name = "asOfSequence" if opts.as_of_sequence is not None else "asOfTimestamp"
        raise OptionError(name, _text(options.get(name)), "It applies to batch DataFrames only: a streaming lookup "
                          "reads each key's value when its micro-batch runs.")
    if pinned and opts.cache == "full":
        raise OptionError("cache", "full", "A full cache follows the bucket as it changes; a pinned lookup "
                          "(asOfSequence, asOfTimestamp) reads one point: use cache='none' or 'partial'.")
    target = resolve_target(opts)
    if opts.cache == "full" and target.key_bucket != opts.bucket:
        raise OptionError("cache", "full", f"Bucket '{bucket}' mirrors '{target.key_bucket}', whose watch nats-py "
                          "does not follow through a mirror: use cache='partial', or look up the origin.")
    schema = StructType([*df.schema.fields, StructField(added[0], BinaryType()), StructField(added[1], LongType()),
                         StructField(added[2], TimestampType())])
    return df.mapInArrow(LookupTask(opts, target, key), schema)
