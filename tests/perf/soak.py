"""Soak run: a read -> transform -> write pipeline under server restarts, for minutes.

    python tests/perf/soak.py                      # 10 minutes, 500 msg/s, a restart every 3 minutes
    python tests/perf/soak.py --minutes 2 --restart-every 40

An embedded nats-server (file storage) holds two streams. A publisher writes
TTL'd messages (each carries its index and a ``Nats-Msg-Id``) into ``SOAK_IN`` at a
steady rate; a streaming query reads ``SOAK_IN``, transforms each row, and writes it
to ``SOAK_OUT`` keeping the TTL. Every ``--restart-every`` seconds the server is
SIGKILLed and started again on the same store. When the query fails (instead of
riding through), it is started again from its checkpoint, as a job supervisor
would. At the end the publisher stops, the query catches up, and every message in
``SOAK_OUT`` is read back with nats-py (not with the connector) and compared with
what was published.

It prints (and writes to ``--out``/soak.md) messages in and out, duplicates and
losses (both must be 0), restarts, the Python workers' RSS over time and the
micro-batch latency percentiles. Exit status 1 when anything was lost or duplicated.
Not run in CI: ``pytest -m slow tests/perf`` runs a 1-minute version.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import python_worker_rss_kib  # noqa: E402

TTLS = ("30m", "1h", "2h", "90m")


def _cause(text: str) -> str:
    """The line of a (Python-wrapped) query exception that names the error."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    named = [line for line in lines if "Error:" in line or "Exception:" in line]
    return (named[-1] if named else lines[0] if lines else text)[:300]


class SteadyPublisher:
    """Publishes ``rate`` messages a second into ``subject`` until stopped.

    Every message has a deterministic ``Nats-Msg-Id`` (``in-<index>``), so a message
    whose PubAck was lost in a restart is simply sent again and the server drops
    any copy. ``acked`` counts indices the server confirmed (stored or duplicate).
    """

    def __init__(self, url: str, subject: str, rate: int) -> None:
        self.url, self.subject, self.rate = url, subject, rate
        self.next_index = 0
        self.acked: set[int] = set()
        self.unacked: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> SteadyPublisher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)

    async def _run(self) -> None:
        import nats

        async def quiet(exc: Exception) -> None:
            """Restarts are the point of the run: reconnect errors are expected."""

        nc = await nats.connect(self.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2, error_cb=quiet)
        inbox = nc.new_inbox()

        async def on_ack(msg) -> None:
            index = int(msg.subject.rsplit(".", 1)[1])
            if msg.data and b'"error"' not in msg.data:
                self.acked.add(index)
                self.unacked.pop(index, None)

        await nc.subscribe(inbox + ".*", cb=on_ack)

        async def send(index: int) -> None:
            headers = {"Nats-Msg-Id": f"in-{index}", "Nats-TTL": TTLS[index % len(TTLS)]}
            body = json.dumps({"index": index, "customer": f"c{index % 97}", "amount": index % 1000}).encode()
            self.unacked[index] = time.monotonic()
            with contextlib.suppress(Exception):  # resent below until acknowledged
                await nc.publish(self.subject, body, reply=f"{inbox}.{index}", headers=headers)

        started = time.monotonic()
        tick = 0.05
        # Publish until stopped, then keep resending until every index is acknowledged.
        while not self._stop.is_set() or self.unacked:
            if not self._stop.is_set():
                due = int((time.monotonic() - started) * self.rate)
                while self.next_index < due:
                    await send(self.next_index)
                    self.next_index += 1
            now = time.monotonic()
            for index, sent in list(self.unacked.items()):
                if now - sent > 3.0:
                    await send(index)
            await asyncio.sleep(tick)
        await nc.close()


def worker_rss_mib() -> tuple[int, float, float]:
    """Spark's Python worker processes now: how many, their total and their largest RSS (MiB)."""
    sizes = [kib / 1024 for kib in python_worker_rss_kib()]
    return len(sizes), sum(sizes), max(sizes, default=0.0)


def start_query(spark, url: str, checkpoint: str):
    from pyspark.sql import functions as F

    source = (spark.readStream.format("jetstream").option("servers", url).option("stream", "SOAK_IN")
              .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", "20000")
              .option("consume.maxWait", "60s").load())
    body = F.from_json(F.col("data").cast("string"), "index long, customer string, amount long")
    return (source.select(body.alias("o"), "seq", "ttl")
            .select(F.concat(F.lit("soak.out."), F.col("o.customer")).alias("subject"),
                    F.to_json(F.struct(F.col("o.index").alias("index"), F.col("seq").alias("source_seq"),
                                       (F.col("o.amount") * 2).alias("doubled"))).cast("binary").alias("data"),
                    "ttl")
            .writeStream.format("jetstream").option("servers", url).option("stream", "SOAK_OUT")
            .option("checkpointLocation", checkpoint).option("ackTimeout", "60s")
            .trigger(processingTime="1 second").start())


async def read_back(url: str, stream: str) -> list[int]:
    """Every stored message's ``index``, read with nats-py through an ephemeral consumer."""
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.pull_subscribe("", stream=stream, config=nats.js.api.ConsumerConfig(ack_policy="none"))
    info = await js.stream_info(stream)
    indices: list[int] = []
    while len(indices) < info.state.messages:
        for msg in await sub.fetch(5000, timeout=10):
            indices.append(json.loads(msg.data)["index"])
    await nc.close()
    return indices


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=500, help="messages published per second")
    parser.add_argument("--restart-every", type=float, default=180.0, help="seconds between server restarts")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    from pyspark_jetstream.tools.server import EmbeddedNatsServer

    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    server = EmbeddedNatsServer(store_dir=workdir / "store").start()
    spark = (SparkSession.builder.master("local[2]").appName("pyspark-jetstream-soak")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.python.worker.reuse", "true").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    import nats

    async def streams() -> None:
        nc = await nats.connect(server.url)
        for name, subject in (("SOAK_IN", "soak.in"), ("SOAK_OUT", "soak.out.>")):
            await nc.request(f"$JS.API.STREAM.CREATE.{name}", json.dumps(
                {"name": name, "subjects": [subject], "storage": "file", "allow_msg_ttl": True,
                 "duplicate_window": 600 * 10**9}).encode(), timeout=10)
        await nc.close()

    asyncio.run(streams())
    checkpoint = str(workdir / "checkpoint")
    publisher = SteadyPublisher(server.url, "soak.in", args.rate).start()
    query = start_query(spark, server.url, checkpoint)
    started = time.monotonic()
    deadline = started + args.minutes * 60
    next_restart = started + args.restart_every
    server_restarts = query_restarts = 0
    failures: list[str] = []
    rss: list[tuple[float, tuple[int, float, float]]] = []
    progress: dict[tuple[str, int], dict] = {}

    def collect(q) -> None:
        for p in q.recentProgress:
            progress[(p["runId"], p["batchId"])] = p

    print(f"soak: {args.minutes:g} min at {args.rate} msg/s, server restart every {args.restart_every:g}s; "
          f"work dir {workdir}", flush=True)
    last_report = started
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = time.monotonic()
        rss.append((now - started, worker_rss_mib()))
        collect(query)
        if now >= next_restart:
            server.restart(kill=True)
            server_restarts += 1
            next_restart = now + args.restart_every
            print(f"  [{now - started:6.0f}s] nats-server SIGKILLed and restarted", flush=True)
        if not query.isActive:
            failures.append(_cause(str(query.exception())))
            print(f"  [{now - started:6.0f}s] query stopped ({failures[-1]}); restarting from its checkpoint",
                  flush=True)
            query = start_query(spark, server.url, checkpoint)
            query_restarts += 1
        if now - last_report >= 30:
            last_report = now
            print(f"  [{now - started:6.0f}s] published {len(publisher.acked)}, batches {len(progress)}, "
                  f"largest Python worker {rss[-1][1][2]:.0f} MiB", flush=True)

    publisher.stop()
    published = len(publisher.acked)
    print(f"publisher stopped after {published} messages; waiting for the query to catch up", flush=True)

    async def out_count() -> int:
        nc = await nats.connect(server.url)
        reply = await nc.request("$JS.API.STREAM.INFO.SOAK_OUT", b"", timeout=10)
        await nc.close()
        return json.loads(reply.data)["state"]["messages"]

    catch_up = time.monotonic() + 300
    while asyncio.run(out_count()) < published and time.monotonic() < catch_up:
        if not query.isActive:
            query = start_query(spark, server.url, checkpoint)
            query_restarts += 1
        time.sleep(1.0)
    collect(query)
    query.stop()
    indices = asyncio.run(read_back(server.url, "SOAK_OUT"))
    spark.stop()
    server.close()

    seen: dict[int, int] = {}
    for index in indices:
        seen[index] = seen.get(index, 0) + 1
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    losses = sum(1 for index in publisher.acked if index not in seen)
    latencies = [p["durationMs"]["triggerExecution"] for p in progress.values() if p["numInputRows"] > 0]
    minute: dict[int, list[tuple[int, float, float]]] = {}
    for t, sample in rss:
        minute.setdefault(int(t // 60), []).append(sample)

    lines = [
        f"# Soak: {args.minutes:g} min, {args.rate} msg/s, nats-server SIGKILLed every {args.restart_every:g}s",
        "",
        "| measure | value |",
        "|---|---:|",
        f"| messages in (acknowledged by the server) | {published} |",
        f"| messages out (distinct) | {len(seen)} |",
        f"| duplicates | {duplicates} |",
        f"| losses | {losses} |",
        f"| server restarts | {server_restarts} |",
        f"| query restarts from the checkpoint | {query_restarts} |",
        f"| micro-batches with rows | {len(latencies)} |",
    ]
    if latencies:
        lines += [f"| micro-batch latency p{p} (ms) | {percentile(latencies, p):.0f} |" for p in (50, 90, 99)]
        lines += [f"| micro-batch latency max (ms) | {max(latencies):.0f} |"]
    lines += ["", "Spark's Python workers per minute (sampled every second; the daemon counts as one):", "",
              "| minute | processes (max) | largest worker RSS, mean (MiB) | largest worker RSS, max (MiB) "
              "| total RSS, max (MiB) |", "|---:|---:|---:|---:|---:|"]
    lines += [f"| {m} | {max(s[0] for s in v)} | {statistics.mean(s[2] for s in v):.0f} | {max(s[2] for s in v):.0f} "
              f"| {max(s[1] for s in v):.0f} |" for m, v in sorted(minute.items())]
    if failures:
        lines += ["", "Query failures (restarted from the checkpoint):", ""] + [f"- {f}" for f in failures]
    report = "\n".join(lines)
    print(report)
    os.makedirs(args.out, exist_ok=True)
    Path(args.out, "soak.md").write_text(report + "\n")
    return 0 if duplicates == 0 and losses == 0 and len(seen) == published else 1


if __name__ == "__main__":
    sys.exit(main())
