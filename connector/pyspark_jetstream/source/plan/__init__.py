"""Planning a read, on the driver: what a micro-batch or a batch read covers and how it is split.

Offsets, read limits and loss (:mod:`.offsets`), the stream's facts asked of the server
(:mod:`.stream_facts`), the partitions a read is cut into (:mod:`.partitions`), a split by subject
(:mod:`.subject_split`), and what Spark's pushed filters ask of the read (:mod:`.filter_pushdown`, used
only on a PySpark that keeps a pushed read to its own scan). Nothing here reads a message.
"""
