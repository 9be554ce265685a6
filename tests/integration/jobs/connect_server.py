"""A Spark Connect server on a port, from the PySpark of this interpreter (which must hold the
connector: data sources run on the server). Prints ``ready`` once it listens; stops when its
standard input closes.

Usage: python connect_server.py PORT
"""

import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession  # noqa: E402

spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
         .config("spark.connect.grpc.binding.address", "127.0.0.1")
         .config("spark.connect.grpc.binding.port", sys.argv[1]).getOrCreate())
print("ready", flush=True)
sys.stdin.read()
spark.stop()
