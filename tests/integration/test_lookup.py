"""Lookup joins (issue #55): every row's result equals nats-py's ``kv.get`` of its key at that point, field by
field (value, revision, created), on one server; the R3, Spark Connect and bench cases are in their own files.

The bucket holds present keys (of every allowed character), a deleted one, a purged one and one expired by
the bucket's MaxAge; the rows hold those, missing keys, repeats, nulls and invalid keys.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import time

import nats.errors
import nats.js.errors
import pytest
from pyspark.sql import functions as F

from pyspark_jetstream import OptionError, lookup
from pyspark_jetstream.lookup.join import InvalidKeyError

from ..helpers import SyncNats, kv_of, wait_until

LIVE = ["a", "A-z_0/9=x", "dev.site7.t-1", "-", "=", "/", "_", "9"]
GONE = ["deleted", "purged"]
INVALID = ["a b", ".x", "x.", "a..b", "*", ">", "é"]
MISSING = ["never", "dev.site8"]


def _bucket(client: SyncNats, name: str, **config) -> None:
    kv = client.run(client.js.create_key_value(bucket=name, history=5, **config))
    for i, key in enumerate(LIVE):
        client.run(kv.put(key, f"v{i}".encode()))
    client.run(kv.put(LIVE[0], b"v-latest"))  # the latest of several values
    for key in GONE:
        client.run(kv.put(key, b"old"))
    client.run(kv.delete("deleted"))
    client.run(kv.purge("purged"))


def _judge(client: SyncNats, kv, key: str | None, bucket: str) -> tuple:
    """nats-py's kv.get of ``key``: (value, revision, created) or three Nones. nats-py 2.16's entry has no
    ``created`` (None through direct gets): that is the stored message's time, as nats.go's ``Created()``
    gives it, read with ``get_last_msg`` and checked to be the same revision."""
    if key is None:
        return (None, None, None)
    deadline = time.monotonic() + 30
    while True:
        try:
            return _judge_once(client, kv, key, bucket)
        except (nats.js.errors.ServiceUnavailableError, nats.errors.TimeoutError):
            # "Not yet" (an R3 bucket electing after step-downs, CI of ae94ee0): nats-py is asked again.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _judge_once(client: SyncNats, kv, key: str, bucket: str) -> tuple:
    try:
        entry = client.run(kv.get(key))
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError, nats.js.errors.InvalidKeyError):
        return (None, None, None)
    try:
        stored = client.run(client.js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{key}"))
    except nats.js.errors.NotFoundError:  # expired between the two calls
        return (None, None, None)
    assert stored.seq == entry.revision, (key, stored.seq, entry.revision)
    return (entry.value, entry.revision, stored.time)


def _rows(spark, keys: list[str | None]):
    return spark.createDataFrame([(i, k) for i, k in enumerate(keys)], "n int, device string").repartition(3)


def _compare(client, kv, got: list, keys: list) -> None:
    for row in got:
        key = keys[row["n"]]
        value, revision, created = _judge(client, kv, key, kv._name)
        assert (row["b_value"], row["b_revision"]) == (value, revision), (key, row)
        if created is None:
            assert row["b_created"] is None, (key, row)
        else:
            assert abs((row["b_created"].astimezone(dt.timezone.utc) - created).total_seconds()) < 1e-6, (key, row)


def test_every_row_gets_what_kv_get_gives(spark, nats_server, nats_client, stream_name):
    bucket = stream_name.replace("_", "")[:40]
    _bucket(nats_client, bucket)
    kv = kv_of(nats_client, bucket)
    keys = LIVE + GONE + MISSING + INVALID + [None] + LIVE[:3] * 3
    df = _rows(spark, keys)
    got = lookup(df, bucket, "device", servers=nats_server.url, prefix="b_").collect()
    assert sorted(r["n"] for r in got) == list(range(len(keys)))  # left: every row kept
    _compare(nats_client, kv, got, keys)
    assert sum(r["b_value"] is not None for r in got) == len(LIVE) + 9  # a break-check: values are there

    inner = lookup(df, bucket, "device", servers=nats_server.url, prefix="b_", how="inner").collect()
    assert sorted(keys[r["n"]] for r in inner) == sorted(LIVE + LIVE[:3] * 3)
    _compare(nats_client, kv, inner, keys)


def test_a_key_expired_by_the_buckets_max_age_has_no_value(spark, nats_server, nats_client, stream_name):
    bucket = stream_name.replace("_", "")[:40]
    kv = nats_client.run(nats_client.js.create_key_value(bucket=bucket, ttl=1))
    nats_client.run(kv.put("soon", b"gone"))
    df = _rows(spark, ["soon"])
    assert lookup(df, bucket, "device", servers=nats_server.url, prefix="b_").collect()[0]["b_value"] == b"gone"
    wait_until(lambda: _judge(nats_client, kv, "soon", bucket)[0] is None, timeout=30, what="the key expired for nats-py")
    got = lookup(df, bucket, "device", servers=nats_server.url, prefix="b_").collect()
    assert got[0]["b_value"] is None and got[0]["b_revision"] is None


def test_an_invalid_key_fails_the_task_naming_the_row_when_asked(spark, nats_server, nats_client, stream_name):
    bucket = stream_name.replace("_", "")[:40]
    _bucket(nats_client, bucket)
    df = spark.createDataFrame([(0, "a"), (1, "x."), (2, "a")], "n int, device string").coalesce(1)
    with pytest.raises(Exception) as failed:
        lookup(df, bucket, "device", servers=nats_server.url, invalidKey="error").collect()
    assert InvalidKeyError.__name__ in str(failed.value) and "Row 1 of partition 0" in str(failed.value)
    assert "'x.'" in str(failed.value)


def test_options_are_checked_when_the_dataframe_is_defined(spark, nats_server, nats_client, stream_name):
    bucket = stream_name.replace("_", "")[:40]
    _bucket(nats_client, bucket)
    df = _rows(spark, ["a"])
    for options, named in (({"hwo": "left"}, "hwo"), ({"how": "outer"}, "how"), ({"cache": "lru"}, "cache"),
                           ({"prefix": "a.b"}, "prefix"), ({"cacheTtl": "5s"}, "cacheTtl")):
        with pytest.raises(OptionError) as refused:
            lookup(df, bucket, "device", servers=nats_server.url, **options)
        assert named in str(refused.value), (options, refused.value)
    with pytest.raises(OptionError, match="key"):
        lookup(df, bucket, "n", servers=nats_server.url)  # not a string column
    with pytest.raises(OptionError, match="key"):
        lookup(df, bucket, "nope", servers=nats_server.url)
    with pytest.raises(Exception, match="does not exist"):
        lookup(df, bucket + "X", "device", servers=nats_server.url)
    clash = df.withColumn(f"{bucket}_value", F.lit(1))
    with pytest.raises(OptionError, match="prefix"):
        lookup(clash, bucket, "device", servers=nats_server.url)  # the default prefix, <bucket>_, collides


def test_a_lookup_pinned_to_a_sequence_or_a_time_reads_the_values_of_then(spark, nats_server, nats_client,
                                                                          stream_name):
    bucket = stream_name.replace("_", "")[:40]
    kv = nats_client.run(nats_client.js.create_key_value(bucket=bucket, history=10, direct=True))
    first = nats_client.run(kv.put("a", b"v1"))
    time.sleep(0.01)  # the next put's timestamp is later than the pinned time, which nats-server stamps to the ns
    pinned_time = dt.datetime.now(dt.timezone.utc)
    time.sleep(0.01)
    nats_client.run(kv.put("a", b"v2"))
    nats_client.run(kv.put("b", b"new"))  # created after the pin: no value then
    df = _rows(spark, ["a", "b"])
    for pin in ({"asOfSequence": first}, {"asOfTimestamp": pinned_time}):
        got = {r["n"]: r for r in lookup(df, bucket, "device", servers=nats_server.url, prefix="b_", **pin).collect()}
        assert (got[0]["b_value"], got[0]["b_revision"]) == (b"v1", first), pin
        assert got[1]["b_value"] is None, pin
    now = {r["n"]: r["b_value"] for r in lookup(df, bucket, "device", servers=nats_server.url, prefix="b_").collect()}
    assert now == {0: b"v2", 1: b"new"}


def test_a_streaming_dataframe_is_enriched_per_micro_batch(spark, nats_server, nats_client, stream_name, tmp_path):
    bucket = stream_name.replace("_", "")[:30] + "B"
    _bucket(nats_client, bucket)
    kv = kv_of(nats_client, bucket)
    events = stream_name + "E"
    nats_client.add_stream(events, [f"{events}.>"])
    keys = LIVE + GONE + MISSING + INVALID
    for i, key in enumerate(keys):
        nats_client.publish_raw(f"{events}.e", None, f"{i}|{key}".encode())
    read = (spark.readStream.format("jetstream").option("servers", nats_server.url).option("stream", events)
            .option("startingOffsets", "earliest").load()
            .select(F.split(F.col("data").cast("string"), r"\|").alias("p"))
            .select(F.col("p")[0].cast("int").alias("n"), F.col("p")[1].alias("device")))
    enriched = lookup(read, bucket, "device", servers=nats_server.url, prefix="b_")
    query = (enriched.writeStream.format("memory").queryName(f"q{stream_name}".lower())
             .option("checkpointLocation", str(tmp_path / "c")).trigger(availableNow=True).start())
    assert query.awaitTermination(120)
    got = spark.sql(f"select * from q{stream_name}".lower()).collect()
    assert sorted(r["n"] for r in got) == list(range(len(keys)))
    _compare(nats_client, kv, got, keys)


@pytest.mark.parametrize("cache", ["partial", "full"])
def test_a_cache_answers_as_the_bucket_did_and_follows_it_as_documented(spark, nats_server, nats_client, stream_name,
                                                                       cache):
    bucket = stream_name.replace("_", "")[:40]
    _bucket(nats_client, bucket)
    kv = kv_of(nats_client, bucket)
    keys = LIVE + GONE + MISSING + INVALID
    df = _rows(spark, keys).coalesce(1)  # one worker: the same cache for every lookup
    options = {"servers": nats_server.url, "prefix": "b_", "cache": cache}
    if cache == "partial":
        options["cacheTtl"] = "1s"
    _compare(nats_client, kv, lookup(df, bucket, "device", **options).collect(), keys)
    nats_client.run(kv.put("a", b"changed"))
    nats_client.run(kv.put("never", b"born"))
    changed = time.monotonic()

    def fresh() -> bool:
        got = lookup(df, bucket, "device", **options).collect()
        if {keys[r["n"]]: r["b_value"] for r in got}.get("a") != b"changed":
            return False
        _compare(nats_client, kv, got, keys)
        return True

    if cache == "partial":
        # Expire after write: an answer fetched before the puts may be used for cacheTtl, in each worker that
        # holds one; past it, every lookup fetches again and is fresh at once.
        time.sleep(max(0.0, changed + 1.0 - time.monotonic()))  # the documented staleness bound, not a race
        for _ in range(3):  # whichever worker runs the task
            assert fresh()
    else:
        # Each worker's watch applies the puts as they are delivered: fresh within a network hop.
        wait_until(fresh, timeout=30, what="the full cache to follow the bucket")


async def _fill_keys(url: str, bucket: str, count: int) -> None:
    """``count`` keys ``k<i>`` put by nats-py with windowed PubAcks (a million in seconds)."""
    import nats as nats_py

    nc = await nats_py.connect(url)
    js = nc.jetstream()
    window = []
    for i in range(count):
        window.append(js.publish(f"$KV.{bucket}.k{i}", f"v{i}".encode()))
        if len(window) >= 2_000:
            await asyncio.gather(*window)
            window = []
    await asyncio.gather(*window)
    await nc.close()


@pytest.mark.parametrize("keys", [1, 1_000_000])
def test_buckets_of_one_key_and_of_a_million_answer_as_kv_get(spark, nats_server, nats_client, stream_name, keys):
    bucket = stream_name.replace("_", "")[:40]
    nats_client.run(nats_client.js.create_key_value(bucket=bucket, direct=True))
    nats_client.run(_fill_keys(nats_server.url, bucket, keys), timeout=900)
    kv = kv_of(nats_client, bucket)
    rng = random.Random(keys)
    asked = [f"k{rng.randrange(keys + keys // 10 + 1)}" for _ in range(2_000)]  # about 1 in 11 missing
    df = _rows(spark, asked)
    got = lookup(df, bucket, "device", servers=nats_server.url, prefix="b_").collect()
    assert sorted(r["n"] for r in got) == list(range(len(asked)))
    _compare(nats_client, kv, got, asked)
    assert sum(r["b_value"] is not None for r in got) == sum(int(k[1:]) < keys for k in asked)
