"""df.write / df.writeStream: checking the target, encoding rows, publishing with every PubAck awaited.

The rooms, in the order a row passes them:

* ``plan/``: on the driver, once per query: options, the input's columns, the target stream
  (``ensureStream``), the replay records' plan: a :class:`~.plan.sink_plan.SinkPlan`.
* ``spark_writers.py``: the writer classes Spark calls (thin); each task runs ``task/``.
* ``task/``: one task's write as a pipeline of the stages below, its refusals, dead letters and
  commit message.
* ``order/``: the batches in each subject's source order (``order=subject``), or counted where that
  order arrived broken (``order=none``).
* ``reduce/``: with ``sequenceBy``, each key's newest row, published under compare-and-set.
* ``encode/``: the rows checked and turned into ``HPUB`` frames with deterministic message ids.
* ``records/``: exactly-once past the duplicate window: what an earlier attempt of the run stored.
* ``publish/``: the frames published through a window of PubAcks, with the recovery that keeps a
  subject's order through a leader change or a retry.
"""
