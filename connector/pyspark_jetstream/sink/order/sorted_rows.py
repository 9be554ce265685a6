"""Holding a task's rows and giving them back in source sequence order, within a memory bound.

Rows that reached the sink through a shuffle by subject come from several read tasks in no fixed
order; with ``order=subject`` they are held and published in the order of the source's ``seq``
column (:mod:`.decide` says when). Memory is bounded by the option ``order.maxBufferBytes``: beyond
it, the rows held are merged into a sorted run file (Arrow IPC) under Spark's local directories
(:mod:`.spill_dirs`), and the runs are merged when the task's input ends, a bounded round at a time.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

SPILL_ROWS = 8192
"""Rows per batch of a spilled run (the merge reads them a batch per run at a time)."""


MIN_ROUND_ROWS = 256
"""The fewest rows a merge round looks at in each source it takes from (:func:`_merge`)."""


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
        self.folder: Any = None  # a spill_dirs.SpillFolder, created (and claimed) at the first spill
        self.held: list[list[Any]] = []  # in-memory runs: lists of sorted batches, each run in order
        self.held_bytes = 0
        self.held_rows = 0
        self.runs: list[str] = []  # sorted run files, in the order written
        self.rows = 0
        self._maps: list[Any] = []  # the merge's open memory maps (closed by close())

    def hold(self, batch: Any) -> None:
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
        path = os.path.join(self.folder.path, f"run-{len(self.runs)}.arrow")
        runs, rows = self.held, self._round_rows()
        schema = runs[0][0].schema
        try:
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
                for batch in _merge([iter(run) for run in runs], self.seq, SPILL_ROWS, rows):
                    writer.write_batch(batch)
        except OSError as exc:  # the folder gone (removed under the task) or full: the rows cannot be ordered
            raise spill_dirs.missing(self.folder.path, exc) from None
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

        from . import spill_dirs

        try:
            source = pa.memory_map(path)
        except OSError as exc:  # a run removed under the task: what it held is lost, never skipped
            raise spill_dirs.missing(path, exc) from None
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
        self.held, self.held_bytes, self.held_rows = [], 0, 0
        self._close_maps()
        if self.folder is not None:
            self.folder.remove()
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
