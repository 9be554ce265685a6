"""Sensor alerts: JetStream -> streaming table -> JetStream, and a materialized view.

- ``readings``: a streaming table fed by the JetStream stream of sensor readings (JSON
  ``{"sensor", "reading", "temp"}``), each reading with its stream and sequence.
- ``alerts``: an append flow into the sink ``alert_stream`` (the JetStream stream of alerts):
  one message per reading at or above the threshold, on ``alerts.<sensor>``.
- ``sensor_stats``: a materialized view, per sensor: readings, highest temperature, alerts.

``spark`` is the pipeline's session, which ``spark-pipelines`` gives this module. Connection
settings come from the environment (``NATS_URL``, and ``NATS_CREDS``: a ``.creds`` file's path),
so no credential is written in the spec; the rest from the spec's ``configuration``.
"""

import os

from pyspark import pipelines as dp
from pyspark.sql import functions as F

SOURCE_STREAM = spark.conf.get("spark.sensor_alerts.sourceStream", "SENSORS")  # noqa: F821 (given by spark-pipelines)
ALERT_STREAM = spark.conf.get("spark.sensor_alerts.alertStream", "ALERTS")  # noqa: F821
THRESHOLD = float(spark.conf.get("spark.sensor_alerts.threshold", "90"))  # noqa: F821

CONNECTION = {"servers": os.environ.get("NATS_URL", "nats://127.0.0.1:4222")}
if os.environ.get("NATS_CREDS"):
    CONNECTION["credsFile"] = os.environ["NATS_CREDS"]

READING = "sensor string, reading long, temp double"


@dp.table(comment="Sensor readings from JetStream, each with its stream and sequence")
def readings():
    messages = (
        spark.readStream.format("jetstream")  # noqa: F821
        .options(**CONNECTION)
        .option("stream", SOURCE_STREAM)
        .option("startingOffsets", "earliest")  # the first run reads the whole stream
        .load()
    )
    reading = F.from_json(F.col("data").cast("string"), READING)
    return messages.select(reading.alias("r"), "stream", "seq").select("r.*", "stream", "seq")


# A pipeline sink is an append-mode streaming write with a checkpoint the pipeline keeps (under
# the spec's storage). ensureStream=create creates the alert stream on the first run.
dp.create_sink(
    "alert_stream",
    "jetstream",
    {**CONNECTION, "stream": ALERT_STREAM, "ensureStream": "create",
     "stream.subjects": f"{ALERT_STREAM.lower()}.>"},
)


@dp.append_flow(target="alert_stream")
def alerts():
    return (
        spark.readStream.table("readings")  # noqa: F821
        .where(F.col("temp") >= THRESHOLD)
        .select(
            F.concat(F.lit(f"{ALERT_STREAM.lower()}."), "sensor").alias("subject"),
            F.to_json(F.struct("sensor", "reading", "temp",
                               F.col("seq").alias("source_seq"))).alias("data"),
            # The reading's position: the sink's Nats-Msg-Id is built from it, so a micro-batch
            # run again (a restart) stores nothing twice; and each sensor's alerts keep its order.
            "stream", "seq",
        )
        .repartition(2, "subject")  # each sensor's alerts in one write task, in reading order
    )


@dp.materialized_view(comment="Per sensor: readings, highest temperature, alerts")
def sensor_stats():
    return (
        spark.read.table("readings")  # noqa: F821
        .groupBy("sensor")
        .agg(F.count("*").alias("readings"), F.max("temp").alias("max_temp"),
             F.count_if(F.col("temp") >= THRESHOLD).alias("alerts"))
    )
