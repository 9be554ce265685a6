"""The source under faults: a server killed and restarted in the middle of a partition
(a batch read, and a streaming read -> write)."""

from __future__ import annotations

import asyncio
import os

from pyspark.sql import functions as F

from pyspark_jetstream.tools.server import EmbeddedNatsServer

from ..helpers import HeldRead, SyncNats, fill_stream, gate_at_sequence, wait_until


def test_server_killed_mid_partition_read_rides_through(spark, tmp_path):
    count = 100_000
    with EmbeddedNatsServer() as server:
        client = SyncNats(server.url)
        client.add_stream("RESTART", ["restart.>"], storage="file")
        client.close()
        asyncio.run(fill_stream(server.url, "restart.x", count))

        df = (spark.read.format("jetstream").option("servers", server.url).option("stream", "RESTART")
              .option("numPartitions", "1").option("batchSize", "500").option("consume.maxMessages", "1000")
              .option("consume.expires", "5s").load())
        read = HeldRead(df, tmp_path)
        server.restart(kill=True)
        read.let_go()
        assert read.seqs() == list(range(1, count + 1))


def test_server_killed_mid_batch_of_a_streaming_copy_exactly_once(spark, tmp_path):
    """A streaming query reads one file-storage stream and writes another on the same
    server; the server is SIGKILLed while a partition is held mid-batch (part of the
    batch already published) and started again on the same store. The query rides
    through, or fails and is restarted from its checkpoint: either way the target holds
    every source sequence exactly once."""
    count = 20_000
    with EmbeddedNatsServer() as server:
        client = SyncNats(server.url)
        client.add_stream("KSRC", ["ksrc.>"], storage="file")
        client.add_stream("KDST", ["kdst.>"], storage="file")
        asyncio.run(fill_stream(server.url, "ksrc.x", count))
        reached, release = str(tmp_path / "reached"), str(tmp_path / "release")
        gate = gate_at_sequence(6_500, reached, release)

        def start():
            source = (spark.readStream.format("jetstream").option("servers", server.url).option("stream", "KSRC")
                      .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", "4000")
                      .option("numPartitions", "2").option("batchSize", "500").option("consume.expires", "5s")
                      .load())
            return (source.mapInArrow(gate, source.schema)
                    .select(F.lit("kdst.copy").alias("subject"),
                            F.concat_ws(":", "stream", F.col("seq").cast("string")).alias("data"))
                    .writeStream.format("jetstream").option("servers", server.url).option("stream", "KDST")
                    .option("order", "none")  # exactly-once of positional ids, straight from the read
                    .option("checkpointLocation", str(tmp_path / "chk")).trigger(processingTime="200 milliseconds")
                    .start())

        def stored() -> int:
            return client.stored_count("KDST")

        query = start()
        restarts = 0
        try:
            wait_until(lambda: os.path.exists(reached), timeout=180, what="the query reached sequence 6500")
            assert 0 < stored() < count
            server.restart(kill=True)
            open(release, "w").close()
            while stored() < count:
                if not query.isActive:  # failed with a clear error: restart from the checkpoint
                    restarts += 1
                    assert restarts <= 3, query.exception()
                    query = start()
                wait_until(lambda q=query: stored() >= count or not q.isActive, timeout=240,
                           what="every message copied")
        finally:
            query.stop()
        stored_messages = client.messages("KDST")
        client.close()
    # Every source (stream, seq) exactly once, and every message under its own Nats-Msg-Id.
    copied = [tuple(m.data.decode().split(":")) for m in stored_messages]
    assert len(copied) == count
    assert set(copied) == {("KSRC", str(seq)) for seq in range(1, count + 1)}
    assert len({m.headers["Nats-Msg-Id"][0] for m in stored_messages}) == count
