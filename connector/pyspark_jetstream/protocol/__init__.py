"""Pure NATS and JetStream knowledge: no I/O, and neither nats-py nor pyspark imported (a test checks it)."""
