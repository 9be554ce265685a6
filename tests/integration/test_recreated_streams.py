"""Streams deleted and created again under a query: never silent loss.

A recreated stream restarts at sequence 1, so a checkpointed offset (``seq`` 100) means
nothing in it; before offsets recorded the stream's identity, a restarted query read
nothing until the new stream passed sequence 100 and never read its first 100 messages.
"""

from __future__ import annotations

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from ..helpers import HeldRead, finished, publish, worker_log, write_json_inputs


def _recreate(client, stream: str, subjects: list[str]) -> None:
    assert client.api(f"STREAM.DELETE.{stream}").get("success")
    client.add_stream(stream, subjects)


def _copy_to_parquet(spark, server, stream: str, tmp_path, **options):
    r = (spark.readStream.format("jetstream").option("servers", server.url).option("stream", stream)
         .option("startingOffsets", "earliest"))
    for key, value in options.items():
        r = r.option(key, value)
    return (r.load().select("seq", "data").writeStream.format("parquet").option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())


@pytest.mark.parametrize("fail", [True, False], ids=["failOnDataLoss", "goOn"])
def test_a_query_restarted_on_a_recreated_stream_fails_or_reads_the_new_stream(spark, nats_server, nats_client,
                                                                                stream_name, tmp_path, fail):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    publish(nats_client, f"{stream_name}.x", 100)
    finished(_copy_to_parquet(spark, nats_server, stream_name, tmp_path))
    _recreate(nats_client, stream_name, [f"{stream_name}.>"])
    publish(nats_client, f"{stream_name}.x", 30, start=1000)
    query = _copy_to_parquet(spark, nats_server, stream_name, tmp_path, failOnDataLoss=str(fail).lower())
    out = lambda: sorted((r.seq, r.data) for r in spark.read.parquet(str(tmp_path / "out")).collect())  # noqa: E731
    if fail:
        with pytest.raises(StreamingQueryException) as info:
            finished(query, 180)  # raises: the query fails
        text = str(info.value)
        assert "StreamRecreatedError" in text and f"stream '{stream_name}'" in text
        assert "deleted and created again" in text and "failOnDataLoss" in text
        assert out() == [(i, f"m{i - 1}".encode()) for i in range(1, 101)]  # nothing of the new stream yet
    else:
        finished(query)
        new = [(i, f"m{999 + i}".encode()) for i in range(1, 31)]
        assert out() == sorted([(i, f"m{i - 1}".encode()) for i in range(1, 101)] + new)
        # It goes on from there: later messages of the new stream are read by the next run.
        publish(nats_client, f"{stream_name}.x", 5, start=2000)
        finished(_copy_to_parquet(spark, nats_server, stream_name, tmp_path, failOnDataLoss="false"))
        later = [(i, f"m{1969 + i}".encode()) for i in range(31, 36)]
        assert out() == sorted([(i, f"m{i - 1}".encode()) for i in range(1, 101)] + new + later)


@pytest.mark.parametrize("fail", [True, False], ids=["failOnDataLoss", "goOn"])
def test_a_stream_recreated_while_a_batch_read_runs(spark, nats_server, nats_client, stream_name, tmp_path, fail,
                                                    worker_logging):
    """Planned 1..300 in three partitions (the third open to the end); two read while the third waits for a core. The stream
    is then deleted and created again with other messages: the third partition must notice."""
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    publish(nats_client, f"{stream_name}.old", 300)
    df = (spark.read.format("jetstream").option("servers", nats_server.url).option("stream", stream_name)
          .option("numPartitions", "3").option("split", "sequence").option("failOnDataLoss", str(fail).lower())
          .load())
    read = HeldRead(df, tmp_path, tasks=2)
    _recreate(nats_client, stream_name, [f"{stream_name}.>"])
    publish(nats_client, f"{stream_name}.new", 300)
    read.let_go()
    if fail:
        error = str(read.error())
        assert "StreamRecreatedError" in error and "deleted and created again" in error
    else:
        assert read.seqs() == list(range(1, 201))  # the third range belonged to the old stream
        assert any(f"stream '{stream_name}'" in m and "Sequences from 201 on of the old stream are skipped" in m
                   for m in worker_log(spark, "pyspark_jetstream.source"))


def test_a_sink_whose_target_stream_is_recreated_keeps_publishing(spark, nats_server, nats_client, stream_name,
                                                                    tmp_path):
    """The duplicate window does not survive a recreation: the new stream starts with none."""
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    write_json_inputs(tmp_path / "in", files=2, rows_per_file=50)

    def run():
        return finished(spark.readStream.schema("id long, data string").option("maxFilesPerTrigger", 1)
                        .json(str(tmp_path / "in")).select(F.lit(f"{stream_name}.x").alias("subject"), "data")
                        .writeStream.format("jetstream").option("servers", nats_server.url)
                        .option("stream", stream_name).option("checkpointLocation", str(tmp_path / "chk"))
                        .trigger(availableNow=True).start())

    run()
    assert sorted(m.data for m in nats_client.messages(stream_name)) == sorted(f"row-{i}".encode() for i in range(100))
    _recreate(nats_client, stream_name, [f"{stream_name}.>"])
    write_json_inputs(tmp_path / "in2", files=2, rows_per_file=50)
    for name in ("part-000.json", "part-001.json"):  # two more files: micro-batches 2 and 3
        (tmp_path / "in2" / name).rename(tmp_path / "in" / name.replace("part-", "part-1"))
    run()
    assert sorted(m.data for m in nats_client.messages(stream_name)) == sorted(f"row-{i}".encode() for i in range(100))
