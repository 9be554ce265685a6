"""spark.read / spark.readStream: planning offsets and ranges, reading a partition, building Arrow batches."""
