"""Issue #34, filter pushdown for batch reads: ``python tests/perf/bench.py --only pushdown`` (``--quick``: smaller).

What it measures, on one embedded nats-server whose monitoring port counts the messages it sent
(``/varz`` ``out_msgs``), with ``spark.sql.python.filterPushdown.enabled`` on, each query on a fresh
temporary view (a view's partitions are planned once):

- **a bucket's latest view**: ``SELECT * FROM v WHERE key = 'x'`` and ``key IN`` (100 keys) on a
  1,000,000-key bucket against the same queries on an empty bucket in the same run (Spark's fixed
  cost); the same query with pushdown off, once, for scale;
- **a stream**: ``SELECT count(*) ... WHERE subject = ...`` on 1,000,000 messages over 1,000 subjects:
  the messages the server sent for it (its API replies included) against that subject's count, with
  pushdown on and off, and the times.
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

    one = "SELECT * FROM v WHERE key = 'k4242'"
    some = "SELECT * FROM v WHERE key IN (" + ", ".join(f"'k{i * 997 % keys}'" for i in range(100)) + ")"
    latest = "bucket '{}', `kv.view` 'latest', numPartitions 2"
    timed_query(spark, url, latest.format("PDEMPTY"), one, True)  # warm-up: the planner workers start
    rows = []
    for label, query, expected in (("key = 'x'", one, 1), ("key IN (100 keys)", some, 100)):
        empty, full = [], []
        for r in range(repeat + 1):
            for bucket, times in ((("PDEMPTY", empty), ("PDFULL", full)) if r % 2 else
                                  (("PDFULL", full), ("PDEMPTY", empty))):
                seconds, got = timed_query(spark, url, latest.format(bucket), query, True)
                assert len(got) == (expected if bucket == "PDFULL" else 0), (label, bucket, len(got))
                if r:  # the first round warms this query's path up
                    times.append(seconds)
        e, f = statistics.median(empty), statistics.median(full)
        rows.append(f"| {label} | {e * 1000:.0f} ms | {f * 1000:.0f} ms | {f / e:.2f}x |")
        results.append(Result(f"latest view, {label}, {keys:,}-key bucket (pushdown)", expected, 100, f))
    off_seconds, got = timed_query(spark, url, latest.format("PDFULL"), one, False)
    assert len(got) == 1
    tables.append((f"A bucket's latest view with pushdown ({keys:,} keys against an empty bucket, median of "
                   f"{repeat}, same run)",
                   "| query | empty bucket | full bucket | ratio |\n|---|---:|---:|---:|\n" + "\n".join(rows)))
    notes.append(f"The same `key = 'x'` query with pushdown off (every key read, Spark filters): "
                 f"{off_seconds:.1f} s.")

    count = "SELECT count(*) AS n FROM v WHERE subject = 'PDS.s7'"
    per_subject = messages // subjects
    cases = {"on, 2 partitions": ("stream 'PDS', numPartitions 2", True),
             "on, 1 partition": ("stream 'PDS', numPartitions 1", True),
             "off, 2 partitions": ("stream 'PDS', numPartitions 2", False)}
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
        results.append(Result(f"stream, subject = 'x' of {subjects:,}, pushdown {label}", per_subject, 100, seconds))
    tables.append((f"`subject = ...` on a {messages:,}-message stream of {subjects:,} subjects (median of {repeat}; "
                   "the most messages sent in a run)",
                   "| pushdown | time | messages the server sent (/varz out_msgs delta) | the subject's messages |\n"
                   "|---|---:|---:|---:|\n" + "\n".join(lines)))


def main(url: str, http: int, quick: bool, repeat: int) -> tuple[list, list, list]:
    return in_session("jetstream-bench-pushdown", run, url, http, quick, repeat)
