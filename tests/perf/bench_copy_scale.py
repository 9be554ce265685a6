"""Copies at scale into fast-ingest targets and per-row targets, beside a nats-py copy (issue #48, part 4).

    python tests/perf/bench_copy_scale.py [--quick] [--repeat 3]

One embedded nats-server, one local[2] Spark session (the order section's harness, bench_order.py):

- **a 100,000-subject stream** (500,000 x 100 B): an ordered 4-partition copy (``repartition(4,
  "subject")``, the sink's default ``publish.mode=auto``) into a target with ``allow_batched`` (fast-ingest
  batches) and into one without (a PubAck per row), against nats-py's copy (a pull consumer feeding
  publishes with 10k PubAcks in flight, one process); the three alternated every round, every subject's
  messages compared in order with the source for each kind of target once;
- **a 1,000,000-key bucket** (1.3M change-log messages): an ordered 4-partition copy of its change log
  into a bucket with ``allow_batched`` and into one without, against nats-py's copy of its state (a
  last-per-subject consumer feeding puts), per message written; the target's latest value compared key
  by key with the source's.

Prints a Markdown table: seconds, rows/s and each copy's time per message written against nats-py's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench import api, collect_garbage, delete_streams, make_stream  # noqa: E402
from bench_order import by_subject, fill, nats_py_copy, ordered_copy  # noqa: E402

from pyspark_jetstream.tools.server import EmbeddedNatsServer  # noqa: E402

KINDS = ("batched", "acked", "natspy")
BATCH = 10_000
"""Messages a check's pull asks for: 50,000 could outlast the pull's 30 s expiry on a busy server."""


def _bucket(url: str, bucket: str, batched: bool) -> None:
    from pyspark_jetstream.protocol import kv

    async def go():
        import nats

        config = kv.new_bucket_config(bucket, kv.BucketSettings())
        if batched:
            config["allow_batched"] = True
        nc = await nats.connect(url)
        await api(nc, f"STREAM.CREATE.{kv.stream_name(bucket)}", config)
        await nc.close()

    asyncio.run(go())


def warm_up(spark, url: str) -> None:
    """A small copy first: a session's first copy job took 22 s where the next took 5 (either mode)."""
    asyncio.run(make_stream(url, "WARM"))
    asyncio.run(fill(url, "WARM", 20_000, 100, 1_000))
    asyncio.run(make_stream(url, "WARMT"))
    ordered_copy(spark, url, "WARM", "WARMT", 4)
    asyncio.run(delete_streams(url, "WARM", "WARMT"))


def stream_copies(spark, url: str, rows: int, subjects: int, repeat: int) -> dict[str, list[float]]:
    asyncio.run(make_stream(url, "SRC"))
    asyncio.run(fill(url, "SRC", rows, 100, subjects))
    source = asyncio.run(by_subject(url, "SRC", batch=BATCH))
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    for r in range(repeat):
        for kind in KINDS[r % 3:] + KINDS[:r % 3]:
            target = f"DST{kind.upper()}{r}"
            asyncio.run(make_stream(url, target, batched=kind == "batched"))
            collect_garbage(spark)
            if kind == "natspy":
                times[kind].append(asyncio.run(nats_py_copy(url, "SRC", lambda s, t=target: f"{t}.{s}", rows)))
            else:
                times[kind].append(ordered_copy(spark, url, "SRC", target, 4))
            print(f"stream copy, {kind}: {times[kind][-1]:.1f} s", flush=True)
            if r == 0:
                copy = {k.removeprefix(f"{target}."): v for k, v in asyncio.run(by_subject(url, target, batch=BATCH)).items()}
                assert copy == source, f"{kind}: a subject's messages differ or are out of order"
            asyncio.run(delete_streams(url, target))
    asyncio.run(delete_streams(url, "SRC"))
    return times


def bucket_copies(spark, url: str, keys: int, updates: int, repeat: int) -> dict[str, list[float]]:
    _bucket(url, "BIG", False)
    asyncio.run(fill(url, "", keys + updates, 100, keys, key_of=lambda i: f"$KV.BIG.user{i % keys}"))
    source = asyncio.run(by_subject(url, "KV_BIG", last_per_subject=True, batch=BATCH))
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    for r in range(repeat):
        for kind in KINDS[r % 3:] + KINDS[:r % 3]:
            target = f"CP{kind.upper()}{r}"
            _bucket(url, target, kind == "batched")
            collect_garbage(spark)
            if kind == "natspy":
                times[kind].append(asyncio.run(nats_py_copy(
                    url, "KV_BIG", lambda s, t=target: f"$KV.{t}." + s.split(".", 2)[2], keys,
                    last_per_subject=True, filter_subject="$KV.BIG.>")))
            else:
                times[kind].append(ordered_copy(spark, url, "BIG", target, 4, bucket=True))
                print(f"bucket copy, {kind}: {times[kind][-1]:.1f} s", flush=True)
                copy = asyncio.run(by_subject(url, f"KV_{target}", last_per_subject=True, batch=BATCH))
                stale = sum(1 for k, v in source.items() if copy.get(k.replace("$KV.BIG.", f"$KV.{target}.", 1)) != v)
                assert len(copy) == keys and stale == 0, (kind, len(copy), stale)
            asyncio.run(delete_streams(url, f"KV_{target}"))
    asyncio.run(delete_streams(url, "KV_BIG"))
    return times


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100k x 20k subjects, a 100,000-key bucket")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=("stream", "bucket"))
    args = parser.parse_args(argv)
    rows, subjects = (100_000, 20_000) if args.quick else (500_000, 100_000)
    keys, updates = (100_000, 30_000) if args.quick else (1_000_000, 300_000)
    from pyspark.sql import SparkSession

    with EmbeddedNatsServer() as server:
        spark = (SparkSession.builder.master("local[2]").appName("jetstream-bench-copy-scale")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        started = time.time()
        warm_up(spark, server.url)
        none = {k: [float("nan")] for k in KINDS}
        stream = stream_copies(spark, server.url, rows, subjects, args.repeat) if args.only != "bucket" else none
        bucket = bucket_copies(spark, server.url, keys, updates, max(1, args.repeat - 2)) if args.only != "stream" else none
        spark.stop()
    print(f"\n{(time.time() - started) / 60:.1f} min, medians of {args.repeat} (stream) and "
          f"{max(1, args.repeat - 2)} (bucket) alternated runs\n")
    print("| copy | target | seconds | messages written/s | time per message written / nats-py's |")
    print("|---|---|---:|---:|---:|")
    for label, times, written, theirs_written in (
            (f"stream, {rows:,} x 100 B, {subjects:,} subjects", stream, rows, rows),
            (f"bucket, {keys:,} keys ({keys + updates:,} change-log messages)", bucket, keys + updates, keys)):
        theirs = statistics.median(times["natspy"]) / theirs_written
        for kind, what in (("batched", "fast-ingest batches"), ("acked", "a PubAck per row"),
                           ("natspy", "nats-py copy, one process")):
            t = statistics.median(times[kind])
            print(f"| {label} | {what} | {t:.1f} | {written if kind != 'natspy' else theirs_written} / {t:.1f} s "
                  f"= {(written if kind != 'natspy' else theirs_written) / t:,.0f} | "
                  f"{(t / (written if kind != 'natspy' else theirs_written)) / theirs:.2f}x |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
