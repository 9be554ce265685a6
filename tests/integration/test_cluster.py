"""Clustered JetStream: R3 streams through a leader step-down and the loss of a node.

One streaming query reads an R3 stream and writes every message to a second R3
stream. While a partition is held mid-read (and its earlier rows are being
published), the test steps both stream leaders down; later it SIGKILLs the node
that leads the target stream and starts it again on the same store. The output
must hold every source sequence exactly once, and the query must go on.
"""

from __future__ import annotations

import asyncio
import os

from pyspark.sql import functions as F

from ..helpers import SyncNats, fill_stream, gate_at_sequence, wait_until


def _stored(client: SyncNats, stream: str) -> int:
    """The stream's message count, or -1 while the cluster cannot answer (this
    client reconnecting, or the stream between leaders)."""
    try:
        return client.api(f"STREAM.INFO.{stream}").get("state", {}).get("messages", -1)
    except Exception:
        return -1


def _leader(client: SyncNats, stream: str) -> str:
    return client.api(f"STREAM.INFO.{stream}")["cluster"]["leader"]


def _step_down(client: SyncNats, stream: str) -> str:
    before = _leader(client, stream)
    reply = client.api(f"STREAM.LEADER.STEPDOWN.{stream}")
    assert reply.get("success"), reply
    return wait_until(lambda: (lambda now: now if now and now != before else None)(
        client.api(f"STREAM.INFO.{stream}").get("cluster", {}).get("leader")), timeout=30, what=f"a new leader of {stream}")


def test_r3_pipeline_survives_step_down_and_node_loss(spark, nats_cluster, tmp_path):
    count = 30_000
    client = SyncNats(nats_cluster.url)
    try:
        client.add_stream("CSRC", ["csrc.>"], storage="file", num_replicas=3)
        client.add_stream("CDST", ["cdst.>"], storage="file", num_replicas=3, allow_msg_ttl=True)
        asyncio.run(fill_stream(nats_cluster.url, "csrc.x", count))

        first_gate = (str(tmp_path / "reached-1"), str(tmp_path / "release-1"))
        second_gate = (str(tmp_path / "reached-2"), str(tmp_path / "release-2"))
        gate_one = gate_at_sequence(6_500, *first_gate)
        gate_two = gate_at_sequence(16_500, *second_gate)

        source = (spark.readStream.format("jetstream").option("servers", nats_cluster.url).option("stream", "CSRC")
                  .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", "4000")
                  .option("numPartitions", "2").option("batchSize", "500").option("consume.maxMessages", "1000")
                  .option("consume.expires", "5s").load())
        schema = source.schema
        query = (source.mapInArrow(gate_one, schema).mapInArrow(gate_two, schema)
                 .select(F.concat(F.lit("cdst."), F.col("seq") % 4).alias("subject"),
                         F.col("seq").cast("string").alias("data"), F.lit("1h").alias("ttl"))
                 .writeStream.format("jetstream").option("servers", nats_cluster.url).option("stream", "CDST")
                 .option("checkpointLocation", str(tmp_path / "chk")).option("ackTimeout", "30s")
                 .trigger(processingTime="200 milliseconds").start())
        try:
            wait_until(lambda: os.path.exists(first_gate[0]), timeout=180, what="the query reached sequence 6500")
            _step_down(client, "CSRC")
            _step_down(client, "CDST")
            open(first_gate[1], "w").close()

            wait_until(lambda: os.path.exists(second_gate[0]), timeout=180, what="the query reached sequence 16500")
            victim = nats_cluster.node_named(_leader(client, "CDST"))
            victim.stop(kill=True)
            open(second_gate[1], "w").close()
            wait_until(lambda: _stored(client, "CDST") >= 24_000 or query.exception(),
                       timeout=240, what="the query went on without the killed node")
            assert query.exception() is None, query.exception()
            victim.start()
            nats_cluster.wait_for_jetstream()
            wait_until(lambda: _stored(client, "CDST") >= count or query.exception(),
                       timeout=240, what="every message copied")
            assert query.exception() is None, query.exception()
            assert query.isActive
        finally:
            query.stop()

        stored = client.messages("CDST")
        seqs = sorted(int(m.data) for m in stored)
        assert seqs == list(range(1, count + 1)), "every source sequence exactly once"
        assert len({m.headers["Nats-Msg-Id"][0] for m in stored}) == count
        # The restarted node caught up: all three replicas are current again.
        wait_until(lambda: all(r.get("current") for r in client.api("STREAM.INFO.CDST")["cluster"].get("replicas", []))
                   and len(client.api("STREAM.INFO.CDST")["cluster"].get("replicas", [])) == 2,
                   timeout=60, what="the restarted replica caught up")
    finally:
        for stream in ("CSRC", "CDST"):
            client.api(f"STREAM.DELETE.{stream}")
        client.close()
