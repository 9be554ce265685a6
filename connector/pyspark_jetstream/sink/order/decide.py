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

Memory is bounded by the option ``order.maxBufferBytes``: beyond it, the rows held are merged into a
sorted run file (Arrow IPC) under Spark's local directories (:mod:`.spill_dirs`), and the runs are
merged when the task's input ends, a bounded round at a time (:class:`SortedRows`).
"""

from __future__ import annotations

import contextlib
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import OrderError
from ...task_notes import ReadNote

PUBLISH = "publish"
"""Publish rows as they come: without the source's ``seq`` there is nothing to order them by."""
SORT = "sort"
"""Hold the task's rows and publish them in source sequence order (:class:`SortedRows`)."""
SPILL_ROWS = 8192
"""Rows per batch of a spilled run (the merge reads them a batch per run at a time)."""
MIN_ROUND_ROWS = 256
"""The fewest rows a merge round looks at in each source it takes from (:func:`_merge`)."""


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
    order they came), holding about ``max_bytes`` in memory at most (module docstring).

    Each batch is sorted as it comes (kept as it is when it is in order already: a shuffle hands a
    task each read task's rows in order) and appended to an in-memory run of sorted batches. Beyond
    ``max_bytes`` the runs are merged into a sorted run file under the task's spill folder
    (:mod:`.spill_dirs`), and at the end the files and what is held are merged. A merge copies a
    bounded round of rows at a time (:func:`_merge`), never the whole: the peak stays about
    ``max_bytes`` (docs/sink.md, ``order.maxBufferBytes``). ``directory``: where the spill folder
    goes (default: Spark's local directories)."""

    def __init__(self, seq: str, max_bytes: int, directory: str | None = None) -> None:
        from . import spill_dirs

        self.seq = seq
        self.max_bytes = max_bytes
        self.root = directory if directory is not None else spill_dirs.spill_root()
        spill_dirs.sweep(self.root)  # the folders of killed tasks
        self.folder: str | None = None  # created at the first spill
        self.held: list[list[Any]] = []  # in-memory runs: lists of sorted batches, each run in order
        self.held_bytes = 0
        self.held_rows = 0
        self.runs: list[str] = []  # sorted run files, in the order written
        self.rows = 0
        self._maps: list[Any] = []  # the merge's open memory maps (closed by close())

    def add(self, batch: Any) -> None:
        if batch.num_rows == 0:
            return
        batch = _sorted(batch, self.seq)
        runs = self.held
        if runs and _follows(runs[-1][-1], batch, self.seq):
            runs[-1].append(batch)
        else:
            runs.append([batch])
        self.held_bytes += batch.nbytes
        self.held_rows += batch.num_rows
        self.rows += batch.num_rows
        if self.held_bytes > self.max_bytes:
            self._spill()

    def _round_rows(self) -> int:
        """Rows a merge round looks at, all sources together (:func:`_merge`): about 1/32 of ``max_bytes``
        (a round's sort copies its rows twice, concatenated then taken)."""
        row_bytes = max(1, self.held_bytes // max(1, self.held_rows)) if self.held_rows else 64
        return max(MIN_ROUND_ROWS, self.max_bytes // 32 // row_bytes)

    def _spill(self) -> None:
        import pyarrow as pa

        from . import spill_dirs

        if self.folder is None:
            self.folder = spill_dirs.task_folder(self.root)
        path = os.path.join(self.folder, f"run-{len(self.runs)}.arrow")
        runs, rows = self.held, self._round_rows()
        schema = runs[0][0].schema
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            for batch in _merge([iter(run) for run in runs], self.seq, SPILL_ROWS, rows):
                writer.write_batch(batch)
        self.runs.append(path)
        self.held, self.held_bytes, self.held_rows = [], 0, 0

    def batches(self, size: int) -> Iterator[Any]:
        """The rows in order, in batches of at most ``size`` rows."""
        sources = [self._read(path) for path in self.runs] + [iter(run) for run in self.held]
        try:
            yield from _merge(sources, self.seq, size, self._round_rows())
        finally:
            self._close_maps()

    def _read(self, path: str) -> Iterator[Any]:
        import pyarrow as pa

        source = pa.memory_map(path)
        self._maps.append(source)
        reader = pa.ipc.open_file(source)
        return (reader.get_batch(k) for k in range(reader.num_record_batches))

    def _close_maps(self) -> None:
        maps, self._maps = self._maps, []
        for source in maps:
            with contextlib.suppress(Exception):
                source.close()

    def close(self) -> None:
        """Drop what is held and remove the spill folder (whatever happened: the task's ``finally``)."""
        from . import spill_dirs

        self.held, self.held_bytes, self.held_rows = [], 0, 0
        self._close_maps()
        spill_dirs.remove(self.folder)
        self.folder, self.runs = None, []


def _sorted(batch: Any, seq: str) -> Any:
    """``batch`` by ``seq`` (stable, nulls last): itself when it is so already (no copy)."""
    import pyarrow.compute as pc

    column = batch.column(seq)
    valid = batch.num_rows - column.null_count
    if column.null_count == 0 or column.slice(valid).null_count == column.null_count:
        head = column.slice(0, valid)
        if valid < 2 or pc.all(pc.less_equal(head.slice(0, valid - 1), head.slice(1))).as_py():
            return batch
    return batch.take(pc.sort_indices(batch, sort_keys=[(seq, "ascending")]))


def _follows(last: Any, batch: Any, seq: str) -> bool:
    """Whether sorted ``batch`` may go after sorted ``last`` in one run: no nulls end ``last`` and
    ``batch`` starts at or after its end."""
    before, after = last.column(seq), batch.column(seq)
    if before.null_count or not after[0].is_valid:
        return False
    return before[-1].as_py() <= after[0].as_py()


def _merge(sources: list[Iterator[Any]], seq: str, size: int, round_rows: int) -> Iterator[Any]:
    """Merge sorted sources (iterators of sorted batches, rows without a sequence at their ends) by
    ``seq``, stably (sources in the order given), rows without a sequence last, source by source.

    Each round finds the heads that reach below the lowest head's end (the others cannot contribute),
    looks at the first ``round_rows / k`` rows of each of those ``k``, takes the rows up to the
    smallest of those views' last sequences (every row taken is then in place), sorts just those (a
    copy of at most ``round_rows`` rows; none when they all come from one source: sorted input costs
    nothing) and moves on."""
    import pyarrow as pa
    import pyarrow.compute as pc

    heads: list[Any] = [None] * len(sources)
    ends: list[tuple[Any, Any]] = [(None, None)] * len(sources)  # each head's first and last sequence
    nulls: list[list[Any]] = [[] for _ in sources]

    def refill(i: int) -> None:
        while heads[i] is None or heads[i].num_rows == 0:
            batch = next(sources[i], None)
            if batch is None:
                heads[i] = None
                return
            missing = batch.column(seq).null_count
            if missing:  # sorted: the rows without a sequence end it (and the source)
                nulls[i].append(batch.slice(batch.num_rows - missing))
                batch = batch.slice(0, batch.num_rows - missing)
            heads[i] = batch
        column = heads[i].column(seq)
        ends[i] = (column[0].as_py(), column[-1].as_py())

    def chunks(batch: Any) -> Iterator[Any]:
        yield from (batch.slice(k, size) for k in range(0, batch.num_rows, size))

    for i in range(len(sources)):
        refill(i)
    while True:
        live = [i for i, h in enumerate(heads) if h is not None]
        if not live:
            break
        lowest_end = min(ends[i][1] for i in live)
        reach = [i for i in live if ends[i][0] <= lowest_end]
        view_rows = max(MIN_ROUND_ROWS, round_rows // len(reach))
        bound = min(lowest_end, *(heads[i].column(seq)[min(view_rows, heads[i].num_rows) - 1].as_py()
                                  for i in reach))
        taken = []
        for i in reach:
            head = heads[i]
            cut = int(pc.sum(pc.less_equal(head.slice(0, view_rows).column(seq), bound)).as_py() or 0)
            if cut:
                taken.append(head.slice(0, cut))
                heads[i] = head.slice(cut)
                refill(i)
        if len(taken) == 1:  # one source below the others: in order as it is
            yield from chunks(taken[0])
        else:
            table = pa.Table.from_batches(taken)
            table = table.take(pc.sort_indices(table, sort_keys=[(seq, "ascending")])).combine_chunks()
            yield from (b for piece in table.to_batches() for b in chunks(piece))
    for run in nulls:
        for batch in run:
            yield from chunks(batch)


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
