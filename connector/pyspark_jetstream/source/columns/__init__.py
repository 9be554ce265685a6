"""Building columns: the raw lists a partition's reader collected become the read's Arrow batch.

Which columns a read produces (:mod:`.selection`: the fixed schema, ``includeHeaders=false`` or a
schema the user gives), the batch built from raw messages on Spark's task thread (:mod:`.rows`), and
the header-derived columns decoded column-wise (:mod:`.header_columns`). Free of I/O.
"""
