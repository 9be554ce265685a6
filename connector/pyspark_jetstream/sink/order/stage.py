"""The order stage of a task's write: what a task does with its batches before they are encoded.

With ``order=subject`` (the default) the task decides at its first rows, from the notes its reads
left (:mod:`.decide`): rows straight from a read split by sequence ranges are refused, rows straight
from an ordered read are published as they come, and the rest are held and given back in source
sequence order at the end (:mod:`.sorted_rows`), with a sample of their subjects for the driver
(:mod:`.subject_sample`). Rows with no position to order by are published as they come and counted.
With ``order=none``, rows as read are published as they come and the rows whose subject's source
order arrived broken are counted (:mod:`.order_check`). A write with ``sequenceBy`` skips this stage:
the reduction publishes each key's newest row under compare-and-set.
"""

from __future__ import annotations

from typing import Any

from ... import task_notes
from .decide import SORT, decide
from .order_check import OrderCheck
from .sorted_rows import SortedRows
from .subject_sample import SubjectSample


class OrderStage:
    """One task's order per subject (module docstring): :meth:`order` each batch, :meth:`release` the rows
    held at the end (after :meth:`check_at_end`), and always :meth:`close`."""

    def __init__(self, plan: Any, target: str) -> None:
        """``plan``: the write's :class:`~pyspark_jetstream.sink.plan.sink_plan.SinkPlan`; ``target``: where the
        write goes, as the refusals name it."""
        self.plan, self.opts, self.target = plan, plan.options, target
        self.undecided = self.opts.order == "subject" and plan.sequence is None  # see _decide_order
        self.held: SortedRows | None = None  # order=subject, rows that came through a shuffle: held and sorted
        self.notes: list = []  # order=subject: what the reads of this task left (task_notes), checked again at the end
        self.unpositioned: int | None = None  # order=subject, rows of unknown order published as they came: counted
        self.sample: SubjectSample | None = None  # ... and a sample of their subjects, for the driver
        self.check: OrderCheck | None = None  # order=none, rows as read: where a subject's source order arrived broken
        layout = plan.layout
        if layout.as_read and layout.source_seq is not None and plan.sequence is None and self.opts.order == "none":
            self.check = OrderCheck(layout.key if self.opts.bucket is not None else layout.subject,
                                    layout.source_stream, layout.source_seq)

    def order(self, batch: Any) -> bool:
        """Whether ``batch`` is published now; False: it is held, to be published in order by the end."""
        if self.undecided:
            self._decide_order()
        if self.held is not None:
            self.sample = self.sample.merged(self._subjects_of(batch))
            self.held.hold(batch)
            return False
        if self.check is not None:
            self.check.check(batch)
        if self.unpositioned is not None:
            self.unpositioned += batch.num_rows
        return True

    def _decide_order(self) -> None:
        """``order=subject``, at the task's first rows: refuse rows that come straight from a read split by
        sequence ranges, publish rows straight from an ordered read as they come, hold and sort the rest
        (sink/order/decide.py)."""
        self.undecided = False
        self.notes = task_notes.take()
        mode = self._decide(self.notes, ended=False)
        if mode == SORT:
            self.held = SortedRows(self.plan.layout.source_seq, self.opts.order_max_buffer_bytes)
            self.sample = SubjectSample()
        elif not self.notes:
            # Not straight from a read, and nothing to order by: a copy that dropped 'seq' after its shuffle
            # would lose each subject's order here without a word. The commit line says how many rows.
            self.unpositioned = 0

    def _subjects_of(self, batch: Any) -> Any:
        """The column a row's target subject comes from (a bucket's key), or the default subject."""
        import pyarrow as pa

        layout = self.plan.layout
        column = layout.key if self.opts.bucket is not None else layout.subject
        if column is not None:
            return batch.column(column).cast(pa.string())
        return pa.array([self.opts.subject or ""] * min(batch.num_rows, 1), pa.string())

    def check_at_end(self) -> None:
        """``order=subject``: with the task's input over, every note of its reads is there; refuse (before
        anything is published) a task that read only some ranges of a read split into several, even one
        that got no row (sink/order/decide.py: the guard is a property of the query)."""
        if self.undecided:  # no row came: nothing was decided
            self.undecided = False
            self.notes = task_notes.take()
        elif self.held is None:
            return
        else:
            self.notes = [*self.notes, *task_notes.take()]
        self._decide(self.notes, ended=True)

    def _decide(self, notes: list, *, ended: bool) -> str:
        """sink/order/decide.decide for this task's rows: whether they carry the source's positions."""
        layout = self.plan.layout
        return decide(notes, layout.as_read and layout.source_seq is not None, self.target, ended=ended)

    def release(self) -> SortedRows | None:
        """The rows held, to be published in order (the caller closes them), and no longer this stage's."""
        held, self.held = self.held, None
        return held

    @property
    def out_of_order(self) -> int:
        """order=none: rows that came right after a later source sequence of their subject."""
        return self.check.behind if self.check is not None else 0

    def close(self) -> None:
        if self.held is not None:
            self.held.close()  # its spilled runs, if any
