"""A server that stops answering (SIGSTOP): bounded waits, then errors that name what timed out."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from pyspark_jetstream.tools.server import EmbeddedNatsServer

from ..helpers import HeldRead, SyncNats, fill_stream, wait_until, worker_log


@pytest.fixture
def frozen_server():
    server = EmbeddedNatsServer().start()
    yield server
    os.kill(server.pid, signal.SIGCONT)
    server.close()


def test_pubacks_that_never_come_hit_ack_timeout(spark, frozen_server):
    client = SyncNats(frozen_server.url)
    client.add_stream("STUCKW", ["stuckw.>"])
    df = spark.range(500_000).selectExpr("cast(id as string) as data").coalesce(1)
    froze = threading.Event()

    def freeze_once_publishing() -> None:
        # The write runs on the main thread: PySpark 4.3 does not find auto-registered Python
        # data sources for writes issued from other threads (DATA_SOURCE_NOT_FOUND).
        wait_until(lambda: client.stream_state("STUCKW")["messages"] > 1000, timeout=120, interval=0.01,
                   what="the write is publishing")
        os.kill(frozen_server.pid, signal.SIGSTOP)
        froze.set()

    freezer = threading.Thread(target=freeze_once_publishing, daemon=True)
    freezer.start()
    with pytest.raises(Exception) as info:
        (df.write.format("jetstream").mode("append").option("servers", frozen_server.url)
         .option("stream", "STUCKW").option("subject", "stuckw.x").option("ackTimeout", "3s").save())
    freezer.join(10)
    assert froze.is_set()
    os.kill(frozen_server.pid, signal.SIGCONT)
    client.close()
    text = str(info.value)
    assert "No PubAck for" in text and "ackTimeout" in text


def test_pulls_that_never_complete_hit_max_wait(spark, frozen_server, tmp_path):
    client = SyncNats(frozen_server.url)
    client.add_stream("STUCKR", ["stuckr.>"])
    client.close()
    asyncio.run(fill_stream(frozen_server.url, "stuckr.x", 100_000))
    df = (spark.read.format("jetstream").option("servers", frozen_server.url).option("stream", "STUCKR")
          .option("numPartitions", "1").option("batchSize", "500").option("consume.maxMessages", "1000")
          .option("consume.expires", "2s").option("consume.maxWait", "4s").load())
    read = HeldRead(df, tmp_path)
    os.kill(frozen_server.pid, signal.SIGSTOP)
    read.let_go()
    text = str(read.error(timeout=180))
    assert "Reading stream 'STUCKR'" in text and "made no progress for 4s" in text and "consume.maxWait" in text


def test_a_brief_freeze_misses_heartbeats_and_the_read_rides_through(spark, frozen_server, tmp_path, worker_logging):
    """Frozen for three heartbeat intervals but well inside consume.maxWait: the partition
    notices the missed heartbeats, pulls again, and the range arrives exactly once."""
    client = SyncNats(frozen_server.url)
    client.add_stream("PAUSED", ["paused.>"])
    client.close()
    count = 50_000
    asyncio.run(fill_stream(frozen_server.url, "paused.x", count))
    df = (spark.read.format("jetstream").option("servers", frozen_server.url).option("stream", "PAUSED")
          .option("numPartitions", "1").option("batchSize", "500").option("consume.maxMessages", "1000")
          .option("consume.expires", "2s").option("consume.idleHeartbeat", "1s").option("consume.maxWait", "60s")
          .load())
    read = HeldRead(df, tmp_path)
    os.kill(frozen_server.pid, signal.SIGSTOP)
    read.let_go()  # the partition pulls again into a frozen server
    time.sleep(3.0)  # the fault itself: frozen for three heartbeat intervals
    os.kill(frozen_server.pid, signal.SIGCONT)
    assert read.seqs(timeout=180) == list(range(1, count + 1))
    # The freeze hit the partition mid-read: it noticed the missed heartbeats and pulled again.
    assert "stream PAUSED: missed heartbeats; pulling again" in worker_log(spark, "pyspark_jetstream.source")


def test_a_server_frozen_between_micro_batches_does_not_fail_the_query(spark, frozen_server):
    """The driver plans each micro-batch with a STREAM.INFO; frozen past that request's
    10s timeout, the server leaves it unanswered. The planner asks again (within
    consume.maxWait) instead of failing the query, and the query goes on."""
    client = SyncNats(frozen_server.url)
    client.add_stream("IDLE", ["idle.>"])
    asyncio.run(fill_stream(frozen_server.url, "idle.x", 100))
    query = (spark.readStream.format("jetstream").option("servers", frozen_server.url).option("stream", "IDLE")
             .option("startingOffsets", "earliest").load()
             .writeStream.format("memory").queryName("idle_copy").trigger(processingTime="200 milliseconds").start())

    def copied() -> int:
        assert query.isActive, query.exception()
        return spark.sql("select count(*) from idle_copy").first()[0]

    try:
        wait_until(lambda: copied() == 100, timeout=120, what="the first 100 messages copied")
        os.kill(frozen_server.pid, signal.SIGSTOP)
        time.sleep(12.0)  # the fault itself: longer than the planner's 10s request timeout
        os.kill(frozen_server.pid, signal.SIGCONT)
        asyncio.run(fill_stream(frozen_server.url, "idle.x", 100))
        wait_until(lambda: copied() == 200, timeout=120, what="the next 100 messages copied")
        seqs = sorted(r.seq for r in spark.sql("select seq from idle_copy").collect())
    finally:
        query.stop()
        client.close()
    assert seqs == list(range(1, 201))
    # The freeze hit the planner: one micro-batch's latestOffset (its STREAM.INFO, unanswered for 10s,
    # then asked again) took longer than the request timeout, and the query went on.
    planning = [p["durationMs"].get("latestOffset", 0) for p in query.recentProgress]
    assert max(planning) >= 10_000, planning
