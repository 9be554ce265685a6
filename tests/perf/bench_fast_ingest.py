"""The publish limit on this machine: per-message PubAcks against fast-ingest batches (issue #48).

    python -m tests.perf.bench_fast_ingest [--messages 200000] [--rounds 3] [--sizes 100,1024] [--replicas 1,3]
                                           [--out tests/perf/results]

Three publishers store the same messages (subject, payload, ``Nats-Msg-Id``) into a fresh file stream
of the same config (``allow_batched``), on one server (R1) and on a 3-node cluster (R3):

- ``nats-py``: the reference, nats-py's own pipelined ``nc.publish(subject, payload, reply=inbox.i,
  headers=...)`` with a window of unacknowledged messages, every PubAck parsed and checked;
- ``per-message``: ours without Spark, the sink's way: HPUB frames through ``send_raw`` in chunks,
  PubAcks on a raw subscription (no ``Msg`` per ack), the same window;
- ``fast-ingest``: :class:`~pyspark_jetstream.client.fast_publisher.FastPublisher`, one batch, flow
  500, two flow intervals ahead;
- ``server, PubAcks`` and ``server, batches``: the server's own limit, the same messages with the
  sink's headers written pre-built over a plain socket (``raw_ingest.py``): what the server stores
  when its client costs next to nothing.

The order of the three rotates every round; each run's messages are checked stored (the stream's
count). Prints and writes (``bench-fast-ingest.md``) the medians of messages a second, their ratio to
``nats-py`` within the same round, and the server's CPU per 100,000 messages (utime + stime of every
server process, from /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import nats
from nats.js.api import StreamConfig

from pyspark_jetstream.client.fast_publisher import FastPublisher
from pyspark_jetstream.client.nats_internals import raw_subscribe, raw_unsubscribe, send_raw
from pyspark_jetstream.protocol.frames import hpub_frame
from pyspark_jetstream.protocol.puback import STORED, may_be_plain, parse_puback
from pyspark_jetstream.tools.server import EmbeddedNatsCluster, EmbeddedNatsServer

from . import raw_ingest

WINDOW = 4096
"""Unacknowledged messages of the per-message publishers: the sink's default maxPendingAcks."""
CHUNK = 256
METHODS = ("nats-py", "per-message", "fast-ingest", "server, PubAcks", "server, batches")


def _messages(subject: str, n: int, size: int, run: str) -> list:
    payload = b"x" * size
    return [(f"{subject}.{p % 16}", None, payload, f"{run}-{p}") for p in range(n)]


async def _nats_py(nc, messages: list) -> None:
    """nats-py's pipelined publish: one coroutine call per message, PubAcks as ``Msg`` s on a callback."""
    inbox = nc.new_inbox()
    state = {"acked": 0, "bad": None}
    room = asyncio.Event()

    async def on_ack(msg) -> None:
        data = msg.data
        if not may_be_plain(data) and parse_puback(data).outcome != STORED and state["bad"] is None:
            state["bad"] = data
        state["acked"] += 1
        room.set()

    sub = await nc.subscribe(inbox + ".*", cb=on_ack, pending_msgs_limit=4 * WINDOW)
    for i, (subject, _headers, payload, msg_id) in enumerate(messages):
        while i - state["acked"] >= WINDOW:
            room.clear()
            await asyncio.wait_for(room.wait(), 30)
        await nc.publish(subject, payload, reply=f"{inbox}.{i}", headers={"Nats-Msg-Id": msg_id})
    while state["acked"] < len(messages):
        room.clear()
        await asyncio.wait_for(room.wait(), 30)
    await sub.unsubscribe()
    assert state["bad"] is None, state["bad"]


async def _per_message(nc, messages: list) -> None:
    """The sink's path without Spark: frames in chunks through send_raw, acks on a raw subscription."""
    inbox = nc.new_inbox()
    state = {"acked": 0, "bad": None}
    room = asyncio.Event()

    def on_acks(frames: list) -> None:
        for _subject, _reply, data, _headers in frames:
            if not (data and may_be_plain(data)) and parse_puback(data).outcome != STORED and state["bad"] is None:
                state["bad"] = data
        state["acked"] += len(frames)
        room.set()

    sub = await raw_subscribe(nc, inbox + ".*", lambda *frame: on_acks([frame]), on_acks)
    sent, total = 0, len(messages)
    while sent < total:
        room_left = WINDOW - (sent - state["acked"])
        if room_left <= 0:
            room.clear()
            await asyncio.wait_for(room.wait(), 30)
            continue
        upto = min(total, sent + min(room_left, CHUNK))
        await send_raw(nc, b"".join(
            hpub_frame(subject, f"{inbox}.{i}", f"NATS/1.0\r\nNats-Msg-Id: {msg_id}\r\n\r\n".encode(), payload)
            for i, (subject, _h, payload, msg_id) in enumerate(messages[sent:upto], sent)))
        sent = upto
    while state["acked"] < total:
        room.clear()
        await asyncio.wait_for(room.wait(), 30)
    await raw_unsubscribe(nc, sub)
    assert state["bad"] is None, state["bad"]


async def _fast_ingest(nc, messages: list) -> None:
    pub = await FastPublisher(nc, flow=500).start()
    result = await pub.publish(messages)
    await pub.close()
    assert result.stored == len(messages) and result.refused is None, result


RUNNERS = {"nats-py": _nats_py, "per-message": _per_message, "fast-ingest": _fast_ingest}
RAW = {"server, PubAcks": raw_ingest.pubacks, "server, batches": raw_ingest.batch}
"""Publishers that time themselves (their frames are made before their clock starts)."""


def _cpu_seconds(pids: list[int]) -> float:
    """utime + stime of the server processes, in seconds (Linux /proc)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


async def _one(url: str, pids: list[int], method: str, replicas: int, size: int, n: int, run: str) -> tuple:
    nc = await nats.connect(servers=url.split(","), pending_size=64 * 1024 * 1024)
    js = nc.jetstream()
    name = f"BENCH_{run}"
    await js.add_stream(StreamConfig(name=name, subjects=[f"{name}.>"], num_replicas=replicas, allow_batched=True,
                                     duplicate_window=120))
    messages = _messages(name, n, size, run)
    cpu = _cpu_seconds(pids)
    started = time.perf_counter()
    if method in RAW:
        elapsed = await RAW[method](url, name, messages)
    else:
        await RUNNERS[method](nc, messages)
        elapsed = time.perf_counter() - started
    cpu = _cpu_seconds(pids) - cpu
    stored = (await js.stream_info(name)).state.messages
    assert stored == n, (method, stored, n)
    await js.delete_stream(name)
    await nc.close()
    return n / elapsed, cpu * 100_000 / n


def bench(replicas: int, size: int, n: int, rounds: int) -> dict:
    """Medians over ``rounds`` of msgs/s, the ratio to nats-py within each round, and server CPU."""
    server = EmbeddedNatsCluster(3) if replicas == 3 else EmbeddedNatsServer()
    runs: dict[str, list[tuple[float, float]]] = {m: [] for m in METHODS}
    ratios: dict[str, list[float]] = {m: [] for m in METHODS}
    counter = itertools.count()
    with server:
        nodes = server.nodes if replicas == 3 else [server]
        pids = [node.pid for node in nodes]
        for r in range(rounds):
            order = METHODS[r % len(METHODS):] + METHODS[:r % len(METHODS)]
            this_round = {}
            for method in order:
                rate, cpu = asyncio.run(_one(server.url, pids, method, replicas, size, n, f"r{replicas}s{size}n{next(counter)}"))
                this_round[method] = rate
                runs[method].append((rate, cpu))
                print(f"  R{replicas} {size:>5} B round {r + 1} {method:<12} {rate:>9,.0f} msgs/s  "
                      f"server CPU {cpu:.2f} s/100k", flush=True)
            for method in METHODS:
                ratios[method].append(this_round[method] / this_round["nats-py"])
    return {m: {"rate": statistics.median(r for r, _ in runs[m]), "ratio": statistics.median(ratios[m]),
                "cpu": statistics.median(c for _, c in runs[m]), "rates": [round(r) for r, _ in runs[m]]}
            for m in METHODS}


def _table(results: dict, n: int, rounds: int) -> str:
    lines = [f"Fast-ingest bench: {n:,} messages a run, {rounds} rounds, medians (ratio: to nats-py in the same round)",
             "", "| stream | payload | publisher | msgs/s | × nats-py | server CPU s / 100k msgs | runs (msgs/s) |",
             "|---|---|---|---:|---:|---:|---|"]
    for (replicas, size), by_method in results.items():
        for method, row in by_method.items():
            lines.append(f"| R{replicas} | {size} B | {method} | {row['rate']:,.0f} | {row['ratio']:.2f} | "
                         f"{row['cpu']:.2f} | {', '.join(f'{r:,}' for r in row['rates'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="100,1024")
    parser.add_argument("--replicas", default="1,3")
    parser.add_argument("--out", default=None, help="directory for bench-fast-ingest.md and .json")
    args = parser.parse_args(argv)
    results = {}
    for replicas in (int(r) for r in args.replicas.split(",")):
        for size in (int(s) for s in args.sizes.split(",")):
            results[(replicas, size)] = bench(replicas, size, args.messages, args.rounds)
    table = _table(results, args.messages, args.rounds)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench-fast-ingest.md").write_text(table)
        (out / "bench-fast-ingest.json").write_text(json.dumps(
            {f"R{r} {s} B": v for (r, s), v in results.items()}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
