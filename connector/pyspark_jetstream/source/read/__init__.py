"""Reading a partition, on an executor: a Spark task's consumer, its consume loop, and its end."""
