"""Pushdowns of one relation close together in time: several scans of it in one query.

**Why.** Spark gives every scan of a DataFrame or view the read the *last* filter pushdown on it
planned (PySpark 4.1 to 4.3, :mod:`.pushdown_scope`). A query that scans the same relation twice,
both scans with filters to push (a self-join: Spark adds ``IsNotNull`` on the join keys of both
sides), plans two pushed reads one after the other in the same optimizer pass, and both scans then
read the second. If the second narrowed (``key = 'a'``), the other side reads only that key.

So each pushdown notes, on the driver's disk, when it planned a read of its relation (the data
source's token, made once per ``load()`` or view: :class:`~pyspark_jetstream.datasource.JetStreamDataSource`),
and a pushdown that finds another of the same relation noted within :data:`WINDOW_S` plans the whole
read: it is what every scan of that query gets, and Spark filters each scan's rows itself. The
planner runs in short-lived Python workers of the driver, so the note is a file, not a variable.
"""

from __future__ import annotations

import os
import tempfile
import time

from ...logs import get_logger

log = get_logger("source")

WINDOW_S = 5.0
"""How close two pushdowns of one relation must be to count as one query's. One query's scans are
planned in one optimizer pass (each pushdown a few server round trips); two queries a user runs one
after the other are rarely this close, and when they are the later one only reads more (and Spark
filters it): slower, never wrong."""


def _path(token: str) -> str:
    folder = os.path.join(tempfile.gettempdir(), f"pyspark-jetstream-pushdowns-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return os.path.join(folder, token)


def another_scan_close_by(token: str | None, now: float | None = None) -> bool:
    """Note a pushdown of relation ``token`` now, and say whether another was noted within the window.
    No token (a data source pickled by an older release) or no usable disk: assume another scan
    (the whole read is always right)."""
    if not token:
        return True
    now = time.time() if now is None else now
    try:
        path = _path(token)
        try:
            before = os.stat(path).st_mtime
        except FileNotFoundError:
            before = None
        with open(path, "a"):
            pass
        os.utime(path, (now, now))
    except OSError as exc:
        log.warning("filter pushdown: cannot note the pushdown on the driver's disk (%s); reading the whole range", exc)
        return True
    return before is not None and abs(now - before) < WINDOW_S


def claim_partition(plan: str, execution: str, index: int, reader: str) -> bool:
    """Note that ``reader`` (a task's stage and partition in its stage) reads partition ``index`` of
    pushed plan ``plan`` for SQL execution ``execution``; False when another reader of the same
    execution noted it first: two scans of one query share the plan (a ``UNION ALL`` of a lookup and
    the whole view, a scalar subquery over it), and one of them reads a narrowing meant for the other.
    A retried or speculative task is the same reader. Tasks of one execution on other hosts are not
    seen: there the rule cannot help (docs/source.md says so)."""
    folder = os.path.join(tempfile.gettempdir(), f"pyspark-jetstream-scans-{os.getuid()}")
    path = os.path.join(folder, f"{plan}.{execution}.{index}")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        _sweep(folder)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            with open(path) as f:
                return f.read() == reader
        with os.fdopen(fd, "w") as f:
            f.write(reader)
        return True
    except OSError as exc:
        log.warning("filter pushdown: cannot note a scan on this host's disk (%s)", exc)
        return True


_last_sweep = 0.0


def _sweep(folder: str, max_age: float = 3600.0) -> None:
    """Remove notes older than an hour, at most once a minute per process."""
    global _last_sweep
    now = time.time()
    if now - _last_sweep < 60:
        return
    _last_sweep = now
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        try:
            if now - os.stat(path).st_mtime > max_age:
                os.unlink(path)
        except OSError:
            continue
