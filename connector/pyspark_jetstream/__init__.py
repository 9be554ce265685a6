"""pyspark-jetstream: the Apache Spark connector for NATS JetStream.

After ``pip install pyspark-jetstream``, ``format("jetstream")`` works with no
registration call: Spark imports top-level ``pyspark_*`` modules and registers
their ``DefaultSource``. This module therefore imports only the data source
class (and the error types), never nats-py or pyarrow. Without PySpark 4.0 or newer (the
package does not require one: a platform brings its own), the import fails with one line
saying what to install (``spark_api``).
"""

from . import spark_api  # noqa: F401  (first: the PySpark check)
from .datasource import JetStreamDataSource
from .errors import (
    AckTimeoutError,
    DataLossError,
    JetStreamApiError,
    JetStreamConnectorError,
    LocalDirectoryError,
    NatsConnectError,
    OptionError,
    PartitionReadError,
    PublishError,
    SchemaError,
    ServerBinaryNotFound,
    StreamConfigError,
    StreamRecreatedError,
)
from .lookup import lookup
from .threads import bind_session_to_thread
from .write_check import check_write

DefaultSource = JetStreamDataSource

__version__ = "0.2.0"

__all__ = [
    "AckTimeoutError",
    "DataLossError",
    "DefaultSource",
    "JetStreamApiError",
    "JetStreamConnectorError",
    "JetStreamDataSource",
    "LocalDirectoryError",
    "NatsConnectError",
    "OptionError",
    "PartitionReadError",
    "PublishError",
    "SchemaError",
    "ServerBinaryNotFound",
    "StreamConfigError",
    "StreamRecreatedError",
    "bind_session_to_thread",
    "check_write",
    "lookup",
]
