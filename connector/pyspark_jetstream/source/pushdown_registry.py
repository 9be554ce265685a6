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

from ..logs import get_logger

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
