"""The sink's write in fast-ingest batches against a PubAck per row and raw nats-py (issue #48).

    python -m tests.perf.bench_sink_batched [--messages 100000] [--rounds 3] [--sizes 100,1024] [--replicas 1]

One nats-server (R1) or a 3-node cluster (``--replicas 3``: R3 streams), file streams of the same
config, duplicate window 2 min; per round and size, in rotating order:

- ``sink batched``: a write task of the sink (``write_partition``: encode, ids, publish, settle; no
  Spark around it, whose own cost is the same in both modes) to a stream with ``allow_batched``,
  ``publish.mode=batched``;
- ``sink acked``: the same task to a stream without ``allow_batched`` (``auto`` falls back);
- ``nats-py``: nats-py's pipelined ``publish`` with a window of 4,096 PubAcks (bench_fast_ingest.py).

Every row has a ``Nats-Msg-Id``; each run's stream is checked to hold every message. Prints the
medians of rows a second and their ratio to nats-py within the round.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
import uuid

import nats
import pyarrow as pa
from nats.js.api import StreamConfig
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from pyspark_jetstream.client import runtime
from pyspark_jetstream.sink.plan.sink_plan import plan_sink
from pyspark_jetstream.sink.task.write import write_partition
from pyspark_jetstream.tools.server import EmbeddedNatsCluster, EmbeddedNatsServer

from .bench_fast_ingest import _nats_py

METHODS = ("sink batched", "sink acked", "nats-py")
SCHEMA = StructType([StructField("subject", StringType()), StructField("data", BinaryType())])


async def _stream(url: str, name: str, batched: bool, replicas: int = 1) -> None:
    nc = await nats.connect(url.split(","))
    await nc.jetstream().add_stream(StreamConfig(name=name, subjects=[f"{name}.>"], allow_batched=batched or None,
                                                 duplicate_window=120, num_replicas=replicas))
    await nc.close()


async def _count_and_delete(url: str, name: str) -> int:
    nc = await nats.connect(url.split(","))
    js = nc.jetstream()
    stored = (await js.stream_info(name)).state.messages
    await js.delete_stream(name)
    await nc.close()
    return stored


def _sink(url: str, name: str, n: int, size: int, batched: bool) -> float:
    plan = plan_sink({"servers": url, "stream": name, "sinkState": "none", "order": "none",
                      "publish.mode": "batched" if batched else "auto"}, SCHEMA, overwrite=False, streaming=False)
    assert plan.publish.batched == batched
    payload = b"x" * size

    batches = []  # made before the clock starts, as nats-py's messages are (Spark hands a task its rows)
    for start in range(0, n, 10_000):
        ids = range(start, min(n, start + 10_000))
        batches.append(pa.RecordBatch.from_pydict({"subject": [f"{name}.{i % 16}" for i in ids],
                                                   "data": [payload] * len(ids)}))

    started = time.perf_counter()
    message = write_partition(plan, iter(batches))
    elapsed = time.perf_counter() - started
    assert message.published == n, message
    return n / elapsed


def _raw(url: str, name: str, n: int, size: int) -> float:
    async def go() -> float:
        nc = await nats.connect(url.split(","), pending_size=64 * 1024 * 1024)
        payload = b"x" * size
        messages = [(f"{name}.{p % 16}", None, payload, f"{name}-{p}") for p in range(n)]
        started = time.perf_counter()
        await _nats_py(nc, messages)
        elapsed = time.perf_counter() - started
        await nc.close()
        return n / elapsed

    return asyncio.run(go())


def bench(url: str, size: int, n: int, rounds: int, replicas: int = 1) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {m: [] for m in METHODS}
    ratios: dict[str, list[float]] = {m: [] for m in METHODS}
    order = itertools.cycle(itertools.permutations(METHODS))
    for _ in range(rounds):
        found = {}
        for method in next(order):
            name = f"BS{uuid.uuid4().hex[:10]}"
            runtime.run(_stream(url, name, method == "sink batched", replicas))
            if method == "nats-py":
                found[method] = _raw(url, name, n, size)
            else:
                found[method] = _sink(url, name, n, size, method == "sink batched")
            assert runtime.run(_count_and_delete(url, name)) == n, method
        for method, rate in found.items():
            rates[method].append(rate)
            ratios[method].append(rate / found["nats-py"])
    return {m: (statistics.median(rates[m]), statistics.median(ratios[m])) for m in METHODS}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="100,1024")
    parser.add_argument("--replicas", type=int, choices=(1, 3), default=1)
    args = parser.parse_args(argv)
    print("| payload | " + " | ".join(METHODS) + " |")
    print("|---|" + "---:|" * len(METHODS))
    with EmbeddedNatsCluster(3) if args.replicas == 3 else EmbeddedNatsServer() as server:
        for size in (int(s) for s in args.sizes.split(",")):
            result = bench(server.url, size, args.messages, args.rounds, args.replicas)
            cells = [f"{rate:,.0f} /s ({ratio:.2f})" for rate, ratio in (result[m] for m in METHODS)]
            print(f"| {size} B | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
