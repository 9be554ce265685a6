"""Where the sort spills its sorted runs, and how the runs of a killed task go away (issue #39).

**Why.** ``tempfile.gettempdir()`` is often a tmpfs (memory again) or a container's writable layer;
Spark gives each Python worker its executor's local directories instead (``SPARK_LOCAL_DIRS``: the
block manager's ``<spark.local.dir>/blockmgr-<uuid>``, sized for shuffles and removed by Spark when
the application ends). The runs go under the first usable one, the temp dir only when there is none.

A task removes its folder when it ends in any way it can see (``SortedRows.close``). A task killed
by SIGKILL (speculation, a cancel, the OOM killer) cannot, and a long application keeps its local
directories for days: so each folder is named after the worker's pid (and the task attempt, for
whoever looks), and every sort that starts sweeps the folders whose pid is no longer running. A pid
reused by a new process only keeps a dead task's folder until a later sweep; a live task's folder is
never taken (its pid runs).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Mapping

PREFIX = "pyspark-jetstream-sort-"
"""``<PREFIX><pid>-<task attempt id>-<random>``: one folder per sorting task."""


def spill_root(environ: Mapping[str, str] | None = None) -> str:
    """The first of ``SPARK_LOCAL_DIRS`` that is a directory this process can write into, else the
    temp dir."""
    environ = os.environ if environ is None else environ
    for candidate in environ.get("SPARK_LOCAL_DIRS", "").split(","):
        candidate = candidate.strip()
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return candidate
    return tempfile.gettempdir()


def task_folder(root: str) -> str:
    """A new folder under ``root`` for the running task's runs, named for :func:`sweep`."""
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-{_task_attempt()}-", dir=root)


def sweep(root: str) -> list[str]:
    """Remove the folders under ``root`` left by processes that are gone; the names removed."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    removed = []
    for name in names:
        pid = _owner(name)
        if pid is None or _running(pid):
            continue
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        removed.append(name)
    return removed


def remove(folder: str | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def _owner(name: str) -> int | None:
    if not name.startswith(PREFIX):
        return None
    pid = name[len(PREFIX):].split("-", 1)[0]
    return int(pid) if pid.isdigit() else None


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: running
        return True
    return True


def _task_attempt() -> str:
    with contextlib.suppress(ImportError):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None:
            return str(ctx.taskAttemptId())
    return "none"
