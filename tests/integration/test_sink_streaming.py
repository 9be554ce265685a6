"""df.writeStream.format("jetstream"): micro-batches, and exactly-once across a crash."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from ..helpers import finished, wait_until, write_json_inputs

JOB = Path(__file__).parent / "jobs" / "stream_copy_job.py"
COMMIT_LINES_JOB = Path(__file__).parent / "jobs" / "commit_lines_job.py"


def _query(spark, nats_server, source_dir, checkpoint, stream_name, transform=None):
    df = spark.readStream.schema("id long, data string").option("maxFilesPerTrigger", 1).json(str(source_dir))
    if transform is not None:
        df = transform(df)
    return (
        df.select(F.concat(F.lit(f"{stream_name}."), (F.col("id") % 3).cast("string")).alias("subject"),
                  F.col("data"), F.lit("1h").alias("ttl"))
        .writeStream.format("jetstream")
        .option("servers", nats_server.url)
        .option("stream", stream_name)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def test_streaming_write_publishes_every_micro_batch(spark, nats_server, nats_client, stream_name, tmp_path):
    nats_client.add_stream(stream_name, [f"{stream_name}.>"], allow_msg_ttl=True)
    write_json_inputs(tmp_path / "in", files=3, rows_per_file=50)
    query = _query(spark, nats_server, tmp_path / "in", tmp_path / "chk", stream_name)
    finished(query, 120)
    msgs = nats_client.messages(stream_name)
    assert sorted(m.data for m in msgs) == sorted(f"row-{i}".encode() for i in range(150))
    ids = {m.headers["Nats-Msg-Id"][0] for m in msgs}
    assert len(ids) == 150
    # <queryId>:<batchId>:<partition>:<position>, three micro-batches of one file each
    assert {i.split(":")[0] for i in ids} == {query.id}
    assert {i.split(":")[1] for i in ids} == {"0", "1", "2"}
    assert all(m.headers["Nats-TTL"] == ["1h"] for m in msgs)


def test_each_commit_line_names_its_query_and_its_target(nats_server, nats_client, stream_name, tmp_path):
    """Two queries in one driver, one named and one not, running side by side: each micro-batch's
    totals line says which query (its name, else its id) and which stream; a batch write's says where."""
    a, b = f"{stream_name}A", f"{stream_name}B"
    nats_client.add_stream(a, [f"{a}.>"])
    nats_client.add_stream(b, [f"{b}.>"])
    write_json_inputs(tmp_path / "in", files=2, rows_per_file=5)
    done = subprocess.run([sys.executable, str(COMMIT_LINES_JOB), nats_server.url, str(tmp_path / "in"),
                           str(tmp_path), a, b], capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    ids = json.loads(done.stdout.strip().splitlines()[-1])
    assert nats_client.stream_state(a)["messages"] == 11 and nats_client.stream_state(b)["messages"] == 10

    batch = re.compile(r"JetStream sink batch [01] committed: 5 published, 0 duplicates.* \((.*)\)$")
    whose = [m.group(1) for m in map(batch.search, done.stderr.splitlines()) if m]
    assert sorted(whose) == sorted([f"query 'orders', to stream '{a}'"] * 2
                                   + [f"query id {ids['unnamed']}, to stream '{b}'"] * 2), done.stderr[-4000:]
    assert re.search(rf"JetStream sink write committed: 1 published, .*\(to subject '{a}\.one'\)$", done.stderr,
                     re.MULTILINE), done.stderr[-4000:]


def test_task_failing_mid_batch_restarts_exactly_once(spark, nats_server, nats_client, stream_name, tmp_path):
    """Micro-batch 1 fails after publishing most of its rows: its last row goes to a subject
    the stream does not capture yet (the server rejects it). After the stream is fixed, the
    restarted query replays batch 1 with the same msg ids and the server drops the copies."""
    nats_client.add_stream(stream_name, [f"{stream_name}.0", f"{stream_name}.1", f"{stream_name}.2"], allow_msg_ttl=True)
    rows_per_file = 400
    write_json_inputs(tmp_path / "in", files=3, rows_per_file=rows_per_file)
    poison = 2 * rows_per_file - 1  # the last row of micro-batch 1

    def query():
        df = spark.readStream.schema("id long, data string").option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
        subject = F.when(F.col("id") == poison, F.lit(f"{stream_name}.late")).otherwise(
            F.concat(F.lit(f"{stream_name}."), (F.col("id") % 3).cast("string")))
        return (
            df.select(subject.alias("subject"), "data").coalesce(1)
            .writeStream.format("jetstream").option("servers", nats_server.url).option("stream", stream_name)
            .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start()
        )

    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        q = query()
        with pytest.raises(Exception, match=f"row {rows_per_file - 1} of partition 0 to subject '{stream_name}.late'"):
            finished(q, 120)
        # Batch 0 whole, batch 1 all but its last row.
        assert sorted(m.data for m in nats_client.messages(stream_name)) == \
            sorted(f"row-{i}".encode() for i in range(2 * rows_per_file) if i != poison)

        config = nats_client.stream_config(stream_name)
        config["subjects"].append(f"{stream_name}.late")
        assert "error" not in nats_client.api(f"STREAM.UPDATE.{stream_name}", config)
        q = query()
        finished(q, 120)
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)

    datas = [m.data for m in nats_client.messages(stream_name)]
    assert sorted(datas) == sorted(f"row-{i}".encode() for i in range(3 * rows_per_file))


# Two spark-submit drivers (~100 s, 2 JVMs): run on request (-m slow) with the chaos soak, which kills
# drivers mid-batch too; CI keeps the in-process crash replays (test_faults, test_replay_past_window).
@pytest.mark.slow
def test_driver_killed_mid_batch_restarts_exactly_once(nats_server, nats_client, stream_name, tmp_path):
    """SIGKILL the whole job (driver JVM and Python workers) while micro-batch 1 is being
    published; the restarted job replays it from the checkpoint without duplicates."""
    nats_client.add_stream(stream_name, [f"{stream_name}.>"])
    rows_per_file = 6000
    write_json_inputs(tmp_path / "in", files=3, rows_per_file=rows_per_file)
    job = [sys.executable, str(JOB), nats_server.url, str(tmp_path / "in"), str(tmp_path / "chk"), stream_name]

    # maxPendingAcks=1 publishes one row per round trip, so a micro-batch takes long enough to be caught.
    proc = subprocess.Popen(job + ["1"], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: nats_client.stream_state(stream_name)["messages"] > rows_per_file + 100,
                   timeout=180, interval=0.01, what="micro-batch 1 has started publishing")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    stored_after_kill = nats_client.stream_state(stream_name)["messages"]
    assert rows_per_file < stored_after_kill < 2 * rows_per_file, stored_after_kill

    done = subprocess.run(job + ["256"], start_new_session=True, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    datas = [m.data for m in nats_client.messages(stream_name)]
    assert len(datas) == 3 * rows_per_file
    assert set(datas) == {f"row-{i}".encode() for i in range(3 * rows_per_file)}
