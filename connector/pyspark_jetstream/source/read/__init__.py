"""Reading a partition, on an executor: a Spark task's consumers, the consume loop, and its end.

A task reads its planned partition (:mod:`.partition`): it settles what it reads (:mod:`.ownership`,
the stream checked by :mod:`.stream_checks`), runs a :class:`~.partition_reader.PartitionReader` per
consumer (the consumer itself: :mod:`.consumer`; frames into rows: :mod:`.consume_loop`; when the read
is complete: :mod:`.completion`; where it stands in its range: :mod:`.range_tracker`), or reads a few
keys of a bucket by direct get (:mod:`.key_reader`).
"""
