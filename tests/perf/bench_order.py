"""Issue #32, order without the price: ``python tests/perf/bench.py --only order`` (``--quick``: smaller).

What it measures, each beside its baseline in the same run, on one embedded nats-server whose
monitoring port gives the server's own count of messages sent (``/varz`` ``out_msgs``):

- **deliveries**: messages the server delivered per message read, for a plain read (``noop``) and
  for an ordered copy (``repartition(n, "subject")`` then the sink; its PubAcks subtracted), at 4, 16
  and 64 partitions over 1, 16, 1,000 and 100,000 subjects;
- **plain read**: 300,000 x 100 B over 16 subjects, 2 partitions, ``noop``, against a raw nats-py pull
  of the same range into the same Arrow batches; and the same read of data the sink wrote (its
  ``Nats-Msg-Id``, ``Nats-TTL`` and ``Nats-Expected-Stream`` on every message) against header-less data;
- **copies**: an ordered 4-partition copy of 1,000 subjects against the unordered one (``order=none``,
  no shuffle), and of 100,000 subjects against a single-process nats-py copy (a pull consumer feeding
  publishes with 10k PubAcks in flight), every subject's order checked with nats-py;
- **a 1,000,000-key bucket**: an ordered 4-partition copy of its change log against a nats-py copy of its
  state (a last-per-subject consumer feeding puts), per message written; its planning time; the
  target's state compared key by key; and the planning of a one-message micro-batch on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import statistics
import time
import urllib.request
import uuid

from bench import (
    Result,
    api,
    collect_garbage,
    delete_streams,
    make_stream,
    raw_pull_to_arrow,
    stream_messages,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def out_msgs(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=10) as reply:
        return int(json.load(reply)["out_msgs"])


async def fill(url: str, stream_prefix: str, rows: int, size: int, subjects: int, *, window: int = 10_000,
               key_of=None) -> None:
    """``rows`` messages over ``subjects`` subjects (``<prefix>.s<i>``, or ``key_of(i)``), windowed PubAcks."""
    import nats

    nc = await nats.connect(url, pending_size=32 * 1024 * 1024)
    inbox = nc.new_inbox()
    payload = b"x" * size
    state = {"pending": 0, "acked": 0, "errors": 0}
    room, done = asyncio.Event(), asyncio.Event()

    async def on_ack(msg):
        if b'"error"' in msg.data:
            state["errors"] += 1
        state["acked"] += 1
        state["pending"] -= 1
        if state["pending"] <= window // 2:
            room.set()
        if state["acked"] == rows:
            done.set()

    await nc.subscribe(inbox + ".*", cb=on_ack)
    for i in range(rows):
        if state["pending"] >= window:
            room.clear()
            await room.wait()
        state["pending"] += 1
        subject = key_of(i) if key_of else f"{stream_prefix}.s{i % subjects}"
        await nc.publish(subject, payload, reply=f"{inbox}.{i}")
    await done.wait()
    await nc.close()
    assert state["errors"] == 0, state


async def nats_py_copy(url: str, source: str, subject_of, count: int, *, last_per_subject: bool = False,
                       filter_subject: str | None = None, window: int = 10_000, batch: int = 10_000) -> float:
    """The baseline copy, one process: an AckNone pull consumer (batch 10k, refilled at half; with
    ``last_per_subject`` the state of a bucket, as a KV watch delivers it) feeding publishes to
    ``subject_of(source subject)`` with up to ``window`` PubAcks in flight, every PubAck checked."""
    import nats

    nc = await nats.connect(url, pending_size=32 * 1024 * 1024)
    name = f"cp{uuid.uuid4().hex[:8]}"
    config = {"name": name, "ack_policy": "none", "deliver_policy": "last_per_subject" if last_per_subject else "all",
              "mem_storage": True, "num_replicas": 1}
    if filter_subject:
        config["filter_subject"] = filter_subject
    await api(nc, f"CONSUMER.CREATE.{source}.{name}", {"stream_name": source, "config": config})
    inbox, acks = nc.new_inbox(), nc.new_inbox()
    state = {"got": 0, "pending": 0, "inflight": 0, "acked": 0, "errors": 0}
    done, room = asyncio.Event(), asyncio.Event()
    room.set()
    queue: asyncio.Queue = asyncio.Queue()
    pull_subject = f"$JS.API.CONSUMER.MSG.NEXT.{source}.{name}"

    async def pull(n):
        state["pending"] += n
        await nc.publish(pull_subject, json.dumps({"batch": n, "expires": 30 * 10**9}).encode(), reply=inbox)

    async def on_msg(msg):
        if not msg.reply:
            return
        state["got"] += 1
        state["pending"] -= 1
        queue.put_nowait(msg)
        if state["got"] < count and state["pending"] < batch // 2:
            want = min(batch - state["pending"], count - state["got"] - state["pending"])
            if want > 0:
                await pull(want)

    async def on_ack(msg):
        if b'"error"' in msg.data:
            state["errors"] += 1
        state["acked"] += 1
        state["inflight"] -= 1
        if state["inflight"] <= window // 2:
            room.set()
        if state["acked"] == count:
            done.set()

    await nc.subscribe(inbox, cb=on_msg)
    await nc.subscribe(acks + ".*", cb=on_ack)
    start = time.perf_counter()
    await pull(min(batch, count))
    for i in range(count):
        msg = await queue.get()
        if state["inflight"] >= window:
            room.clear()
            await room.wait()
        state["inflight"] += 1
        await nc.publish(subject_of(msg.subject), msg.data, reply=f"{acks}.{i}", headers=msg.headers)
    await done.wait()
    elapsed = time.perf_counter() - start
    with contextlib.suppress(AssertionError):  # reaped already: idle past its inactive threshold
        await api(nc, f"CONSUMER.DELETE.{source}.{name}", {})
    await nc.close()
    assert state["errors"] == 0, state
    return elapsed


async def by_subject(url: str, stream: str, *, last_per_subject: bool = False,
                     batch: int = 50_000) -> dict[str, list[bytes]]:
    """Every message of ``stream`` (or the last of each subject), as nats-py reads it: subject -> data in order.
    ``batch``: messages a pull asks for (each must arrive within its 30 s expiry)."""
    import nats

    nc = await nats.connect(url, pending_size=32 * 1024 * 1024)
    info = await api(nc, f"STREAM.INFO.{stream}", {})
    total = info["state"]["num_subjects"] if last_per_subject else info["state"]["messages"]
    name = f"chk{uuid.uuid4().hex[:8]}"
    config = {"name": name, "ack_policy": "none", "mem_storage": True, "num_replicas": 1,
              "deliver_policy": "last_per_subject" if last_per_subject else "all"}
    if last_per_subject:
        config["filter_subject"] = ">"
    await api(nc, f"CONSUMER.CREATE.{stream}.{name}", {"stream_name": stream, "config": config})
    out: dict[str, list[bytes]] = {}
    got = 0
    sub = await nc.subscribe(nc.new_inbox())
    while got < total:
        await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}",
                         json.dumps({"batch": min(batch, total - got), "expires": 30 * 10**9}).encode(),
                         reply=sub.subject)
        want = min(batch, total - got)
        while want:
            msg = await sub.next_msg(timeout=30)
            if not msg.reply:
                continue
            out.setdefault(msg.subject, []).append(msg.data)
            got += 1
            want -= 1
    await api(nc, f"CONSUMER.DELETE.{stream}.{name}", {})
    await nc.close()
    return out


def _read(spark, url: str, stream: str, partitions: int, **options):
    r = (spark.read.format("jetstream").option("servers", url).option("stream", stream)
         .option("numPartitions", partitions))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def plain_read(spark, url: str, stream: str, partitions: int, **options) -> float:
    df = _read(spark, url, stream, partitions, **options)
    start = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def ordered_copy(spark, url: str, source: str, target: str, partitions: int, *, ordered: bool = True,
                 bucket: bool = False) -> float:
    """A batch copy, ``partitions`` tasks on both sides: through ``repartition(n, "subject")`` (``"key"``),
    or, unordered, straight from the read with ``order=none``."""
    from pyspark.sql import functions as F

    if bucket:
        df = (spark.read.format("jetstream").option("servers", url).option("bucket", source)
              .option("numPartitions", partitions).load())
        column = "key"
    else:
        df = _read(spark, url, source, partitions).select(
            F.concat(F.lit(f"{target}."), F.col("subject")).alias("subject"), "data", "stream", "seq")
        column = "subject"
    if ordered:
        df = df.repartition(partitions, column)
    writer = df.write.format("jetstream").mode("append").option("servers", url)
    writer = writer.option("bucket", target) if bucket else writer.option("stream", target)
    if not ordered:
        writer = writer.option("order", "none")
    start = time.perf_counter()
    writer.save()
    return time.perf_counter() - start


def deliveries(spark, url: str, http: int, rows: int, partition_counts, subject_counts) -> list[dict]:
    """The grid: per subject count and partition count, messages delivered per message read."""
    cells = []
    for subjects in subject_counts:
        source = f"GRID{subjects}"
        asyncio.run(make_stream(url, source))
        asyncio.run(fill(url, source, rows, 100, subjects))
        for parts in partition_counts:
            collect_garbage(spark)
            before = out_msgs(http)
            seconds = plain_read(spark, url, source, parts)
            read = (out_msgs(http) - before) / rows
            target = f"GRIDT{subjects}P{parts}"
            asyncio.run(make_stream(url, target))
            collect_garbage(spark)
            before = out_msgs(http)
            copy_seconds = ordered_copy(spark, url, source, target, parts)
            stored = asyncio.run(stream_messages(url, target))
            copied = (out_msgs(http) - before - stored) / rows  # the PubAcks are not deliveries
            assert stored == rows, (target, stored)
            asyncio.run(delete_streams(url, target))
            cells.append({"subjects": subjects, "partitions": parts, "read": read, "read_s": seconds,
                          "copy": copied, "copy_s": copy_seconds})
            if subjects == 1000 and parts <= 16:  # what split=subject (the default before #32) costs the server
                before = out_msgs(http)
                seconds = plain_read(spark, url, source, parts, split="subject")
                cells[-1]["old"] = ((out_msgs(http) - before) / rows, seconds)
            print(cells[-1], flush=True)
        asyncio.run(delete_streams(url, source))
    return cells


def run(spark, url: str, http: int, quick: bool, repeat: int, results: list, notes: list, tables: list) -> None:

    from bench import fill_with_the_sink

    # ---- plain read, 16 subjects: against raw nats-py, and the sink's own data against header-less data
    rows = 100_000 if quick else 300_000
    asyncio.run(make_stream(url, "PLAIN"))
    asyncio.run(fill(url, "PLAIN", rows, 100, 16))
    plain_read(spark, url, "PLAIN", 2)  # warm-up: the workers start
    label = f"{rows // 1000}k x 100 B, 16 subjects"
    raw = statistics.median(asyncio.run(raw_pull_to_arrow(url, "PLAIN", rows)) for _ in range(repeat))
    base = f"raw nats-py pull to Arrow {label}"
    results.append(Result(base, rows, 100, raw))
    plain = statistics.median(plain_read(spark, url, "PLAIN", 2) for _ in range(repeat))
    name = f"plain read {label}, 2 partitions, noop"
    results.append(Result(name, rows, 100, plain, base))
    asyncio.run(make_stream(url, "PLAINS"))
    fill_with_the_sink(spark, url, "PLAINS", rows, 100, rich=False, subjects=16)
    headered = statistics.median(plain_read(spark, url, "PLAINS", 2) for _ in range(repeat))
    results.append(Result(f"plain read {label} the sink wrote (its headers), 2 partitions, noop", rows, 100,
                          headered, name))
    asyncio.run(delete_streams(url, "PLAIN", "PLAINS"))

    # ---- deliveries per message read
    grid_rows = 50_000 if quick else 200_000
    parts = (4, 16) if quick else (4, 16, 64)
    subject_counts = (1, 16, 1000) if quick else (1, 16, 1000, 100_000)
    cells = deliveries(spark, url, http, grid_rows, parts, subject_counts)
    lines = ["| subjects | partitions | plain read: delivered per message | time | ordered copy: delivered per "
             "message (PubAcks not counted) | time |", "|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {c['subjects']:,} | {c['partitions']} | {c['read']:.3f} | {c['read_s']:.1f} s | {c['copy']:.3f} | "
              f"{c['copy_s']:.1f} s |" for c in cells]
    tables.append((f"Messages the server delivered per message read ({grid_rows:,} x 100 B, /varz out_msgs)",
                   "\n".join(lines)))
    notes.append("For comparison, split=subject (the default before issue #32) over 1,000 subjects: " + "; ".join(
        f"{c['partitions']} partitions {c['old'][0]:.2f} delivered per message read ({c['old'][1]:.1f} s)"
        for c in cells if "old" in c) + ".")
    notes.append(f"Deliveries per message read, worst cell: plain read {max(c['read'] for c in cells):.3f}, "
                 f"ordered copy {max(c['copy'] for c in cells):.3f}.")

    # ---- copies of 1,000 subjects: ordered against unordered, alternated
    rows = 50_000 if quick else 200_000
    asyncio.run(make_stream(url, "C1K"))
    asyncio.run(fill(url, "C1K", rows, 100, 1000))
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(repeat):
        for ordered in ((False, True) if r % 2 == 0 else (True, False)):
            target = f"C1KT{int(ordered)}{r}"
            asyncio.run(make_stream(url, target))
            collect_garbage(spark)
            times[ordered].append(ordered_copy(spark, url, "C1K", target, 4, ordered=ordered))
            assert asyncio.run(stream_messages(url, target)) == rows
            asyncio.run(delete_streams(url, target))
    label = f"{rows // 1000}k x 100 B, 1,000 subjects, 4 partitions"
    base = f"copy {label}, unordered (order=none, no shuffle)"
    results.append(Result(base, rows, 100, statistics.median(times[False])))
    results.append(Result(f"copy {label}, ordered (repartition by subject)", rows, 100,
                          statistics.median(times[True]), base))
    asyncio.run(delete_streams(url, "C1K"))

    # ---- a 100,000-subject stream: ordered copy against a nats-py copy, every subject's order checked
    rows, subjects = (100_000, 20_000) if quick else (500_000, 100_000)
    asyncio.run(make_stream(url, "C100K"))
    asyncio.run(fill(url, "C100K", rows, 100, subjects))
    ours, theirs = [], []
    for r in range(repeat):
        for who in (("natspy", "ours") if r % 2 == 0 else ("ours", "natspy")):
            target = f"C100KT{who.upper()}{r}"
            asyncio.run(make_stream(url, target))
            collect_garbage(spark)
            if who == "ours":
                ours.append(ordered_copy(spark, url, "C100K", target, 4))
            else:
                theirs.append(asyncio.run(nats_py_copy(url, "C100K", lambda s, t=target: f"{t}.{s}", rows)))
            if r == 0:
                source_view = asyncio.run(by_subject(url, "C100K"))
                copy_view = {k.removeprefix(f"{target}."): v for k, v in asyncio.run(by_subject(url, target)).items()}
                assert copy_view == source_view, f"{who}: a subject's messages differ or are out of order"
            asyncio.run(delete_streams(url, target))
    label = f"{rows // 1000}k x 100 B, {subjects:,} subjects"
    base = f"nats-py copy {label}, one process"
    results.append(Result(base, rows, 100, statistics.median(theirs)))
    results.append(Result(f"ordered copy {label}, 4 partitions (every subject's order checked)", rows, 100,
                          statistics.median(ours), base))
    asyncio.run(delete_streams(url, "C100K"))

    # ---- a 1,000,000-key bucket: its change log copied in order, against nats-py's copy of its state
    bucket_copy(spark, url, quick, results, notes)


def _new_bucket(url: str, bucket: str) -> None:
    from pyspark_jetstream.protocol import kv

    async def go():
        import nats

        nc = await nats.connect(url)
        await api(nc, f"STREAM.CREATE.{kv.stream_name(bucket)}", kv.new_bucket_config(bucket, kv.BucketSettings()))
        await nc.close()

    asyncio.run(go())


def bucket_copy(spark, url: str, quick: bool, results: list, notes: list) -> None:
    keys, updates = (100_000, 30_000) if quick else (1_000_000, 300_000)
    _new_bucket(url, "BIG")
    asyncio.run(fill(url, "", keys + updates, 100, keys, key_of=lambda i: f"$KV.BIG.user{i % keys}"))
    changes = keys + updates

    # planning: the DataFrame defined and its partitions planned, nothing read
    start = time.perf_counter()
    df = (spark.read.format("jetstream").option("servers", url).option("bucket", "BIG")
          .option("numPartitions", 4).load())
    partitions = df.rdd.getNumPartitions()
    planning = time.perf_counter() - start
    assert partitions == 4, partitions

    _new_bucket(url, "BIGNATS")
    collect_garbage(spark)
    theirs = asyncio.run(nats_py_copy(url, "KV_BIG", lambda s: "$KV.BIGNATS." + s.split(".", 2)[2], keys,
                                      last_per_subject=True, filter_subject="$KV.BIG.>"))
    _new_bucket(url, "BIGCOPY")
    collect_garbage(spark)
    ours = ordered_copy(spark, url, "BIG", "BIGCOPY", 4, bucket=True)
    source = asyncio.run(by_subject(url, "KV_BIG", last_per_subject=True))
    copy = asyncio.run(by_subject(url, "KV_BIGCOPY", last_per_subject=True))
    stale = sum(1 for k, v in source.items() if copy.get(k.replace("$KV.BIG.", "$KV.BIGCOPY.", 1)) != v)
    assert len(copy) == len(source) == keys and stale == 0, (len(copy), len(source), stale)
    base = f"nats-py copy of a {keys:,}-key bucket's state ({keys:,} messages written), one process"
    results.append(Result(base, keys, 100, theirs))
    results.append(Result(f"ordered copy of its change log ({changes:,} messages written), 4 partitions, per "
                          "message written", changes, 100, ours, base))
    notes.append(f"{keys:,}-key bucket ({changes:,} change-log messages): the ordered copy planned in "
                 f"{planning:.2f} s and read in {partitions} partitions; the target's latest value equals the "
                 f"source's for all {keys:,} keys (0 stale); {ours:.1f} s against {theirs:.1f} s for nats-py's copy "
                 f"of the state: {ours / changes / (theirs / keys):.2f}x per message written.")
    notes.append(one_message_micro_batch(spark, url, "BIG"))
    asyncio.run(delete_streams(url, "KV_BIG", "KV_BIGNATS", "KV_BIGCOPY"))


def one_message_micro_batch(spark, url: str, bucket: str) -> str:
    """The planning of a micro-batch with one new message on the big bucket: on the driver (``latestOffset``
    and ``partitions``, the calls Spark makes) and in its partition (what the task settles before it reads)."""
    from pyspark_jetstream.client import runtime
    from pyspark_jetstream.options import parse_source_options
    from pyspark_jetstream.source.read import ownership
    from pyspark_jetstream.source.spark_readers import JetStreamStreamReader
    from pyspark_jetstream.spark_api import ReadAllAvailable

    opts = parse_source_options({"servers": url, "bucket": bucket, "numPartitions": "4"}, streaming=True)
    reader = JetStreamStreamReader(opts)
    start_offset = reader.initialOffset()  # latest

    async def put():
        import nats

        nc = await nats.connect(url)
        await nc.jetstream().publish(f"$KV.{bucket}.user-new", b"one")
        await nc.close()

    asyncio.run(put())
    started = time.perf_counter()
    end = reader.latestOffset(start_offset, ReadAllAvailable())
    parts = reader.partitions(start_offset, end)
    driver = time.perf_counter() - started
    started = time.perf_counter()
    for p in parts:
        runtime.run(ownership.resolve(opts, p.stream, p.first, p.last, p.created, p.last_per_subject,
                                     p.split, p.index))
    in_partition = time.perf_counter() - started
    assert end["seq"] - start_offset["seq"] == 1 and len(parts) == 1
    return (f"One-message micro-batch on that bucket: planned in {driver * 1000:.0f} ms on the driver "
            f"(latestOffset and partitions: {len(parts)} partition) and {in_partition * 1000:.0f} ms in its "
            "partition (stream identity and end), no subject listed.")


def in_session(app: str, body, url: str, http: int, quick: bool, repeat: int) -> tuple[list, list, list]:
    """Run a section's ``body(spark, url, http, quick, repeat, results, notes, tables)`` in a local[2]
    session of its own (the sections are measured apart from the main bench's session)."""
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName(app)
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    results: list = []
    notes: list = []
    tables: list = []
    body(spark, url, http, quick, repeat, results, notes, tables)
    spark.stop()
    return results, notes, tables


def main(url: str, http: int, quick: bool, repeat: int) -> tuple[list, list, list]:
    return in_session("jetstream-bench-order", run, url, http, quick, repeat)
