"""The options of a lookup join (``pyspark_jetstream.lookup``, issue #55): a DataFrame's rows joined with a
bucket's current value of each row's key, checked when the DataFrame is defined.

The table is the reference (docs/kv.md's lookup table is generated from it); the connection options are
the source's and the sink's (:mod:`.connection`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import OptionError
from .connection import CONNECTION_OPTIONS, ConnectionOptions, api_prefix, connection_from
from .source import _TIMESTAMP_ALLOWED, parse_timestamp
from .spec import (
    OptionSpec,
    as_fields,
    parse_bool,
    parse_choice,
    parse_duration_seconds,
    parse_int_range,
    parse_name,
    parse_table,
    raw_value,
)

LOOKUP_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("bucket", None, "Expected a KV bucket name (letters, digits, '-' and '_').",
               "The bucket whose values are joined (its stream `KV_<bucket>`, or a mirror of it).", parse_name),
    OptionSpec("how", "left", "Expected 'left' or 'inner'.",
               "`left`: a row whose key has no value (missing, deleted, purged, expired) gets nulls; `inner`: it "
               "is dropped.", parse_choice("left", "inner")),
    OptionSpec("prefix", None, "Expected a column-name prefix without '.' or backticks.",
               "Prefix of the columns added (`<prefix>value`, `<prefix>revision`, `<prefix>created`). Default: "
               "`<bucket>_`. A name that collides with a column of the DataFrame is refused.", lambda raw: _prefix(raw)),
    OptionSpec("invalidKey", "null", "Expected 'null' or 'error'.",
               "A null key, or one that is not a valid KV key: `null` gives it no value (as a missing key); "
               "`error` fails the task naming the row.", parse_choice("null", "error")),
    OptionSpec("cache", "none", "Expected 'none', 'partial' or 'full'.",
               "Per Python worker, as Flink's lookup cache. `partial`: the keys looked up, at most "
               "`cacheMaxRows`, each kept `cacheTtl`; `full`: a KV watch keeps the whole bucket, at most "
               "`cacheMaxRows` keys (more fails the task). docs/kv.md says how fresh each answer is.",
               parse_choice("none", "partial", "full")),
    OptionSpec("cacheMaxRows", "100000", "Expected an integer from 1 to 100000000.",
               "The most keys a worker's cache holds (`partial`: the least recently used go first).",
               parse_int_range(1, 100_000_000)),
    OptionSpec("cacheTtl", None, "Expected a duration such as '60s' (at least 1ms).",
               "`partial`: how long a cached answer is used after it was fetched (expire after write). "
               "Default: until evicted.", parse_duration_seconds(0.001)),
    OptionSpec("cacheMissing", "true", "Expected 'true' or 'false'.",
               "`partial`: whether a key with no value is cached too (a later put is then seen after `cacheTtl`).",
               parse_bool),
    OptionSpec("asOfSequence", None, "Expected an integer of at least 1.",
               "Batch only: each key's last value at or before this stream sequence, so that a rerun reads the "
               "same values (as long as the bucket keeps them: docs/kv.md).", parse_int_range(1)),
    OptionSpec("asOfTimestamp", None, _TIMESTAMP_ALLOWED,
               "Batch only: as `asOfSequence`, at the last sequence stored at or before this time (resolved once, "
               "when the DataFrame is defined).", parse_timestamp),
    OptionSpec("timeout", "30s", "Expected a duration of at least 1s, such as '30s'.",
               "How long the lookups of one batch of rows may take, retries through an election included, before "
               "the task fails naming the bucket.", parse_duration_seconds(1.0)),
)


def _prefix(raw: str) -> str:
    if not raw or any(ch in raw for ch in ".`") or raw != raw.strip():
        raise ValueError(raw)
    return raw


@dataclass(frozen=True)
class LookupOptions:
    """A lookup's parsed options (the table above)."""

    connection: ConnectionOptions
    api_prefix: str
    bucket: str
    how: str
    prefix: str
    invalid_key: str
    cache: str
    cache_max_rows: int
    cache_ttl: float | None
    cache_missing: bool
    as_of_sequence: int | None
    as_of_timestamp: dt.datetime | None
    timeout: float

    @property
    def stream(self) -> str:
        return f"KV_{self.bucket}"


def parse_lookup_options(raw: Mapping[str, str]) -> LookupOptions:
    """A lookup's options (the bucket among them); an :class:`OptionError` names what is wrong."""
    values = parse_table(raw, CONNECTION_OPTIONS + LOOKUP_OPTIONS, direction="looking up")
    if values["bucket"] is None:
        raise OptionError("bucket", None, "A lookup needs the bucket whose values it joins.")
    if values["asOfSequence"] is not None and values["asOfTimestamp"] is not None:
        raise OptionError("asOfTimestamp", raw_value(raw, "asOfTimestamp"), "Set either 'asOfSequence' or "
                          "'asOfTimestamp', not both.")
    if values["cache"] != "partial" and values["cacheTtl"] is not None:
        raise OptionError("cacheTtl", raw_value(raw, "cacheTtl"), "It applies to cache='partial' only.")
    return LookupOptions(
        connection=connection_from(values), api_prefix=api_prefix(values),
        prefix=values["prefix"] if values["prefix"] is not None else f"{values['bucket']}_",
        **as_fields(values, "bucket", "how", "invalidKey", "cache", "cacheMaxRows", "cacheTtl", "cacheMissing",
                    "asOfSequence", "asOfTimestamp", "timeout"))

