"""Option ``sequenceBy`` on KV writes against a real nats-server, judged by nats-py's own ``KeyValue``:
each key holds its newest row, whichever task, job or writer published last (issue #27, finding 3)."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from ..helpers import history, jetstream_writer, kv_keys, kv_of, latest, worker_log

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def windows(spark, keys: int, count: int, *, first: int = 0):
    """``keys`` x ``count`` rows (key, data, w): ``w`` the start of a 1-minute window, ``data`` naming it;
    four tasks by window, each publishing its newest window first, so a key's newest row is never last."""
    rows = [(f"k{k}", f"w{w}", T0 + dt.timedelta(minutes=w)) for w in range(first, first + count) for k in range(keys)]
    df = spark.createDataFrame(rows, "key string, data string, w timestamp")
    return df.repartition(4, "w").sortWithinPartitions(F.desc("w"))


def committed(spark, bucket: str) -> str:
    """Every commit line of the writes to ``bucket``, one per line (the commits run in Python workers on the
    driver; the worker-log table keeps no order, so a test searches them all)."""
    lines = [m for m in worker_log(spark, "pyspark_jetstream.sink") if "committed:" in m and f"'{bucket}'" in m]
    assert lines, "no commit line"
    return "\n".join(lines)


def test_each_key_keeps_its_newest_window_whatever_task_publishes_last(spark, nats_server, nats_client, stream_name,
                                                                       worker_logging):
    bucket = stream_name
    jetstream_writer(windows(spark, 30, 10), nats_server.url, bucket=bucket, ensureBucket="create",
                     sequenceBy="w", **{"bucket.history": "10"}).save()
    kv = kv_of(nats_client, bucket)
    assert {f"k{k}": latest(nats_client, kv, f"k{k}") for k in range(30)} == {f"k{k}": b"w9" for k in range(30)}
    # One value per key was published: the 4 tasks' own newest, the later ones only when newer.
    assert all(1 <= len(history(nats_client, kv, f"k{k}")) <= 4 for k in range(0, 30, 7))
    entry = nats_client.run(nats_client.js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.k0"))
    assert entry.headers["Spark-JetStream-Sequence"] == f"ts:{int((T0 + dt.timedelta(minutes=9)).timestamp() * 1e6)}"
    line = committed(spark, bucket)
    published = int(re.search(r"(\d+) published", line).group(1))
    skipped = re.search(r"(\d+) older skipped \((\d+) not newer than the stored value, (\d+) superseded\)", line)
    assert skipped, line
    assert published + int(skipped.group(1)) == 300
    assert int(skipped.group(3)) == 300 - 4 * 30  # each task keeps one row per key


def test_older_rows_change_nothing_and_a_newer_row_wins(spark, nats_server, nats_client, stream_name, worker_logging):
    bucket = stream_name
    jetstream_writer(windows(spark, 5, 3, first=10), nats_server.url, bucket=bucket, ensureBucket="create",
                     sequenceBy="w").save()
    kv = kv_of(nats_client, bucket)
    revisions = {k: nats_client.run(kv.get(f"k{k}")).revision for k in range(5)}
    # A later job with older windows (and one equal): nothing is written, all counted.
    jetstream_writer(windows(spark, 5, 3, first=10).where("w <= '2026-01-01 00:12:00'")
                     .withColumn("data", F.lit("stale")), nats_server.url, bucket=bucket, sequenceBy="w").save()
    assert {k: nats_client.run(kv.get(f"k{k}")).revision for k in range(5)} == revisions
    assert re.search(r" 0 published, .* 15 older skipped", committed(spark, bucket))
    # A newer row wins, for the keys it names only.
    newer = spark.createDataFrame([("k1", "w20", T0 + dt.timedelta(minutes=20))], "key string, data string, w timestamp")
    jetstream_writer(newer, nats_server.url, bucket=bucket, sequenceBy="w").save()
    assert latest(nats_client, kv, "k1") == b"w20"
    assert latest(nats_client, kv, "k2") == b"w12"


def test_a_value_written_without_the_option_is_older_and_another_type_is_refused(spark, nats_server, nats_client,
                                                                                 stream_name):
    bucket = stream_name
    kv = nats_client.run(nats_client.js.create_key_value(bucket=bucket))
    nats_client.run(kv.put("plain", b"by nats-py"))
    jetstream_writer(spark.createDataFrame([("plain", "v1", 1)], "key string, data string, n long"),
                     nats_server.url, bucket=bucket, sequenceBy="n").save()
    assert latest(nats_client, kv, "plain") == b"v1"
    df = spark.createDataFrame([("plain", "v2", "b")], "key string, data string, s string")
    with pytest.raises(PySparkException, match=r"key 'plain'.*integer.*string.*sequenceBy"):
        jetstream_writer(df, nats_server.url, bucket=bucket, sequenceBy="s").save()
    assert latest(nats_client, kv, "plain") == b"v1"


def test_a_stale_revision_is_retried_against_a_concurrent_writer(spark, nats_server, nats_client, stream_name,
                                                                  monkeypatch):
    """The driver's own publishing path (a task run in this process), with the first lookup answering
    a revision another writer has since moved past: the refusal (10071) is looked up again and settled."""
    from pyspark_jetstream.client import jsapi
    from pyspark_jetstream.sink.plan.sink_plan import plan_sink
    from pyspark_jetstream.sink.task.write import write_partition

    bucket = stream_name
    kv = nats_client.run(nats_client.js.create_key_value(bucket=bucket, history=10))
    nats_client.run(kv.put("a", b"old", ))
    df = spark.createDataFrame([("a", "mine", 5), ("b", "mine", 5)], "key string, data string, n long")
    plan = plan_sink({"servers": nats_server.url, "bucket": bucket, "sequenceBy": "n"}, df.schema, overwrite=False,
                     streaming=False)
    real = jsapi.last_messages
    raced = []

    async def racing(nc, stream, subjects, **kw):
        found = await real(nc, stream, subjects, **kw)
        if not raced:  # another writer stores a value without the header (older than ours: we still win)
            raced.append(await nc.jetstream().publish(f"$KV.{bucket}.a", b"theirs"))
        return found

    monkeypatch.setattr(jsapi, "last_messages", racing)
    message = write_partition(plan, iter(df.toArrow().to_batches()))
    assert raced
    assert message.published == 2
    assert [v for _, v in history(nats_client, kv, "a")] == [b"old", b"theirs", b"mine"]
    assert latest(nats_client, kv, "b") == b"mine"


def test_racing_writers_with_the_option_settle_on_the_newest(spark, nats_server, nats_client, stream_name,
                                                            monkeypatch):
    """Two writers interleaved on the same key: the second one's newer value lands between the first one's lookup
    and publish; the first one's refused publish is compared again and skipped, the newer value stays."""
    from pyspark_jetstream.client import jsapi
    from pyspark_jetstream.sink.plan.sink_plan import plan_sink
    from pyspark_jetstream.sink.task.write import write_partition

    bucket = stream_name
    kv = nats_client.run(nats_client.js.create_key_value(bucket=bucket, history=10, direct=True))
    schema = "key string, data string, n long"
    options = {"servers": nats_server.url, "bucket": bucket, "sequenceBy": "n"}
    first = spark.createDataFrame([("a", "five", 5)], schema)
    second = spark.createDataFrame([("a", "seven", 7)], schema)
    plan = plan_sink(options, first.schema, overwrite=False, streaming=False)
    write_other = plan_sink(options, second.schema, overwrite=False, streaming=False)
    real = jsapi.last_messages
    calls = []

    async def racing(nc, stream, subjects, **kw):
        found = await real(nc, stream, subjects, **kw)
        calls.append(kw.get("direct"))
        if len(calls) == 1:
            jsapi.last_messages = real
            import asyncio

            await asyncio.get_running_loop().run_in_executor(
                None, lambda: write_partition(write_other, iter(second.toArrow().to_batches())))
            jsapi.last_messages = racing
        return found

    monkeypatch.setattr(jsapi, "last_messages", racing)
    message = write_partition(plan, iter(first.toArrow().to_batches()))
    assert calls[:2] == [True, False]  # the second lookup, after the refusal, asks the leader
    assert (message.published, message.older_than_stored) == (0, 1)
    assert [v for _, v in history(nats_client, kv, "a")] == [b"seven"]


def test_deletes_and_purges_are_ordered_too(spark, nats_server, nats_client, stream_name):
    bucket = stream_name
    schema = "key string, data string, operation string, ttl string, n int"

    def write(rows):
        df = spark.createDataFrame(rows, schema).repartition(2)
        jetstream_writer(df, nats_server.url, bucket=bucket, sequenceBy="n", ensureBucket="create",
                         **{"bucket.history": "10"}).save()

    write([("d", "v1", None, None, 1), ("d", None, "DEL", None, 2), ("p", "v1", None, None, 1),
           ("p", None, "PURGE", "1h", 3), ("x", "v5", None, "1h", 5), ("x", None, "DEL", None, 4)])
    kv = kv_of(nats_client, bucket)
    assert (latest(nats_client, kv, "d"), latest(nats_client, kv, "p"), latest(nats_client, kv, "x")) == (
        "DEL", "PURGE", b"v5")
    tombstone = nats_client.run(nats_client.js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.p"))
    assert tombstone.headers["Spark-JetStream-Sequence"] == "int:3"
    assert tombstone.headers["Nats-TTL"] == "1h"
    # An older delete is skipped; a newer one wins; a put newer than a tombstone brings the key back.
    write([("x", None, "DEL", None, 5), ("d", "back", None, None, 3), ("p", None, "PURGE", None, 2)])
    assert (latest(nats_client, kv, "d"), latest(nats_client, kv, "p"), latest(nats_client, kv, "x")) == (
        b"back", "PURGE", b"v5")
    write([("x", None, "PURGE", None, 6)])
    assert history(nats_client, kv, "x") == [("PURGE", b"")]


def test_rows_without_a_sequence_value_are_refused_naming_the_key(spark, nats_server, nats_client, stream_name):
    bucket = stream_name
    df = spark.createDataFrame([("a", "v", 1), ("b", "v", None)], "key string, data string, n long").coalesce(1)
    with pytest.raises(PySparkException, match=r"row 1 of partition 0.*no value in column 'n'"):
        jetstream_writer(df, nats_server.url, bucket=bucket, sequenceBy="n", ensureBucket="create").save()


def test_a_streaming_query_keeps_each_keys_newest_window_across_micro_batches(spark, nats_server, nats_client,
                                                                               stream_name, tmp_path):
    """Append mode, one input file per micro-batch, each with windows older and newer than the bucket holds,
    spread over three tasks: after every micro-batch each key holds its newest window so far."""
    import json

    bucket = stream_name
    source = tmp_path / "in"
    source.mkdir()
    batches = [
        [(k, w) for w in (3, 7, 5) for k in range(10)],  # newest (7) in the middle
        [(k, w) for w in (1, 2) for k in range(10)] + [(0, 9)],  # late windows; k0 moves on
        [(k, 6) for k in range(10)] + [(1, 8), (1, 4)],
    ]
    for n, rows in enumerate(batches):
        (source / f"{n}.json").write_text("\n".join(json.dumps({"k": f"k{k}", "w": w}) for k, w in rows))
    events = spark.readStream.schema("k string, w long").option("maxFilesPerTrigger", 1).json(str(source))
    rows = events.repartition(3).select(F.col("k").alias("key"), F.concat(F.lit("w"), F.col("w")).alias("data"),
                                        F.timestamp_seconds(F.col("w") * 60).alias("w"))
    query = (rows.writeStream.format("jetstream").outputMode("append").option("servers", nats_server.url)
             .option("bucket", bucket).option("ensureBucket", "create").option("sequenceBy", "w")
             .option("bucket.history", "10").option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
    assert query.awaitTermination(180)
    assert query.exception() is None
    assert len([p for p in query.recentProgress if p["numInputRows"]]) == 3
    kv = kv_of(nats_client, bucket)
    expected = {f"k{k}": b"w7" for k in range(10)} | {"k0": b"w9", "k1": b"w8"}
    assert {f"k{k}": latest(nats_client, kv, f"k{k}") for k in range(10)} == expected
    # Nothing older was ever stored over something newer: each key's history only goes forward.
    for k in range(10):
        stored = [int(v[1:]) for _, v in history(nats_client, kv, f"k{k}")]
        assert stored == sorted(set(stored)) and stored[-1] == int(expected[f"k{k}"][1:]), (k, stored)


@pytest.mark.parametrize("order", ["long", "timestamp"])
def test_a_copy_with_the_option_orders_by_its_own_column_not_the_sources_header(spark, nats_server, nats_client,
                                                                                 stream_name, worker_logging, order):
    """Issue #33: bucket A written with sequenceBy (its values carry A's Spark-JetStream-Sequence), then newer
    values put by nats-py; A's change log copied into B with sequenceBy=seq in two writes, older rows first.
    B must compare with its own order (A's seq), not with A's header (which kept B's old values, or failed on
    a type mismatch for another type)."""
    source, target = f"{stream_name}_A", f"{stream_name}_B"
    n = "cast(100 as long)" if order == "long" else "timestamp'2026-01-01 00:00:00'"
    old = spark.createDataFrame([(f"k{k}", f"old{k}") for k in range(5)], "key string, data string")
    jetstream_writer(old.withColumn("n", F.expr(n)), nats_server.url, bucket=source, ensureBucket="create",
                     sequenceBy="n", **{"bucket.history": "10"}).save()
    a = kv_of(nats_client, source)
    a0 = nats_client.run(nats_client.js.get_last_msg(f"KV_{source}", f"$KV.{source}.k0"))
    assert a0.headers["Spark-JetStream-Sequence"] in ("int:100", f"ts:{int(T0.timestamp() * 1e6)}")
    for k in range(5):
        nats_client.run(a.put(f"k{k}", f"new{k}".encode()))  # A's seq 6..10, without the header

    read = (spark.read.format("jetstream").option("servers", nats_server.url).option("bucket", source)
            .option("numPartitions", 1).load())
    jetstream_writer(read.where("seq <= 5"), nats_server.url, bucket=target, ensureBucket="create", sequenceBy="seq",
                     **{"bucket.history": "10"}).save()
    jetstream_writer(read.where("seq > 5"), nats_server.url, bucket=target, sequenceBy="seq").save()

    b = kv_of(nats_client, target)
    assert kv_keys(nats_client, b) == [f"k{k}" for k in range(5)]
    assert {f"k{k}": latest(nats_client, b, f"k{k}") for k in range(5)} == {f"k{k}": f"new{k}".encode()
                                                                             for k in range(5)}
    for k in range(5):  # each key was written twice, each time with B's own order (A's seq) alone
        assert history(nats_client, b, f"k{k}") == [("PUT", f"old{k}".encode()), ("PUT", f"new{k}".encode())]
        stored = nats_client.run(nats_client.js.get_last_msg(f"KV_{target}", f"$KV.{target}.k{k}"))
        assert stored.headers["Spark-JetStream-Sequence"] == f"int:{6 + k}"
    # Both writes published their 5 rows; none was skipped as older.
    lines = committed(spark, target).splitlines()
    assert len(lines) == 2 and all(re.search(r" 5 published,", line) for line in lines), lines
    assert "older than" not in "\n".join(lines)


@pytest.mark.parametrize("sequence_by", [True, False])
def test_a_users_row_cannot_set_the_sequence_header(spark, nats_server, nats_client, stream_name, sequence_by):
    """Issue #33: the header is the option's; a row carrying it (here pinning its key with the greatest long) is
    refused naming the row, the column and the value, with the option or without it, and dead-lettered when asked."""
    bucket = stream_name
    pin = {"spark-jetstream-sequence": "int:9223372036854775807"}
    df = spark.createDataFrame([("a", "pin", 1, pin), ("b", "ok", 1, None)],
                               "key string, data string, n long, headers map<string,string>").coalesce(1)
    options = {"sequenceBy": "n"} if sequence_by else {}
    if not sequence_by:
        df = df.drop("n")
    with pytest.raises(PySparkException) as info:
        jetstream_writer(df, nats_server.url, bucket=bucket, ensureBucket="create", **options).save()
    text = str(info.value)
    assert "PublishError" in text and "row 0 of partition 0" in text and f"$KV.{bucket}.a" in text, text[:3000]
    assert "'spark-jetstream-sequence' is set by the option 'sequenceBy'" in text, text[:3000]
    assert "column 'headers' value" in text and "int:9223372036854775807" in text, text[:3000]
    kv = kv_of(nats_client, bucket)
    assert latest(nats_client, kv, "a") == "missing"

    nats_client.add_stream(f"{stream_name}DLQ", [f"{stream_name}.dlq"])
    jetstream_writer(df, nats_server.url, bucket=bucket, deadLetterSubject=f"{stream_name}.dlq", **options).save()
    [dead] = nats_client.messages(f"{stream_name}DLQ")
    assert dead.data == b"pin" and dead.headers["Spark-JetStream-Original-Subject"] == [f"$KV.{bucket}.a"]
    assert "sequenceBy" in dead.headers["Spark-JetStream-Error"][0]
    assert (latest(nats_client, kv, "a"), latest(nats_client, kv, "b")) == ("missing", b"ok")


def test_a_tie_goes_to_the_later_row_within_a_flush_and_to_the_stored_value_across_flushes(
        nats_server, nats_client, stream_name, monkeypatch):
    """docs/kv.md, 'Limits': a task that holds more than its flush's keys publishes what it has and starts
    over; a row tied with one it published before then loses to it, as to any stored value, while within one
    flush the later row wins. The flush is lowered to one key through Reduction's own parameter."""
    import functools

    import pyarrow as pa
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from pyspark_jetstream.sink.plan.sink_plan import plan_sink
    from pyspark_jetstream.sink.reduce import sequenced_write
    from pyspark_jetstream.sink.reduce.sequencer import Reduction
    from pyspark_jetstream.sink.task.write import write_partition

    bucket = stream_name
    kv = nats_client.run(nats_client.js.create_key_value(bucket=bucket, history=10))
    schema = StructType([StructField("key", StringType()), StructField("data", StringType()),
                         StructField("n", LongType())])
    plan = plan_sink({"servers": nats_server.url, "bucket": bucket, "sequenceBy": "n"}, schema, overwrite=False,
                     streaming=False)
    monkeypatch.setattr(sequenced_write, "Reduction", functools.partial(Reduction, max_keys=1))

    def batch(rows):
        keys, datas, ns = zip(*rows, strict=True)
        return pa.record_batch({"key": list(keys), "data": list(datas), "n": pa.array(ns, pa.int64())})

    message = write_partition(plan, iter([
        batch([("k", "first", 5), ("a", "a1", 1)]),  # two keys: flushed after this batch
        batch([("k", "second", 5), ("b", "b1", 7), ("b", "b2", 7)]),  # flushed after this one too
    ]))
    assert latest(nats_client, kv, "k") == b"first"  # a tie across flushes: the earlier row, already stored
    assert latest(nats_client, kv, "b") == b"b2"  # a tie within one flush: the later row
    assert (message.published, message.older_than_stored, message.older_in_write) == (3, 1, 1)
