"""Publishing a task's rows in source order (sink option ``order=subject``, the default).

**Why.** The source splits a read into sequence ranges (each message delivered once, whatever the
subjects: docs/architecture.md, "Where order is kept"), so one subject's messages are spread
over every read partition. A copy keeps each subject's order when each subject is written by
one task, in source sequence order:

* ``repartition(n, "subject")`` (for a bucket, ``"key"``) before the write puts each subject in
  one task, but a reduce task receives the blocks of several read tasks in no fixed order;
  :class:`SortedRows` puts the task's rows back in source sequence order (the ``seq`` column)
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
  (:class:`SubjectSample`) and the driver says, in the commit's log line, when two tasks wrote
  one subject.

Memory is bounded by the option ``order.maxBufferBytes``: beyond it, the rows held are sorted and
written to a local file (Arrow IPC), and the sorted runs are merged when the task's input ends.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import OrderError
from ..task_notes import ReadNote

PUBLISH = "publish"
"""Publish rows as they come: without the source's ``seq`` there is nothing to order them by."""
SORT = "sort"
"""Hold the task's rows and publish them in source sequence order (:class:`SortedRows`)."""
SPILL_ROWS = 8192
"""Rows per batch of a spilled run (the merge reads them a batch per run at a time)."""


def decide(notes: Sequence[ReadNote], has_positions: bool, describe_target: str, *, ended: bool = False) -> str:
    """How a task with ``order=subject`` publishes: :data:`PUBLISH`, :data:`SORT` or an
    :class:`OrderError` (module docstring). ``notes``: what the reads of this task left so far;
    ``has_positions``: the rows carry the source's ``stream`` and ``seq`` columns; ``ended``: the task's
    input is over (its notes are all there).

    The rule is a property of the query: a read split into sequence ranges always has as many
    partitions as its split (source/reader.py pads ranges past the data), so a write fed straight from
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


class SortedRows:
    """A task's Arrow batches, given back in ``seq`` order (stable; rows without a sequence last, in the
    order they came), holding at most ``max_bytes`` in memory (module docstring)."""

    def __init__(self, seq: str, max_bytes: int, directory: str | None = None) -> None:
        self.seq = seq
        self.max_bytes = max_bytes
        self.directory = directory
        self.held: list[Any] = []
        self.held_bytes = 0
        self.runs: list[str] = []
        self.rows = 0

    def add(self, batch: Any) -> None:
        if batch.num_rows == 0:
            return
        self.held.append(batch)
        self.held_bytes += batch.nbytes
        self.rows += batch.num_rows
        if self.held_bytes > self.max_bytes:
            self._spill()

    def _sorted_held(self) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        table = pa.Table.from_batches(self.held)
        self.held, self.held_bytes = [], 0
        order = pc.sort_indices(table, sort_keys=[(self.seq, "ascending")])  # nulls last: the default
        return table.take(order)

    def _spill(self) -> None:
        import pyarrow as pa

        table = self._sorted_held()
        handle, path = tempfile.mkstemp(prefix="pyspark-jetstream-order-", suffix=".arrow", dir=self.directory)
        os.close(handle)
        self.runs.append(path)
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=SPILL_ROWS):
                writer.write_batch(batch)

    def batches(self, size: int) -> Iterator[Any]:
        """The rows in order, in batches of at most ``size`` rows."""
        if not self.runs:
            if self.held:
                yield from self._sorted_held().to_batches(max_chunksize=size)
            return
        if self.held:
            self._spill()
        yield from _merge(self.runs, self.seq, size)

    def close(self) -> None:
        self.held = []
        for path in self.runs:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self.runs = []


def _merge(paths: list[str], seq: str, size: int) -> Iterator[Any]:
    """Merge sorted Arrow IPC runs by ``seq``: each round takes, from the batch at the head of every run,
    the rows up to the smallest of the heads' last sequences (so every row taken is in place), sorts
    them (stably: runs in the order they were written), and moves on; rows without a sequence come
    last, run by run."""
    import pyarrow as pa
    import pyarrow.compute as pc

    readers = [pa.ipc.open_file(pa.memory_map(p)) for p in paths]
    nexts = [iter(range(r.num_record_batches)) for r in readers]
    heads: list[Any] = [None] * len(readers)
    nulls: list[list[Any]] = [[] for _ in readers]

    def refill(i: int) -> None:
        while heads[i] is None or heads[i].num_rows == 0:
            k = next(nexts[i], None)
            if k is None:
                heads[i] = None
                return
            batch = readers[i].get_batch(k)
            valid = pc.is_valid(batch.column(seq))
            if valid.false_count:  # nulls sort last: everything after them in this run is null too
                nulls[i].append(batch.filter(pc.invert(valid)))
                batch = batch.filter(valid)
            heads[i] = batch

    for i in range(len(readers)):
        refill(i)
    while any(h is not None for h in heads):
        live = [i for i, h in enumerate(heads) if h is not None]
        bound = min(h.column(seq)[-1].as_py() for h in (heads[i] for i in live))
        taken = []
        for i in live:
            head = heads[i]
            cut = int(pc.sum(pc.less_equal(head.column(seq), bound)).as_py() or 0)
            if cut:
                taken.append(head.slice(0, cut))
                heads[i] = head.slice(cut)
        table = pa.Table.from_batches(taken)
        table = table.take(pc.sort_indices(table, sort_keys=[(seq, "ascending")]))
        yield from table.to_batches(max_chunksize=size)
        for i in live:
            refill(i)
    for run in nulls:
        for batch in run:
            yield from (batch.slice(k, size) for k in range(0, batch.num_rows, size))


@dataclass(frozen=True)
class SubjectSample:
    """The subjects with the smallest hashes among those a task wrote (a bottom-k sample): two tasks'
    samples share a subject only if both wrote it, and when many subjects are in several tasks
    (a narrow read split by sequence, a shuffle by something else) the smallest hashes are the
    same in each, so the driver sees it. Rare shared subjects may be missed: it is a warning, the
    refusal in :func:`decide` is the guard."""

    entries: tuple[tuple[int, str], ...] = ()

    K = 64

    def merged(self, subjects: Any) -> SubjectSample:
        """With the distinct values of an Arrow string array ``subjects`` (nulls skipped)."""
        import pyarrow.compute as pc

        found = dict(self.entries)
        bound = max(found) if len(found) >= self.K else None
        for subject in pc.unique(subjects.drop_null()).to_pylist():
            text = subject if isinstance(subject, str) else bytes(subject).decode("utf-8", "replace")
            h = zlib.crc32(text.encode()) << 32 | zlib.adler32(text.encode())
            if bound is not None and h >= bound:
                continue
            found[h] = text
            if len(found) > self.K:
                del found[max(found)]
                bound = max(found)
        return SubjectSample(tuple(sorted(found.items())))


def shared_subjects(samples: Sequence[tuple[int, SubjectSample]]) -> dict[str, list[int]]:
    """Subjects that appear in the samples of more than one task: subject -> the tasks' partitions."""
    seen: dict[str, list[int]] = {}
    for partition, sample in samples:
        for _, subject in sample.entries:
            seen.setdefault(subject, []).append(partition)
    return {s: sorted(p) for s, p in seen.items() if len(set(p)) > 1}
