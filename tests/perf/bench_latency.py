"""Stream-to-stream latency of the documented setups, beside Spark's own floor (issue #56, point 6).

    python -m tests.perf.bench_latency [--seconds 20] [--rate 500] [--rounds 2]

One nats-server, ``local[2]``. A publisher sends ``--rate`` messages a second over 50 subjects to a source
stream, each carrying its send time; a streaming query (default trigger) copies them to a target stream;
a core subscriber of the target's subjects takes each message's arrival time. Cells, in rotating order:

- ``1 partition`` (the streaming default), no shuffle, ``subject`` and ``data`` only: the filter-and-republish
  as a Kafka user writes it, with ``publish.mode`` ``auto`` and ``acked``;
- ``2 partitions + repartition(2, "subject")``, ``stream`` and ``seq`` kept (the documented copy through a
  shuffle), both modes;
- ``2 partitions, order=none``, no shuffle;
- the floor: Spark's ``rate`` source into the ``noop`` sink at the same rate (no I/O): the time of each
  micro-batch with rows, from the query's progress (Spark's own; a row waits at least that long).

Prints p50/p99 per cell (medians over rounds) as a Markdown table for docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import struct
import sys
import tempfile
import threading
import time

import nats
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pyspark_jetstream.tools.server import EmbeddedNatsServer

SUBJECTS = 50
CELLS = ("1 partition, auto", "1 partition, acked", "2 partitions + shuffle, auto", "2 partitions + shuffle, acked",
         "2 partitions, order=none, auto", "floor: rate -> noop")


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


async def _streams(url: str, source: str, target: str) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(name=source, subjects=[f"{source}.>"])
    await js.add_stream(name=target, subjects=[f"{target}.>"], allow_msg_ttl=True)
    await nc.close()


def _copy_query(spark, url: str, source: str, target: str, cell: str):
    read = (spark.readStream.format("jetstream").option("servers", url).option("stream", source)
            .option("startingOffsets", "latest"))
    if cell.startswith("2 partitions"):
        read = read.option("numPartitions", "2")
    df = read.load().withColumn("subject", F.concat(F.lit(f"{target}."), F.col("subject")))
    if "shuffle" in cell:
        df = df.select("subject", "data", "stream", "seq").repartition(2, "subject")
    else:
        df = df.select("subject", "data")
    w = (df.writeStream.format("jetstream").option("servers", url).option("stream", target)
         .option("checkpointLocation", tempfile.mkdtemp()).option("publish.mode", cell.rsplit(", ", 1)[1]))
    if "order=none" in cell:
        w = w.option("order", "none")
    return w.start()


def copy_latency(spark, url: str, cell: str, rate: int, seconds: float, tag: str) -> list[float]:
    """Each message's send -> arrival at a core subscriber of the target (ms)."""
    source, target = f"LS{tag}", f"LT{tag}"
    asyncio.run(_streams(url, source, target))
    query = _copy_query(spark, url, source, target, cell)
    deadline = time.monotonic() + 60
    while not query.recentProgress and time.monotonic() < deadline:
        time.sleep(0.1)  # the first (empty) micro-batch planned: the query is running
    arrivals: list[float] = []
    done = threading.Event()

    async def run() -> None:
        nc = await nats.connect(url)

        async def on_msg(msg) -> None:
            arrivals.append((time.time() - struct.unpack(">d", msg.data[:8])[0]) * 1000)

        await nc.subscribe(f"{target}.>", cb=on_msg)
        pub = await nats.connect(url)
        n, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            delay = start + n / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing the publisher
            await pub.publish(f"{source}.d{n % SUBJECTS}", struct.pack(">d", time.time()) + b"x" * 92)
            n += 1
        await pub.flush()
        until = time.monotonic() + 60
        while len(arrivals) < n and time.monotonic() < until:
            await asyncio.sleep(0.1)  # the last micro-batches arriving
        info = await nc.jetstream().stream_info(target)
        if info.state.messages != n or len(arrivals) != n:
            print(f"  {cell}: {n} sent, {info.state.messages} stored in {target}, {len(arrivals)} received",
                  flush=True)
        await pub.close()
        await nc.close()
        done.set()

    asyncio.run(run())
    query.stop()
    return arrivals


def floor_latency(spark, rate: int, seconds: float) -> list[float]:
    """Spark's own: ``rate`` -> ``noop``, the time of each micro-batch that had rows (``triggerExecution``, from
    the query's progress). A row waits at least that long in any copy; the rate source emits its rows in
    whole seconds, so a per-row latency from its timestamps would measure its second, not Spark."""
    query = (spark.readStream.format("rate").option("rowsPerSecond", rate).load()
             .writeStream.format("noop").option("checkpointLocation", tempfile.mkdtemp()).start())
    time.sleep(seconds)  # the floor runs for as long as a copy cell; nothing to wait on
    progress = list(query.recentProgress)
    query.stop()
    return [float(p["durationMs"].get("triggerExecution", 0)) for p in progress if int(p["numInputRows"])]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cells", default="", help="cell names separated by ; (default: all)")
    args = parser.parse_args()
    chosen = tuple(c for c in CELLS if not args.cells or c in args.cells.split(";"))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the workers' interpreter: this one, with the connector
    spark = (SparkSession.builder.master("local[2]").appName("jetstream-latency")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    figures: dict[str, list[tuple[float, float, int]]] = {cell: [] for cell in chosen}
    with EmbeddedNatsServer() as server:
        for round_no in range(args.rounds):
            cells = chosen[round_no % len(chosen):] + chosen[:round_no % len(chosen)]
            for k, cell in enumerate(cells):
                if cell.startswith("floor"):
                    values = floor_latency(spark, args.rate, args.seconds)
                else:
                    values = copy_latency(spark, server.url, cell, args.rate, args.seconds, f"{round_no}x{k}")
                figures[cell].append((_pct(values, 0.5), _pct(values, 0.99), len(values)))
                print(f"round {round_no} {cell}: p50 {figures[cell][-1][0]:.0f} ms, p99 {figures[cell][-1][1]:.0f} ms, "
                      f"{len(values)} messages", flush=True)
    spark.stop()
    print("\n| setup | p50 | p99 | messages |\n|---|---:|---:|---:|")
    for cell, runs in figures.items():
        print(f"| {cell} | {statistics.median(r[0] for r in runs):.0f} ms | {statistics.median(r[1] for r in runs):.0f} ms "
              f"| {sum(r[2] for r in runs):,} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
