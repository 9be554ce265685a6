"""The source under faults: a server killed and restarted in the middle of a partition."""

from __future__ import annotations

import asyncio
import os
import threading

from pyspark_jetstream.server import EmbeddedNatsServer

from ..helpers import SyncNats, fill_stream, gate_at_first_batch, wait_until


def test_server_killed_mid_partition_read_rides_through(spark, tmp_path):
    count = 100_000
    with EmbeddedNatsServer() as server:
        client = SyncNats(server.url)
        client.add_stream("RESTART", ["restart.>"], storage="file")
        client.close()
        asyncio.run(fill_stream(server.url, "restart.x", count))

        reached, resume = str(tmp_path / "reached"), str(tmp_path / "resume")

        gate = gate_at_first_batch(reached, resume)

        df = (spark.read.format("jetstream").option("servers", server.url).option("stream", "RESTART")
              .option("numPartitions", "1").option("batchSize", "500").option("consume.maxMessages", "1000")
              .option("consume.expires", "5s").load())
        result: dict = {}

        def run() -> None:
            try:
                result["seqs"] = [r.seq for r in df.mapInArrow(gate, df.schema).select("seq").collect()]
            except Exception as exc:  # surfaced by the assertion below
                result["error"] = exc

        reader = threading.Thread(target=run)
        reader.start()
        wait_until(lambda: os.path.exists(reached), timeout=120, what="the first batch reached the gate")
        server.restart(kill=True)
        open(resume, "w").close()
        reader.join(300)
        assert not reader.is_alive()
        assert "error" not in result, result.get("error")
        seqs = result["seqs"]
        assert len(seqs) == count and sorted(seqs) == list(range(1, count + 1))
