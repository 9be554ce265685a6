"""A server that stops answering (SIGSTOP): bounded waits, then errors that name what timed out."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from pyspark_jetstream.server import EmbeddedNatsServer

from ..helpers import SyncNats, fill_stream, gate_at_first_batch, wait_until


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
    reached, frozen = str(tmp_path / "reached"), str(tmp_path / "frozen")

    gate = gate_at_first_batch(reached, frozen)

    df = (spark.read.format("jetstream").option("servers", frozen_server.url).option("stream", "STUCKR")
          .option("numPartitions", "1").option("batchSize", "500").option("consume.maxMessages", "1000")
          .option("consume.expires", "2s").option("consume.maxWait", "4s").load())
    errors: list[BaseException] = []

    def run() -> None:
        try:
            df.mapInArrow(gate, df.schema).count()
        except Exception as exc:
            errors.append(exc)

    reader = threading.Thread(target=run)
    reader.start()
    wait_until(lambda: os.path.exists(reached), timeout=120, what="the read has started")
    os.kill(frozen_server.pid, signal.SIGSTOP)
    open(frozen, "w").close()
    reader.join(180)
    assert not reader.is_alive() and errors, "the read should fail while the server is frozen"
    text = str(errors[0])
    assert "Reading stream 'STUCKR'" in text and "made no progress for 4s" in text and "consume.maxWait" in text


def test_a_brief_freeze_misses_heartbeats_and_the_read_rides_through(spark, frozen_server, tmp_path):
    """Frozen for three heartbeat intervals but well inside consume.maxWait: the partition
    notices the missed heartbeats, pulls again, and the range arrives exactly once."""
    client = SyncNats(frozen_server.url)
    client.add_stream("PAUSED", ["paused.>"])
    client.close()
    count = 50_000
    asyncio.run(fill_stream(frozen_server.url, "paused.x", count))
    reached, resume = str(tmp_path / "reached"), str(tmp_path / "resume")
    gate = gate_at_first_batch(reached, resume)

    df = (spark.read.format("jetstream").option("servers", frozen_server.url).option("stream", "PAUSED")
          .option("numPartitions", "1").option("batchSize", "500").option("consume.maxMessages", "1000")
          .option("consume.expires", "2s").option("consume.idleHeartbeat", "1s").option("consume.maxWait", "60s")
          .load())
    result: dict = {}

    def run() -> None:
        try:
            result["seqs"] = [r.seq for r in df.mapInArrow(gate, df.schema).select("seq").collect()]
        except Exception as exc:
            result["error"] = exc

    reader = threading.Thread(target=run)
    reader.start()
    wait_until(lambda: os.path.exists(reached), timeout=120, what="the read has started")
    os.kill(frozen_server.pid, signal.SIGSTOP)
    open(resume, "w").close()  # the partition pulls again into a frozen server
    time.sleep(3.0)  # the fault itself: frozen for three heartbeat intervals
    os.kill(frozen_server.pid, signal.SIGCONT)
    reader.join(180)
    assert not reader.is_alive()
    assert "error" not in result, result.get("error")
    assert sorted(result["seqs"]) == list(range(1, count + 1))
