"""Generated ``Nats-Msg-Id``s (issue #23): distinct rows never share one, whatever the plan between
the read and the write, and a replayed micro-batch gives every row its id again.

Rows that carry the source's ``stream``/``seq`` get content ids: the same source message made
into several rows (a union with another subject, two servers' streams named alike) must not
collide; an empty ``msg_id`` (column or header) is no id, so the generated one stands. The copies
here are about ids, not order: written straight from the read with ``order=none``.
"""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from pyspark_jetstream.tools.server import EmbeddedNatsServer

from ..helpers import SyncNats, finished, forget_last_commit, publish, write


def _read(spark, url: str, stream: str):
    return spark.read.format("jetstream").option("servers", url).option("stream", stream).load()


def _stored(client, stream: str) -> list[tuple[str, bytes]]:
    return sorted((m.subject, m.data) for m in client.messages(stream))


def test_a_union_of_one_read_under_two_subjects_stores_every_row(spark, nats_server, nats_client, stream_name):
    source, target = stream_name + "S", stream_name + "T"
    nats_client.add_stream(source, [f"{source}.>"])
    nats_client.add_stream(target, [f"{target}.>"])
    publish(nats_client, f"{source}.in", 3)
    df = _read(spark, nats_server.url, source)
    seq = F.col("seq").cast("string")
    both = df.withColumn("subject", F.concat(F.lit(f"{target}.a."), seq)).union(
        df.withColumn("subject", F.concat(F.lit(f"{target}.b."), seq)))
    write(both, nats_server, order="none")
    assert _stored(nats_client, target) == sorted(
        (f"{target}.{side}.{s}", f"m{s - 1}".encode()) for side in "ab" for s in (1, 2, 3))


def test_two_servers_streams_of_one_name_merge_into_one_target(spark, nats_server, nats_client, stream_name):
    """Each server holds a stream ORDERS with the same subjects and payloads at the same seqs: only the
    messages' timestamps differ. Both are read, merged and written to one target: 4 of 4."""
    target = stream_name + "T"
    nats_client.add_stream(target, [f"{target}.>"])
    nats_client.api("STREAM.DELETE.ORDERS")  # the name is fixed: one left by an earlier run goes first
    try:
        with EmbeddedNatsServer() as other:
            other_client = SyncNats(other.url)
            try:
                for client in (nats_client, other_client):
                    client.add_stream("ORDERS", ["orders.>"])
                    publish(client, "orders.x", 2)
                reads = [_read(spark, url, "ORDERS") for url in (nats_server.url, other.url)]
                merged = reads[0].union(reads[1]).withColumn("subject", F.lit(f"{target}.x"))
                assert merged.select("seq", "data").distinct().count() == 2  # alike but for the timestamp
                write(merged, nats_server, order="none")
            finally:
                other_client.close()
        assert _stored(nats_client, target) == [(f"{target}.x", b"m0")] * 2 + [(f"{target}.x", b"m1")] * 2
    finally:
        nats_client.api("STREAM.DELETE.ORDERS")


def _replayed(spark, server, checkpoint, build) -> None:
    """Run the streaming copy ``build(readStream)`` to the end, forget its last commit, run it again:
    the replay must re-publish its micro-batch with the same ids."""
    def run():
        df = (spark.readStream.format("jetstream").option("servers", server.url)
              .option("startingOffsets", "earliest").option("numPartitions", "2"))
        q = (build(df).writeStream.format("jetstream").option("servers", server.url).option("order", "none")
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        return finished(q)

    run()
    replayed = forget_last_commit(checkpoint)
    q = run()
    assert [p["batchId"] for p in q.recentProgress if p["numInputRows"]] == [replayed]


def test_a_replayed_union_stores_nothing_twice(spark, nats_server, nats_client, stream_name, tmp_path):
    source, target = stream_name + "S", stream_name + "T"
    nats_client.add_stream(source, [f"{source}.>"])
    nats_client.add_stream(target, [f"{target}.>"])
    publish(nats_client, f"{source}.in", 20, headers=b"NATS/1.0\r\nX-Origin: test\r\n\r\n")

    def build(reader):
        df = reader.option("stream", source).load()  # every source column: stream, seq, timestamp, headers
        return df.withColumn("subject", F.lit(f"{target}.a")).union(df.withColumn("subject", F.lit(f"{target}.b")))

    _replayed(spark, nats_server, tmp_path / "chk", build)
    assert _stored(nats_client, target) == sorted((f"{target}.{side}", f"m{i}".encode()) for side in "ab"
                                                  for i in range(20))


@pytest.mark.parametrize("where", ["column", "header"])
def test_an_empty_msg_id_is_no_id_and_a_replay_stores_once(spark, nats_server, nats_client, stream_name, tmp_path,
                                                            where):
    """Issue #23: an empty Nats-Msg-Id header used to send no id at all, so the replay stored every row
    again; it now takes the generated id, as a null does. (An empty msg_id column already fell through to
    the generated id; kept here so that it stays so.)"""
    source, target = stream_name + "S", stream_name + "T"
    nats_client.add_stream(source, [f"{source}.>"])
    nats_client.add_stream(target, [f"{target}.>"])
    publish(nats_client, f"{source}.in", 20)

    def build(reader):
        df = reader.option("stream", source).load().select(F.lit(f"{target}.x").alias("subject"), "data")
        if where == "column":
            return df.withColumn("msg_id", F.lit(""))
        return df.withColumn("headers", F.create_map(F.lit("Nats-Msg-Id"), F.lit("")))

    _replayed(spark, nats_server, tmp_path / "chk", build)
    stored = nats_client.messages(target)
    assert sorted(m.data for m in stored) == sorted(f"m{i}".encode() for i in range(20))
    assert all(m.headers["Nats-Msg-Id"][0] for m in stored)  # the generated id
