"""Publishing a task's rows in source order (sink option ``order=subject``, the default).

**Why.** The source splits a read into sequence ranges (each message delivered once, whatever the
subjects: docs/architecture.md, "Where order is kept"), so one subject's messages are spread
over every read partition. A copy keeps each subject's order when each subject is written by
one task, in source sequence order:

* ``repartition(n, "subject")`` (for a bucket, ``"key"``) before the write puts each subject in
  one task, but a reduce task receives the blocks of several read tasks in no fixed order;
  :class:`~.sorted_rows.SortedRows` puts the task's rows back in source sequence order (the ``seq`` column)
  before they are published. A sort is refused on a streaming DataFrame, and the sink sees all
  of its task's rows: it is the one place that can do it.
* Without a shuffle, the write runs in the read's task (a narrow plan), and one subject's rows
  are in every task: nothing a task can do keeps their order. :func:`decide` tells that case from
  the notes the read left in the task (:mod:`~pyspark_jetstream.task_notes`) and the write is
  refused before anything is published (:class:`~pyspark_jetstream.errors.OrderError`). Rows
  straight from a read that keeps each subject in one partition (``split=subject``, one range,
  ``coalesce(1)``) are in order as read, and are sorted all the same (a narrow
  ``sortWithinPartitions`` could have reordered them).
* Rows that reach the sink by any other way (a cache, a shuffle by something else than the
  subject) cannot be checked from one task: each task reports a small sample of its subjects
  (:class:`~.subject_sample.SubjectSample`) and the driver says, in the commit's log line, when two tasks wrote
  one subject.

The rows held are sorted by :mod:`.sorted_rows` (within ``order.maxBufferBytes``, spilling beyond), the
samples are :mod:`.subject_sample`'s, and :mod:`.stage` runs all of it for a task.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import OrderError
from ...task_notes import ReadNote

PUBLISH = "publish"
"""Publish rows as they come: without the source's ``seq`` there is nothing to order them by."""
SORT = "sort"
"""Hold the task's rows and publish them in source sequence order (:class:`~.sorted_rows.SortedRows`)."""


def decide(notes: Sequence[ReadNote], has_positions: bool, describe_target: str, *, ended: bool = False) -> str:
    """How a task with ``order=subject`` publishes: :data:`PUBLISH`, :data:`SORT` or an
    :class:`OrderError` (module docstring). ``notes``: what the reads of this task left so far;
    ``has_positions``: the rows carry the source's ``stream`` and ``seq`` columns; ``ended``: the task's
    input is over (its notes are all there).

    The rule is a property of the query: a read split into sequence ranges always has as many
    partitions as its split (source/plan/partitions.py pads ranges past the data), so a write fed straight from
    it sees one range of several at one message as at a million, and is refused. A task that reads
    every range itself (``coalesce(1)``) has all of them by the end of its input: its rows are held
    (and sorted) until then, and published only when every range was its own."""
    for stream, partitions, indexes in _split_reads(notes):
        if ended or not has_positions:
            raise OrderError(
                f"This write to {describe_target} gets its rows straight from a read of stream '{stream}' split into "
                f"{partitions} sequence ranges, and this task reads {len(indexes)} of them while the others are "
                "written by their own tasks at the same time: a subject's messages would be stored out of their "
                "source order. Add `.repartition(n, \"subject\")` (for a bucket, `\"key\"`) before the write, "
                "keeping the columns 'stream' and 'seq': each subject is then written by one task, which publishes "
                "its rows in source order. Or read with numPartitions=1, or set the sink option order='none' if "
                "the target does not need each subject's order (an append-only log, say). See docs/source.md, "
                "'Splits: order per subject'." + ("" if has_positions else " (Without the column 'seq', rows cannot "
                                                 "be held and put back in order, so even `coalesce(1)` is refused.)"))
    # Rows straight from a read that keeps each subject in one partition come in order, unless a narrow
    # transformation reordered them (sortWithinPartitions): sorted all the same, wherever they come from.
    # A read not yet seen whole (coalesce(1) still to read its other ranges): held until the end, checked again.
    return SORT if has_positions else PUBLISH


def _split_reads(notes: Sequence[ReadNote]) -> list[tuple[str, int, set[int]]]:
    """The reads split into several sequence ranges of which these notes hold only some."""
    by_read: dict[tuple[str, str, int], set[int]] = {}
    for note in notes:
        by_read.setdefault((note.stream, note.split, note.partitions), set()).add(note.index)
    return [(stream, partitions, indexes) for (stream, split, partitions), indexes in sorted(by_read.items())
            if split == "sequence" and partitions > 1 and len(indexes) < partitions]


