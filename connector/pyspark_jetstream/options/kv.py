"""The options of a write to a KV bucket (``bucket``, ``ensureBucket``, ``bucket.*``, ``sequenceBy``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import OptionError
from ..protocol.kv import MAX_HISTORY, BucketSettings
from .spec import (
    OptionSpec,
    as_fields,
    parse_choice,
    parse_duration_seconds,
    parse_int_range,
    parse_name,
    parse_text,
    raw_value,
    user_keys,
)

KV_SINK_OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("bucket", None, "Expected a KV bucket name (letters, digits, '-' and '_').",
               "Write to this KV bucket instead of a stream: each row is a key operation (columns `key`, `data`, "
               "`operation`, `ttl`, `expected_revision`; see [KV buckets](#kv-buckets)).", parse_name),
    OptionSpec("ensureBucket", "validate", "Expected one of 'validate', 'create', 'update'.",
               "`validate`: the bucket must exist and take what the rows carry (TTLs, purges); `create`: create it "
               "as nats-py's `create_key_value` would; `update`: also enable per-key TTLs, roll-ups or the limit "
               "marker TTL on an existing bucket.", parse_choice("validate", "create", "update")),
    OptionSpec("bucket.history", "1", f"Expected an integer from 1 to {MAX_HISTORY}.",
               "Values kept per key in a created bucket (KV history).", parse_int_range(1, MAX_HISTORY)),
    OptionSpec("bucket.ttl", "0", "Expected a duration such as '24h', or 0 for none.",
               "Max age of every value in a created bucket (KV TTL); per-key TTLs (`ttl`) can only be shorter.",
               parse_duration_seconds(0.0)),
    OptionSpec("bucket.maxValueSize", "-1", "Expected an integer >= -1 (-1 for unlimited).",
               "Largest value a created bucket accepts, in bytes.", parse_int_range(-1)),
    OptionSpec("bucket.storage", "file", "Expected 'file' or 'memory'.",
               "Storage of a created bucket.", parse_choice("file", "memory")),
    OptionSpec("bucket.replicas", "1", "Expected an integer from 1 to 5.",
               "Replicas of a created bucket.", parse_int_range(1, 5)),
    OptionSpec("bucket.limitMarkerTtl", None, "Expected a duration of at least 1s, such as '15m' (ADR-43 minimum).",
               "Limit marker TTL (SubjectDeleteMarkerTTL) for `create`/`update`: when a key's last value expires the "
               "server leaves a marker that watchers see as a purge, kept this long.", parse_duration_seconds(1.0)),
    OptionSpec("sequenceBy", None, "Expected the name of a column of type byte, short, int, long, timestamp, "
               "timestamp_ntz, date or string.",
               "Column that orders the rows of one key: the bucket keeps, per key, the row with the greatest value, "
               "whichever task, micro-batch or writer publishes last; older rows are skipped and counted (see "
               "[Keeping each key's newest row](#keeping-each-keys-newest-row-sequenceby)).", parse_text),
)



def bucket_settings(raw: Mapping[str, str], values: Mapping[str, Any]) -> BucketSettings | None:
    """A KV write's bucket settings (None for a write to a stream), refusing options of the other kind:
    a write goes to a bucket or to a stream, never both."""
    given = {k.lower(): k for k in user_keys(raw)}
    if values["bucket"] is None:
        if values["sequenceBy"] is not None:
            raise OptionError("sequenceBy", values["sequenceBy"], "It orders the rows of each key of a KV bucket: "
                              "set 'bucket' too (a stream keeps every message; 'stream.maxMsgsPerSubject' keeps the "
                              "last published, not the newest).")
        kv_only = [given[k] for k in given if k == "ensurebucket" or k.startswith("bucket.")]
        if kv_only:
            raise OptionError(kv_only[0], raw_value(raw, kv_only[0]), "It applies to KV writes: set 'bucket' too.")
        return None
    for name in ("stream", "subject", "ensureStream"):
        if name.lower() in given:
            raise OptionError(given[name.lower()], raw_value(raw, name),
                              "A write goes to a KV bucket ('bucket') or to a stream, not both: with 'bucket' "
                              "the subject is $KV.<bucket>.<key> and 'ensureBucket' sets the bucket up.")
    stream_only = [given[k] for k in given if k.startswith("stream.")]
    if stream_only:
        raise OptionError(stream_only[0], raw_value(raw, stream_only[0]),
                          "With 'bucket', set the bucket up with the 'bucket.*' options (e.g. 'bucket.history').")
    return BucketSettings(**as_fields(values, "history", "ttl", "maxValueSize", "storage", "replicas", "limitMarkerTtl",
                                      group="bucket."))
