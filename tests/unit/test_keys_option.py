"""The source option ``keys`` (issue #46): a bucket's keys or key filters, as nats-py's ``keys()`` takes
them, checked when the DataFrame is defined; the latest view of literal keys is planned as direct gets."""

from __future__ import annotations

import pytest

from pyspark_jetstream.errors import OptionError
from pyspark_jetstream.options import parse_source_options
from pyspark_jetstream.protocol.kv import is_valid_key_filter
from pyspark_jetstream.source.plan.offsets import StreamBounds
from pyspark_jetstream.source.plan.partitions import KEYS_PER_REQUEST, plan_key_partitions


def test_keys_become_the_buckets_subjects_in_the_order_given_without_repeats():
    opts = parse_source_options({"bucket": "users", "keys": "b, a,b,dev.*,x.>"}, streaming=False)
    assert opts.keys == ("b", "a", "dev.*", "x.>")
    assert opts.subjects == ("$KV.users.b", "$KV.users.a", "$KV.users.dev.*", "$KV.users.x.>")
    assert opts.filter_subjects == opts.subjects
    assert opts.literal_keys is None  # a wildcard: read through a filtered consumer


def test_literal_keys_are_read_by_direct_get():
    opts = parse_source_options({"bucket": "users", "keys": "a.b,c", "kv.view": "latest"}, streaming=False)
    assert opts.literal_keys == ("$KV.users.a.b", "$KV.users.c")


@pytest.mark.parametrize("key", ["a b", "a..b", ".a", "a.", "a.>.b", "a*", "caf\u00e9", "", "a,,b", "x\tb"])
def test_a_key_no_bucket_takes_is_refused_naming_it(key):
    with pytest.raises(OptionError) as caught:
        parse_source_options({"bucket": "users", "keys": key}, streaming=False)
    message = str(caught.value)
    assert "'keys'" in message and "not a valid key" in message


@pytest.mark.parametrize("key", ["user42", "a.b.c", "*", ">", "a.*.c", "a.>", "-/_=09AZaz"])
def test_keys_and_filters_nats_py_takes_are_accepted(key):
    assert is_valid_key_filter(key)


def test_keys_need_a_bucket_and_exclude_subjects():
    with pytest.raises(OptionError, match="applies to KV buckets"):
        parse_source_options({"stream": "S", "keys": "a"}, streaming=False)
    with pytest.raises(OptionError, match="either 'keys' or 'subjects'"):
        parse_source_options({"bucket": "b", "keys": "a", "subjects": "$KV.b.a"}, streaming=False)


def test_keys_combine_with_the_other_options():
    opts = parse_source_options({"bucket": "b", "keys": "a", "startingOffsets": "5", "endingOffsets": "9",
                                 "numPartitions": "3", "includeHeaders": "false"}, streaming=False)
    assert (opts.starting.value, opts.ending_seq, opts.num_partitions, opts.include_headers) == (5, 9, 3, False)
    streaming = parse_source_options({"bucket": "b", "keys": "a.*", "startingOffsets": "lastPerSubject"},
                                     streaming=True)
    assert streaming.subjects == ("$KV.b.a.*",)


def _bounds() -> StreamBounds:
    return StreamBounds(first_seq=1, last_seq=5000, created="c", allow_direct=True)


@pytest.mark.parametrize("count, partitions, expected", [(1, 4, 1), (KEYS_PER_REQUEST, 4, 1),
                                                         (KEYS_PER_REQUEST + 1, 4, 2), (10_000, 4, 4),
                                                         (10_000, 1, 1)])
def test_key_partitions_cover_every_key_once(count, partitions, expected):
    opts = parse_source_options({"bucket": "b", "keys": ",".join(f"k{i}" for i in range(count)),
                                 "kv.view": "latest", "numPartitions": str(partitions)}, streaming=False)
    planned = plan_key_partitions(opts, opts.literal_keys, 0, _bounds())
    assert len(planned) == expected
    assert [k for p in planned for k in p.keys] == list(opts.literal_keys)
    # No sequence is fixed when planning: a view's partitions serve every later query, each reading the keys now.
    assert all(p.up_to is None and p.last_per_subject for p in planned)
