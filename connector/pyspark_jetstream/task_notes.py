"""What a Spark task's read of a stream tells the write running in the same task.

**Why.** Spark runs a narrow plan (read -> select/filter -> write) in one task per read partition:
the partition's rows go straight to the sink, in the task that read them. A read split into
sequence ranges spreads one subject's messages over every partition, so a narrow copy publishes
them from several tasks at once, out of order. After a shuffle (``repartition("subject")``) each
subject is in one write task, which orders its rows itself. The sink must tell the two apart
before it publishes anything, and nothing in the Python Data Source API says what feeds a
writer: only the task is shared. So the partition reader leaves a note (the stream, how the read
was split, which partition of how many) under the task's attempt id, and the sink, seeing its
first rows, takes the notes of its own task. Its read and its write run in two Python workers of
the same executor (forked by one daemon): the notes are small files in a directory of that daemon.

A note no write takes (a read into ``count()``, Parquet, ...) is removed by age: each process
sweeps, at most every :data:`SWEEP_EVERY` seconds, the notes older than :data:`MAX_AGE`.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SWEEP_EVERY = 300.0
MAX_AGE = 3600.0
_last_sweep = 0.0


@dataclass(frozen=True)
class ReadNote:
    """One partition of a read, as its task ran it."""

    stream: str
    split: str  # "sequence": a sequence range; "subject": every message of its subjects; "snapshot": last per subject
    partitions: int  # how many partitions the read (the micro-batch) has
    index: int  # which one this task read


def _task_key() -> str | None:
    """The running task's attempt id, qualified by the daemon that forked this worker (another Spark
    application on the host has its own), or None outside a Spark task."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - pyspark is there wherever a task runs
        return None
    ctx = TaskContext.get()
    if ctx is None:
        return None
    return str(ctx.taskAttemptId())


def _directory() -> Path:
    return Path(tempfile.gettempdir()) / f"pyspark-jetstream-{os.getuid() if hasattr(os, 'getuid') else 0}" \
        / f"tasks-{os.getppid()}"


def leave(note: ReadNote, *, key: str | None = None, directory: Path | None = None) -> None:
    """Record ``note`` for the write of the running task (``key``/``directory``: tests). Never fails the
    read: without the note, the sink orders what it gets as if it came through a shuffle."""
    key = key if key is not None else _task_key()
    if key is None:
        return
    where = directory or _directory()
    try:
        where.mkdir(parents=True, exist_ok=True)
        path = where / f"{key}.{note.stream}.{note.index}"
        scratch = path.with_suffix(path.suffix + ".tmp")
        scratch.write_text(json.dumps(asdict(note)))
        os.replace(scratch, path)  # whole or not at all for the reader
        _sweep(where)
    except OSError:
        return


def take(*, key: str | None = None, directory: Path | None = None) -> list[ReadNote]:
    """The notes the reads of the running task left, removed."""
    key = key if key is not None else _task_key()
    if key is None:
        return []
    where = directory or _directory()
    notes = []
    try:
        paths = [p for p in where.iterdir() if p.name.startswith(f"{key}.") and not p.name.endswith(".tmp")]
    except OSError:
        return []
    for path in paths:
        try:
            notes.append(ReadNote(**json.loads(path.read_text())))
            path.unlink()
        except (OSError, ValueError, TypeError):
            continue
    return notes


def _sweep(where: Path) -> None:
    global _last_sweep
    now = time.time()
    if now - _last_sweep < SWEEP_EVERY:
        return
    _last_sweep = now
    for path in where.iterdir():
        try:
            if now - path.stat().st_mtime > MAX_AGE:
                path.unlink()
        except OSError:
            continue
