"""Where a write task's CPU goes: the task's thread, its I/O thread and the server, per row (issue #48).

    python -m tests.perf.task_cpu [--mode batched|acked] [--size 100] [--rows 200000] [--runs 3]

One nats-server, a write task of the sink alone (``write_partition``, as in bench_sink_batched.py),
``--runs`` times to fresh streams. Per run: rows a second, the process's CPU a row (user and
system), the task thread's (the encoding and the waits' bookkeeping), the busiest other thread's
(the I/O thread: writing frames, reading and settling the answers) and the server's, read from
``/proc`` (Linux only). The first run carries the imports and warm-up.
"""

from __future__ import annotations

import argparse
import os
import resource
import uuid
from pathlib import Path

from pyspark_jetstream.client import runtime
from pyspark_jetstream.tools.server import EmbeddedNatsServer

from .bench_sink_batched import _count_and_delete, _sink, _stream

HZ = os.sysconf("SC_CLK_TCK")


def _cpu_of(stat: str) -> float:
    """User plus system seconds from a ``/proc/.../stat`` line (the command name may hold spaces)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def _threads() -> dict[int, float]:
    return {int(tid): _cpu_of(Path(f"/proc/self/task/{tid}/stat").read_text()) for tid in os.listdir("/proc/self/task")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("batched", "acked"), default="batched")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    batched, n = args.mode == "batched", args.rows
    with EmbeddedNatsServer() as server:
        server_stat = Path(f"/proc/{server.pid}/stat")
        for _ in range(args.runs):
            name = f"TC{uuid.uuid4().hex[:10]}"
            runtime.run(_stream(server.url, name, batched))
            before, server_before, threads = (resource.getrusage(resource.RUSAGE_SELF),
                                              _cpu_of(server_stat.read_text()), _threads())
            rate = _sink(server.url, name, n, args.size, batched)
            after, server_after = resource.getrusage(resource.RUSAGE_SELF), _cpu_of(server_stat.read_text())
            spent = {tid: cpu - threads.get(tid, 0.0) for tid, cpu in _threads().items()}
            assert runtime.run(_count_and_delete(server.url, name)) == n
            user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
            task = spent.pop(os.getpid())
            other = max(spent.values(), default=0.0)
            print(f"{args.mode} {args.size} B: {rate:,.0f} rows/s; process {(user + system) / n * 1e6:.2f} us a row "
                  f"(system {system / n * 1e6:.2f}; the task's thread {task / n * 1e6:.2f}, the busiest other "
                  f"{other / n * 1e6:.2f}); server {(server_after - server_before) / n * 1e6:.2f} us a row", flush=True)


if __name__ == "__main__":
    main()
