"""``spark.read`` with filter pushdown (PySpark 4.1+, ``spark.sql.python.filterPushdown.enabled``).

The thin hook: :mod:`.plan.filter_pushdown` decides what each filter asks of the read; this reader plans
it beside the whole read of :class:`~.spark_readers.JetStreamBatchReader`, once Spark has pushed the
filters (``pushFilters`` runs after the reader is made and before ``partitions``):

- subjects (and keys) narrow the read's filter subjects, intersected with the option ``subjects``
  but never with the stream's configured subjects (:func:`~.plan.filter_pushdown.narrow_subjects`: a stream
  holds subjects its configuration does not name, sourced, mirrored, transformed or from before a
  change of its subjects); a bucket's latest view of literal keys is read by batched direct gets
  instead, when the bucket allows them;
- a sequence range moves the start and fixes the end.

Times are not narrowed: a clustered stream stamps each message with its leader's clock, so after a
leader change (or a clock step) time need not grow with the sequence, and a sequence range found by
time could leave out rows that match. Spark filters times itself.

**Each query answers itself.** PySpark 4.1 to 4.3 give the read a pushdown planned to every later
scan of the same DataFrame or view, so each partition carries both reads, the narrowed one and the
whole one, and the task picks by the SQL execution it serves (:mod:`.plan.pushdown_scope`); every filter
is returned to Spark, so the whole read is right wherever it runs. Where no task can tell the
executions apart (PySpark 4.1), and where another scan of the same relation was planned
in the same query (:mod:`.plan.pushdown_registry`), the narrowed read is not planned.

Only :func:`~pyspark_jetstream.spark_api.pushdown_requested` readers are of this class: with the
conf off, Spark refuses a reader that defines ``pushFilters``.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from pyspark.sql.datasource import InputPartition

from ..errors import SharedPushdownError
from ..logs import get_logger
from ..options import SourceOptions
from ..spark_api import execution_query_id, scoped_pushdown
from .plan.filter_pushdown import Translation, is_literal, narrow_subjects, translate
from .plan.partitions import JetStreamPartition
from .plan.pushdown_registry import another_scan_close_by, claim_partition
from .plan.pushdown_scope import narrowed_applies, start_ms
from .plan.subject_split import MAX_FILTERS
from .spark_readers import JetStreamBatchReader, read_planned

log = get_logger("source")

MAX_PUSHED_SUBJECTS = MAX_FILTERS
"""Most filter subjects a pushed filter may give a consumer read: a longer ``IN`` list is left to Spark.
A read by sequence range runs one consumer per partition with every filter subject, and the project keeps
a consumer at :data:`~.plan.subject_split.MAX_FILTERS` (nats-server #6046)."""


@dataclasses.dataclass(frozen=True)
class ScopedPartition(InputPartition):
    """Partition ``index`` of a pushed read: of the narrowed plan (None: it has fewer partitions, or
    none) and of the whole read's plan, made at ``planned_ms``; the task reads one of the two."""

    index: int
    narrowed: JetStreamPartition | None
    whole: JetStreamPartition | None
    planned_ms: int
    plan: str = ""  # this pushed plan's id: two scans of one query reading it are told apart by it


@dataclasses.dataclass(frozen=True)
class _Narrowing:
    """What the pushed filters narrowed: the read's options (subjects), range, keys for direct gets."""

    opts: SourceOptions
    start: int
    end: int | None
    keys: tuple[str, ...] | None = None
    nothing: bool = False


class JetStreamPushdownReader(JetStreamBatchReader):
    """``spark.read`` that takes the filters Spark pushes (see the module docstring)."""

    _plan_at_once = False
    _narrowing: _Narrowing | None = None
    _planned_ms = 0

    def __init__(self, opts: SourceOptions, relation: str | None = None) -> None:
        super().__init__(opts)
        self._relation = relation

    def pushFilters(self, filters: list[Any]) -> Iterable[Any]:
        self._planned_ms = time.time_ns() // 1_000_000
        filters = list(filters)
        if not scoped_pushdown():
            log.info("stream %s: filters are applied by Spark, not pushed to the read: this PySpark shares a pushed "
                     "read between queries and gives no task a way to tell them apart (PySpark 4.2+ does)",
                     self.opts.stream)
            return filters
        if another_scan_close_by(self._relation):
            log.info("stream %s: another scan of the same view or DataFrame was planned just before (a query that "
                     "reads it twice?): filters are applied by Spark, not pushed, since Spark would give every scan "
                     "of it the same read", self.opts.stream)
            return filters
        open_end = self.bounds.last_seq if self.end is None else None
        result = translate(filters, bucket=self.opts.bucket, snapshot=self.snapshot, open_end_last=open_end)
        self._narrowing = self._narrow(result)
        log.debug("stream %s: filters narrowing the read %s; all returned to Spark", self.opts.stream,
                  [f for f in filters if not any(f is r for r in result.returned)])
        return filters  # Spark filters every row: the whole read runs wherever the narrowed one must not

    def _narrow(self, result: Translation) -> _Narrowing:
        pushed = result.pushed
        opts, start, end, keys = self.opts, self.start, self.end, None
        if pushed.nothing:
            return _Narrowing(opts, start, end, nothing=True)
        if pushed.subjects is not None:
            narrowed = narrow_subjects(opts.filter_subjects, pushed.subjects)
            if not narrowed:  # the option 'subjects' and the pushed subjects share none
                return _Narrowing(opts, start, end, nothing=True)
            direct = self.snapshot and opts.bucket is not None and self.bounds.allow_direct
            if direct and is_literal(narrowed):
                keys = narrowed
            if keys is not None or len(narrowed) <= MAX_PUSHED_SUBJECTS:  # longer lists: Spark alone
                opts = dataclasses.replace(opts, subjects=narrowed)
        if pushed.first_seq is not None:
            start = max(start, pushed.first_seq - 1)
        if pushed.last_seq is not None:
            end = pushed.last_seq if end is None else min(end, pushed.last_seq)
        return _Narrowing(opts, start, end, keys, nothing=end is not None and end <= start)

    def _plan_narrowed(self, n: _Narrowing) -> list[JetStreamPartition]:
        if n.nothing:
            return []
        if n.keys is None:
            whole = (self.opts, self.start, self.end)
            self.opts, self.start, self.end = n.opts, n.start, n.end
            try:
                return super()._plan()
            finally:
                self.opts, self.start, self.end = whole
        # A bucket's latest view of literal keys: batched direct gets, one request per 1,024 keys.
        keys = n.keys
        per = -(-len(keys) // max(1, min(n.opts.num_partitions, -(-len(keys) // 1024))))
        chunks = [keys[i:i + per] for i in range(0, len(keys), per)]
        up_to = self.bounds.last_seq if n.end is None else n.end  # every chunk reads the bucket as of one sequence
        return [JetStreamPartition(n.opts.stream, i, n.start + 1, None, self.bounds.created,
                                   self.bounds.max_age, True, None, True, len(chunks), keys=chunk, up_to=up_to)
                for i, chunk in enumerate(chunks)]

    def _plan(self) -> list[Any]:
        whole = super()._plan()
        if self._narrowing is None:
            return whole
        narrowed = self._plan_narrowed(self._narrowing)
        count = max(len(whole), len(narrowed))
        plan = uuid.uuid4().hex
        return [ScopedPartition(i, narrowed[i] if i < len(narrowed) else None, whole[i] if i < len(whole) else None,
                                self._planned_ms, plan)
                for i in range(count)]

    def read(self, partition: Any) -> Iterator[Any]:
        if not isinstance(partition, ScopedPartition):
            return read_planned(self.opts, partition)
        n = self._narrowing
        query_id = execution_query_id()
        if n is not None and narrowed_applies(partition.planned_ms, start_ms(query_id)):
            _check_one_scan(self.opts.stream, partition, query_id)
            return read_planned(n.opts, partition.narrowed) if partition.narrowed is not None else iter(())
        return read_planned(self.opts, partition.whole) if partition.whole is not None else iter(())


def _check_one_scan(stream: str, partition: ScopedPartition, query_id: str | None) -> None:
    """Refuse a narrowed read that a second scan of the same query shares (plan/pushdown_registry.claim_partition)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None or query_id is None:
        return
    if not claim_partition(partition.plan, query_id, partition.index,
                           f"{context.stageId()}:{context.partitionId()}"):
        raise SharedPushdownError(
            f"This query reads the same view or DataFrame (stream '{stream}') more than once, once with a filter "
            "pushed to the read, and this PySpark gives every scan of it the read that filter narrowed: another "
            "scan would read too few rows, so the query is refused rather than answered wrong. Read the other "
            "scan through its own view (CREATE TEMPORARY VIEW ... USING jetstream) or spark.read...load(), or "
            "set spark.sql.python.filterPushdown.enabled=false for this query. See docs/source.md, 'Each query "
            "answers itself'.")
