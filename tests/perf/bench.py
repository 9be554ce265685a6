"""Benchmark harness: each connector path next to a raw nats-py baseline, in the same run.

    python tests/perf/bench.py --quick        # small sizes, a few minutes
    python tests/perf/bench.py                # the full run
    python tests/perf/bench.py --only read    # only the reads beside raw nats-py (header-less, with headers)
    python tests/perf/bench.py --only write   # only the batch writes beside raw nats-py (100 B and 1 KiB rows)
    python tests/perf/bench.py --only sequence  # only the KV write with sequenceBy vs without
    python tests/perf/bench.py --only pushdown  # filter pushdown: key lookups on a 1M-key bucket, a subject's reads
    python tests/perf/bench.py --only headers   # the sink's data read with and without the headers column

It starts an embedded nats-server, prepares file-storage streams and prints a
Markdown table (rows/s, MB/s, ratio to the baseline measured beside it). Never
run in CI: ratios, not absolute numbers, are what it proves, and only when the
machine is otherwise idle.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
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
    ceiling: str | None = None  # the socket client's row for the same work (ceiling.py)

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


async def make_stream(url: str, name: str, batched: bool = False) -> None:
    """A file stream taking ``<name>.>``, TTLs, a 2-minute duplicate window; ``batched``: fast-ingest
    batches allowed too (``allow_batched``, nats-server 2.14+)."""
    import nats

    config = {"name": name, "subjects": [f"{name}.>"], "storage": "file", "allow_msg_ttl": True,
              "duplicate_window": 120 * 10**9}
    if batched:
        config["allow_batched"] = True
    nc = await nats.connect(url)
    try:
        await api(nc, f"STREAM.CREATE.{name}", config)
    finally:
        await nc.close()


async def delete_streams(url: str, *names: str) -> None:
    """Delete ``names``, or every stream when none is given."""
    import nats

    nc = await nats.connect(url)
    try:
        if not names:
            names = tuple((await api(nc, "STREAM.NAMES", {})).get("streams") or ())
        for name in names:
            await api(nc, f"STREAM.DELETE.{name}", {})
    finally:
        await nc.close()


def collect_garbage(spark) -> None:
    """Python's and the JVM's garbage collected, so that no path pays for the one before it."""
    import gc

    gc.collect()
    spark.sparkContext._jvm.System.gc()


async def stream_messages(url: str, name: str) -> int:
    import nats

    nc = await nats.connect(url)
    try:
        return (await api(nc, f"STREAM.INFO.{name}", {}))["state"]["messages"]
    finally:
        await nc.close()


async def raw_publish(url: str, stream: str, rows: int, size: int, window: int = 10_000, headers: bool = True,
                      subjects: int = 8, ids: str = "raw") -> float:
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
        await nc.publish(f"{stream}.s{i % subjects}", payload, reply=f"{inbox}.{i}",
                         headers={"Nats-TTL": "1h", "Nats-Msg-Id": f"{ids}-{i}"} if headers else None)
    await done.wait()
    elapsed = time.perf_counter() - start
    await nc.close()
    assert state["errors"] == 0, state
    return elapsed


async def raw_pull_to_arrow(url: str, stream: str, count: int, batch: int = 10_000, keep: list | None = None) -> float:
    """Baseline: one process pulling the range through CONSUMER.MSG.NEXT on a core
    subscription (ADR-37 style: batch 10k, refill at half), building the same Arrow batches
    (appended to ``keep`` when given, else dropped)."""
    import json
    import uuid

    import nats

    from pyspark_jetstream.source.columns.rows import BatchBuilder

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
            built = builder.build()
            if keep is not None:
                keep.append(built)
            state["batches"] += 1
        if state["got"] == count:
            if len(builder):
                built = builder.build()
                if keep is not None:
                    keep.append(built)
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


def python_worker_rss_kib() -> list[int]:
    """Current RSS (KiB) of each of Spark's Python worker processes (the daemon and its forks), from /proc."""
    sizes = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"pyspark.daemon" not in f.read():
                    continue
            with open(f"/proc/{pid}/status") as f:
                sizes += [int(line.split()[1]) for line in f if line.startswith("VmRSS:")]
        except OSError:
            continue
    return sizes


class WorkerRss:
    """Peak current RSS of Spark's Python worker processes, sampled from /proc while a path runs."""

    def __init__(self, interval: float = 0.05) -> None:
        import threading

        self.interval = interval
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _sample() -> int:
        return max(python_worker_rss_kib(), default=0)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_kib = max(self.peak_kib, self._sample())
            self._stop.wait(self.interval)

    def __enter__(self) -> WorkerRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mib(self) -> float:
        return self.peak_kib / 1024


def timed(fn, *args, repeat: int = 1) -> tuple[float, float]:
    """Median time of ``repeat`` runs and the workers' peak RSS (MiB) over them."""
    times = []
    with WorkerRss() as rss:
        for _ in range(repeat):
            times.append(fn(*args))
    return statistics.median(times), rss.mib


def connector_batch_read(spark, url: str, stream: str, partitions: int, ending: int | None = None) -> float:
    r = spark.read.format("jetstream").option("servers", url).option("stream", stream).option("numPartitions", partitions)
    if ending is not None:
        r = r.option("endingOffsets", ending)
    df = r.load()
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
    assert query.awaitTermination(3600), "the benchmark query did not finish within an hour"
    return time.perf_counter() - start


def cached_rows(spark, stream: str, rows: int, size: int, partitions: int):
    """The write jobs' rows (8 subjects of ``stream``, ``size``-byte payloads, a TTL of 1 h), cached and
    counted before any clock starts."""
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
    return df


def connector_batch_write(spark, url: str, stream: str, rows: int, size: int, partitions: int,
                          fmt: str = "jetstream", mode: str | None = None) -> float:
    """The time of the write job; with ``fmt`` ``noio_sink`` (noio_sink.py), the same job into a Python
    writer that does no I/O: Spark's own cost of the job. ``mode``: the option ``publish.mode``."""
    df = cached_rows(spark, stream, rows, size, partitions)
    writer = df.write.format(fmt).mode("append").option("servers", url).option("stream", stream)
    if mode is not None:
        writer = writer.option("publish.mode", mode)
    start = time.perf_counter()
    writer.save()
    elapsed = time.perf_counter() - start
    df.unpersist()
    return elapsed


def bound_write(spark, url: str, stream: str, rows: int, size: int, partitions: int, batched: bool) -> float:
    """The least time any sink could take for :func:`connector_batch_write`'s job on this machine: Spark's
    own job (the same cached rows into the writer that does no I/O) and the server storing the same
    messages (``Nats-Msg-Id``, ``Nats-TTL``, the expected stream) from a client that costs next to
    nothing (raw_ingest.py: frames made before the clock, in one fast-ingest batch or with a PubAck
    each), run at the same time on the same cores; the time until both are done."""
    import threading

    import raw_ingest

    df = cached_rows(spark, stream, rows, size, partitions)
    payload = b"x" * size
    messages = [(f"{stream}.s{i % 8}", None, payload, f"bound-{i}") for i in range(rows)]
    ready, go = threading.Event(), threading.Event()

    def start() -> None:  # the frames are made: start both at once
        ready.set()
        go.wait(60)

    publish = raw_ingest.batch if batched else raw_ingest.pubacks
    # The client in a thread of its own, Spark's job on this one (a data source registered in a
    # session is not found from a job started on another Python thread).
    client = threading.Thread(target=lambda: asyncio.run(publish(url, stream, messages, ttl="1h", on_start=start)))
    client.start()
    assert ready.wait(60)
    started = time.perf_counter()
    go.set()
    df.write.format("noio_sink").mode("append").save()
    client.join(120)
    elapsed = time.perf_counter() - started
    df.unpersist()
    return elapsed


def connector_copy(spark, url: str, source: str, target: str, partitions: int, split: str) -> float:
    """A stream-to-stream copy (batch read -> batch write, ``partitions`` tasks on both sides)."""
    from pyspark.sql import functions as F

    df = (spark.read.format("jetstream").option("servers", url).option("stream", source)
          .option("numPartitions", partitions).option("split", split).load()
          .select(F.concat(F.lit(f"{target}."), F.col("subject")).alias("subject"), "data", "stream", "seq"))
    start = time.perf_counter()
    writer = df.write.format("jetstream").mode("append").option("servers", url).option("stream", target)
    if split == "sequence":
        writer = writer.option("order", "none")  # straight from ranges: no order per subject (bench_order has it)
    writer.save()
    return time.perf_counter() - start


def connector_stream_copy(spark, url: str, source: str, target: str, per_trigger: int, state: str) -> tuple[float, int]:
    """A streaming copy (AvailableNow, ``per_trigger`` messages per micro-batch, 2 partitions), with the sink's
    replay records (``sinkState``) or without them (``none``): (seconds, micro-batches)."""
    import tempfile

    from pyspark.sql import functions as F

    q = (spark.readStream.format("jetstream").option("servers", url).option("stream", source)
         .option("startingOffsets", "earliest").option("numPartitions", 2)
         .option("maxMessagesPerTrigger", per_trigger).load()
         .select(F.concat(F.lit(f"{target}."), F.col("subject")).alias("subject"), "data", "stream", "seq")
         .writeStream.format("jetstream").option("servers", url).option("stream", target).option("order", "none")
         .option("sinkState", state).option("checkpointLocation", tempfile.mkdtemp()).trigger(availableNow=True))
    start = time.perf_counter()
    query = q.start()
    assert query.awaitTermination(3600), "the benchmark query did not finish within an hour"
    elapsed = time.perf_counter() - start
    return elapsed, len([p for p in query.recentProgress if p["numInputRows"]])


def copies(spark, url: str, quick: bool, repeat: int, results: list, notes: list) -> None:
    """Issue #23: a 4-partition copy split by subject and by sequence ranges, in alternation on the same
    source (1,000 subjects), and the cost per micro-batch of the sink's replay records."""
    rows, size, subjects = (50_000, 100, 1000) if quick else (200_000, 100, 1000)
    asyncio.run(make_stream(url, "COPYSRC"))
    asyncio.run(raw_publish(url, "COPYSRC", rows, size, headers=False, subjects=subjects))
    times: dict[str, list[float]] = {"sequence": [], "subject": []}
    for r in range(repeat):
        for split in (("sequence", "subject") if r % 2 == 0 else ("subject", "sequence")):
            target = f"COPY{split.upper()}{r}"
            asyncio.run(make_stream(url, target))
            collect_garbage(spark)
            times[split].append(connector_copy(spark, url, "COPYSRC", target, 4, split))
            assert asyncio.run(stream_messages(url, target)) == rows, split
            asyncio.run(delete_streams(url, target))
    label = f"{rows // 1000}k x {size} B, {subjects:,} subjects"
    base = f"copy stream -> stream {label}, 4 partitions, split=sequence (no order per subject)"
    results.append(Result(base, rows, size, statistics.median(times["sequence"])))
    results.append(Result(f"copy stream -> stream {label}, 4 partitions, split=subject (order kept)", rows, size,
                          statistics.median(times["subject"]), base))
    # The replay records: one STREAM.INFO and one KV create per task and micro-batch.
    per_trigger = 1000
    stream_rows = 20_000 if quick else 50_000
    asyncio.run(make_stream(url, "GUARDSRC"))
    asyncio.run(raw_publish(url, "GUARDSRC", stream_rows, size, headers=False, subjects=100))
    per_batch: dict[str, list[float]] = {"SPARK_JETSTREAM_SINK": [], "none": []}
    for r in range(repeat):
        for state in (("none", "SPARK_JETSTREAM_SINK") if r % 2 == 0 else ("SPARK_JETSTREAM_SINK", "none")):
            target = f"GUARD{r}{'N' if state == 'none' else 'S'}"
            asyncio.run(make_stream(url, target))
            collect_garbage(spark)
            seconds, batches = connector_stream_copy(spark, url, "GUARDSRC", target, per_trigger, state)
            per_batch[state].append(seconds / batches * 1000)
            asyncio.run(delete_streams(url, target))
    on, off = statistics.median(per_batch["SPARK_JETSTREAM_SINK"]), statistics.median(per_batch["none"])
    notes.append(f"Replay records (exactly-once past the duplicate window), streaming copy of {stream_rows:,} messages "
                 f"in micro-batches of {per_trigger:,}, 2 partitions, median of {repeat} alternated runs: "
                 f"{on:.0f} ms per micro-batch with them, {off:.0f} ms without (sinkState=none): "
                 f"{on - off:+.0f} ms per micro-batch.")

def bucket_write(spark, url: str, bucket: str, rows: int, keys: int, partitions: int, sequence: bool,
                 fmt: str = "jetstream") -> float:
    """The time of a batch write of ``rows`` 100-byte rows over ``keys`` keys to an existing bucket, with
    ``sequenceBy`` (a long growing with the row, so each key's newest row is its last) or without it."""
    from pyspark.sql import functions as F

    columns = [F.concat(F.lit("k"), (F.col("id") % keys).cast("string")).alias("key"),
               F.expr("cast(repeat('x', 100) as binary)").alias("data")]
    if sequence:
        columns.append(F.col("id").alias("n"))
    df = spark.range(rows, numPartitions=partitions).select(*columns).cache()
    df.count()
    writer = df.write.format(fmt).mode("append").option("servers", url).option("bucket", bucket)
    if sequence and fmt == "jetstream":
        writer = writer.option("sequenceBy", "n")
    start = time.perf_counter()
    writer.save()
    elapsed = time.perf_counter() - start
    df.unpersist()
    return elapsed


def sequence_bench(spark, url: str, repeat: int, rows: int = 1_000_000, keys: int = 10_000) -> list[Result]:
    """A bucket write with ``sequenceBy`` beside the same write without it, in the same run (paths alternated,
    each into a new bucket): the option costs a reduction per task and a lookup per key, and saves the
    publishes of every row but each key's newest."""
    from noio_sink import NoIoSink

    from pyspark_jetstream.protocol import kv

    spark.dataSource.register(NoIoSink)
    times: dict[bool, list[float]] = {False: [], True: []}
    bucket_write(spark, url, "NOIO", rows, keys, 2, True, "noio_sink")  # warm: the first caches cold
    spark_own = [bucket_write(spark, url, "NOIO", rows, keys, 2, True, "noio_sink") for _ in range(repeat)]
    for r in range(repeat):
        for sequence in ((False, True) if r % 2 == 0 else (True, False)):
            bucket = f"SEQ{r}{int(sequence)}"

            async def create(bucket: str = bucket) -> None:
                import nats

                nc = await nats.connect(url)
                await api(nc, f"STREAM.CREATE.{kv.stream_name(bucket)}",
                          kv.new_bucket_config(bucket, kv.BucketSettings()))
                await nc.close()

            asyncio.run(create())
            collect_garbage(spark)
            times[sequence].append(bucket_write(spark, url, bucket, rows, keys, 2, sequence))
            asyncio.run(delete_streams(url, kv.stream_name(bucket)))
    label = f"{rows // 1000}k rows over {keys // 1000}k keys x 100 B"
    base = f"bucket write {label}, 2 partitions"
    own = statistics.median(spark_own)
    return [Result(base, rows, 100, statistics.median(times[False])),
            Result(f"bucket write {label}, 2 partitions, sequenceBy", rows, 100, statistics.median(times[True]), base),
            Result(f"Spark's own job (the same rows into a writer that does no I/O: {own * 1000:.0f} ms)", rows, 100,
                   own),
            Result(f"bucket write {label}, the connector's own time (job minus Spark's own)", rows, 100,
                   statistics.median(times[False]) - own),
            Result(f"bucket write {label}, sequenceBy, the connector's own time (job minus Spark's own)", rows, 100,
                   statistics.median(times[True]) - own, f"bucket write {label}, the connector's own time (job minus "
                   "Spark's own)")]


def fill_with_the_sink(spark, url: str, stream: str, rows: int, size: int, rich: bool, subjects: int = 8) -> None:
    """The connector's own output: every message with a generated Nats-Msg-Id and a Nats-TTL; with
    ``rich``, three user headers too (X-Tag twice)."""
    from pyspark.sql import functions as F

    df = spark.range(rows, numPartitions=2).select(
        F.concat(F.lit(f"{stream}.s"), (F.col("id") % subjects).cast("string")).alias("subject"),
        F.expr(f"cast(repeat('x', {size}) as binary)").alias("data"), F.lit("1h").alias("ttl"))
    if rich:
        df = df.withColumn("headers", F.create_map(
            F.lit("X-Tenant"), F.array(F.lit("acme")), F.lit("X-Trace"), F.array(F.col("subject")),
            F.lit("X-Tag"), F.array(F.lit("blue"), F.lit("green"))))
    df.write.format("jetstream").mode("append").option("servers", url).option("stream", stream).save()
    assert asyncio.run(stream_messages(url, stream)) == rows


def run_until(df, count: int) -> float:
    """Run a streaming DataFrame (default trigger) until it has delivered ``count`` rows."""
    import tempfile
    import threading

    seen = {"rows": 0}
    done = threading.Event()

    def count_rows(batch_df, batch_id):
        seen["rows"] += batch_df.count()
        if seen["rows"] >= count:
            done.set()

    q = df.writeStream.foreachBatch(count_rows).option("checkpointLocation", tempfile.mkdtemp()).start()
    start = time.perf_counter()
    done.wait(1800)
    elapsed = time.perf_counter() - start
    q.stop()
    assert seen["rows"] >= count, seen
    return elapsed


def naive_stream_read(spark, url: str, stream: str, count: int) -> float:
    """The naive driver-side fetch source (naive_source.py) until it has delivered ``count`` rows."""
    from naive_source import NaiveSource

    spark.dataSource.register(NaiveSource)
    return run_until(spark.readStream.format("naive_jetstream").option("servers", url).option("stream", stream)
                     .option("batch", 100_000).load(), count)


def connector_stream_read_until(spark, url: str, stream: str, count: int) -> float:
    """The connector's streaming read, measured exactly like the naive source (same rows per micro-batch)."""
    return run_until(spark.readStream.format("jetstream").option("servers", url).option("stream", stream)
                     .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", 100_000).load(), count)


def per_batch_costs(spark, url: str, stream: str, rows: int, per_trigger: int, rounds: int) -> tuple[float, float, int]:
    """Average ``triggerExecution`` (ms) of the micro-batches that read rows: the connector's streaming
    read and the no-I/O source (noio_source.py), same rows per micro-batch, same partitions, noop sink,
    alternated ``rounds`` times; the medians of the rounds' means. Their difference is the connector's
    own cost per micro-batch (planning with STREAM.INFO, consumer creation, pulls until the range's end)."""
    import tempfile

    from noio_source import NoIoSource

    spark.dataSource.register(NoIoSource)

    def run(reader) -> list[float]:
        collect_garbage(spark)
        query = (reader.load().writeStream.format("noop").option("checkpointLocation", tempfile.mkdtemp())
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(600), "the per-batch cost query did not finish"
        durations = [p["durationMs"]["triggerExecution"] for p in query.recentProgress if p["numInputRows"]]
        return durations[1:]  # the first micro-batch also starts the query

    ours, spark_only = [], []
    for _ in range(rounds):
        ours_run = run(spark.readStream.format("jetstream").option("servers", url).option("stream", stream)
                       .option("startingOffsets", "earliest").option("numPartitions", 2)
                       .option("maxMessagesPerTrigger", per_trigger))
        ours.append(sum(ours_run) / len(ours_run))
        noio_run = run(spark.readStream.format("noio_jetstream").option("rows", rows).option("numPartitions", 2))
        spark_only.append(sum(noio_run) / len(noio_run))
    return statistics.median(ours), statistics.median(spark_only), len(ours_run)


def connector_stream_write(spark, url: str, stream: str, parquet_dir: str) -> float:
    """File source (Parquet) -> jetstream, AvailableNow. Timed by Spark's own ``addBatch``
    durations (the micro-batches' execution), the counterpart of a batch write job; the
    query's start-up (about 1.5 s here) is a one-off cost of a long-running query."""
    import tempfile

    schema = spark.read.parquet(parquet_dir).schema
    q = (spark.readStream.schema(schema).parquet(parquet_dir)
         .writeStream.format("jetstream").option("servers", url).option("stream", stream)
         .option("checkpointLocation", tempfile.mkdtemp()).trigger(availableNow=True))
    query = q.start()
    assert query.awaitTermination(3600), "the benchmark query did not finish within an hour"
    return sum(p["durationMs"].get("addBatch", 0) for p in query.recentProgress) / 1000


def latency(spark, url: str, stream: str, rate: int, seconds: float) -> tuple[float, float, int]:
    """p50/p99 publish -> arrival (ms) in a foreach sink, publishing at a steady ``rate``."""
    import struct
    import tempfile

    import nats

    out_dir = tempfile.mkdtemp()

    def record(row):
        import os as _os
        import struct as _struct
        import time as _time

        sent = _struct.unpack(">d", row.data[:8])[0]
        with open(_os.path.join(out_dir, f"lat-{_os.getpid()}.txt"), "a") as f:
            f.write(f"{(_time.time() - sent) * 1000:.3f}\n")

    q = (spark.readStream.format("jetstream").option("servers", url).option("stream", stream).load()
         .writeStream.foreach(record).option("checkpointLocation", tempfile.mkdtemp()).start())
    # Let the query settle on its first (empty) micro-batch before publishing.
    deadline = time.monotonic() + 60
    while not q.recentProgress and time.monotonic() < deadline:
        time.sleep(0.1)

    async def publish() -> int:
        nc = await nats.connect(url)
        js = nc.jetstream()
        n, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            due = start + n / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing the publisher, not waiting on a result
            await nc.publish(f"{stream}.lat", struct.pack(">d", time.time()) + b"x" * 92)
            n += 1
        await nc.flush()
        await js.stream_info(stream)
        await nc.close()
        return n

    sent = asyncio.run(publish())
    deadline = time.monotonic() + 60
    values: list[float] = []
    while time.monotonic() < deadline:
        values = []
        for name in os.listdir(out_dir):
            with open(os.path.join(out_dir, name)) as f:
                values += [float(x) for x in f.read().split()]
        if len(values) >= sent:
            break
        time.sleep(0.2)
    q.stop()
    values.sort()
    assert values, "no latency samples arrived"
    p50 = values[len(values) // 2]
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return p50, p99, len(values)


def writes(spark, url: str, write_sets: list[tuple[int, int]], repeat: int, results: list, out: str,
           streaming: bool = True) -> None:
    """The write section: for each (rows, size), the sink beside raw nats-py, the socket ceiling and the
    same job into a writer that does no I/O, the paths rotated; with ``streaming``, the Parquet -> jetstream
    query too (100 B rows)."""
    # ---- writes. Only the connector's path runs through the JVM, so each path starts from the same
    # state: the read streams deleted (the server held over a gigabyte of them), every target stream
    # deleted once measured, the JVM's and Python's garbage collected before each run, and the order
    # of the paths rotated. Without this the connector's writes ran 15-40% slower in this
    # harness than on a fresh server and JVM, while raw nats-py did not (see docs/performance.md).
    import ceiling
    from noio_sink import NoIoSink
    from pyspark.sql import functions as F

    spark.dataSource.register(NoIoSink)
    asyncio.run(delete_streams(url))
    asyncio.run(make_stream(url, "WARM"))
    connector_batch_write(spark, url, "WARM", 5_000, 100, 2)
    n = 0
    for rows, size in write_sets:
        times: dict[str, list[float]] = {"top": [], "raw": [], "conn": [], "spark": [], "conn1": [], "fast": [],
                                         "fast1": [], "bound": [], "boundacks": []}
        paths = {
            "spark": lambda name, rows=rows, size=size: connector_batch_write(spark, url, name, rows, size, 2,
                                                                              "noio_sink"),
            "top": lambda name, rows=rows, size=size: asyncio.run(ceiling.publish(url, name, rows, size)),
            "raw": lambda name, rows=rows, size=size: asyncio.run(raw_publish(url, name, rows, size)),
            "conn": lambda name, rows=rows, size=size: connector_batch_write(spark, url, name, rows, size, 2),
            # One connection and one process, as the raw client: what a task alone does.
            "conn1": lambda name, rows=rows, size=size: connector_batch_write(spark, url, name, rows, size, 1),
            # Fast-ingest batches (issue #48): the same stream config with allow_batched (which a plain
            # publish does not notice), so that the default publish.mode=auto writes the others per row.
            "fast": lambda name, rows=rows, size=size: connector_batch_write(spark, url, name, rows, size, 2,
                                                                             mode="batched"),
            "fast1": lambda name, rows=rows, size=size: connector_batch_write(spark, url, name, rows, size, 1,
                                                                              mode="batched"),
            # What no sink can beat here: Spark's own job and the server's ingest from a free client at once.
            "bound": lambda name, rows=rows, size=size: bound_write(spark, url, name, rows, size, 2, True),
            "boundacks": lambda name, rows=rows, size=size: bound_write(spark, url, name, rows, size, 2, False),
        }
        for r in range(repeat):
            order = list(paths)[r % len(paths):] + list(paths)[:r % len(paths)]
            for path in order:
                n += 1
                name = f"{path.upper()}{n}"
                asyncio.run(make_stream(url, name, batched=path.startswith("fast") or path == "bound"))
                collect_garbage(spark)
                times[path].append(paths[path](name))
                assert asyncio.run(stream_messages(url, name)) == (0 if path == "spark" else rows), path
                asyncio.run(delete_streams(url, name))
        top_times, raw_times, conn_times = times["top"], times["raw"], times["conn"]
        spark_job = statistics.median(times["spark"])
        label = f"{rows // 1000}k x {size} B"
        base = f"raw nats-py publish {label}"
        top = f"ceiling: socket publish {label}"
        results.append(Result(top, rows, size, statistics.median(top_times)))
        results.append(Result(base, rows, size, statistics.median(raw_times), ceiling=top))
        results.append(Result(f"batch write {label}, TTL + msg id, 2 partitions", rows, size,
                              statistics.median(conn_times), base, ceiling=top))
        # What the connector adds to Spark's own write job (the job into a writer that does no I/O,
        # same rows, same run): the part a raw client does too, so that is what is compared with it.
        results.append(Result(f"batch write {label}, the connector's own time (job minus Spark's own "
                              f"{spark_job * 1000:.0f} ms)", rows, size,
                              statistics.median(conn_times) - spark_job, base, ceiling=top))
        results.append(Result(f"batch write {label}, TTL + msg id, 1 partition", rows, size,
                              statistics.median(times["conn1"]), base, ceiling=top))
        results.append(Result(f"batch write {label}, TTL + msg id, 2 partitions, fast-ingest batches", rows, size,
                              statistics.median(times["fast"]), base, ceiling=top))
        results.append(Result(f"batch write {label}, TTL + msg id, 1 partition, fast-ingest batches", rows, size,
                              statistics.median(times["fast1"]), base, ceiling=top))
        results.append(Result(f"bound: Spark's own job and the server storing the same messages from a free client, "
                              f"at once, fast-ingest batches {label}", rows, size,
                              statistics.median(times["bound"]), base, ceiling=top))
        results.append(Result(f"bound: Spark's own job and the server storing the same messages from a free client, "
                              f"at once, a PubAck each {label}", rows, size,
                              statistics.median(times["boundacks"]), base, ceiling=top))
        if size == 100 and streaming:
            parquet_dir = os.path.join(out, ".tmp-parquet")
            (spark.range(rows, numPartitions=2)
             .select(F.concat(F.lit("SWRITE.s"), (F.col("id") % 8).cast("string")).alias("subject"),
                     F.expr(f"cast(repeat('x', {size}) as binary)").alias("data"), F.lit("1h").alias("ttl"))
             .write.mode("overwrite").parquet(parquet_dir))
            stream_times = []
            for r in range(repeat):
                asyncio.run(api_once(url, "SWRITE", r))
                collect_garbage(spark)
                stream_times.append(connector_stream_write(spark, url, "SWRITE", parquet_dir))
            results.append(Result(f"streaming write {label} (Parquet files -> jetstream, addBatch time)",
                                  rows, size, statistics.median(stream_times), base, ceiling=top))


def write_chart(results: list[Result], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r.path for r in results]
    values = [r.rows_per_s / 1000 for r in results]
    colors = ["#3aa657" if r.path.startswith("memory") else "#c0392b" if r.path.startswith("ceiling")
              else "#9aa5b1" if r.baseline is None else "#2f6fdf"
              for r in results]
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(results) + 1.5))
    ax.barh(labels, values, color=colors)
    ax.invert_yaxis()
    ax.set_xlabel("thousand rows/s (red: the socket-client ceiling and grey: the baseline, both measured in the "
                  "same run; green: memory runs)")
    ax.set_title("pyspark-jetstream throughput by path and message size")
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:,.0f}k", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")


def write_order_chart(results: list[Result], tables: list, path: str) -> None:
    """The order section's plot: each path's rate beside its baseline, and the server's deliveries per
    message read by partitions and subjects (bench_order.py)."""
    import re

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 0.45 * len(results) + 6.5),
                                      gridspec_kw={"height_ratios": [len(results) + 1, 6]})
    labels = [r.path for r in results]
    values = [r.rows_per_s / 1000 for r in results]
    top.barh(labels, values, color=["#9aa5b1" if r.baseline is None else "#2f6fdf" for r in results])
    top.invert_yaxis()
    top.set_xlabel("thousand rows/s (grey: the baseline, measured in the same run)")
    top.set_title("Order without the price: reads and copies beside their baselines")
    for y, v in enumerate(values):
        top.text(v, y, f" {v:,.1f}k", va="center", fontsize=8)
    cells = []
    for _, table in tables:
        for line in table.splitlines()[2:]:
            parts = [p.strip() for p in line.strip("|").split("|")]
            cells.append((int(parts[0].replace(",", "")), int(parts[1]), float(parts[2]), float(parts[4])))
    subjects = sorted({c[0] for c in cells})
    partitions = sorted({c[1] for c in cells})
    width = 0.8 / (2 * len(partitions))
    for k, p in enumerate(partitions):
        for j, (what, column) in enumerate((("plain read", 2), ("ordered copy", 3))):
            xs = [i + (2 * k + j) * width for i in range(len(subjects))]
            ys = [next(c[column] for c in cells if c[0] == s and c[1] == p) for s in subjects]
            bottom.bar(xs, ys, width, label=f"{what}, {p} partitions",
                       color=plt.cm.Blues(0.4 + 0.2 * k) if j == 0 else plt.cm.Oranges(0.4 + 0.2 * k))
    bottom.axhline(1.2, color="#c0392b", linestyle="--", linewidth=1, label="target: at most 1.2")
    bottom.set_xticks([i + 0.4 - width / 2 for i in range(len(subjects))], [f"{s:,}" for s in subjects])
    bottom.set_xlabel("subjects in the stream")
    bottom.set_ylabel("delivered per message read")
    bottom.set_ylim(0, 1.6)
    bottom.legend(fontsize=7, ncol=2)
    bottom.set_title(re.sub(r"\s+", " ", tables[0][0]) if tables else "")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")


def reads(spark, url: str, read_sets: list[tuple[int, int]], repeat: int, results: list[Result],
          notes: list[str], naive_rows: int) -> None:
    """The reads: header-less data on one and two partitions beside raw nats-py, the sink's own output and a
    rich header set beside the header-less read, the streaming read, and the naive driver-fetch source."""
    import ceiling

    for rows, size in read_sets:
        name = f"READ{size}"
        asyncio.run(make_stream(url, name))
        asyncio.run(raw_publish(url, name, rows, size, headers=False))
        connector_batch_read(spark, url, name, 2)  # warm-up
        label = f"{rows // 1000}k x {size} B"
        base = f"raw nats-py pull to Arrow {label}"
        top = f"ceiling: socket pull to Arrow {label}"
        results.append(Result(top, rows, size, statistics.median(
            asyncio.run(ceiling.pull_to_arrow(url, name, rows)) for _ in range(repeat))))
        raw = statistics.median(asyncio.run(raw_pull_to_arrow(url, name, rows)) for _ in range(repeat))
        results.append(Result(base, rows, size, raw, ceiling=top))
        for parts in (1, 2):
            t, rss = timed(connector_batch_read, spark, url, name, parts, repeat=repeat)
            results.append(Result(f"batch read {label}, {parts} partition(s)", rows, size, t, base, rss, top))
        # What users' streams hold: the sink's own output (Nats-Msg-Id + Nats-TTL), and a rich set
        # (those plus three user headers, one repeated), read like the header-less one beside it.
        plain = f"batch read {label}, 2 partition(s)"
        for kind, what in (("S", "the sink's headers"), ("R", "rich headers")):
            headered = f"{name}{kind}"
            asyncio.run(make_stream(url, headered))
            fill_with_the_sink(spark, url, headered, rows, size, rich=kind == "R")
            top_h = f"ceiling: socket pull to Arrow {label} with {what}"
            results.append(Result(top_h, rows, size, statistics.median(
                asyncio.run(ceiling.pull_to_arrow(url, headered, rows)) for _ in range(repeat))))
            t, rss = timed(connector_batch_read, spark, url, headered, 2, repeat=repeat)
            results.append(Result(f"batch read {label} with {what}, 2 partition(s)", rows, size, t, plain, rss,
                                  top_h))
            if kind == "S":
                # What the server allows: its delivery alone, the frames counted and nothing built.
                bare = statistics.median(asyncio.run(ceiling.pull_frames(url, name, rows)) for _ in range(repeat))
                hdr = statistics.median(asyncio.run(ceiling.pull_frames(url, headered, rows))
                                        for _ in range(repeat))
                notes.append(f"Server delivery alone ({label}, two consumers in parallel, frames only counted): "
                             f"header-less {rows / bare:,.0f} msg/s, with the sink's headers {rows / hdr:,.0f} "
                             f"msg/s: {bare / hdr:.2f}x the header-less rate.")
        if size == 100:
            t, rss = timed(connector_stream_read, spark, url, name, 2, 100_000, repeat=repeat)
            results.append(Result(f"streaming read {label} (AvailableNow, 100k/trigger)", rows, size, t, base, rss,
                                  top))
            naive = naive_stream_read(spark, url, name, naive_rows)
            nbase = f"naive driver-fetch source {naive_rows // 1000}k x {size} B"
            results.append(Result(nbase, naive_rows, size, naive))
            t = connector_stream_read_until(spark, url, name, naive_rows)
            results.append(Result(f"connector streaming read {naive_rows // 1000}k x {size} B (100k/trigger)",
                                  naive_rows, size, t, nbase))


def print_table(results: list[Result]) -> str:
    """Print the Markdown table and return it."""
    by_path = {r.path: r for r in results}
    lines = [
        "| path | rows | size | rows/s | MB/s | ratio to baseline | fraction of ceiling | worker peak RSS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        ratio = f"{r.rows_per_s / by_path[r.baseline].rows_per_s:.2f}x ({r.baseline})" if r.baseline else "baseline"
        if r.baseline is None and (r.path.startswith("memory") or r.path.startswith("ceiling")):
            ratio = "ceiling" if r.path.startswith("ceiling") else ""
        top = f"{r.rows_per_s / by_path[r.ceiling].rows_per_s:.2f}" if r.ceiling else ""
        rss = f"{r.rss_mib:.0f} MiB" if r.rss_mib is not None else ""
        lines.append(f"| {r.path} | {r.rows:,} | {r.size} B | {r.rows_per_s:,.0f} | {r.mb_per_s:.1f} | {ratio} | {top} "
                     f"| {rss} |")
    table = "\n".join(lines)
    print(table)
    return table


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes (under 3 minutes)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per path; the median is kept")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--only", choices=("read", "write", "copies", "sequence", "order", "pushdown", "headers",
                                           "lookup", "percore", "readbound"),
                        help="run one section only: 'read' (the batch and streaming reads beside raw nats-py, "
                        "header-less, the sink's headers, rich headers), 'write' (the batch writes beside raw nats-py, no streaming "
                        "write), 'copies' (the two splits, the replay records' cost), "
                        "'sequence' (a KV write with sequenceBy beside the same write without it), 'order' "
                        "(issue #32: deliveries per message, ordered copies at scale, bench_order.py), 'pushdown' "
                        "(issue #34: filter pushdown on a 1,000,000-key bucket and stream, bench_pushdown.py), 'headers' "
                        "(issue #41: the sink's data read with and without the headers column, bench_headers.py), 'lookup' "
                        "(issue #55: lookups against bucket size, a per-row kv.get, a stream-static join, bench_lookup.py), "
                        "'percore' and 'readbound' (issue #57: an executor core's shape with CPU per row from /proc, "
                        "the read bound; bench_per_core.py)")
    args = parser.parse_args()
    quick, repeat = args.quick, (1 if args.quick else args.repeat)

    read_sets = [(100_000, 100), (20_000, 1024)] if quick else [(500_000, 100), (100_000, 1024)]
    write_sets = [(50_000, 100), (10_000, 1024)] if quick else [(200_000, 100), (50_000, 1024)]
    naive_rows = 20_000 if quick else 300_000
    memory_rows, memory_ranges = (100_000, (25_000, 100_000)) if quick else (1_000_000, (250_000, 1_000_000))
    latency_seconds = 8 if quick else 20

    # The naive source's module must be importable by Spark's Python workers too.
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = here + os.pathsep + os.environ.get("PYTHONPATH", "")
    sys.path.insert(0, here)

    from pyspark.sql import SparkSession

    from pyspark_jetstream.tools.server import EmbeddedNatsServer

    if args.only == "order":
        import bench_order

        started = time.perf_counter()
        http = bench_order.free_port()
        with EmbeddedNatsServer(config=f"http_port: {http}\n") as server:
            results, notes, tables = bench_order.main(server.url, http, quick, repeat)
        suffix = "order-quick" if quick else "order"
        for title, table in tables:
            notes.insert(0, f"{title}:\n\n{table}\n")
        write_order_chart(results, tables, os.path.join(args.out, f"bench-{suffix}.png"))
        return _report(results, notes, started, args.out, suffix, chart=False)

    if args.only == "pushdown":
        import bench_pushdown

        started = time.perf_counter()
        http = _free_port()
        with EmbeddedNatsServer(config=f"http_port: {http}\n") as server:
            results, notes, tables = bench_pushdown.main(server.url, http, quick, repeat)
        for title, table in tables:
            notes.insert(0, f"{title}:\n\n{table}\n")
        return _report(results, notes, started, args.out, "pushdown-quick" if quick else "pushdown", chart=False)

    if args.only == "headers":
        import bench_headers

        started = time.perf_counter()
        with EmbeddedNatsServer() as server:
            results, notes, tables = bench_headers.main(server.url, 0, quick, repeat)
        for title, table in tables:
            notes.insert(0, f"{title}:\n\n{table}\n")
        return _report(results, notes, started, args.out, "headers-quick" if quick else "headers", chart=False)

    if args.only in ("percore", "readbound"):
        import bench_per_core

        started = time.perf_counter()
        results, notes, tables = [], [], []
        with EmbeddedNatsServer() as server:
            cores = args.only == "percore"
            if cores:  # the server on core 0; this process, and the JVM and workers it starts, on core 1
                bench_per_core.pin(server.pid, {0})
                bench_per_core.pin(os.getpid(), {1})
            spark = (SparkSession.builder.master("local[1]" if cores else "local[2]").appName("jetstream-bench")
                     .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                     .getOrCreate())
            spark.sparkContext.setLogLevel("ERROR")
            if cores:
                bench_per_core.per_core(spark, server.url, server.pid, repeat, quick, results, notes, tables,
                                        os.path.join(args.out, f"bench-percore{'-quick' if quick else ''}.png"))
            else:
                bench_per_core.bound(spark, server.url, repeat, quick, results, notes, tables)
            spark.stop()
        for title, table in tables:
            notes.insert(0, f"{title}:\n\n{table}\n")
        return _report(results, notes, started, args.out, f"{args.only}-quick" if quick else args.only, chart=False)

    if args.only == "lookup":
        import bench_lookup

        started = time.perf_counter()
        with EmbeddedNatsServer() as server:
            results, notes, tables = bench_lookup.main(server.url, 0, quick, repeat)
        for title, table in tables:
            notes.insert(0, f"{title}:\n\n{table}\n")
        return _report(results, notes, started, args.out, "lookup-quick" if quick else "lookup")

    if args.only == "sequence":
        with EmbeddedNatsServer() as server:
            spark = (SparkSession.builder.master("local[2]").appName("jetstream-bench")
                     .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                     .getOrCreate())
            spark.sparkContext.setLogLevel("ERROR")
            sequence_bench(spark, server.url, 1, rows=5_000, keys=100)  # warm-up: the workers start
            table = print_table(sequence_bench(spark, server.url, repeat, rows=100_000 if quick else 1_000_000))
            spark.stop()
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench-sequence.md"), "w") as f:
            f.write(table + "\n")
        return 0

    results: list[Result] = []
    notes: list[str] = []
    started = time.perf_counter()
    with EmbeddedNatsServer() as server:
        url = server.url
        spark = (
            SparkSession.builder.master("local[2]").appName("jetstream-bench")
            .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        if args.only == "write":
            writes(spark, url, write_sets, repeat, results, args.out, streaming=False)
            spark.stop()
            return _report(results, notes, started, args.out, "write-quick" if quick else "write", chart=False)
        if args.only == "read":
            reads(spark, url, read_sets, repeat, results, notes, naive_rows)
            spark.stop()
            return _report(results, notes, started, args.out, "read-quick" if quick else "read", chart=False)
        if args.only == "copies":
            copies(spark, url, quick, repeat, results, notes)
            spark.stop()
            return _report(results, notes, started, args.out, "copies")

        # ---- memory first: worker RSS must not grow with the range length. The workers are reused
        # across paths, and a worker keeps the high-water mark of what it allocated before: measured
        # after the headered reads, the same run shows 40-90 MiB more.
        asyncio.run(make_stream(url, "MEM"))
        asyncio.run(raw_publish(url, "MEM", memory_rows, 1024, headers=False))
        connector_batch_read(spark, url, "MEM", 2, 1000)  # warm-up: the workers start
        for length in memory_ranges:
            t, rss = timed(connector_batch_read, spark, url, "MEM", 2, length)
            results.append(Result(f"memory: batch read {length // 1000}k x 1 KiB, 2 partitions", length, 1024, t,
                                  None, rss))

        reads(spark, url, read_sets, repeat, results, notes, naive_rows)

        # ---- the connector's own cost per streaming micro-batch, beside Spark's (a source with no I/O)
        mb_rows = 20_000 if quick else 50_000
        asyncio.run(make_stream(url, "MB"))
        asyncio.run(raw_publish(url, "MB", mb_rows, 100, headers=False))
        ours_ms, spark_ms, batches = per_batch_costs(spark, url, "MB", mb_rows, 1000, repeat)
        notes.append(f"Cost per streaming micro-batch (1,000 messages, 2 partitions, noop sink, median of {repeat} "
                     f"alternated runs of the mean of {batches}): "
                     f"connector {ours_ms:.0f} ms, a source with no I/O {spark_ms:.0f} ms (Spark's own fixed "
                     f"cost): the connector's own cost is {ours_ms - spark_ms:.0f} ms.")

        writes(spark, url, write_sets, repeat, results, args.out)

        # ---- copies: the two splits, and the replay records' cost
        asyncio.run(delete_streams(url))
        copies(spark, url, quick, repeat, results, notes)

        # ---- latency
        asyncio.run(make_stream(url, "LAT"))
        p50, p99, samples = latency(spark, url, "LAT", 2000, latency_seconds)
        notes.append(f"End-to-end latency at 2,000 msg/s, default trigger, foreach sink: p50 {p50:.0f} ms, "
                     f"p99 {p99:.0f} ms ({samples:,} messages over {latency_seconds} s).")
        spark.stop()

    return _report(results, notes, started, args.out, "quick" if quick else "full")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _report(results: list[Result], notes: list[str], started: float, out: str, suffix: str,
            chart: bool = True) -> int:
    table = print_table(results)
    notes.append(f"Total harness time: {time.perf_counter() - started:.0f} s ({suffix} run).")
    for note in notes:
        print(note)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"bench-{suffix}.md"), "w") as f:
        f.write(table + "\n\n" + "\n".join(notes) + "\n")
    if chart:
        write_chart(results, os.path.join(out, f"bench-{suffix}.png"))
    print(f"Wrote {out}/bench-{suffix}.md and .png")
    return 0


async def api_once(url: str, stream: str, attempt: int) -> None:
    """A fresh target stream for each streaming-write repeat (so msg ids are not deduplicated)."""
    import nats

    nc = await nats.connect(url)
    try:
        if attempt:
            await api(nc, f"STREAM.DELETE.{stream}", {})
        await api(nc, f"STREAM.CREATE.{stream}", {"name": stream, "subjects": [f"{stream}.>"], "storage": "file",
                                                  "allow_msg_ttl": True})
    finally:
        await nc.close()


if __name__ == "__main__":
    sys.exit(main())
