"""Issue #41, headers only when asked: ``python tests/perf/bench.py --only headers`` (``--quick``: smaller).

Three reads of the same 300,000 messages of 100 B that the sink wrote (every message with
``Nats-Msg-Id`` and ``Nats-TTL``), side by side with the header-less read of the same payloads
written by nats-py without headers, each a 2-partition batch read into Spark's ``noop`` sink,
alternated, median of ``repeat``:

- the default read (every column, the ``headers`` map built);
- ``includeHeaders=false`` (no ``headers`` column, no map built);
- a schema given to the read, ``subject string, data binary, seq long``.

The target of issue #41: both of the last two at >= 0.9x the header-less read's speed.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from bench import Result, collect_garbage, delete_streams, fill_with_the_sink, make_stream
from bench_order import fill, in_session

SCHEMA = "subject string, data binary, seq long"


def _noop(spark, url: str, stream: str, schema: str | None = None, **options: str) -> float:
    r = spark.read.format("jetstream").option("servers", url).option("stream", stream).option("numPartitions", 2)
    for k, v in options.items():
        r = r.option(k, v)
    if schema is not None:
        r = r.schema(schema)
    df = r.load()
    start = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def run(spark, url: str, http: int, quick: bool, repeat: int, results: list, notes: list, tables: list) -> None:
    rows = 100_000 if quick else 300_000
    asyncio.run(make_stream(url, "HBARE"))
    asyncio.run(fill(url, "HBARE", rows, 100, 16))
    asyncio.run(make_stream(url, "HSINK"))
    fill_with_the_sink(spark, url, "HSINK", rows, 100, rich=False, subjects=16)
    paths = {
        "header-less data, default read": lambda: _noop(spark, url, "HBARE"),
        "the sink's data, default read (headers map built)": lambda: _noop(spark, url, "HSINK"),
        "the sink's data, includeHeaders=false": lambda: _noop(spark, url, "HSINK", includeHeaders="false"),
        f"the sink's data, schema '{SCHEMA}'": lambda: _noop(spark, url, "HSINK", SCHEMA),
    }
    for measure in paths.values():  # warm-up: the workers start, the streams are cached
        measure()
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeat):
        for name, measure in paths.items():
            collect_garbage(spark)
            times[name].append(measure())
    base = next(iter(paths))
    for name in paths:
        results.append(Result(f"{name}, {rows // 1000}k x 100 B, 2 partitions, noop", rows, 100,
                              statistics.median(times[name]), None if name == base else f"{base}, "
                              f"{rows // 1000}k x 100 B, 2 partitions, noop"))
    bare = statistics.median(times[base])
    lines = ["| read | time (median) | speed against the header-less read |", "|---|---:|---:|"]
    lines += [f"| {name} | {statistics.median(t):.2f} s | {bare / statistics.median(t):.2f}x |"
              for name, t in times.items()]
    tables.append((f"Reads of {rows:,} messages of 100 B (16 subjects), 2 partitions, noop, median of {repeat}",
                   "\n".join(lines)))
    asyncio.run(delete_streams(url, "HBARE", "HSINK"))


def main(url: str, http: int, quick: bool, repeat: int) -> tuple[list, list, list]:
    return in_session("jetstream-bench-headers", run, url, http, quick, repeat)
