"""Issue #55, lookups: ``python tests/perf/bench.py --only lookup`` (``--quick``: a 100,000-key big bucket).

Buckets SMALL (1,000 keys) and BIG (1,000,000 keys, 100 B values), filled by nats-py with windowed PubAcks;
a stream EVENTS of ``EVENTS`` messages whose subject's last token is a key of the 1,000 hot ones
(``k0`` ... ``k999``, present in both buckets). Each path is a Spark job into the ``noop`` sink, alternated,
median of ``repeat``; rows/s counts the job's rows:

- **bucket size**: a 10,000-row batch (keys from the hot set, cached in memory) looked up in SMALL and in BIG:
  the issue's bar is BIG <= 1.2x SMALL;
- **a per-row nats-py ``kv.get``**: what a user writes without the connector (a ``mapInArrow`` whose worker
  keeps one nats-py connection and awaits ``kv.get`` row after row), on 100,000 rows of the hot keys in BIG
  (its rows/s do not depend on the count: a round trip per row), against the lookup's rows/s on 1,000,000
  such rows (Spark's fixed cost of a job, about 80 ms here, spread as in a real job; the lookup on 100,000
  rows is shown too): the bar is >= 50x the rows/s;
- **a stream-static join**: the 10,000 rows joined with ``kv.view=latest`` of BIG (the whole bucket read
  per batch), run once (it reads the whole bucket): the bar is >= 10x at 1,000,000 keys;
- **the hot set with ``cache=partial``**: a batch read of EVENTS, its key column, into ``noop``, with and
  without the lookup (the cache warm): the bar is <= 1.3x the pipeline without the join.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from bench import Result, collect_garbage, make_stream
from bench_order import fill, in_session

HOT = 1_000
ROWS = 10_000
MANY = 100_000
MOST = 1_000_000
EVENTS = 200_000


async def _bucket(url: str, name: str, keys: int) -> None:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.create_key_value(bucket=name, history=1, direct=True)
    await nc.close()
    await fill(url, f"KV_{name}", keys, 100, 1, key_of=lambda i: f"$KV.{name}.k{i}")


def _timed(df) -> float:
    start = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def _per_row_get(url: str, bucket: str):
    """The per-row ``kv.get`` a user would write: one connection per worker, a round trip per row."""

    def per_row(batches):
        import asyncio as aio

        import nats as nats_py
        import pyarrow as pa

        loop = aio.new_event_loop()
        nc = loop.run_until_complete(nats_py.connect(url))
        kv = loop.run_until_complete(nc.jetstream().key_value(bucket))

        async def get(key):
            try:
                return (await kv.get(key)).value
            except Exception:  # noqa: BLE001 - missing: null
                return None

        for batch in batches:
            values = [loop.run_until_complete(get(k)) for k in batch.column("key").to_pylist()]
            yield pa.RecordBatch.from_arrays([*batch.columns, pa.array(values, pa.binary())],
                                             names=[*batch.schema.names, "value"])
        loop.run_until_complete(nc.close())

    return per_row


def run(spark, url: str, http: int, quick: bool, repeat: int, results: list, notes: list, tables: list) -> None:
    from pyspark.sql import functions as F

    from pyspark_jetstream import lookup

    big = 100_000 if quick else 1_000_000
    asyncio.run(_bucket(url, "SMALL", HOT))
    asyncio.run(_bucket(url, "BIG", big))
    asyncio.run(make_stream(url, "EVENTS"))
    asyncio.run(fill(url, "EVENTS", EVENTS, 100, 1, key_of=lambda i: f"EVENTS.k{(i * 7919) % HOT}"))

    rows = spark.createDataFrame([(i, f"k{(i * 7919) % HOT}") for i in range(ROWS)], "n long, key string") \
        .repartition(2).cache()
    many = spark.createDataFrame([(i, f"k{(i * 7919) % HOT}") for i in range(MANY)], "n long, key string") \
        .repartition(2).cache()
    most = spark.range(MOST).select("id", F.concat(F.lit("k"), (F.col("id") * 7919 % HOT).cast("string"))
                                    .alias("key")).repartition(2).cache()
    rows.count(), many.count(), most.count()
    events = (spark.read.format("jetstream").option("servers", url).option("stream", "EVENTS")
              .option("numPartitions", 2).load().select(F.substring_index("subject", ".", -1).alias("key")))
    latest_big = spark.read.format("jetstream").option("servers", url).option("bucket", "BIG") \
        .option("kv.view", "latest").option("numPartitions", 2).load().select("key", F.col("data").alias("value"))
    paths = {
        "lookup, SMALL (1,000 keys)": lambda: _timed(lookup(rows, "SMALL", "key", servers=url)),
        f"lookup, BIG ({big:,} keys)": lambda: _timed(lookup(rows, "BIG", "key", servers=url)),
        "lookup, BIG, 100,000 rows": lambda: _timed(lookup(many, "BIG", "key", servers=url)),
        "lookup, BIG, 1,000,000 rows": lambda: _timed(lookup(most, "BIG", "key", servers=url)),
        "per-row nats-py kv.get, BIG, 100,000 rows": lambda: _timed(many.mapInArrow(
            _per_row_get(url, "BIG"), "n long, key string, value binary")),
        f"events {EVENTS // 1000}k, no join": lambda: _timed(events),
        f"events {EVENTS // 1000}k, lookup cache=partial": lambda: _timed(
            lookup(events, "SMALL", "key", servers=url, cache="partial")),
    }
    for measure in paths.values():  # warm-up: the workers start, the caches fill
        measure()
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeat):
        for name, measure in paths.items():
            collect_garbage(spark)
            times[name].append(measure())
    median = {name: statistics.median(ts) for name, ts in times.items()}
    static_name = "stream-static join with kv.view=latest, BIG"
    median[static_name] = _timed(rows.join(latest_big, "key", "left"))  # once: it reads the whole bucket
    names = [*paths, static_name]
    for name in names:
        count = EVENTS if name.startswith("events") else MANY if "100,000 rows" in name else \
            MOST if "1,000,000 rows" in name else ROWS
        label = name if "rows" in name else f"{name}, {count:,} rows"
        results.append(Result(f"{label}, noop", count, 100, median[name]))
    small, bigger, many_lookup, most_lookup, per_row, plain, cached, static = (median[n] for n in names)
    table = ["| measure | figure | the issue's bar |", "|---|---:|---|",
             f"| {ROWS:,}-row batch: BIG ({big:,} keys) / SMALL (1,000 keys) | {bigger / small:.2f}x the time | <= 1.2x |",
             f"| lookup ({MOST:,} rows) / per-row nats-py `kv.get` ({MANY:,} rows), rows/s | "
             f"{(MOST / most_lookup) / (MANY / per_row):.0f}x | >= 50x |",
             f"| the same, the lookup on {MANY:,} rows | {per_row / many_lookup:.0f}x | |",
             f"| lookup / stream-static join of the whole bucket, rows/s, {big:,} keys | {static / bigger:.1f}x | "
             ">= 10x |",
             f"| {EVENTS:,} events, `cache=partial` hot set / no join | {cached / plain:.2f}x the time | <= 1.3x |"]
    tables.append((f"Lookups (median of {repeat}, 2 cores, local[2])", "\n".join(table)))
    notes.append("Per path (s): " + ", ".join(f"{n} {median[n]:.3f}" for n in names))


def main(url: str, http: int, quick: bool, repeat: int) -> tuple[list, list, list]:
    return in_session("jetstream-bench-lookup", run, url, http, quick, repeat)
