"""Planning a read, on the driver: what a micro-batch or a batch read covers and how it is split.

Offsets, read limits and loss (:mod:`.offsets`), the stream's facts asked of the server
(:mod:`.stream_facts`), the partitions a read is cut into (:mod:`.partitions`), a split by subject
(:mod:`.subject_split`), and filter pushdown: what Spark's filters ask of the read
(:mod:`.filter_pushdown`) and the rules that keep a pushed filter to its own query
(:mod:`.pushdown_scope`, :mod:`.pushdown_registry`). Nothing here reads a message.
"""
