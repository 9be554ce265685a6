"""Logging that is visible where Spark runs the connector's driver-side code.

The driver-side hooks (writer commit, stream reader planning) run in Python
processes that Spark starts and that configure no logging, so records at INFO
would vanish. When neither the application nor the root logger has a handler,
the connector's logger gets one on stderr (which Spark forwards to the driver's
console or log); an application that configures logging keeps full control.

``PYSPARK_JETSTREAM_LOG_LEVEL`` (``DEBUG``, ``INFO``, ...) sets the level in every
process that inherits the environment, executors' Python workers included
(``spark.executorEnv.PYSPARK_JETSTREAM_LOG_LEVEL`` on a cluster).
"""

from __future__ import annotations

import logging
import os
import sys

ROOT = "pyspark_jetstream"


def get_logger(name: str) -> logging.Logger:
    base = logging.getLogger(ROOT)
    if not base.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        base.addHandler(handler)
        if base.level == logging.NOTSET:
            base.setLevel(logging.INFO)
    level = os.environ.get("PYSPARK_JETSTREAM_LOG_LEVEL", "").strip().upper()
    if level in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        base.setLevel(level)
    return logging.getLogger(f"{ROOT}.{name}")
