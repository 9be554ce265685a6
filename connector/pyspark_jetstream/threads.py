"""Writes from threads other than the one that created the SparkSession.

PySpark 4.3 (classic, pinned-thread mode) gives each Python thread its own JVM
thread, and a new JVM thread has no *active* SparkSession. ``df.write`` resolves a
Python data source through the active session, so ``format("jetstream").save()``
of a DataFrame built on another thread, from a ``threading.Thread`` or a
``ThreadPoolExecutor``, fails with ``DATA_SOURCE_NOT_FOUND`` although the same
write works on the main thread. Some session calls (``createDataFrame``) activate
the session in their thread as a side effect, which is why the failure looks
random; reads resolve through the DataFrame's own session and are not affected.
Spark does not copy the active session into new threads, not even in
``pyspark.InheritableThread`` (observed), so the thread has to set it.
"""

from __future__ import annotations

from typing import Any


def bind_session_to_thread(spark: Any) -> None:
    """Make ``spark`` the JVM's active session for the calling thread.

    Call it at the start of a thread (or of a pool task) that writes with
    ``format("jetstream")``. A no-op on Spark Connect sessions, which resolve data
    sources on the server.
    """
    jsession = getattr(spark, "_jsparkSession", None)
    jvm = getattr(spark, "_jvm", None)
    if jsession is None or jvm is None:
        return
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(jsession)
