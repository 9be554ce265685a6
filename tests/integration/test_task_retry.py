"""Spark task retries: a task that fails after publishing part of its rows, and Python
workers SIGKILLed mid-partition on the read side. Each runs as its own Spark job on
``local[2,4]`` (four attempts per task); the retried tasks re-publish the same
``Nats-Msg-Id``s and the server drops the copies."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import child_processes, fill_stream, processes_connected_to, wait_until

JOB = Path(__file__).parent / "jobs" / "task_retry_job.py"


def _job(mode: str, nats_server, source: str, target: str, gate_dir: Path) -> list[str]:
    return [sys.executable, str(JOB), mode, nats_server.url, source, target, str(gate_dir)]


def _duplicates_dropped(log: str) -> int:
    found = re.search(r"committed: (\d+) published, (\d+) duplicates", log)
    assert found, log[-3000:]
    return int(found.group(2))


def _kill(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _released(proc, tmp_path) -> str:
    """Open the job's gate and wait for it to end (killed, with its process group, when it does not):
    its stderr; the job must have succeeded."""
    try:
        (tmp_path / "release").touch()
        _, stderr = proc.communicate(timeout=300)
    finally:
        _kill(proc)
    assert proc.returncode == 0, stderr[-3000:]
    return stderr


def test_task_failing_after_partial_publish_is_retried_exactly_once(nats_server, nats_client, stream_name, tmp_path):
    nats_client.add_stream(stream_name, [f"{stream_name.lower()}.x"])
    done = subprocess.run(_job("write", nats_server, "-", stream_name, tmp_path), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "injected failure on the first attempt" in done.stderr  # the first attempt did fail
    # The failed attempt had published part of its rows: the retry's copies were dropped.
    assert _duplicates_dropped(done.stderr) > 0
    datas = sorted(int(m.data) for m in nats_client.messages(stream_name))
    assert datas == list(range(4000))


STAGE_JOB = Path(__file__).parent / "jobs" / "stage_retry_job.py"
PAD = b"x" * 4000


# A job of its own that loses shuffle files mid-stage (38 to 80 s): run on request (-m slow) with the chaos soak;
# CI keeps the replays past the window through test_replay_past_window.py and the retried task below.
@pytest.mark.slow
def test_a_write_stage_spark_resubmits_past_the_window_stores_nothing_twice(nats_server, nats_client, stream_name,
                                                                           tmp_path):
    """Issue #33, item 1: a lost shuffle output (FetchFailed) makes Spark resubmit the write stage, whose
    task runs again with attemptNumber 0, after the first attempt published part of its rows; the
    resubmitted task runs past the target's duplicate window. The replay records tell it from its first
    attempt by the task attempt: every source message is in the target once."""
    source, target = f"{stream_name}S", f"{stream_name}T"
    nats_client.add_stream(source, [f"{source.lower()}.>"])
    nats_client.add_stream(target, [f"{target.lower()}.>"], duplicate_window=1_000_000_000)

    async def fill():  # 64 MB: more than the shuffle reader can have read ahead when the files go
        for i in range(0, 16000, 100):
            await asyncio.gather(*(nats_client.js.publish(f"{source.lower()}.k{k % 40}", f"{k}:".encode() + PAD)
                                   for k in range(i, i + 100)))

    nats_client.run(fill(), timeout=300)
    local_dir, gate_dir = tmp_path / "local", tmp_path / "gate"
    local_dir.mkdir()
    gate_dir.mkdir()
    done = subprocess.run([sys.executable, str(STAGE_JOB), nats_server.url, source, target, str(local_dir),
                           str(gate_dir), "1"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (gate_dir / "deleted").exists() and (gate_dir / "resubmitted").exists()  # the stage did run again
    assert "FetchFailedException" in done.stderr, done.stderr[-3000:]
    stored = sorted(int(m.data.split(b":", 1)[0]) for m in nats_client.messages(target))
    assert len(stored) == 16000 and stored == list(range(16000)), f"{len(stored) - len(set(stored))} duplicates"
    found = [int(n) for n in re.findall(r"replays; (\d+) of its ids are in stream", done.stderr)]
    assert found and max(found) > 0, done.stderr[-3000:]  # a first attempt had stored rows before it failed


# ~95 s with its own JVM: run on request (-m slow) with the chaos soak, which kills Python workers too;
# CI keeps test_task_failing_after_partial_publish_is_retried_exactly_once below.
@pytest.mark.slow
def test_python_workers_killed_mid_read_are_retried_exactly_once(nats_server, nats_client, stream_name, tmp_path):
    source, target = f"{stream_name}S", f"{stream_name}T"
    count = 30_000
    nats_client.add_stream(source, [f"{source.lower()}.x"])
    nats_client.add_stream(target, [f"{target.lower()}.x"])
    asyncio.run(fill_stream(nats_server.url, f"{source.lower()}.x", count))
    proc = subprocess.Popen(_job("read", nats_server, source, target, tmp_path), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (tmp_path / "reached").exists() or proc.poll() is not None, timeout=180,
                   what="the partition holding sequence 15000 reached the gate")
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        # The rows ahead of the gate are on their way to the sink: kill once some are stored.
        wait_until(lambda: nats_client.stream_state(target)["messages"] >= 1000, timeout=120,
                   what="the first attempt published part of its rows")
        # Every Python worker of the job talking to NATS: the partition readers (one of them
        # mid-partition behind the gate) and the writers. Only the job's own descendants: neither
        # this process nor the test session's own (reused) Spark workers, which share the server.
        job = set(child_processes(proc.pid, ""))
        workers = [pid for pid in processes_connected_to(nats_server.port) if pid in job]
        assert workers, "the job's Python workers should be connected to the server"
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
    except BaseException:
        _kill(proc)
        raise
    stderr = _released(proc, tmp_path)
    assert re.search(r"Python worker exited unexpectedly|crashed|EOFError|Connection reset", stderr), stderr[-3000:]
    assert _duplicates_dropped(stderr) > 0  # rows published before the kill were sent again and dropped
    datas = sorted(int(m.data) for m in nats_client.messages(target))
    assert datas == list(range(1, count + 1))


@pytest.mark.parametrize("mode", ["hole", "hole-no-write-id"])
def test_a_retry_puts_back_in_order_what_its_failed_attempt_stored_past_a_hole(nats_server, nats_client,
                                                                              stream_name, tmp_path, mode):
    """Issue #39: a task attempt that dies after a subject's later rows were stored, and not an earlier
    one, leaves its retry to finish the order. Here the target refuses row 100 (larger than its
    ``max_msg_size``) while the rows behind it are stored; the attempt fails; the test raises the limit
    while the retry waits at a gate. The retry publishes row 100, and its subject's rows stored after it
    in the task are deleted and published again behind it: every subject holds its rows in the task's
    order, each once, as written. With a ``writeId`` the retry reads what its predecessor stored from the
    replay records; without one (``hole-no-write-id``), from its PubAcks: the rows stored before come back
    as duplicates at sequences below the hole's new copy, and the publisher moves them behind it."""
    from .jobs.task_retry_job import HOLE_ROW, hole_data

    target = stream_name
    nats_client.add_stream(target, [f"{target.lower()}.>"], max_msg_size=1024)
    proc = subprocess.Popen(_job(mode, nats_server, "-", target, tmp_path), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (tmp_path / "retrying").exists() or proc.poll() is not None, timeout=240,
                   what="the failed task's retry reached its gate")
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        # The failed attempt left a hole: row 100 is not stored, rows of its subject behind it are.
        first = {int(m.data.split(b":", 1)[0]) for m in nats_client.messages(target)}
        assert HOLE_ROW not in first and {HOLE_ROW + 3, HOLE_ROW + 6} <= first, sorted(first)
        config = nats_client.stream_config(target)
        reply = nats_client.api(f"STREAM.UPDATE.{target}", {**config, "max_msg_size": -1})
        assert "error" not in reply, reply
    except BaseException:
        _kill(proc)
        raise
    stderr = _released(proc, tmp_path)
    assert "exceeds maximum allowed" in stderr, stderr[-3000:]  # the first attempt failed on the refusal
    stored = nats_client.messages(target)
    for k in range(3):
        subject = f"{target.lower()}.k{k}"
        got = [(m.subject, m.data) for m in stored if m.subject == subject]
        want = [(subject, hole_data(i).encode()) for i in range(k, 300, 3)]
        assert got == want, ([int(data.split(b":", 1)[0]) for _, data in got], stderr[-3000:])
    assert len(stored) == 300
    moved = re.search(r"committed: .*, (\d+) moved", stderr)
    assert moved and int(moved.group(1)) > 0, stderr[-3000:]  # rows of its subject stored behind it moved
