"""Exactly-once ids that survive any replay of a stream-to-stream copy.

A streaming copy that dies after its write and before its commit is replayed by
Spark from the logged offsets. The replay may differ from the first attempt in
two ways the connector cannot prevent: the user restarts it with another
``numPartitions``, and messages inside the replayed range expire (or are
deleted) in between.
Either way, every source message must be in the target exactly once, compared
by content.
"""

from __future__ import annotations

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from ..helpers import forget_last_commit, publish


def _copy(spark, server, source: str, target: str, checkpoint, partitions: int, keep_position: bool):
    df = (spark.readStream.format("jetstream").option("servers", server.url).option("stream", source)
          .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", "200")
          .option("numPartitions", str(partitions)).load())
    columns = [F.lit(f"{target}.x").alias("subject"), "data"] + (["stream", "seq"] if keep_position else [])
    q = (df.select(*columns).writeStream.format("jetstream").option("servers", server.url)
         .option("stream", target).option("order", "none")  # ids under replay, straight from the read
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        finished = q.awaitTermination(180)
    except StreamingQueryException:
        finished = True  # q.exception() tells the test what happened
    assert finished, "the copy did not finish"
    return q


def _payloads(client, stream: str) -> list[bytes]:
    return sorted(m.data for m in client.messages(stream))


@pytest.mark.parametrize("keep_position", [True, False], ids=["content-ids", "positional-ids"])
def test_replay_with_another_partition_count_stores_each_message_once(spark, nats_server, nats_client, stream_name,
                                                                       tmp_path, keep_position):
    source, target = stream_name + "S", stream_name + "D"
    nats_client.add_stream(source, [f"{source}.>"])
    nats_client.add_stream(target, [f"{target}.>"])
    publish(nats_client, f"{source}.in", 200, start=1)
    checkpoint = tmp_path / "chk"
    assert _copy(spark, nats_server, source, target, checkpoint, 2, keep_position).exception() is None
    replayed = forget_last_commit(checkpoint)
    q = _copy(spark, nats_server, source, target, checkpoint, 3, keep_position)
    assert q.exception() is None
    assert [(p["batchId"], p["numInputRows"]) for p in q.recentProgress if p["numInputRows"]] == [(replayed, 200)]
    assert _payloads(nats_client, target) == sorted(f"m{i}".encode() for i in range(1, 201))


def test_replay_after_a_message_in_the_range_vanished_stores_each_message_once(spark, nats_server, nats_client,
                                                                               stream_name, tmp_path):
    """The first attempt of the micro-batch stores part of its rows (the target is full and refuses the
    rest), seq 101 goes away, the target is given room, and the batch is replayed: positions shift by
    one, content-addressed ids do not.

    Seq 101 is removed with STREAM.MSG.DELETE rather than left to expire: to the consumer both leave
    the same gap in the stream, and a delete happens exactly between the two attempts, where an
    expiry would race Spark's start-up."""
    source, target = stream_name + "S", stream_name + "D"
    nats_client.add_stream(source, [f"{source}.>"], allow_msg_ttl=True)
    nats_client.add_stream(target, [f"{target}.>"], max_msgs=150, discard="new")
    publish(nats_client, f"{source}.in", 200, start=1)
    checkpoint = tmp_path / "chk"
    first = _copy(spark, nats_server, source, target, checkpoint, 1, keep_position=True)
    assert first.exception() is not None and "maximum messages" in str(first.exception())
    stored = _payloads(nats_client, target)
    assert stored == sorted(f"m{i}".encode() for i in range(1, 151)), set(stored) ^ {f"m{i}".encode() for i in range(1, 151)}
    assert nats_client.api(f"STREAM.MSG.DELETE.{source}", {"seq": 101}).get("success")
    config = dict(nats_client.stream_config(target), max_msgs=-1)
    assert "error" not in nats_client.api(f"STREAM.UPDATE.{target}", config)
    q = _copy(spark, nats_server, source, target, checkpoint, 1, keep_position=True)
    assert q.exception() is None
    assert [(p["batchId"], p["numInputRows"]) for p in q.recentProgress if p["numInputRows"]] == [(0, 199)]
    assert _payloads(nats_client, target) == sorted(f"m{i}".encode() for i in range(1, 201))
