"""The lookup's pure parts (issue #55): the keys of a batch, the join, the partial cache, the options."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from pyspark_jetstream.errors import OptionError
from pyspark_jetstream.lookup.cache import PartialCache
from pyspark_jetstream.lookup.join import (
    Found,
    InvalidKeyError,
    check_keys,
    joined,
    keys_to_fetch,
    value_fields,
)
from pyspark_jetstream.options import parse_lookup_options
from pyspark_jetstream.protocol.kv import is_valid_key

KEYS = ["a", "a", None, "b.c", "x.", ".x", "a..b", "a b", "*", "-/_=9", "é", "", "a"]


def _found(entries: dict) -> Found:
    return Found.of_entries(entries)


def test_keys_to_fetch_are_the_distinct_keys_a_bucket_can_hold_in_first_order():
    assert keys_to_fetch(pa.array(KEYS, pa.string())) == ["a", "b.c", "-/_=9"]
    # The same rule as the sink's key check, but for two dots in a row (an empty subject token: never stored).
    for key in [k for k in KEYS if k]:
        assert (key in ("a", "b.c", "-/_=9")) == (is_valid_key(key) and ".." not in key), key


def _schema(batch: pa.RecordBatch, prefix: str = "p_") -> pa.Schema:
    return pa.schema([*batch.schema, *(pa.field(n, t) for n, t in value_fields(prefix))])


def test_left_keeps_every_row_and_inner_only_the_rows_with_a_value():
    batch = pa.RecordBatch.from_pydict({"n": list(range(len(KEYS))), "k": KEYS},
                                       schema=pa.schema([("n", pa.int64()), ("k", pa.string())]))
    found = _found({"a": (b"va", 7, 1_000_000), "-/_=9": (b"v9", 9, 2_000_000)})
    left = joined(batch, "k", found, _schema(batch), "left").to_pylist()
    assert [r["n"] for r in left] == list(range(len(KEYS)))
    by_key = {(r["k"], r["p_value"], r["p_revision"]) for r in left}
    assert ("a", b"va", 7) in by_key and ("-/_=9", b"v9", 9) in by_key and ("b.c", None, None) in by_key
    assert all(r["p_value"] is None for r in left if r["k"] not in ("a", "-/_=9"))
    assert [r["p_created"] for r in left if r["k"] == "a"][0] == dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.timezone.utc)
    inner = joined(batch, "k", found, _schema(batch), "inner").to_pylist()
    assert [r["k"] for r in inner] == ["a", "a", "-/_=9", "a"]


def test_an_invalid_key_named_with_its_row_when_asked():
    check_keys(pa.array(["a", "b"], pa.string()), 0, "k")
    with pytest.raises(InvalidKeyError, match=r"Row 12 of partition 3 has key 'x\.'"):
        check_keys(pa.array(["a", "b", "x.", None], pa.string()), 10, "k", "partition 3")
    with pytest.raises(InvalidKeyError, match="Row 1 of this task has key null"):
        check_keys(pa.array(["a", None], pa.string()), 0, "k")


def test_found_entries_round_trip():
    entries = {"a": (b"1", 3, 1_700_000_000_123_456), "b": (b"", 4, 0)}
    assert Found.of_entries(entries).entries() == entries
    assert Found.empty().entries() == {}


def test_the_partial_cache_expires_after_write_evicts_the_least_recent_and_may_cache_misses():
    cache = PartialCache(max_rows=2, ttl=10.0, cache_missing=True)
    assert cache.lookup(["a", "b"], now=0.0) == ({}, ["a", "b"])
    cache.remember(["a", "b"], {"a": (b"1", 1, 0)}, now=0.0)  # b had no value: held as missing
    assert cache.lookup(["a", "b"], now=5.0) == ({"a": (b"1", 1, 0)}, [])
    assert cache.lookup(["a", "b"], now=10.0) == ({}, ["a", "b"])  # expired after write, read or not
    cache.remember(["a", "b"], {"a": (b"1", 1, 0)}, now=10.0)
    cache.lookup(["a"], now=11.0)  # a used: b is the least recent
    cache.remember(["c"], {"c": (b"3", 3, 0)}, now=11.0)
    assert len(cache) == 2 and cache.lookup(["b"], now=11.0) == ({}, ["b"])
    no_misses = PartialCache(max_rows=10, ttl=None, cache_missing=False)
    no_misses.remember(["a", "b"], {"a": (b"1", 1, 0)}, now=0.0)
    assert no_misses.lookup(["a", "b"], now=1e9) == ({"a": (b"1", 1, 0)}, ["b"])  # no ttl: held until evicted


def test_lookup_options_name_what_is_wrong():
    opts = parse_lookup_options({"bucket": "devices"})
    assert (opts.prefix, opts.how, opts.cache, opts.invalid_key, opts.stream) == ("devices_", "left", "none", "null",
                                                                                  "KV_devices")
    for raw, named in (({"bucket": "d", "hw": "left"}, "hw"), ({"bucket": "d", "how": "right"}, "how"),
                       ({"bucket": "d", "cacheTtl": "1s"}, "cacheTtl"),
                       ({"bucket": "d", "asOfSequence": "1", "asOfTimestamp": "2026-01-01T00:00:00Z"}, "asOfTimestamp"),
                       ({"bucket": "d", "asOfTimestamp": "2026-01-01T00:00:00"}, "asOfTimestamp"),
                       ({"bucket": "d", "prefix": "a.b"}, "prefix"), ({"bucket": "d e"}, "bucket")):
        with pytest.raises(OptionError) as refused:
            parse_lookup_options(raw)
        assert named in str(refused.value), (raw, refused.value)
