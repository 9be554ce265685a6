"""KV writes (option ``bucket``) against a real nats-server, checked through nats-py's own ``KeyValue``
(``get``, ``history``, ``keys``, ``watch``): what the connector writes reads as a KV client's writes."""

from __future__ import annotations

import datetime as dt

import pytest
from pyspark.errors import PySparkException

from ..helpers import SyncNats, history, jetstream_writer, kv_keys, kv_of, latest, new_bucket, wait_until

SCHEMA = "key string, data string, operation string, ttl string"


def kv_write(spark, server, bucket, rows, schema=SCHEMA, **options):
    df = spark.createDataFrame(rows, schema).coalesce(1)  # one task: rows published in order
    jetstream_writer(df, server.url, bucket=bucket, **options).save()


def read_bucket(spark, server, bucket):
    df = spark.read.format("jetstream").option("servers", server.url).option("bucket", bucket).load()
    return [(r.key, r.operation, r.data, r.marker_reason) for r in df.orderBy("seq").collect()]


def test_puts_deletes_and_purges_read_the_same_through_nats_py_kv(spark, nats_server, nats_client, stream_name):
    bucket = stream_name
    kv_write(spark, nats_server, bucket, [
        ("a", "1", None, None), ("b", "2", None, None), ("a", "3", "PUT", None), ("b", None, "DEL", None),
        ("c", "4", None, None), ("c", "5", None, None), ("c", None, "PURGE", None), ("d/e=f", "6", None, None),
    ], ensureBucket="create", **{"bucket.history": "5"})
    kv = kv_of(nats_client, bucket)
    assert {k: latest(nats_client, kv, k) for k in ("a", "b", "c", "d/e=f")} == {
        "a": b"3", "b": "DEL", "c": "PURGE", "d/e=f": b"6"}
    assert kv_keys(nats_client, kv) == ["a", "d/e=f"]
    assert history(nats_client, kv, "a") == [("PUT", b"1"), ("PUT", b"3")]
    assert history(nats_client, kv, "b") == [("PUT", b"2"), ("DEL", b"")]
    assert history(nats_client, kv, "c") == [("PURGE", b"")]  # the purge rolled the key's history up

    async def watched():
        watcher = await kv.watchall()
        seen = []
        async for entry in watcher:
            if entry is None:  # the current values delivered
                break
            seen.append((entry.key, entry.operation or "PUT", entry.value))
        await watcher.stop()
        return seen

    assert sorted(nats_client.run(watched())) == [("a", "PUT", b"3"), ("b", "DEL", b""), ("c", "PURGE", b""),
                                                  ("d/e=f", "PUT", b"6")]
    # The created bucket is the one nats-py's create_key_value makes.
    config = nats_client.stream_config(f"KV_{bucket}")
    assert (config["subjects"], config["max_msgs_per_subject"], config["discard"], config["allow_rollup_hdrs"],
            config["deny_delete"], config["allow_direct"], config["allow_msg_ttl"]) == (
        [f"$KV.{bucket}.>"], 5, "new", True, True, True, True)
    # The connector's own change-log read agrees with nats-py's history.
    assert read_bucket(spark, nats_server, bucket) == [
        ("a", "PUT", b"1", None), ("b", "PUT", b"2", None), ("a", "PUT", b"3", None), ("b", "DEL", b"", None),
        ("c", "PURGE", b"", None), ("d/e=f", "PUT", b"6", None)]


def test_per_key_ttls_and_expiring_tombstones(spark, nats_server, nats_client, stream_name):
    bucket = stream_name
    kv_write(spark, nats_server, bucket, [
        ("short", "s", None, "2s"), ("forever", "f", None, "never"), ("gone", "g", None, None),
        ("gone", None, "PURGE", "2s"),
    ], ensureBucket="create")
    kv = kv_of(nats_client, bucket)
    assert history(nats_client, kv, "gone") == [("PURGE", b"")]
    assert latest(nats_client, kv, "short") == b"s"
    wait_until(lambda: latest(nats_client, kv, "short") == "missing", timeout=30, what="the 2s key to expire")
    wait_until(lambda: history(nats_client, kv, "gone") == [], timeout=30, what="the purge tombstone to expire")
    assert latest(nats_client, kv, "forever") == b"f"
    assert kv_keys(nats_client, kv) == ["forever"]


def test_an_expired_key_leaves_a_limit_marker_read_as_a_purge(spark, nats_server, nats_client, stream_name):
    """A per-key TTL in a bucket with limit markers: when the key expires the server leaves a MaxAge
    marker (kept for the marker TTL), which nats-py's watcher and the connector's read call PURGE. The
    key's TTL is at least the marker TTL (the server raises a shorter one, ADR-43), so 10s both."""
    bucket = stream_name
    kv_write(spark, nats_server, bucket, [("k", "v", None, "10s"), ("stay", "s", None, "never")],
             ensureBucket="create", **{"bucket.limitMarkerTtl": "10s"})
    kv = kv_of(nats_client, bucket)
    wait_until(lambda: history(nats_client, kv, "k") == [("PURGE", b"")], timeout=60, what="the MaxAge marker")
    assert read_bucket(spark, nats_server, bucket) == [("stay", "PUT", b"s", None), ("k", "PURGE", b"", "MaxAge")]


@pytest.fixture(params=["R1", "R3"])
def where(request, nats_server, nats_client):
    """(server, client, replicas): one server, or the 3-node cluster with R3 buckets (issue #54: every create
    and compare-and-set test on both)."""
    if request.param == "R1":
        yield nats_server, nats_client, 1
        return
    cluster = request.getfixturevalue("nats_cluster")
    client = SyncNats(cluster.url)
    try:
        yield cluster, client, 3
    finally:
        client.close()


@pytest.mark.parametrize("mode", ["acked", "batched"])
def test_compare_and_set_rows_are_refused_when_stale_and_dead_lettered_when_asked(spark, where, stream_name, mode):
    """In fast-ingest batches too (issue #48): Expected-* headers are checked per message in a batch, and
    a refusal ends its batch; the rows after it go in the next."""
    nats_server, nats_client, replicas = where
    bucket = stream_name
    schema = "key string, data string, expected_revision long"
    mode_option = {"publish.mode": mode}  # ensureBucket=create sets allow_batched when batched is asked
    kv_write(spark, nats_server, bucket, [("k", "v1", 0)], schema, ensureBucket="create",
             **{"bucket.replicas": str(replicas)}, **mode_option)  # rev 1
    assert bool(nats_client.stream_config(f"KV_{bucket}").get("allow_batched")) == (mode == "batched")
    with pytest.raises(PySparkException) as info:
        kv_write(spark, nats_server, bucket, [("k", "again", 0)], schema, **mode_option)
    text = str(info.value)
    assert "PublishError" in text and f"$KV.{bucket}.k" in text and "10071" in text, text[:3000]
    nats_client.add_stream(f"{stream_name}DLQ", [f"{stream_name}.dlq"])
    kv_write(spark, nats_server, bucket, [("k", "v2", 1), ("k", "stale", 1), ("new", "n", 0)], schema,
             deadLetterSubject=f"{stream_name}.dlq", **mode_option)
    kv = kv_of(nats_client, bucket)
    assert history(nats_client, kv, "k") == [("PUT", b"v2")]  # history 1: the latest only
    assert latest(nats_client, kv, "new") == b"n"
    [dead] = nats_client.messages(f"{stream_name}DLQ")
    assert dead.data == b"stale" and dead.headers["Spark-JetStream-Err-Code"] == ["10071"]
    assert dead.headers["Spark-JetStream-Original-Subject"] == [f"$KV.{bucket}.k"]


def test_bad_rows_are_refused_naming_the_row_and_the_key(spark, nats_server, nats_client, stream_name):
    bucket = stream_name
    kv_write(spark, nats_server, bucket, [("ok", "1", None, None)], ensureBucket="create")
    for row, needle in ((("bad key", "x", None, None), "'bad key'"), (("k", "x", "UPSERT", None), "'UPSERT'"),
                        (("k", None, "DEL", "5s"), "a DEL row cannot carry a TTL")):
        with pytest.raises(PySparkException) as info:
            kv_write(spark, nats_server, bucket, [row])
        text = str(info.value)
        assert "PublishError" in text and "row 0" in text and needle in text, text[:3000]
    assert history(nats_client, kv_of(nats_client, bucket), "ok") == [("PUT", b"1")]
    assert nats_client.stream_state(f"KV_{bucket}")["messages"] == 1


def test_a_subject_column_on_a_bucket_write_is_refused_at_start(spark, nats_server, nats_client, stream_name):
    """The key decides a KV write's subject: a 'subject' column (not a bucket read's own, which comes with
    its 'stream' and 'seq' and stays ignored: the bucket copy test) would be dropped without a word."""
    bucket = stream_name
    kv_write(spark, nats_server, bucket, [("k", "1", None, None)], ensureBucket="create")
    for name in ("subject", "Subject"):
        with pytest.raises(PySparkException) as info:
            kv_write(spark, nats_server, bucket, [("k", "2", f"orders.{bucket}.k")],
                     f"key string, data string, {name} string")
        text = str(info.value)
        assert "SchemaError" in text and f"Column '{name}' is not used by a KV write" in text, text[:3000]
        assert "the 'key' column decides the subject ($KV.<bucket>.<key>)" in text and "Drop or rename" in text
    assert history(nats_client, kv_of(nats_client, bucket), "k") == [("PUT", b"1")]  # nothing was written


def test_validate_refuses_a_bucket_that_cannot_take_the_rows_and_update_enables_it(spark, nats_server, nats_client,
                                                                                     stream_name):
    """A bucket made by an older client: no per-key TTLs (AllowMsgTTL off). Rows with a TTL are refused
    before anything is published, naming the setting and the fix; ensureBucket=update enables it."""
    bucket = stream_name
    nats_client.add_stream(f"KV_{bucket}", [f"$KV.{bucket}.>"], allow_rollup_hdrs=True, deny_delete=True,
                           max_msgs_per_subject=1, discard="new", allow_direct=True)
    with pytest.raises(PySparkException) as info:
        kv_write(spark, nats_server, bucket, [("k", "v", None, "1h")])
    assert "StreamConfigError" in str(info.value) and "AllowMsgTTL false" in str(info.value), str(info.value)[:2000]
    assert nats_client.stream_state(f"KV_{bucket}")["messages"] == 0
    kv_write(spark, nats_server, bucket, [("k", "v", None, "1h")], ensureBucket="update")
    assert nats_client.stream_config(f"KV_{bucket}")["allow_msg_ttl"] is True
    assert latest(nats_client, kv_of(nats_client, bucket), "k") == b"v"


def test_a_bucket_copy_with_preserve_expiry_keeps_every_keys_absolute_expiry(spark, nats_server, nats_client,
                                                                              stream_name):
    source, target = f"{stream_name}S", f"{stream_name}T"
    kv_write(spark, nats_server, source, [("a", "1", None, "1h"), ("b", "2", None, "never"), ("c", "3", None, "2h"),
                                          ("c", None, "DEL", None)], ensureBucket="create", **{"bucket.history": "3"})
    read = spark.read.format("jetstream").option("servers", nats_server.url).option("bucket", source).load()
    jetstream_writer(read.coalesce(1), nats_server.url, bucket=target, ensureBucket="create", preserveExpiry="true",
                     **{"bucket.history": "3"}).save()
    copy = spark.read.format("jetstream").option("servers", nats_server.url).option("bucket", target).load()
    original = {(r.key, r.operation): r for r in read.collect()}
    copied = {(r.key, r.operation): r for r in copy.collect()}
    assert sorted(copied) == sorted(original) == [("a", "PUT"), ("b", "PUT"), ("c", "DEL"), ("c", "PUT")]
    for k, row in original.items():
        assert copied[k].data == row.data
        if row.expires_at is None:
            assert copied[k].expires_at is None and copied[k].ttl in (None, "never"), k
        else:  # the copy's TTL is counted from its own timestamp: the absolute time stays (to the second)
            assert abs(copied[k].expires_at - row.expires_at) <= dt.timedelta(seconds=1), k
    kv = kv_of(nats_client, target)
    assert {k: latest(nats_client, kv, k) for k in "abc"} == {"a": b"1", "b": b"2", "c": "DEL"}


def test_a_streaming_query_materialises_the_latest_value_per_key(spark, nats_server, nats_client, stream_name,
                                                                  tmp_path):
    """readStream of a stream of readings -> writeStream into a bucket (availableNow, two micro-batches):
    nats-py's KeyValue sees the last reading per device."""
    from pyspark.sql import functions as F

    from ..helpers import finished, publish

    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    publish(nats_client, f"{stream_name}.dev{{i}}", 4)  # m0..m3 on dev0..dev3
    publish(nats_client, f"{stream_name}.dev1", 1, start=9)  # dev1 again: m9
    assert "error" not in nats_client.publish_raw(f"{stream_name}.dev2", None, b"gone")  # a delete of dev2
    rows = (spark.readStream.format("jetstream").option("servers", nats_server.url).option("stream", stream_name)
            .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", 3).load()
            .select(F.element_at(F.split("subject", r"\."), -1).alias("key"), "data",
                    F.when(F.col("data") == F.lit(b"gone"), "DEL").alias("operation"), "stream", "seq")
            .repartition(2, "key"))
    query = (rows.writeStream.format("jetstream").option("servers", nats_server.url).option("bucket", stream_name)
             .option("ensureBucket", "create").option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    finished(query)
    kv = kv_of(nats_client, stream_name)
    assert {k: latest(nats_client, kv, k) for k in ("dev0", "dev1", "dev2", "dev3")} == {
        "dev0": b"m0", "dev1": b"m9", "dev2": "DEL", "dev3": b"m3"}
    assert kv_keys(nats_client, kv) == ["dev0", "dev1", "dev3"]
    assert history(nats_client, kv, "dev1") == [("PUT", b"m9")]  # history 1: the latest value only
    assert history(nats_client, kv, "dev2") == [("DEL", b"")]

    async def watched():
        watcher = await kv.watchall()
        seen = []
        async for entry in watcher:
            if entry is None:
                break
            seen.append((entry.key, entry.operation or "PUT", entry.value))
        await watcher.stop()
        return sorted(seen)

    assert nats_client.run(watched()) == [("dev0", "PUT", b"m0"), ("dev1", "PUT", b"m9"), ("dev2", "DEL", b""),
                                          ("dev3", "PUT", b"m3")]
    assert [p.numInputRows for p in query.recentProgress if p.numInputRows] == [3, 3]


def test_a_streaming_write_to_a_bucket_replayed_after_a_crash_is_exactly_once(spark, nats_server, nats_client,
                                                                               stream_name, tmp_path):
    """A driver crash between a micro-batch's write and its commit: the replay publishes the same ids,
    which the bucket de-duplicates; every reading is in the key's history once."""
    import os

    from pyspark.sql import functions as F

    from ..helpers import finished, publish, read_limit

    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    publish(nats_client, f"{stream_name}.dev{{i}}", 6)  # m0..m5 on dev0..dev5
    publish(nats_client, f"{stream_name}.dev0", 2, start=6)  # m6, m7 on dev0
    checkpoint = tmp_path / "chk"

    def run():
        rows = (spark.readStream.format("jetstream").option("servers", nats_server.url)
                .option("stream", stream_name).option("startingOffsets", "earliest")
                .options(**read_limit(4)).load()
                .select(F.element_at(F.split("subject", r"\."), -1).alias("key"), "data", "stream", "seq")
                .repartition(2, "key"))
        return finished(rows.writeStream.format("jetstream").option("servers", nats_server.url)
                        .option("bucket", stream_name).option("ensureBucket", "create")
                        .option("bucket.history", 10).option("checkpointLocation", str(checkpoint))
                        .trigger(availableNow=True).start())

    run()
    # The last batch (sequences 5..8; all 8 where PySpark < 4.2 reads them in one) written, not committed.
    last = max(int(name) for name in os.listdir(checkpoint / "commits") if name.isdigit())
    os.remove(checkpoint / "commits" / str(last))
    for name in os.listdir(checkpoint / "commits"):
        if name.startswith(f".{last}."):
            os.remove(checkpoint / "commits" / name)
    replayed = run()
    assert [(p.batchId, p.numInputRows) for p in replayed.recentProgress if p.numInputRows] == [
        (last, 4 if read_limit(4) else 8)]
    kv = kv_of(nats_client, stream_name)
    assert history(nats_client, kv, "dev0") == [("PUT", b"m0"), ("PUT", b"m6"), ("PUT", b"m7")]
    assert {k: history(nats_client, kv, k) for k in ("dev4", "dev5")} == {"dev4": [("PUT", b"m4")],
                                                                           "dev5": [("PUT", b"m5")]}
    assert nats_client.stream_state(f"KV_{stream_name}")["messages"] == 8


def test_a_bucket_with_a_short_duplicate_window_warns_at_start(spark, nats_server, nats_client, stream_name,
                                                              worker_logging):
    """nats-py gives a bucket with a 30s TTL a 30s duplicate window: exactly-once holds only for a
    replay within it, and the sink says so when the write starts."""
    from ..helpers import worker_log

    kv_write(spark, nats_server, stream_name, [("k", "v", None, None)], ensureBucket="create",
             **{"bucket.ttl": "30s"})
    assert nats_client.stream_config(f"KV_{stream_name}")["duplicate_window"] == 30_000_000_000
    warned = [m for m in worker_log(spark, "pyspark_jetstream.stream_admin") if stream_name in m]
    assert any("de-duplicates message ids for 30s only" in m for m in warned), warned
    kv_write(spark, nats_server, f"{stream_name}L", [("k", "v", None, None)], ensureBucket="create")
    assert not [m for m in worker_log(spark, "pyspark_jetstream.stream_admin") if f"{stream_name}L " in m]


def _create_history(client, bucket: str) -> list[tuple]:
    """The bucket's messages as (key, seq, data, expected last subject sequence): what a create sent."""
    return [(m.subject.removeprefix(f"$KV.{bucket}."), m.seq, m.data,
             m.headers.get("Nats-Expected-Last-Subject-Sequence"), m.headers.get("KV-Operation"))
            for m in client.messages(f"KV_{bucket}")]


@pytest.mark.parametrize("mode", ["acked", "batched"])
@pytest.mark.parametrize("dead_letters", [False, True], ids=["fail", "dead-letter"])
def test_a_create_after_a_delete_or_purge_succeeds_as_nats_py_kv_create_does(spark, where, stream_name, dead_letters,
                                                                            mode):
    """Issue #23: expected_revision 0 is nats-py's kv.create. Refused with 10071 on a key whose last entry
    is a DEL or PURGE tombstone, it is put again expecting the tombstone's revision, as nats-py does; on a
    live key the refusal stands. nats-py's kv.create on a twin bucket is the judge, message by message.
    The same in fast-ingest batches (issue #48): a refusal ends its batch, the put again goes in another."""
    import nats.js.errors

    nats_server, nats_client, replicas = where
    ours, judge = stream_name, stream_name + "J"
    for bucket in (ours, judge):
        kv = new_bucket(nats_client, bucket, history=5, replicas=replicas)
        for key in ("deleted", "purged", "live"):
            nats_client.run(kv.put(key, b"v0"))
        nats_client.run(kv.delete("deleted"))
        nats_client.run(kv.purge("purged"))
    if mode == "batched":
        config = {**nats_client.stream_config(f"KV_{ours}"), "allow_batched": True}
        assert nats_client.api(f"STREAM.UPDATE.KV_{ours}", config)["config"]["allow_batched"] is True
    mode_option = {"publish.mode": mode}  # batched: fails at start where the bucket takes no batches
    judge_kv = kv_of(nats_client, judge)
    nats_client.run(judge_kv.create("deleted", b"new"))
    nats_client.run(judge_kv.create("purged", b"new"))
    with pytest.raises(nats.js.errors.KeyWrongLastSequenceError) as refused:
        nats_client.run(judge_kv.create("live", b"new"))
    assert "wrong last sequence" in str(refused.value)  # err_code 10071; nats-py keeps only the text

    schema = "key string, data string, expected_revision long"
    rows = [("deleted", "new", 0), ("purged", "new", 0)]
    if dead_letters:
        nats_client.add_stream(f"{stream_name}DLQ", [f"{stream_name}.dlq"])
        kv_write(spark, nats_server, ours, rows + [("live", "new", 0)], schema, deadLetterSubject=f"{stream_name}.dlq",
                 **mode_option)
        [dead] = nats_client.messages(f"{stream_name}DLQ")
        assert dead.data == b"new" and dead.headers["Spark-JetStream-Err-Code"] == ["10071"]
        assert dead.headers["Spark-JetStream-Original-Subject"] == [f"$KV.{ours}.live"]
    else:
        kv_write(spark, nats_server, ours, rows, schema, **mode_option)
        with pytest.raises(PySparkException) as info:
            kv_write(spark, nats_server, ours, [("live", "new", 0)], schema, **mode_option)
        text = str(info.value)
        assert "PublishError" in text and f"$KV.{ours}.live" in text and "10071" in text, text[:3000]
    assert _create_history(nats_client, ours) == _create_history(nats_client, judge)
    ours_kv = kv_of(nats_client, ours)
    for key in ("deleted", "purged", "live"):
        assert history(nats_client, ours_kv, key) == history(nats_client, judge_kv, key), key
    assert latest(nats_client, ours_kv, "deleted") == latest(nats_client, ours_kv, "purged") == b"new"
    assert latest(nats_client, ours_kv, "live") == b"v0"
