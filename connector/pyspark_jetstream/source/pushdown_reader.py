"""``spark.read`` that narrows its read by the filters Spark pushes, on a PySpark that keeps a pushed
read to its own scan (:func:`~pyspark_jetstream.spark_api.scoped_pushdown`).

PySpark 4.1 to 4.3 keep the read a scan's pushdown planned on the data source every scan of the same
view or DataFrame shares, so a narrowed read there would answer other queries: on those releases
``reader()`` never returns this class, Spark filters every row, and fast lookups go through the read's
own options (``keys``, ``subjects``: docs/architecture.md, issue #46). Where Spark scopes the read to
its scan, this reader plans the narrowed read alone:

- subjects (and keys) narrow the read's filter subjects, intersected with the option ``subjects``
  but never with the stream's configured subjects (:func:`~.plan.filter_pushdown.narrow_subjects`: a
  stream holds subjects its configuration does not name); a bucket's latest view of literal keys is
  read by batched direct gets, when the bucket allows them;
- a sequence range moves the start and fixes the end.

Times are not narrowed: a clustered stream stamps each message with its leader's clock, so time need
not grow with the sequence. Every filter is returned to Spark, which checks each row again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from ..logs import get_logger
from .plan.filter_pushdown import Translation, is_literal, narrow_subjects, translate
from .plan.subject_split import MAX_FILTERS
from .spark_readers import JetStreamBatchReader

log = get_logger("source")

MAX_PUSHED_SUBJECTS = MAX_FILTERS
"""Most filter subjects a pushed filter may give a consumer read: a longer ``IN`` list is left to Spark.
A read by sequence range runs one consumer per partition with every filter subject, and the project keeps
a consumer at :data:`~.plan.subject_split.MAX_FILTERS` (nats-server #6046)."""


class JetStreamPushdownReader(JetStreamBatchReader):
    """``spark.read`` that takes the filters Spark pushes (see the module docstring)."""

    _plan_at_once = False

    def pushFilters(self, filters: list[Any]) -> Iterable[Any]:
        filters = list(filters)
        open_end = self.bounds.last_seq if self.end is None else None
        self._narrow(translate(filters, bucket=self.opts.key_bucket, snapshot=self.snapshot, open_end_last=open_end))
        return filters  # Spark filters every row again

    def _narrow(self, result: Translation) -> None:
        """Narrow this reader's options and range by what the filters asked for (before it plans)."""
        pushed = result.pushed
        if pushed.nothing:
            self._partitions = []
            return
        opts = self.opts
        if pushed.subjects is not None:
            narrowed = narrow_subjects(opts.filter_subjects, pushed.subjects)
            if not narrowed:  # the option 'subjects' and the pushed subjects share none
                self._partitions = []
                return
            direct = self.snapshot and opts.bucket is not None and self.bounds.allow_direct and is_literal(narrowed)
            if direct or len(narrowed) <= MAX_PUSHED_SUBJECTS:  # longer lists: Spark alone
                keys = tuple(s.split(".", 2)[2] for s in narrowed) if direct else opts.keys
                self.opts = dataclasses.replace(opts, subjects=narrowed, keys=keys)
        if pushed.first_seq is not None:
            self.start = max(self.start, pushed.first_seq - 1)
        if pushed.last_seq is not None:
            self.end = pushed.last_seq if self.end is None else min(self.end, pushed.last_seq)
        if self.end is not None and self.end <= self.start:
            self._partitions = []
