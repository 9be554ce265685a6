"""What the running PySpark offers a Python data source: the one place that knows the versions.

**Why.** The connector does not depend on ``pyspark`` (see ``pyproject.toml``): a platform brings
its own (Databricks, EMR, Dataproc), Spark Connect users have ``pyspark-client``, and pip must
never replace either. So the PySpark found at run time may be any release since the Python Data
Source API appeared (4.0), and what later releases added is looked up here, by feature, once:

- 4.0: readers and writers, Arrow batches from ``read()``, ``DataSourceArrowWriter``.
- 4.1: ``DataSourceStreamArrowWriter`` (streaming writes in Arrow batches); before it, streaming
  writes get rows, which the sink turns into Arrow batches itself. Also ``pushFilters`` for batch
  readers, behind ``spark.sql.python.filterPushdown.enabled`` (:func:`pushdown_requested`); up to 4.3
  a pushed read is shared by every scan of a view, so nothing is narrowed there (:func:`scoped_pushdown`).
- 4.2: admission control for Python streaming sources (``latestOffset(start, limit)``,
  ``ReadLimit``) and ``Trigger.AvailableNow`` (``SupportsTriggerAvailableNow``). Before it, Spark
  calls ``latestOffset()`` with no arguments: a micro-batch reads everything new, and the read
  limit options are refused when the query starts (:func:`require_admission_control`).

Everything else imports these names from here, never from the version-specific modules.
"""

from __future__ import annotations

import re

MIN_VERSION = (4, 0)
"""The first PySpark with the Python Data Source API."""
_INSTALL = ("pip install 'pyspark>=4.0' (or 'pyspark-jetstream[spark]'; with Spark Connect, 'pyspark-client' "
            "on the client and the connector on the Connect server)")

try:
    import pyspark
except ImportError:  # one line that says what to do, not a traceback into Spark's modules
    raise ImportError(f"pyspark-jetstream needs PySpark 4.0 or newer, and no PySpark is installed: {_INSTALL}.") \
        from None


def _parse(version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


VERSION_TEXT: str = getattr(pyspark, "__version__", "unknown")
VERSION: tuple[int, int] = _parse(VERSION_TEXT)
if VERSION < MIN_VERSION:
    raise ImportError(f"pyspark-jetstream needs PySpark 4.0 or newer (the Python Data Source API); this is PySpark "
                      f"{VERSION_TEXT}: {_INSTALL}.")

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamWriter  # noqa: E402  (after the version check)

try:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    ADMISSION_CONTROL = True
    AVAILABLE_NOW_BASES: tuple[type, ...] = (SupportsTriggerAvailableNow,)
except ImportError:  # PySpark 4.0 and 4.1
    ADMISSION_CONTROL = False
    AVAILABLE_NOW_BASES = ()

    class ReadLimit:  # type: ignore[no-redef]
        """Stand-in: never passed by a PySpark without admission control."""

    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        pass

    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        def __init__(self, max_rows: int) -> None:
            self.max_rows = max_rows

try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as StreamWriterBase

    ARROW_STREAM_WRITER = True
except ImportError:  # PySpark 4.0: streaming writes are given rows
    StreamWriterBase = DataSourceStreamWriter  # type: ignore[assignment,misc]
    ARROW_STREAM_WRITER = False

ADMISSION_CONTROL_VERSION = "4.2"
"""The first PySpark that lets a Python streaming source limit its micro-batches."""


def require_admission_control(max_messages: int | None, min_messages: int | None) -> None:
    """Refuse, when the query starts, the read limits a PySpark without admission control would ignore
    (each micro-batch would read everything new: more, or sooner, than the user asked for).
    (``maxTriggerDelay`` is only accepted beside ``minMessagesPerTrigger``.)"""
    if ADMISSION_CONTROL:
        return
    from .errors import OptionError

    for name, value in (("maxMessagesPerTrigger", max_messages), ("minMessagesPerTrigger", min_messages)):
        if value is not None:
            raise OptionError(name, str(value),
                              f"Limiting micro-batches needs PySpark {ADMISSION_CONTROL_VERSION} or newer (admission "
                              f"control for Python streaming sources); this is PySpark {VERSION_TEXT}, where each "
                              "micro-batch reads everything new. Remove the option, or run on PySpark "
                              f"{ADMISSION_CONTROL_VERSION}+.")


PUSHDOWN = hasattr(DataSourceReader, "pushFilters")
"""Whether this PySpark offers filter pushdown to Python batch readers (4.1+)."""
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
_PUSHDOWN_PLANNER = "pyspark.sql.worker.data_source_pushdown_filters"


def pushdown_requested() -> bool:
    """Whether Spark is asking the data source for a reader to push filters into.

    PySpark 4.1 to 4.3 refuse every read (``DATA_SOURCE_PUSHDOWN_DISABLED``) of a reader whose class
    defines ``pushFilters`` while ``spark.sql.python.filterPushdown.enabled`` is false (the default),
    and ``reader()`` runs in a planner Python worker where no SparkSession (and no conf) can be
    reached (probed on 4.3.0: ``SparkSession.getActiveSession()`` is None there). What tells the two
    apart is the planner that calls ``reader()``: with the conf on and filters to push, Spark runs
    ``pyspark.sql.worker.data_source_pushdown_filters``, which calls ``pushFilters`` next; otherwise
    ``plan_data_source_read``, which refuses a reader that defines it when the conf is off. So the
    reader that defines ``pushFilters`` is returned only to the first. A PySpark that plans reads
    another way gets the plain reader: its reads work as without pushdown."""
    if not PUSHDOWN:
        return False
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        if _module_of(frame.f_globals) == _PUSHDOWN_PLANNER:
            return True
        frame = frame.f_back
    return False


def _module_of(scope: dict) -> str | None:
    """The module a frame's code belongs to. A planner started as ``python -m <module>`` (Spark's simple
    worker, without the daemon) runs as ``__main__``; its spec still names the module."""
    name = scope.get("__name__")
    if name == "__main__":
        spec = scope.get("__spec__")
        return getattr(spec, "name", None) or name
    return name


LAST_SHARED_PUSHDOWN = (4, 3)
"""The newest PySpark known to keep a scan's pushed read on the data source every scan of the view or
DataFrame shares (4.1 to 4.3: SPARK-FACTS.md): a narrowed read there answers other queries too."""


def scoped_pushdown(reader_class: type = DataSourceReader, version: tuple[int, int] | None = None) -> bool:
    """Whether a pushed filter may narrow a read: only on a PySpark that keeps the pushed read on its own
    scan. Spark's master does (``PythonScanBuilder`` holds the read), in the change that brought limit
    pushdown, whose Python API is ``DataSourceReader.pushLimit``; no release up to 4.3 has it. So: a
    PySpark newer than :data:`LAST_SHARED_PUSHDOWN` whose reader API has ``pushLimit`` (docs/architecture.md,
    issue #46). Everywhere else Spark filters every row and the read is the whole read."""
    version = VERSION if version is None else version
    return (hasattr(reader_class, "pushFilters") and version > LAST_SHARED_PUSHDOWN
            and hasattr(reader_class, "pushLimit"))
