"""Spark Connect: the connector from a thin client session (``SparkSession.builder.remote``).

    python examples/spark_connect.py                              # a local Connect server in this process
    python examples/spark_connect.py --remote sc://localhost:15002 # a Connect server started as below
    python examples/spark_connect.py --servers nats://host:4222   # (default: an embedded nats-server)

Python data sources run on the Connect *server*: install ``pyspark-jetstream`` where the server
and its Python workers run (their ``PYSPARK_PYTHON`` must import it); the client needs only
``pyspark[connect]``. No registration call is needed on either side.

**Starting a Connect server.** PySpark from pip ships the script and the Connect jar (PySpark 4.x):

    PYSPARK_PYTHON="$(which python)" \\
      "$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')/sbin/start-connect-server.sh" \\
      --master 'local[2]'

It listens on ``sc://localhost:15002`` (``--conf spark.connect.grpc.binding.port=N`` for another
port) and runs in the background, logging under the pyspark directory's ``logs/`` (set
``SPARK_LOG_DIR`` to move them); ``sbin/stop-connect-server.sh`` next to it stops it, and
``--wait`` as the first argument keeps it in the foreground instead. A Spark 4 distribution's
``$SPARK_HOME/sbin/start-connect-server.sh`` is the same script; a build without the Connect jar
needs ``--packages org.apache.spark:spark-connect_2.13:<its Spark version>``. For a quick local
try there is no server to start: ``--remote local[2]`` (this script's default, as
``SparkSession.builder.remote("local[2]")``) or the shell ``pyspark --remote local`` start one
inside the client's own process.

What it does: publishes a few orders with TTLs through the sink (``ensureStream=create``), reads
them back with a batch read, copies them with a streaming query (``availableNow``) into a second
stream, and prints what each step saw.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile

# A Connect server started by this script (the default) runs its Python workers with this interpreter.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

ORDERS = "CONNECT_ORDERS"
COPY = "CONNECT_ORDERS_COPY"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--remote", default="local[2]",
                        help="Spark Connect URL (sc://host:port), or local[N] to start a server in this process")
    parser.add_argument("--servers", help="NATS URL(s); default: start an embedded nats-server")
    args = parser.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    with contextlib.ExitStack() as stack:
        servers = args.servers
        if servers is None:
            from pyspark_jetstream.tools.server import EmbeddedNatsServer

            servers = stack.enter_context(EmbeddedNatsServer()).url
            print(f"Started an embedded nats-server at {servers}")
        spark = SparkSession.builder.remote(args.remote).getOrCreate()
        stack.callback(spark.stop)
        print(f"Spark Connect session to {args.remote} (Spark {spark.version}, client {type(spark).__module__})")

        orders = spark.createDataFrame(
            [(f"corders.c{i % 3}", f'{{"id": {i}}}', "1h" if i % 2 else None) for i in range(6)],
            "subject string, data string, ttl string")
        (orders.coalesce(1).write.format("jetstream").mode("append").option("servers", servers).option("stream", ORDERS)
         .option("ensureStream", "create").option("stream.subjects", "corders.>").save())
        print(f"Published 6 orders to stream {ORDERS}")

        read = spark.read.format("jetstream").option("servers", servers).option("stream", ORDERS).load()
        for row in read.orderBy("seq").collect():
            print(f"  read back: seq {row.seq} {row.subject} {row.data.decode()} ttl={row.ttl}")

        checkpoint = stack.enter_context(tempfile.TemporaryDirectory(prefix="connect-checkpoint-"))
        copy = (spark.readStream.format("jetstream").option("servers", servers).option("stream", ORDERS)
                .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", 4).load()
                .select(F.concat(F.lit("copy."), "subject").alias("subject"), "data", "ttl", "stream", "seq")
                .repartition(2, "subject"))  # each subject written by one task, in source order
        query = (copy.writeStream.format("jetstream").option("servers", servers).option("stream", COPY)
                 .option("ensureStream", "create").option("stream.subjects", "copy.>")
                 .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        query.awaitTermination()
        if query.exception() is not None:
            print(f"The streaming copy failed: {query.exception()}", file=sys.stderr)
            return 1
        copied = spark.read.format("jetstream").option("servers", servers).option("stream", COPY).load()
        print(f"Streaming copy: {copied.count()} messages in {COPY} after {len(query.recentProgress)} micro-batches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
