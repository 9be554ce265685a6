"""The write benchmark (``bench.py --only write``) for several trees of the connector, alternated in one
session, so that their ratios to raw nats-py are compared as measured beside each other.

    git -C . archive d7c6868 connector | tar -x -C /tmp/old
    python tests/perf/bench_versions.py 2 old=/tmp/old/connector new=connector

Why: a ratio measured on another day, under another load, says little on a shared machine; each tree's
bench runs in a process of its own (Spark's Python workers take the tree from ``PYTHONPATH``), the
trees in a rotated order every round. Prints each run's ratios with the load average when it started,
then the medians per tree.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench.py")
ROWS = {
    "100 B": "batch write 200k x 100 B, TTL + msg id, 2 partitions",
    "1 KiB": "batch write 50k x 1024 B, TTL + msg id, 2 partitions",
    "100 B 1p": "batch write 200k x 100 B, TTL + msg id, 1 partition",
    "1 KiB 1p": "batch write 50k x 1024 B, TTL + msg id, 1 partition",
    "100 B own": "batch write 200k x 100 B, the connector's own",
    "1 KiB own": "batch write 50k x 1024 B, the connector's own",
}


def main() -> int:
    rounds, trees = int(sys.argv[1]), dict(arg.split("=", 1) for arg in sys.argv[2:])
    got: dict[str, dict[str, list[float]]] = {tree: {row: [] for row in ROWS} for tree in trees}
    names = list(trees)
    out = tempfile.mkdtemp(prefix="bench-versions-")
    for r in range(rounds):
        for tree in names[r % len(names):] + names[:r % len(names)]:
            where = os.path.join(out, f"{tree}-{r}")
            load, started = os.getloadavg()[0], time.perf_counter()
            env = dict(os.environ, PYTHONPATH=os.path.abspath(trees[tree]))
            subprocess.run([sys.executable, BENCH, "--only", "write", "--out", where], env=env, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with open(os.path.join(where, "bench-write.md")) as f:
                table = f.read()
            line = []
            for row, label in ROWS.items():
                found = re.search(re.escape(label) + r".*?\| (-?[\d.]+)x \(raw", table)
                assert found is not None, (row, table)
                got[tree][row].append(float(found.group(1)))
                line.append(f"{row} {found.group(1)}x")
            print(f"round {r} {tree} (load {load:.1f}, {time.perf_counter() - started:.0f} s): " + ", ".join(line),
                  flush=True)
    print("medians:")
    for tree in names:
        print(f"{tree}: " + ", ".join(f"{row} {statistics.median(v):.2f}x" for row, v in got[tree].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
