"""Issue #57: the read bound, and an executor core's shape. ``python tests/perf/bench.py --only percore``.

**The read bound** (2 cores, ``local[2]``, 2 partitions): Spark's own job reading the same rows from a source
that does no I/O (noio_source.py, batch) into ``noop``, run at the same time as the server delivering the same
messages to a client that costs next to nothing (ceiling.py ``pull_frames``: two consumers, frames counted);
the time until both are done. No read can beat it on this machine; the connector's read is shown as a fraction
of it.

**Per core** (run in a process of its own, ``--only percore``): the server pinned to core 0, this process,
Spark's JVM and its Python workers (which inherit it) and the baselines pinned to core 1, ``local[1]``, one
partition. Rows a second for a read and writes of 100 B and 1 KiB: the connector; raw nats-py in this
process; and a nats-py job inside Spark, what a user would otherwise write (``mapInArrow`` pulling the range
to Arrow batches; publishing its partition's rows with a window of PubAcks). In every cell, each process
group's CPU per row from ``/proc`` (utime + stime): the server, the JVM, the Python workers, this process.
Medians of ``repeat`` rotated runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import threading
import time
import uuid

from bench import (
    Result,
    api,
    connector_batch_read,
    connector_batch_write,
    make_stream,
    raw_publish,
    raw_pull_to_arrow,
    stream_messages,
)

HZ = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    """A process's user + system seconds (all its threads), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / HZ


def _tree(root: int) -> dict[int, str]:
    """Every descendant of ``root``: pid -> its command name."""
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    text = f.read()
            except OSError:
                continue
            names[int(entry)] = text[text.index("(") + 1:text.rindex(")")]
            parents[int(entry)] = int(text.rsplit(")", 1)[1].split()[1])
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        for child, parent in parents.items():
            if parent == pid and child not in out:
                out[child] = names[child]
                todo.append(child)
    return out


class CpuMeter:
    """CPU seconds per group (server, JVM, Python workers, this process) between :meth:`start` and :meth:`stop`.

    Spark's Python daemon forks workers and reaps them; a worker that ends within the window takes its time
    with it (its parent's ``cutime`` does not get it when SIGCHLD is ignored), so the process tree is sampled
    every 0.2 s and each process counts up to its last sample (at most 0.2 s of a worker that ended is lost;
    a sample costs about 1 ms of core 1)."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid

    def _sample(self) -> None:
        now = {self.server_pid: ("server", _cpu(self.server_pid)), os.getpid(): ("driver", _cpu(os.getpid()))}
        for pid, name in _tree(os.getpid()).items():
            if pid != self.server_pid and not name.startswith("nats-server"):
                now[pid] = ("jvm" if name == "java" else "workers", _cpu(pid))
        for pid, (group, cpu) in now.items():
            if cpu > 0:
                self._first.setdefault(pid, (group, 0.0 if self._started else cpu))
                self._last[pid] = (group, cpu)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def start(self) -> None:
        self._first: dict[int, tuple[str, float]] = {}
        self._last: dict[int, tuple[str, float]] = {}
        self._started = False
        self._sample()
        self._started = True  # a process first seen from now on was born in the window: all its time counts
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self._sample()
        groups = {"server": 0.0, "jvm": 0.0, "workers": 0.0, "driver": 0.0}
        for pid, (group, cpu) in self._last.items():
            groups[group] += max(0.0, cpu - self._first[pid][1])
        return groups


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` to ``cpus`` (its later threads and children inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)


def read_bound(spark, url: str, stream: str, rows: int, size: int) -> float:
    """Module docstring: Spark's no-I/O read and the server's delivery, at once; the time until both end."""
    import ceiling

    df = spark.read.format("noio_jetstream").option("rows", rows).option("numPartitions", 2) \
        .option("size", size).load()
    done: list[float] = []
    client = threading.Thread(target=lambda: done.append(asyncio.run(ceiling.pull_frames(url, stream, rows))))
    started = time.perf_counter()
    client.start()
    df.write.format("noop").mode("overwrite").save()
    client.join(300)
    return time.perf_counter() - started


async def nats_py_fetch_to_arrow(url: str, stream: str, count: int, batch: int = 1000) -> float:
    """Baseline: the read a nats-py user writes with its JetStream API (``pull_subscribe``, ``fetch`` of
    ``batch``, each message's metadata), building the connector's Arrow batches of 10,000 rows."""
    import nats

    from pyspark_jetstream.source.columns.rows import BatchBuilder

    nc = await nats.connect(url, pending_size=8 * 1024 * 1024)
    js = nc.jetstream()
    sub = await js.pull_subscribe(f"{stream}.>", stream=stream, config=nats.js.api.ConsumerConfig(
        ack_policy=nats.js.api.AckPolicy.NONE, mem_storage=True, num_replicas=1, inactive_threshold=30.0))
    builder, got = BatchBuilder(stream), 0
    start = time.perf_counter()
    while got < count:
        for msg in await sub.fetch(min(batch, count - got), timeout=10):
            meta = msg.metadata
            builder.add(msg.subject.encode(), msg.data, None, meta.sequence.stream, int(meta.timestamp.timestamp() * 1e9))
            got += 1
            if len(builder) >= 10_000:
                builder.build()
    if len(builder):
        builder.build()
    elapsed = time.perf_counter() - start
    await sub.unsubscribe()
    await nc.close()
    return elapsed


def _nats_py_read_in_spark(spark, url: str, stream: str, rows: int) -> float:
    """A user's read inside Spark: one task pulls the range to the connector's Arrow batches with nats-py
    (bench.raw_pull_to_arrow, the fastest nats-py read here) and yields them, as the connector's read does."""
    from pyspark_jetstream.source.columns.rows import SOURCE_SCHEMA_DDL

    def pull(_batches):
        import asyncio as aio

        import bench as worker_bench

        built: list = []
        aio.run(worker_bench.raw_pull_to_arrow(url, stream, rows, keep=built))
        yield from built

    start = time.perf_counter()
    spark.range(1, numPartitions=1).mapInArrow(pull, SOURCE_SCHEMA_DDL).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


async def publish_arrow(url: str, batches, ids: str, window: int = 10_000) -> int:
    """What a nats-py user's write task does with its partition: each row of each Arrow batch published
    with its subject, data, ``Nats-TTL`` and a ``Nats-Msg-Id``, a reply subject per message under one
    wildcard subscription, a window of 10k outstanding PubAcks, every PubAck checked (bench.raw_publish's
    loop over the DataFrame's rows instead of a constant payload)."""
    import nats

    nc = await nats.connect(url, pending_size=8 * 1024 * 1024)
    inbox = nc.new_inbox()
    state = {"pending": 0, "acked": 0, "errors": 0, "sent": 0}
    room, done = asyncio.Event(), asyncio.Event()

    async def on_ack(msg):
        if b'"error"' in msg.data or not msg.data:
            state["errors"] += 1
        state["acked"] += 1
        state["pending"] -= 1
        if state["pending"] <= window // 2:
            room.set()
        if state["acked"] == state["sent"]:
            done.set()

    await nc.subscribe(inbox + ".*", cb=on_ack)
    i = 0
    for batch in batches:
        for subject, data, ttl in zip(*(batch.column(c).to_pylist() for c in ("subject", "data", "ttl")), strict=True):
            if state["pending"] >= window:
                room.clear()
                await room.wait()
            state["pending"] += 1
            state["sent"] += 1
            done.clear()
            await nc.publish(subject, data, reply=f"{inbox}.{i}", headers={"Nats-TTL": ttl, "Nats-Msg-Id": f"{ids}-{i}"})
            i += 1
    if state["acked"] < state["sent"]:
        await asyncio.wait_for(done.wait(), 120)
    await nc.close()
    assert state["errors"] == 0, state
    return i


def _nats_py_write_in_spark(spark, url: str, stream: str, rows: int, size: int) -> float:
    """A user's write inside Spark: the same cached rows the connector writes, each partition's published
    with nats-py by ``mapInArrow`` (:func:`publish_arrow`)."""
    from bench import cached_rows

    df = cached_rows(spark, stream, rows, size, 1)

    def publish(batches):
        import asyncio as aio
        import uuid

        import bench_per_core as worker_bench
        import pyarrow as pa

        sent = aio.run(worker_bench.publish_arrow(url, batches, uuid.uuid4().hex))
        yield pa.RecordBatch.from_pydict({"n": [sent]})

    start = time.perf_counter()
    df.mapInArrow(publish, "n long").write.format("noop").mode("overwrite").save()
    elapsed = time.perf_counter() - start
    df.unpersist()
    return elapsed


async def _purge(url: str, stream: str) -> None:
    import nats

    nc = await nats.connect(url)
    try:
        await api(nc, f"STREAM.PURGE.{stream}", {})
    finally:
        await nc.close()


def per_core(spark, url: str, server_pid: int, repeat: int, quick: bool, results: list, notes: list,
             tables: list, chart_path: str | None = None) -> None:
    reads = 100_000 if quick else 300_000
    writes = [(50_000, 100), (20_000, 1024)] if quick else [(200_000, 100), (50_000, 1024)]
    meter = CpuMeter(server_pid)
    asyncio.run(make_stream(url, "PCR"))
    asyncio.run(raw_publish(url, "PCR", reads, 100, headers=False))
    # Each cell: its rows, its measure, and the stream a write cell empties before it and counts after it
    # (every run starts on the same store, and a write that stored fewer rows, de-duplicated, is caught).
    cells: dict[str, tuple[int, object, str | None]] = {
        "read 100 B: connector": (reads, lambda: connector_batch_read(spark, url, "PCR", 1), None),
        "read 100 B: raw nats-py": (reads, lambda: asyncio.run(raw_pull_to_arrow(url, "PCR", reads)), None),
        "read 100 B: nats-py JetStream API (fetch)": (reads, lambda: asyncio.run(
            nats_py_fetch_to_arrow(url, "PCR", reads)), None),
        "read 100 B: nats-py job inside Spark": (reads, lambda: _nats_py_read_in_spark(spark, url, "PCR", reads),
                                                 None),
    }
    for count, size in writes:
        name = f"PCW{size}"
        asyncio.run(make_stream(url, name, batched=True))
        cells[f"write {size} B: connector, a PubAck per row"] = (
            count, lambda c=count, s=size, n=name: connector_batch_write(spark, url, n, c, s, 1, mode="acked"), name)
        cells[f"write {size} B: connector, in batches"] = (
            count, lambda c=count, s=size, n=name: connector_batch_write(spark, url, n, c, s, 1, mode="batched"),
            name)
        cells[f"write {size} B: raw nats-py"] = (count, lambda c=count, s=size, n=name: asyncio.run(
            raw_publish(url, n, c, s, ids=uuid.uuid4().hex)), name)
        cells[f"write {size} B: nats-py job inside Spark"] = (
            count, lambda c=count, s=size, n=name: _nats_py_write_in_spark(spark, url, n, c, s), name)
    only = os.environ.get("PERCORE_ONLY")  # a substring of the cells to run (a probe of one path)
    cells = {name: cell for name, cell in cells.items() if not only or only in name}
    for _, measure, _ in cells.values():  # warm-up: the workers start, the modules load
        measure()
    times: dict[str, list[float]] = {name: [] for name in cells}
    cpu: dict[str, list[dict[str, float]]] = {name: [] for name in cells}
    names = list(cells)
    for k in range(repeat):
        for name in names[k % len(names):] + names[:k % len(names)]:
            count, measure, stream = cells[name]
            if stream:
                asyncio.run(_purge(url, stream))
            meter.start()
            times[name].append(measure())
            cpu[name].append(meter.stop())
            if stream:
                stored = asyncio.run(stream_messages(url, stream))
                assert stored == count, f"{name}: {stored} of {count} rows stored"
    lines = ["| cell | rows/s | server us/row | JVM us/row | Python workers us/row | this process us/row |",
             "|---|---:|---:|---:|---:|---:|"]
    drawn: list[tuple[str, float, dict[str, float]]] = []
    for name in names:
        count = cells[name][0]
        seconds = statistics.median(times[name])
        results.append(Result(f"per core: {name}", count, int(name.split()[1]), seconds))
        per_row = {g: statistics.median(c[g] for c in cpu[name]) / count * 1e6 for g in ("server", "jvm", "workers",
                                                                                          "driver")}
        lines.append(f"| {name} | {count / seconds:,.0f} | {per_row['server']:.1f} | {per_row['jvm']:.1f} | "
                     f"{per_row['workers']:.1f} | {per_row['driver']:.1f} |")
        drawn.append((name, count / seconds, per_row))
    if chart_path:
        _chart(drawn, chart_path)
    tables.append((f"Per executor core (server on core 0, Spark and the baselines on core 1, local[1], one partition, "
                   f"median of {repeat} rotated runs)", "\n".join(lines)))


def _chart(cells: list[tuple[str, float, dict[str, float]]], path: str) -> None:
    """Rows a second per cell, and beside it each cell's CPU per row by process group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [c[0] for c in cells]
    fig, (rate, cost) = plt.subplots(1, 2, figsize=(13, 0.42 * len(cells) + 1.6), sharey=True)
    colors = ["#2f6fdf" if "connector" in n else "#9aa5b1" for n in names]
    rate.barh(names, [c[1] / 1000 for c in cells], color=colors)
    for y, c in enumerate(cells):
        rate.text(c[1] / 1000, y, f" {c[1] / 1000:,.0f}k", va="center", fontsize=8)
    rate.invert_yaxis()
    rate.set_xlabel("thousand rows/s on one executor core (blue: the connector; grey: baselines)")
    left = [0.0] * len(cells)
    for group, label, color in (("server", "nats-server (core 0)", "#c0392b"), ("jvm", "Spark JVM", "#e67e22"),
                                ("workers", "Python workers", "#2f6fdf"), ("driver", "baseline process", "#7f8c8d")):
        values = [c[2][group] for c in cells]
        cost.barh(names, values, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, values, strict=True)]
    cost.set_xlabel("CPU us per row, from /proc")
    cost.legend(loc="lower right", fontsize=8)
    fig.suptitle("An executor core: nats-server on core 0; Spark (local[1]) and the baselines on core 1")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")


def bound(spark, url: str, repeat: int, quick: bool, results: list, notes: list, tables: list) -> None:
    """The read bound beside the connector's read (2 cores)."""
    from noio_source import NoIoSource

    spark.dataSource.register(NoIoSource)
    lines = ["| read | connector | bound | connector / bound |", "|---|---:|---:|---:|"]
    for rows, size in ([(100_000, 100), (20_000, 1024)] if quick else [(500_000, 100), (100_000, 1024)]):
        name = f"RB{size}"
        asyncio.run(make_stream(url, name))
        asyncio.run(raw_publish(url, name, rows, size, headers=False))
        connector_batch_read(spark, url, name, 2)
        read_bound(spark, url, name, rows, size)  # warm-up
        ours, top = [], []
        for _ in range(repeat):
            ours.append(connector_batch_read(spark, url, name, 2))
            top.append(read_bound(spark, url, name, rows, size))
        o, b = statistics.median(ours), statistics.median(top)
        label = f"{rows // 1000}k x {size} B"
        results.append(Result(f"read bound {label}, 2 partitions", rows, size, b))
        results.append(Result(f"batch read {label}, 2 partitions", rows, size, o, f"read bound {label}, 2 partitions"))
        lines.append(f"| {label}, 2 partitions | {rows / o:,.0f}/s | {rows / b:,.0f}/s | {b / o:.2f} |")
    tables.append((f"The read bound (2 cores, local[2], median of {repeat})", "\n".join(lines)))
