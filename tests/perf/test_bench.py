"""The benchmark harness runs end to end (on request: pytest -m slow tests/perf)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).with_name("bench.py")


@pytest.mark.slow
def test_quick_bench_writes_its_table_and_chart(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    table = (tmp_path / "bench-quick.md").read_text()
    assert "| batch read" in table and "| batch write" in table and "p50" in table
    assert "Server delivery alone" in table and "with the sink's headers" in table
    # The write section's bounds (Spark's own job and the server's ingest from a free client, at once).
    assert table.count("| bound: Spark's own job") == 4
    assert (tmp_path / "bench-quick.png").stat().st_size > 10_000


@pytest.mark.slow
def test_the_fast_ingest_bench_runs_every_publisher(tmp_path):
    root = Path(__file__).parents[2]
    done = subprocess.run([sys.executable, "-m", "tests.perf.bench_fast_ingest", "--messages", "3000", "--rounds", "1", "--sizes", "100",
                           "--replicas", "1", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    table = (tmp_path / "bench-fast-ingest.md").read_text()
    methods = ("nats-py", "per-message", "fast-ingest", "server, PubAcks", "server, batches")
    assert all(f"| {method} |" in table for method in methods)


@pytest.mark.slow
def test_the_task_cpu_probe_splits_a_write_task_by_thread():
    root = Path(__file__).parents[2]
    done = subprocess.run([sys.executable, "-m", "tests.perf.task_cpu", "--mode", "acked", "--rows", "3000", "--runs", "1"],
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "acked 100 B:" in done.stdout and "the task's thread" in done.stdout and "server" in done.stdout
