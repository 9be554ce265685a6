"""``WHERE key = ...`` / ``key IN (...)`` on a bucket's latest view, read by batched direct gets
(filter pushdown, PySpark 4.1+; issue #38), against the session's real nats-server. In the compat
cell ps41 that is nats-server 2.11.11, whose ``multi_last`` batches count ``Nats-Num-Pending``
differently (a batch cut by ``max_bytes`` says no key is left while one is)."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from pyspark_jetstream.spark_api import PUSHDOWN_CONF, scoped_pushdown

from .test_direct_get import RELAY_PREFIX, _Relay

pytestmark = pytest.mark.skipif(not scoped_pushdown(), reason="pushed filters narrow a read from PySpark 4.2 on")


@pytest.fixture
def pushdown(spark):
    spark.conf.set(PUSHDOWN_CONF, "true")
    yield spark
    spark.conf.unset(PUSHDOWN_CONF)


def _latest(spark, url: str, bucket: str, keys: list[str], **options: str):
    reader = (spark.read.format("jetstream").option("servers", url).option("bucket", bucket)
              .option("kv.view", "latest"))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load().where(F.col("key").isin(keys))


def _planned(df) -> None:
    """Plan ``df`` (Spark plans a Python source's partitions once per DataFrame, at its first use)."""
    df._jdf.queryExecution().executedPlan()


def test_a_bucket_of_69_keys_of_a_megabyte_reads_every_key(pushdown, nats_server, nats_client, stream_name):
    """One request asks for 69 keys of 1,000,000 bytes; the server sends 64 MB (its max_pending) and
    ends the batch: the 69th key is asked for again (on 2.11 it went missing: 68 rows)."""
    kv = nats_client.run(nats_client.js.create_key_value(bucket=stream_name, direct=True))
    keys = [f"k{i}" for i in range(69)]
    for i, key in enumerate(keys):
        nats_client.run(kv.put(key, bytes([i]) * 1_000_000))
    rows = _latest(pushdown, nats_server.url, stream_name, keys).select("key", F.length("data").alias("n")).collect()
    assert sorted(r.key for r in rows) == sorted(keys) and {r.n for r in rows} == {1_000_000}


def test_every_partition_reads_the_keys_at_the_planned_sequence(pushdown, nats_server, nats_client, stream_name):
    """1,030 keys in two partitions (two requests): both read the bucket as of the planned end, though
    every key changed after the plan."""
    kv = nats_client.run(nats_client.js.create_key_value(bucket=stream_name, direct=True, history=2))
    keys = [f"k{i}" for i in range(1030)]
    for key in keys:
        nats_client.run(kv.put(key, b"old"))
    df = _latest(pushdown, nats_server.url, stream_name, keys, numPartitions="2")
    _planned(df)
    for key in keys:
        nats_client.run(kv.put(key, b"new"))
    rows = df.collect()  # the DataFrame planned above (a select would be a new one, planned now)
    assert df.rdd.getNumPartitions() == 2
    assert sorted(r.key for r in rows) == sorted(keys) and {bytes(r.data) for r in rows} == {b"old"}


def test_message_not_found_is_asked_again(pushdown, nats_server, nats_client, stream_name):
    """A ``404 Message Not Found`` (a message expired or replaced between the server's lookup and its
    load; injected by a relay on the real server) is asked again, not read as "no keys"."""
    kv = nats_client.run(nats_client.js.create_key_value(bucket=stream_name, direct=True))
    for key in ("a", "b"):
        nats_client.run(kv.put(key, key.encode()))
    relay = _Relay(nats_server.url, fail=1, keep=0)
    try:
        rows = _latest(pushdown, nats_server.url, stream_name, ["a", "b"], apiPrefix=RELAY_PREFIX).collect()
    finally:
        relay.close()
    assert sorted((r.key, bytes(r.data)) for r in rows) == [("a", b"a"), ("b", b"b")]
    assert relay.direct_gets == 2
