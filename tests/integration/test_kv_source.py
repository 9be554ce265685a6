"""A bucket's current state and watch semantics against a real nats-server, compared with nats-py's own
``KeyValue`` (``keys`` + ``get``, ``watch``): ``kv.view=latest`` for batch reads and
``startingOffsets=lastPerSubject`` for streaming reads (buckets and streams)."""

from __future__ import annotations

import os

from ..helpers import finished, kv_keys, kv_of, latest, publish


def _bucket(client, name, **config):
    return client.run(client.js.create_key_value(bucket=name, history=5, **config))


def _nats_py_state(client, kv) -> dict[str, bytes]:
    """The bucket as a KV client sees it: every live key and its value."""
    return {key: latest(client, kv, key) for key in kv_keys(client, kv)}


def test_the_latest_view_is_the_buckets_current_state_as_nats_py_sees_it(spark, nats_server, nats_client,
                                                                          stream_name):
    kv = _bucket(nats_client, stream_name)
    for key, value in (("a", b"1"), ("b", b"1"), ("a", b"2"), ("c", b"1"), ("d", b"1"), ("c", b"2")):
        nats_client.run(kv.put(key, value))
    nats_client.run(kv.delete("b"))
    nats_client.run(kv.purge("d"))
    rows = (spark.read.format("jetstream").option("servers", nats_server.url).option("bucket", stream_name)
            .option("kv.view", "latest").load().collect())
    assert {r.key: r.data for r in rows} == _nats_py_state(nats_client, kv) == {"a": b"2", "c": b"2"}
    assert sorted(r.seq for r in rows) == [3, 6] and {r.operation for r in rows} == {"PUT"}


def _watch_bucket(spark, server, bucket, target, checkpoint):
    """readStream of a bucket from its current state (lastPerSubject) into another bucket."""
    rows = (spark.readStream.format("jetstream").option("servers", server.url).option("bucket", bucket)
            .option("startingOffsets", "lastPerSubject").option("maxMessagesPerTrigger", 2).load()
            .select("key", "data", "operation", "stream", "seq").repartition(2, "key"))
    return finished(rows.writeStream.format("jetstream").option("servers", server.url).option("bucket", target)
                    .option("ensureBucket", "create").option("checkpointLocation", str(checkpoint))
                    .trigger(availableNow=True).start())


def test_last_per_subject_streams_the_current_state_then_changes_exactly_once_across_a_crash(
        spark, nats_server, nats_client, stream_name, tmp_path):
    source, target = f"{stream_name}S", f"{stream_name}T"
    kv = _bucket(nats_client, source)
    for key, value in (("a", b"1"), ("b", b"1"), ("a", b"2"), ("c", b"1")):
        nats_client.run(kv.put(key, value))
    nats_client.run(kv.delete("b"))  # seq 5: the snapshot's end
    checkpoint = tmp_path / "chk"
    query = _watch_bucket(spark, nats_server, source, target, checkpoint)
    # The first micro-batch is the current state (live keys only, whatever maxMessagesPerTrigger says).
    assert [p.numInputRows for p in query.recentProgress if p.numInputRows] == [2]
    out = kv_of(nats_client, target)
    assert _nats_py_state(nats_client, out) == {"a": b"2", "c": b"1"}
    # A crash in the first micro-batch, after its write and before its commit; keys change meanwhile.
    os.remove(checkpoint / "commits" / "0")
    for name in os.listdir(checkpoint / "commits"):
        if name.startswith(".0."):
            os.remove(checkpoint / "commits" / name)
    nats_client.run(kv.put("a", b"3"))
    nats_client.run(kv.delete("c"))
    nats_client.run(kv.put("d", b"1"))
    query = _watch_bucket(spark, nats_server, source, target, checkpoint)
    # The replayed snapshot holds the keys whose last value is still at or before its end (none now);
    # the changes after it follow as changes: the final state is nats-py's view of the source.
    assert _nats_py_state(nats_client, out) == _nats_py_state(nats_client, kv) == {"a": b"3", "d": b"1"}
    assert latest(nats_client, out, "c") == "DEL"


def test_last_per_subject_on_a_stream_reads_the_last_message_per_subject_then_every_change(
        spark, nats_server, nats_client, stream_name, tmp_path):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    publish(nats_client, f"{stream_name}.s{{i}}", 3)  # m0 m1 m2 on s0 s1 s2
    publish(nats_client, f"{stream_name}.s1", 1, start=3)  # m3 on s1

    def run():
        finished(spark.readStream.format("jetstream").option("servers", nats_server.url)
                 .option("stream", stream_name).option("startingOffsets", "lastPerSubject").load()
                 .select("seq", "subject").writeStream.format("parquet").option("path", str(tmp_path / "out"))
                 .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
        return sorted(tuple(r) for r in spark.read.parquet(str(tmp_path / "out")).collect())

    assert run() == [(1, f"{stream_name}.s0"), (3, f"{stream_name}.s2"), (4, f"{stream_name}.s1")]
    publish(nats_client, f"{stream_name}.s0", 2, start=4)  # two changes of s0 after the snapshot: both read
    assert run() == [(1, f"{stream_name}.s0"), (3, f"{stream_name}.s2"), (4, f"{stream_name}.s1"),
                     (5, f"{stream_name}.s0"), (6, f"{stream_name}.s0")]
