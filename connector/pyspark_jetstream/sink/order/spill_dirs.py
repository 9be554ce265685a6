"""Where the sort spills its sorted runs, and how the runs of a killed task go away (issues #39, #47).

**Why.** ``tempfile.gettempdir()`` is often a tmpfs (memory again) or a container's writable layer;
Spark gives each Python worker its executor's local directories instead (``SPARK_LOCAL_DIRS``: the
block manager's ``<spark.local.dir>/blockmgr-<uuid>``, sized for shuffles and removed by Spark when
the application ends). The runs go under the first usable one, the temp dir only when there is none
(the runs are read back by the process that wrote them: no other process has to find them).

A task removes its folder when it ends in any way it can see (``SortedRows.close``). A task killed
by SIGKILL (speculation, a cancel, the OOM killer) cannot, and a long application keeps its local
directories for days: so each folder is claimed by an exclusive ``flock`` on a file inside it, held
for the task's life, and every sort that starts sweeps the folders whose lock it can take. The kernel
lets a lock go when its process dies, however it dies, and a lock means the same in every PID
namespace (containers sharing a spill root): a pid does not (issue #47: a folder named after a pid
of another namespace was swept from under its live task, or one reused kept forever).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Mapping

from ...errors import LocalDirectoryError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: folders are left to Spark's own cleanup
    fcntl = None  # type: ignore[assignment]

PREFIX = "pyspark-jetstream-sort-"
"""``<PREFIX><task attempt id>-<random>``: one folder per sorting task."""
LOCK = ".claim"
"""The file in a folder its task holds an exclusive ``flock`` on."""
CLAIM_GRACE = 60.0
"""A folder with no lock file is being created (microseconds), or its task died in between: swept only when
older than this."""


class SpillFolder:
    """A task's spill folder, claimed (module docstring) until :meth:`remove`."""

    def __init__(self, path: str, fd: int | None) -> None:
        self.path, self.fd = path, fd

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self.fd is not None:
            os.close(self.fd)  # the claim goes last: no sweep takes a folder still being removed
            self.fd = None


def spill_root(environ: Mapping[str, str] | None = None) -> str:
    """The first of ``SPARK_LOCAL_DIRS`` that is a directory this process can write into, else the
    temp dir."""
    environ = os.environ if environ is None else environ
    for candidate in environ.get("SPARK_LOCAL_DIRS", "").split(","):
        candidate = candidate.strip()
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return candidate
    return tempfile.gettempdir()


def task_folder(root: str) -> SpillFolder:
    """A new folder under ``root`` for the running task's runs, claimed for :func:`sweep`."""
    path = None
    try:
        path = tempfile.mkdtemp(prefix=f"{PREFIX}{_task_attempt()}-", dir=root)
        fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise missing(path or root, exc) from None
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a folder of its own, just made: nobody else holds it
    return SpillFolder(path, fd)


def missing(where: str, exc: BaseException) -> LocalDirectoryError:
    """The error for a spill folder that cannot be made, written or read back (removed while the task ran)."""
    return LocalDirectoryError(
        f"The sort of this write's rows (order=subject, past order.maxBufferBytes) cannot use its spill folder {where} "
        f"({type(exc).__name__}: {exc}): its rows cannot be put back in source order, so the write stops. The folder is "
        "under the executor's Spark local directory (spark.local.dir) or the temp dir: check its space and "
        "permissions, and that nothing else removes folders there while tasks run; or raise order.maxBufferBytes.",
        where)


def sweep(root: str) -> list[str]:
    """Remove the folders under ``root`` that no live task claims; the names removed."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    removed = []
    for name in names:
        if not name.startswith(PREFIX):
            continue
        folder = os.path.join(root, name)
        fd = _unclaimed(folder)
        if fd is None:
            continue
        try:
            shutil.rmtree(folder, ignore_errors=True)  # under the lock: no other sweep removes it at once
        finally:
            if fd >= 0:
                os.close(fd)
        removed.append(name)
    return removed


def _unclaimed(folder: str) -> int | None:
    """The lock of ``folder`` taken (its fd; -1 for a folder that never got a lock file), or None: still claimed."""
    if fcntl is None:  # pragma: no cover - Windows
        return None
    try:
        fd = os.open(os.path.join(folder, LOCK), os.O_RDONLY)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            if time.time() - os.stat(folder).st_mtime > CLAIM_GRACE:
                return -1
        return None
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _task_attempt() -> str:
    with contextlib.suppress(ImportError):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None:
            return str(ctx.taskAttemptId())
    return "none"
