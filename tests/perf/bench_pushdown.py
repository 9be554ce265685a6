"""Lookups by a read's own options (issue #46; before it, filter pushdown, issue #34):
``python tests/perf/bench.py --only pushdown`` (``--quick``: smaller).

What it measures, on one embedded nats-server whose monitoring port counts the messages it sent
(``/varz`` ``out_msgs``), each query on a fresh temporary view (a view's partitions are planned once):

- **a bucket's latest view by the option ``keys``**: one key and 100 keys on a 1,000,000-key bucket
  against the same reads of an empty bucket in the same run (Spark's fixed cost), and against
  nats-py's ``kv.get`` loop for the same keys; ``WHERE key = 'x'`` on the whole view, once, for scale
  (no released PySpark narrows it: the whole bucket is read);
- **a stream by the option ``subjects``**: one subject of 1,000 on 1,000,000 messages: the messages the
  server sent for it (its API replies included) against that subject's count, and the times, against
  the whole stream filtered by Spark.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from bench import Result, api, collect_garbage
from bench_order import fill, in_session, out_msgs

CONF = "spark.sql.python.filterPushdown.enabled"


async def make_bucket(url: str, bucket: str) -> None:
    """A bucket's stream as a KV client creates it (direct gets allowed, one value per key)."""
    import nats

    nc = await nats.connect(url)
    try:
        await api(nc, f"STREAM.CREATE.KV_{bucket}", {
            "name": f"KV_{bucket}", "subjects": [f"$KV.{bucket}.>"], "storage": "file", "max_msgs_per_subject": 1,
            "allow_direct": True, "allow_rollup_hdrs": True, "deny_delete": True, "discard": "new"})
    finally:
        await nc.close()


async def make_plain_stream(url: str, name: str) -> None:
    import nats

    nc = await nats.connect(url)
    try:
        await api(nc, f"STREAM.CREATE.{name}", {"name": name, "subjects": [f"{name}.>"], "storage": "file"})
    finally:
        await nc.close()


def timed_query(spark, url: str, options: str, query: str, pushdown: bool) -> tuple[float, list]:
    """Seconds for ``query`` on a fresh view ``v`` (planning included), and its rows."""
    spark.conf.set(CONF, "true" if pushdown else "false")
    spark.catalog.dropTempView("v")
    spark.sql(f"CREATE TEMPORARY VIEW v USING jetstream OPTIONS (servers '{url}', {options})")
    collect_garbage(spark)
    started = time.perf_counter()
    rows = spark.sql(query).collect()
    return time.perf_counter() - started, rows


async def kv_get_loop(url: str, bucket: str, keys: list[str]) -> float:
    """Seconds for nats-py's ``kv.get`` of each key, one after the other (a connection made beforehand)."""
    import nats

    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        started = time.perf_counter()
        for key in keys:
            await kv.get(key)
        return time.perf_counter() - started
    finally:
        await nc.close()


def in_process(url: str, bucket: str, keys: list[str], repeat: int) -> float:
    """Median seconds for the connector alone to plan and read ``keys`` of ``bucket``'s latest view (what
    ``spark.read`` runs on the driver and in the tasks, without Spark's own cost per query)."""
    from pyspark_jetstream.options import parse_source_options
    from pyspark_jetstream.source.spark_readers import JetStreamBatchReader

    opts = parse_source_options({"servers": url, "bucket": bucket, "kv.view": "latest", "keys": ",".join(keys),
                                 "numPartitions": "2"}, streaming=False)
    times = []
    for _ in range(repeat + 1):
        started = time.perf_counter()
        reader = JetStreamBatchReader(opts)
        for partition in reader.partitions():
            for _ in reader.read(partition):
                pass
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def run(spark, url: str, http: int, quick: bool, repeat: int, results: list, notes: list, tables: list) -> None:
    keys = 100_000 if quick else 1_000_000
    messages, subjects = (100_000, 1_000) if quick else (1_000_000, 1_000)
    asyncio.run(make_bucket(url, "PDFULL"))
    asyncio.run(make_bucket(url, "PDEMPTY"))
    started = time.perf_counter()
    asyncio.run(fill(url, "", keys, 100, keys, key_of=lambda i: f"$KV.PDFULL.k{i}"))
    notes.append(f"Filled a {keys:,}-key bucket in {time.perf_counter() - started:.1f} s.")
    asyncio.run(make_plain_stream(url, "PDS"))
    asyncio.run(fill(url, "PDS", messages, 100, subjects))

    hundred = [f"k{i * 997 % keys}" for i in range(100)]
    latest = "bucket '{}', `kv.view` 'latest', numPartitions 2, keys '{}'"
    every = "SELECT * FROM v"
    timed_query(spark, url, latest.format("PDEMPTY", "k1"), every, False)  # warm-up: the planner workers start
    rows = []
    for label, wanted in (("one key", ["k4242"]), ("100 keys", hundred)):
        empty, full, sent = [], [], []
        for r in range(repeat + 1):
            for bucket, times in ((("PDEMPTY", empty), ("PDFULL", full)) if r % 2 else
                                  (("PDFULL", full), ("PDEMPTY", empty))):
                before = out_msgs(http)
                seconds, got = timed_query(spark, url, latest.format(bucket, ",".join(wanted)), every, False)
                assert len(got) == (len(wanted) if bucket == "PDFULL" else 0), (label, bucket, len(got))
                if bucket == "PDFULL":
                    sent.append(out_msgs(http) - before)
                if r:  # the first round warms this query's path up
                    times.append(seconds)
        loop = statistics.median(asyncio.run(kv_get_loop(url, "PDFULL", wanted)) for _ in range(repeat))
        alone_empty = in_process(url, "PDEMPTY", wanted, repeat * 4)
        alone_full = in_process(url, "PDFULL", wanted, repeat * 4)
        e, f = statistics.median(empty), statistics.median(full)
        rows.append(f"| {label} | {e * 1000:.0f} ms | {f * 1000:.0f} ms | {f / e:.2f}x | {alone_empty * 1000:.1f} ms | "
                    f"{alone_full * 1000:.1f} ms | {alone_full / alone_empty:.2f}x | {max(sent):,} | "
                    f"{loop * 1000:.1f} ms |")
        results.append(Result(f"latest view, keys: {label}, {keys:,}-key bucket", len(wanted), 100, f))
    if quick:  # the whole 100,000-key view; the full run's million takes a minute or more
        off_seconds, got = timed_query(spark, url, latest.format("PDFULL", "k4242").replace(", keys 'k4242'", ""),
                                       "SELECT * FROM v WHERE key = 'k4242'", True)
        assert len(got) == 1
    else:
        off_seconds = float("nan")
    tables.append((f"A bucket's latest view by the option `keys` ({keys:,} keys against an empty bucket, median of "
                   f"{repeat}, same run; nats-py's `kv.get` loop for the same keys)",
                   "| read | Spark query, empty bucket | Spark query, full bucket | ratio | connector alone, empty | "
                   "connector alone, full | ratio | messages sent (most) | nats-py kv.get loop |\n"
                   "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n" + "\n".join(rows)))
    if quick:
        notes.append(f"`WHERE key = 'k4242'` on the whole view, filter pushdown on (every key read, Spark filters): "
                     f"{off_seconds:.1f} s.")

    count = "SELECT count(*) AS n FROM v WHERE subject = 'PDS.s7'"
    per_subject = messages // subjects
    cases = {"subjects, 2 partitions": ("stream 'PDS', numPartitions 2, subjects 'PDS.s7'", False),
             "subjects, 1 partition": ("stream 'PDS', numPartitions 1, subjects 'PDS.s7'", False),
             "whole stream, 2 partitions": ("stream 'PDS', numPartitions 2", True)}
    for options, pushdown in cases.values():
        timed_query(spark, url, options, count, pushdown)  # warm-up
    times: dict[str, list[float]] = {label: [] for label in cases}
    sent: dict[str, list[int]] = {label: [] for label in cases}
    for r in range(repeat):
        order = list(cases)[r % len(cases):] + list(cases)[:r % len(cases)]
        for label in order:
            options, pushdown = cases[label]
            before = out_msgs(http)
            seconds, got = timed_query(spark, url, options, count, pushdown)
            sent[label].append(out_msgs(http) - before)
            assert got[0]["n"] == per_subject, got
            times[label].append(seconds)
    lines = []
    for label in cases:
        seconds = statistics.median(times[label])
        lines.append(f"| {label} | {seconds:.2f} s | {max(sent[label]):,} | {per_subject:,} |")
        results.append(Result(f"stream, one subject of {subjects:,}, {label}", per_subject, 100, seconds))
    tables.append((f"One subject of a {messages:,}-message stream of {subjects:,} subjects (median of {repeat}; "
                   "the most messages sent in a run)",
                   "| read | time | messages the server sent (/varz out_msgs delta) | the subject's messages |\n"
                   "|---|---:|---:|---:|\n" + "\n".join(lines)))


def main(url: str, http: int, quick: bool, repeat: int) -> tuple[list, list, list]:
    return in_session("jetstream-bench-pushdown", run, url, http, quick, repeat)
