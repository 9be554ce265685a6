"""spark.read / spark.readStream, in the order a micro-batch passes the rooms.

- :mod:`.spark_readers` (and :mod:`.pushdown_reader`): the classes Spark calls on the driver;
- :mod:`.plan`: offsets, ranges, splits and pushed filters, on the driver;
- :mod:`.read`: a task reading its partition, on an executor;
- :mod:`.columns`: the Arrow batch built from what the task read, on Spark's task thread.
"""
