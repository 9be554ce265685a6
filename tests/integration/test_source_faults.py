"""The source under faults: a server killed and restarted in the middle of a partition."""

from __future__ import annotations

import asyncio
import os
import threading

from pyspark_jetstream.server import EmbeddedNatsServer

from ..helpers import SyncNats, wait_until


async def _fill(url: str, stream: str, count: int) -> None:
    """Publish ``count`` small messages fast (pipelined, every PubAck checked)."""
    import nats

    nc = await nats.connect(url)
    inbox = nc.new_inbox()
    done, acked, errors = asyncio.Event(), [0], []

    async def on_ack(msg):
        if b'"error"' in msg.data:
            errors.append(msg.data)
        acked[0] += 1
        if acked[0] == count:
            done.set()

    await nc.subscribe(inbox + ".*", cb=on_ack)
    for i in range(count):
        await nc.publish(f"{stream.lower()}.x", b"p" * 100, reply=f"{inbox}.{i}")
        if i % 5000 == 4999:
            await nc.flush()
    await asyncio.wait_for(done.wait(), 60)
    await nc.close()
    assert not errors, errors[:3]


def test_server_killed_mid_partition_read_rides_through(spark, tmp_path):
    count = 100_000
    with EmbeddedNatsServer() as server:
        client = SyncNats(server.url)
        client.add_stream("RESTART", ["restart.>"], storage="file")
        client.close()
        asyncio.run(_fill(server.url, "RESTART", count))

        reached, resume = str(tmp_path / "reached"), str(tmp_path / "resume")

        def gate(batches):
            # Holds the first batch until the test has restarted the server: a barrier
            # with a deadline, so that the kill lands while the partition is mid-read.
            import time

            first = True
            for batch in batches:
                if first:
                    open(reached, "w").close()
                    deadline = time.monotonic() + 120
                    while not os.path.exists(resume) and time.monotonic() < deadline:
                        time.sleep(0.05)
                    first = False
                yield batch

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
