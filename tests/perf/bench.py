"""Benchmark harness: each connector path next to a raw nats-py baseline, in the same run.

    python tests/perf/bench.py --quick        # small sizes, a few minutes
    python tests/perf/bench.py                # the full run

It starts an embedded nats-server, prepares file-storage streams and prints a
Markdown table (rows/s, MB/s, ratio to the baseline measured beside it). Never
run in CI: ratios, not absolute numbers, are what it proves, and only when the
machine is otherwise idle.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@dataclass
class Result:
    path: str
    rows: int
    size: int
    seconds: float
    baseline: str | None = None
    rss_mib: float | None = None

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.rows * self.size / self.seconds / 1e6


def api(nc, subject: str, body: dict):
    import json

    async def go():
        msg = await nc.request(f"$JS.API.{subject}", json.dumps(body).encode(), timeout=30)
        reply = json.loads(msg.data)
        assert "error" not in reply, reply
        return reply

    return go()


async def make_stream(url: str, name: str) -> None:
    import nats

    nc = await nats.connect(url)
    try:
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{name}.>"], "storage": "file",
                                                 "allow_msg_ttl": True, "duplicate_window": 120 * 10**9})
    finally:
        await nc.close()


async def stream_messages(url: str, name: str) -> int:
    import nats

    nc = await nats.connect(url)
    try:
        return (await api(nc, f"STREAM.INFO.{name}", {}))["state"]["messages"]
    finally:
        await nc.close()


async def raw_publish(url: str, stream: str, rows: int, size: int, window: int = 10_000, headers: bool = True) -> float:
    """Baseline: nc.publish with a reply subject per message under one wildcard ack
    subscription, a window of 10k outstanding acks, every PubAck checked."""
    import nats

    nc = await nats.connect(url, pending_size=8 * 1024 * 1024)
    inbox = nc.new_inbox()
    payload = b"x" * size
    state = {"pending": 0, "acked": 0, "errors": 0}
    room, done = asyncio.Event(), asyncio.Event()

    async def on_ack(msg):
        if b'"error"' in msg.data or not msg.data:
            state["errors"] += 1
        state["acked"] += 1
        state["pending"] -= 1
        if state["pending"] <= window // 2:
            room.set()
        if state["acked"] == rows:
            done.set()

    await nc.subscribe(inbox + ".*", cb=on_ack)
    start = time.perf_counter()
    for i in range(rows):
        if state["pending"] >= window:
            room.clear()
            await room.wait()
        state["pending"] += 1
        await nc.publish(f"{stream}.s{i % 8}", payload, reply=f"{inbox}.{i}",
                         headers={"Nats-TTL": "1h", "Nats-Msg-Id": f"raw-{i}"} if headers else None)
    await done.wait()
    elapsed = time.perf_counter() - start
    await nc.close()
    assert state["errors"] == 0, state
    return elapsed


async def raw_pull_to_arrow(url: str, stream: str, count: int, batch: int = 10_000) -> float:
    """Baseline: one process pulling the range through CONSUMER.MSG.NEXT on a core
    subscription (ADR-37 style: batch 10k, refill at half), building the same Arrow batches."""
    import json
    import uuid

    import nats

    from pyspark_jetstream.source_rows import BatchBuilder

    nc = await nats.connect(url, pending_size=8 * 1024 * 1024)
    name = f"rawbench{uuid.uuid4().hex[:8]}"  # a fresh consumer per run
    await api(nc, f"CONSUMER.CREATE.{stream}.{name}", {"stream_name": stream, "config": {
        "name": name, "ack_policy": "none", "deliver_policy": "all", "mem_storage": True, "num_replicas": 1}})
    inbox = nc.new_inbox()
    builder = BatchBuilder(stream)
    state = {"got": 0, "pending": 0, "batches": 0}
    done = asyncio.Event()
    pull_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}"

    async def pull(n):
        state["pending"] += n
        await nc.publish(pull_subject, json.dumps({"batch": n, "expires": 30 * 10**9}).encode(), reply=inbox)

    async def on_msg(msg):
        if not msg.reply:
            return  # statuses: the range is sized so that none ends a pull early
        tokens = msg.reply.split(".")
        builder.add(msg.subject.encode(), msg.data, None, int(tokens[5]), int(tokens[7]))
        state["got"] += 1
        state["pending"] -= 1
        if len(builder) >= batch:
            builder.build()
            state["batches"] += 1
        if state["got"] == count:
            if len(builder):
                builder.build()
            done.set()
        elif state["pending"] < batch // 2:
            want = min(batch - state["pending"], count - state["got"] - state["pending"])
            if want > 0:  # never a batch of 0: the server would treat it as 1 and queue it
                await pull(want)

    await nc.subscribe(inbox, cb=on_msg)
    start = time.perf_counter()
    await pull(min(batch, count))
    await done.wait()
    elapsed = time.perf_counter() - start
    await api(nc, f"CONSUMER.DELETE.{stream}.{name}", {})
    await nc.close()
    return elapsed


class WorkerRss:
    """Peak RSS (VmHWM) of Spark's Python worker processes, read from /proc."""

    @staticmethod
    def peak_mib() -> float:
        peak = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
                if b"pyspark.daemon" not in cmdline and b"pyspark.worker" not in cmdline:
                    continue
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            peak = max(peak, int(line.split()[1]))
            except OSError:
                continue
        return peak / 1024


def connector_batch_read(spark, url: str, stream: str, partitions: int) -> float:
    df = spark.read.format("jetstream").option("servers", url).option("stream", stream) \
        .option("numPartitions", partitions).load()
    start = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def connector_stream_read(spark, url: str, stream: str, partitions: int, per_trigger: int) -> float:
    import tempfile

    q = (spark.readStream.format("jetstream").option("servers", url).option("stream", stream)
         .option("startingOffsets", "earliest").option("numPartitions", partitions)
         .option("maxMessagesPerTrigger", per_trigger).load()
         .writeStream.format("noop").option("checkpointLocation", tempfile.mkdtemp())
         .trigger(availableNow=True))
    start = time.perf_counter()
    query = q.start()
    query.awaitTermination()
    return time.perf_counter() - start


def connector_batch_write(spark, url: str, stream: str, rows: int, size: int, partitions: int) -> float:
    from pyspark.sql import functions as F

    df = (
        spark.range(rows, numPartitions=partitions)
        .select(
            F.concat(F.lit(f"{stream}.s"), (F.col("id") % 8).cast("string")).alias("subject"),
            F.expr(f"cast(repeat('x', {size}) as binary)").alias("data"),
            F.lit("1h").alias("ttl"),
        )
        .cache()
    )
    df.count()
    start = time.perf_counter()
    df.write.format("jetstream").mode("append").option("servers", url).option("stream", stream).save()
    elapsed = time.perf_counter() - start
    df.unpersist()
    return elapsed


def print_table(results: list[Result]) -> None:
    by_path = {r.path: r for r in results}
    print("\n| path | rows | size | rows/s | MB/s | ratio to baseline | worker peak RSS |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        ratio = f"{r.rows_per_s / by_path[r.baseline].rows_per_s:.2f}x ({r.baseline})" if r.baseline else "baseline"
        rss = f"{r.rss_mib:.0f} MiB" if r.rss_mib is not None else ""
        print(f"| {r.path} | {r.rows:,} | {r.size} B | {r.rows_per_s:,.0f} | {r.mb_per_s:.1f} | {ratio} | {rss} |")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--repeat", type=int, default=2, help="runs per path; the best is kept")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    from pyspark_jetstream.server import EmbeddedNatsServer

    write_sizes = [(50_000, 100)] if args.quick else [(200_000, 100), (50_000, 1024)]
    read_rows = 100_000 if args.quick else 500_000
    results: list[Result] = []
    with EmbeddedNatsServer() as server:
        spark = (
            SparkSession.builder.master("local[2]").appName("jetstream-bench")
            .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        # Reads first, while the Python workers are fresh, so their peak RSS is the read's.
        asyncio.run(make_stream(server.url, "READ"))
        asyncio.run(raw_publish(server.url, "READ", read_rows, 100, headers=False))
        connector_batch_read(spark, server.url, "READ", 2)  # warm-up
        raw_read = min(asyncio.run(raw_pull_to_arrow(server.url, "READ", read_rows)) for _ in range(args.repeat))
        base = f"raw nats-py pull to Arrow {read_rows // 1000}k x 100 B"
        results.append(Result(base, read_rows, 100, raw_read))
        for parts in (1, 2):
            best = min(connector_batch_read(spark, server.url, "READ", parts) for _ in range(args.repeat))
            results.append(Result(f"batch read {read_rows // 1000}k x 100 B, {parts} partition(s)", read_rows, 100,
                                  best, base, WorkerRss.peak_mib()))
        best = min(connector_stream_read(spark, server.url, "READ", 2, 100_000) for _ in range(args.repeat))
        results.append(Result(f"streaming read (AvailableNow, 100k per trigger) {read_rows // 1000}k x 100 B",
                              read_rows, 100, best, base, WorkerRss.peak_mib()))

        # Warm up the write path.
        asyncio.run(make_stream(server.url, "WARM"))
        connector_batch_write(spark, server.url, "WARM", 5_000, 100, 2)
        n = 0
        for rows, size in write_sizes:
            raw_best = conn_best = float("inf")
            for _ in range(args.repeat):
                n += 1
                raw_stream, conn_stream = f"RAW{n}", f"CONN{n}"
                asyncio.run(make_stream(server.url, raw_stream))
                raw_best = min(raw_best, asyncio.run(raw_publish(server.url, raw_stream, rows, size)))
                asyncio.run(make_stream(server.url, conn_stream))
                conn_best = min(conn_best, connector_batch_write(spark, server.url, conn_stream, rows, size, 2))
                stored = asyncio.run(stream_messages(server.url, conn_stream))
                assert stored == rows, (stored, rows)
            base = f"raw nats-py publish {rows // 1000}k x {size} B"
            results.append(Result(base, rows, size, raw_best))
            results.append(Result(f"batch write {rows // 1000}k x {size} B (2 partitions)", rows, size, conn_best, base))
        spark.stop()
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
