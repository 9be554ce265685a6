"""Sections of the benchmark (``bench.py --only ...``) for several trees of the connector, alternated in one
session, so that their figures are compared as measured beside each other.

    git -C . archive d7c6868 connector | tar -x -C /tmp/old
    python tests/perf/bench_versions.py 2 old=/tmp/old/connector new=connector            # the write section
    python tests/perf/bench_versions.py 2 --sections read,write,copies,pushdown old=/tmp/base new=.

A tree is either a ``connector`` folder (this checkout's ``bench.py`` drives it) or a checkout's root (its own
``tests/perf/bench.py`` drives its own ``connector``: the harness may import modules a refactor moved).

Why: a figure measured on another day, under another load, says little on a shared machine; each tree's
bench runs in a process of its own (Spark's Python workers take the tree from ``PYTHONPATH``), the
trees in a rotated order every round. Prints each run's ratios to raw nats-py (the write section) with the
load average when it started, then per table row the median rows/s of each tree and each tree's median
against the first tree's.
"""

from __future__ import annotations

import argparse
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
TABLE_ROW = re.compile(r"^\| (?P<path>[^|]+?) \| [\d,]+ \| \d+ B \| (?P<rate>[\d,]+) \| [\d.]+ \| (?P<ratio>[\d.]+x)?",
                       re.MULTILINE)
VARYING = re.compile(r"\(job minus Spark's own \d+ ms\)")  # a figure in the path itself


def _paths(tree: str) -> tuple[str, str]:
    """(bench.py, PYTHONPATH) for a tree: a checkout's root drives itself, a connector folder is driven by ours."""
    tree = os.path.abspath(tree)
    own = os.path.join(tree, "tests", "perf", "bench.py")
    if os.path.isfile(own):
        return own, os.path.join(tree, "connector")
    return BENCH, tree


def _run(tree: str, section: str, where: str) -> str:
    bench, path = _paths(tree)
    env = dict(os.environ, PYTHONPATH=path)
    subprocess.run([sys.executable, bench, "--only", section, "--out", where], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (name,) = [n for n in os.listdir(where) if n.startswith(f"bench-{section}") and n.endswith(".md")]
    with open(os.path.join(where, name)) as f:
        return f.read()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("rounds", type=int)
    parser.add_argument("trees", nargs="+", help="name=path, the first is the one the others are compared to")
    parser.add_argument("--sections", default="write")
    args = parser.parse_args()
    trees = dict(arg.split("=", 1) for arg in args.trees)
    names = list(trees)
    rates: dict[str, dict[str, list[float]]] = {tree: {} for tree in names}
    ratios: dict[str, dict[str, list[float]]] = {tree: {} for tree in names}  # to the row's baseline, same run
    out = tempfile.mkdtemp(prefix="bench-versions-")
    for r in range(args.rounds):
        for section in args.sections.split(","):
            for tree in names[r % len(names):] + names[:r % len(names)]:
                load, started = os.getloadavg()[0], time.perf_counter()
                table = _run(trees[tree], section, os.path.join(out, f"{tree}-{section}-{r}"))
                for found in TABLE_ROW.finditer(table):
                    path = VARYING.sub("(job minus Spark's own)", found["path"])
                    rates[tree].setdefault(path, []).append(float(found["rate"].replace(",", "")))
                    if found["ratio"]:
                        ratios[tree].setdefault(path, []).append(float(found["ratio"][:-1]))
                line = []
                if section != "write":  # each compared row's ratio, to show the spread of the runs
                    line = [f"{VARYING.sub('', f['path'])[:40]} {f['ratio']}" for f in TABLE_ROW.finditer(table)
                            if f["ratio"]]
                else:
                    for row, label in ROWS.items():
                        found = re.search(re.escape(label) + r".*?\| (-?[\d.]+)x \(raw", table)
                        assert found is not None, (row, table)
                        line.append(f"{row} {found.group(1)}x")
                print(f"round {r} {section} {tree} (load {load:.1f}, {time.perf_counter() - started:.0f} s)"
                      + (": " + ", ".join(line) if line else ""), flush=True)
    _table(names, rates, "rows/s", "{:,.0f}")
    _table(names, ratios, "ratio to the baseline measured in the same run", "{:.2f}x")
    return 0


def _table(names: list[str], figures: dict[str, dict[str, list[float]]], what: str, shown: str) -> None:
    """Per table row, each tree's median ``what`` and each tree's median over the first tree's."""
    first = names[0]
    print(f"\n{what}, median per tree:\n")
    print(f"| path | {' | '.join(names)} | " + " | ".join(f"{t} / {first}" for t in names[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(names) - 1))
    for path in figures[first]:
        medians = [statistics.median(figures[t].get(path) or [float("nan")]) for t in names]
        print(f"| {path} | " + " | ".join(shown.format(m) for m in medians) + " | "
              + " | ".join(f"{m / medians[0]:.2f}x" for m in medians[1:]) + " |")


if __name__ == "__main__":
    sys.exit(main())
