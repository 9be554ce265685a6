"""Faults the guarantees must survive: a lost commit, a lost (deleted or reaped) consumer, stream limits."""

from __future__ import annotations

import asyncio
import os

import pytest
from pyspark.sql import functions as F

from ..helpers import HeldRead, fill_stream, finished, wait_until, worker_log, write_json_inputs


def test_crash_between_write_and_commit_is_deduplicated(spark, nats_server, nats_client, stream_name, tmp_path):
    """A driver crash after the sink wrote a batch but before Spark recorded its commit
    leaves the offsets without the commit file; the restarted query replays the batch."""
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    write_json_inputs(tmp_path / "in", files=3, rows_per_file=100)
    checkpoint = tmp_path / "chk"

    def run():
        q = (spark.readStream.schema("id long, data string").option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
             .select(F.lit(f"{stream_name}.x").alias("subject"), "data")
             .writeStream.format("jetstream").option("servers", nats_server.url).option("stream", stream_name)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        finished(q, 120)
        return q

    run()
    assert nats_client.stream_state(stream_name)["messages"] == 300
    commits = sorted(int(n) for n in os.listdir(checkpoint / "commits") if n.isdigit())
    # What a crash before the commit leaves: neither the commit file nor its checksum.
    os.remove(checkpoint / "commits" / str(commits[-1]))
    crc = checkpoint / "commits" / f".{commits[-1]}.crc"
    if crc.exists():
        os.remove(crc)
    q = run()
    replayed = [p for p in q.recentProgress if p["numInputRows"]]
    assert len(replayed) == 1 and replayed[0]["batchId"] == commits[-1] and replayed[0]["numInputRows"] == 100
    assert nats_client.stream_state(stream_name)["messages"] == 300  # the server dropped the 100 copies
    assert sorted(m.data for m in nats_client.messages(stream_name)) == sorted(f"row-{i}".encode() for i in range(300))


def _delete_consumer(client, stream: str, name: str) -> None:
    assert "error" not in client.api(f"CONSUMER.DELETE.{stream}.{name}")


def _let_server_reap_consumer(client, stream: str, name: str) -> None:
    """Shorten the consumer's inactive threshold to 1s: the server itself reaps it
    while the held partition sends no pulls (what a stall longer than the threshold does)."""
    config = dict(client.api(f"CONSUMER.INFO.{stream}.{name}")["config"], inactive_threshold=1_000_000_000)
    reply = client.api(f"CONSUMER.CREATE.{stream}.{name}", {"stream_name": stream, "config": config, "action": "update"})
    assert reply["config"]["inactive_threshold"] == 1_000_000_000, reply


@pytest.mark.parametrize("lose", [_delete_consumer, _let_server_reap_consumer], ids=["deleted", "reaped"])
def test_consumer_lost_mid_read_is_recreated(spark, nats_server, nats_client, stream_name, tmp_path, lose):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    # Enough data that the reader is still mid-range while the gate holds the pipeline.
    asyncio.run(fill_stream(nats_server.url, f"{stream_name}.x", 100_000))
    df = (spark.read.format("jetstream").option("servers", nats_server.url).option("stream", stream_name)
          .option("numPartitions", "1").option("batchSize", "50").option("consume.maxMessages", "100").load())
    read = HeldRead(df, tmp_path)
    names = nats_client.api(f"CONSUMER.NAMES.{stream_name}")["consumers"]
    assert names, "the partition's consumer should exist mid-read"
    for name in names:
        lose(nats_client, stream_name, name)
    wait_until(lambda: not set(names) & set(nats_client.api(f"CONSUMER.NAMES.{stream_name}")["consumers"]),
               timeout=30, what="the partition's consumer gone from the server")
    read.let_go()
    assert read.seqs() == list(range(1, 100_001))


@pytest.mark.parametrize("fail", [True, False], ids=["failOnDataLoss", "warn"])
def test_head_of_a_range_purged_before_its_partition_starts(spark, nats_server, nats_client, stream_name, tmp_path,
                                                            fail, worker_logging):
    """Planned 1..300 in three partitions; with two cores the third waits while the first two are
    held. The stream's head is then purged up to 249, so the third partition's consumer, asked to
    start at 201, is moved to 250 by the server without a word: the partition must notice."""
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    asyncio.run(fill_stream(nats_server.url, f"{stream_name}.x", 300))
    df = (spark.read.format("jetstream").option("servers", nats_server.url).option("stream", stream_name)
          .option("numPartitions", "3").option("split", "sequence").option("failOnDataLoss", str(fail).lower())
          .load())
    read = HeldRead(df, tmp_path, tasks=2)
    assert nats_client.api(f"STREAM.PURGE.{stream_name}", {"seq": 250})["purged"] == 249
    read.let_go()
    if fail:
        error = str(read.error())
        assert "DataLossError" in error and f"stream '{stream_name}': sequences 201..249" in error
        assert "failOnDataLoss" in error
    else:
        assert read.seqs() == list(range(1, 201)) + list(range(250, 301))
        logged = worker_log(spark, "pyspark_jetstream.source")
        assert any(f"stream '{stream_name}': sequences 201..249 were removed" in m
                   and "Going on from sequence 250 (failOnDataLoss=false)" in m for m in logged), logged


@pytest.mark.parametrize(
    "config, rows, needle",
    [
        ({"max_bytes": 2000, "discard": "new"}, 40, "maximum bytes exceeded"),
        ({"max_msg_size": 200}, 1, "message size exceeds maximum allowed"),
    ],
)
def test_stream_limits_fail_with_the_server_error(spark, nats_server, nats_client, stream_name, config, rows, needle):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], **config)
    df = spark.createDataFrame([("x" * 300,) for _ in range(rows)], "data string").coalesce(1)
    with pytest.raises(Exception, match=rf"subject '{stream_name}.x' failed: {needle}.*server err_code \d+"):
        (df.write.format("jetstream").mode("append").option("servers", nats_server.url)
         .option("stream", stream_name).option("subject", f"{stream_name}.x").save())


def test_max_msgs_per_subject_one_keeps_the_latest(spark, nats_server, nats_client, stream_name):
    """Documented behaviour: with MaxMsgsPerSubject=1 every publish replaces the subject's previous message."""
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], max_msgs_per_subject=1)
    df = spark.createDataFrame([(f"{stream_name}.k{i % 3}", str(i)) for i in range(9)], "subject string, data string")
    df.coalesce(1).write.format("jetstream").mode("append").option("servers", nats_server.url) \
        .option("stream", stream_name).save()
    latest = {m.subject: m.data for m in nats_client.messages(stream_name)}
    assert latest == {f"{stream_name}.k0": b"6", f"{stream_name}.k1": b"7", f"{stream_name}.k2": b"8"}


def test_message_above_max_payload_is_refused_client_side(spark, nats_server, nats_client, stream_name):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    big = "x" * (nats_client.nc.max_payload + 1)
    df = spark.createDataFrame([("small",), (big,)], "data string").coalesce(1)
    with pytest.raises(Exception, match="row 1 of partition 0 .* more than the server's max_payload"):
        (df.write.format("jetstream").mode("append").option("servers", nats_server.url)
         .option("stream", stream_name).option("subject", f"{stream_name}.x").save())
