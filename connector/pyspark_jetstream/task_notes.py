"""What a Spark task's read of a stream tells the write running in the same task.

**Why.** Spark runs a narrow plan (read -> select/filter -> write) in one task per read partition:
the partition's rows go straight to the sink, in the task that read them. A read split into
sequence ranges spreads one subject's messages over every partition, so a narrow copy publishes
them from several tasks at once, out of order. After a shuffle (``repartition("subject")``) each
subject is in one write task, which orders its rows itself. The sink must tell the two apart
before it publishes anything, and nothing in the Python Data Source API says what feeds a
writer: only the task is shared. So the partition reader leaves a note (the stream, how the read
was split, which partition of how many) under the task's attempt id, and the sink, seeing its
first rows, takes the notes of its own task.

**Where (issue #47).** The read and the write of one task run in two Python workers of one
executor. Both are given the executor's block-manager directories (``SPARK_LOCAL_DIRS``, the same
list in the same order, whatever daemon forked them or environment they were given: probed,
docs/architecture.md, "Guards fail closed"), so the notes go under the first of them, one folder
per task attempt (an id no other attempt of the application has). Not the temp directory: a
worker's ``TMPDIR`` may be set per function (``spark.executorEnv``), and a full or read-only one
silently turned the guard off.

**Fails closed.** A read in a Spark task that cannot leave its note fails
(:class:`~pyspark_jetstream.errors.LocalDirectoryError`), so a note that is not there always means
that no read of the task got to run; a write that cannot look for its notes, or finds one it cannot
read, is refused the same way. Nothing is guessed.

**Swept.** A note no write takes (a read into ``count()``, Parquet, ...) is removed by age: each
process sweeps, at most every :data:`SWEEP_EVERY` seconds, the notes older than :data:`MAX_AGE`
that no running read holds. A read holds a shared ``flock`` on its note while it runs and touches
the note when it ends, so a slow read's note is never swept from under the write of its task.
Spark removes the block-manager directories when the application ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import LocalDirectoryError

SWEEP_EVERY = 300.0
MAX_AGE = 3600.0
FOLDER = "pyspark-jetstream-notes"
"""The folder under the first of ``SPARK_LOCAL_DIRS`` that holds the notes, one subfolder per task attempt."""
_last_sweep = 0.0

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: notes are swept by age alone
    fcntl = None  # type: ignore[assignment]


@dataclass(frozen=True)
class ReadNote:
    """One partition of a read, as its task ran it."""

    stream: str
    split: str  # "sequence": a sequence range; "subject": every message of its subjects; "snapshot": last per subject
    partitions: int  # how many partitions the read (the micro-batch) has
    index: int  # which one this task read


class HeldNote:
    """A note a running read holds (a shared lock, so no sweep takes it); :meth:`release` when the read ends."""

    def __init__(self, path: Path | None = None, fd: int | None = None) -> None:
        self.path, self.fd = path, fd

    def release(self) -> None:
        """The read is over: the note's age starts now (the write of its task takes it at its input's end)."""
        if self.path is not None:
            with contextlib.suppress(OSError):  # taken already (unlinked): nothing to keep
                os.utime(self.path)
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
        self.path = self.fd = None


def _task_key() -> str | None:
    """The running task's attempt id (unique in the application, as the block-manager directory is to it),
    or None outside a Spark task."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - pyspark is there wherever a task runs
        return None
    ctx = TaskContext.get()
    if ctx is None:
        return None
    return str(ctx.taskAttemptId())


def notes_root(environ: dict[str, str] | None = None) -> Path:
    """The notes' folder: under the first of ``SPARK_LOCAL_DIRS``, the one every Python worker of the executor is
    given. Not the first *usable* one: two workers must not pick differently, so a broken one is an error."""
    environ = os.environ if environ is None else environ
    first = environ.get("SPARK_LOCAL_DIRS", "").split(",")[0].strip()
    if not first:
        raise LocalDirectoryError(
            "This Spark executor gives its Python workers no SPARK_LOCAL_DIRS (the executors of PySpark 4.0 to 4.3 "
            "always do), so a read cannot leave, and a write cannot find, the note that tells the sink's order guard "
            "whether the write's rows come straight from a read split into sequence ranges. The connector does not "
            "guess another place both would share: run the executors with Spark's local directories set "
            "(spark.local.dir), or, for a write whose target needs no order per subject, set the sink option "
            "order='none'.")
    return Path(first) / FOLDER


def leave(note: ReadNote, *, key: str | None = None, root: Path | None = None) -> HeldNote:
    """Record ``note`` for the write of the running task (``key``/``root``: tests), held until the read ends.
    Outside a Spark task there is no write to tell: nothing is recorded. A note that cannot be written fails
    the read (:class:`LocalDirectoryError`): the guard it feeds would otherwise pass a copy it must refuse."""
    key = key if key is not None else _task_key()
    if key is None:
        return HeldNote()
    root = root if root is not None else notes_root()
    folder = root / key
    path = folder / f"{note.stream}.{note.index}"
    _sweep(root)
    for _ in range(3):
        try:
            return _write(folder, path, note)
        except FileNotFoundError:  # a sweep or the task's write removed the empty folder meanwhile: again
            continue
        except OSError as exc:
            raise _unwritable(note, folder, f"{type(exc).__name__}: {exc}") from None
    raise _unwritable(note, folder, "the folder was removed three times while the note was written")


def _write(folder: Path, path: Path, note: ReadNote) -> HeldNote:
    folder.mkdir(parents=True, exist_ok=True)
    scratch = folder / f".{path.name}.{os.getpid()}.tmp"
    scratch.write_text(json.dumps(asdict(note)))
    fd = os.open(scratch, os.O_RDONLY)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_SH)  # on the file itself: it survives the rename
        os.replace(scratch, path)  # whole or not at all for the write
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            scratch.unlink()
        raise
    return HeldNote(path, fd)


def _unwritable(note: ReadNote, folder: Path, cause: str) -> LocalDirectoryError:
    return LocalDirectoryError(
        f"This read of stream '{note.stream}' cannot leave its note for a write in the same Spark task in {folder} "
        f"({cause}). The sink's order guard needs the note to tell a copy straight from a read split into sequence "
        "ranges (refused: it would store subjects out of order) from one that went through a shuffle, and a guard "
        "that cannot tell refuses: so the read fails. The folder is under the executor's Spark local directory "
        "(spark.local.dir, where Spark keeps its shuffle files too): free space there, or make it writable by the "
        "user running the executors.", folder)


def take(*, key: str | None = None, root: Path | None = None) -> list[ReadNote]:
    """The notes the reads of the running task left, removed. None outside a Spark task, or when no read of this
    task left one (a read that could not would have failed the task). A lookup that fails, or a note that cannot
    be read, is a :class:`LocalDirectoryError`: the order guard cannot decide without them."""
    key = key if key is not None else _task_key()
    if key is None:
        return []
    folder = (root if root is not None else notes_root()) / key
    try:
        names = sorted(n for n in os.listdir(folder) if not n.startswith("."))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise _unreadable(folder, f"{type(exc).__name__}: {exc}") from None
    notes = []
    for name in names:
        path = folder / name
        try:
            notes.append(ReadNote(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError) as exc:
            raise _unreadable(path, f"{type(exc).__name__}: {exc}") from None
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    with contextlib.suppress(OSError):  # not empty: a later read of this task (coalesce) left one meanwhile
        folder.rmdir()
    return notes


def _unreadable(where: Path, cause: str) -> LocalDirectoryError:
    return LocalDirectoryError(
        f"This write cannot read the notes the reads of its Spark task left in {where} ({cause}), so the sink's order "
        "guard cannot tell whether its rows come straight from a read split into sequence ranges (which it must "
        "refuse: subjects would be stored out of order) or through a shuffle: refused. The folder is under the "
        "executor's Spark local directory (spark.local.dir): check its space and permissions; or, if the target "
        "needs no order per subject, set the sink option order='none'.", where)


def _sweep(root: Path) -> None:
    """Remove, at most every :data:`SWEEP_EVERY` seconds, the notes older than :data:`MAX_AGE` that no running
    read holds, and the empty folders of old task attempts. Best effort: it never fails a read."""
    global _last_sweep
    now = time.time()
    if now - _last_sweep < SWEEP_EVERY:
        return
    _last_sweep = now
    try:
        folders = list(root.iterdir())
    except OSError:
        return
    for folder in folders:
        try:
            idle = now - folder.stat().st_mtime > MAX_AGE  # before its old notes go (that touches it)
            for path in folder.iterdir():
                if now - path.stat().st_mtime > MAX_AGE and not _held(path):
                    path.unlink()
            if idle:
                folder.rmdir()  # fails while a note is in it; a read that loses the race writes again
        except OSError:
            continue


def _held(path: Path) -> bool:
    """Whether a running read holds the note (its shared lock)."""
    if fcntl is None:  # pragma: no cover - Windows
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return True  # gone or unreadable: not ours to remove
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)
