"""``spark.read`` with filter pushdown (PySpark 4.1+, ``spark.sql.python.filterPushdown.enabled``).

The thin hook: :mod:`.filter_pushdown` decides what each filter asks of the read; this reader
applies it to the plan of :class:`~.reader.JetStreamBatchReader`, which it plans once Spark has
pushed the filters (``pushFilters`` runs after the reader is made and before ``partitions``):

- subjects (and keys) narrow the read's filter subjects, intersected with the option ``subjects``
  but never with the stream's configured subjects (:func:`~.filter_pushdown.narrow_subjects`); a
  bucket's latest view of literal keys is read by batched direct gets instead, when the bucket
  allows them;
- a sequence range moves the start and fixes the end;
- a time range moves the start and the end to the sequences the server finds for those times.

Only :func:`~pyspark_jetstream.spark_api.pushdown_requested` readers are of this class: with the
conf off, Spark refuses a reader that defines ``pushFilters``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from typing import Any

from ..client import jsapi, runtime
from ..logs import get_logger
from .filter_pushdown import Translation, is_literal, narrow_subjects, translate
from .reader import JetStreamBatchReader, JetStreamPartition, _ask_server
from .subject_split import MAX_FILTERS

log = get_logger("source")

MAX_PUSHED_SUBJECTS = MAX_FILTERS
"""Most filter subjects a pushed filter may give a consumer read: a longer ``IN`` list is left to Spark.
A read by sequence range runs one consumer per partition with every filter subject, and the project keeps
a consumer at :data:`~.subject_split.MAX_FILTERS` (nats-server #6046)."""


class JetStreamPushdownReader(JetStreamBatchReader):
    """``spark.read`` that takes the filters Spark pushes (see the module docstring)."""

    _plan_at_once = False
    _keys: tuple[str, ...] | None = None  # a bucket's latest view of these literal subjects, by direct get
    _nothing = False  # no row can match: no partition

    def pushFilters(self, filters: list[Any]) -> Iterable[Any]:
        open_end = self.bounds.last_seq if self.end is None else None
        result = translate(list(filters), bucket=self.opts.bucket, snapshot=self.snapshot, open_end_last=open_end)
        result = self._apply(result)
        log.debug("stream %s: filters pushed %s; returned to Spark %s", self.opts.stream,
                 [f for f in filters if not any(f is r for r in result.returned)], list(result.returned))
        return list(result.returned)

    def _apply(self, result: Translation) -> Translation:
        pushed = result.pushed
        self._keys = None
        self._nothing = pushed.nothing
        if pushed.subjects is not None and not pushed.nothing:
            narrowed = narrow_subjects(self.opts.filter_subjects, pushed.subjects)
            direct = self.snapshot and self.opts.bucket is not None and self.bounds.allow_direct
            if direct and is_literal(narrowed):
                self._keys = narrowed
            elif len(narrowed) > MAX_PUSHED_SUBJECTS:
                return self._apply(result.without_subjects())
            if not narrowed:  # the option 'subjects' and the pushed subjects share none
                self._nothing = True
                return result
            self.opts = dataclasses.replace(self.opts, subjects=narrowed)
        if self._nothing:
            return result
        if pushed.first_seq is not None:
            self.start = max(self.start, pushed.first_seq - 1)
        if pushed.last_seq is not None:
            self.end = pushed.last_seq if self.end is None else min(self.end, pushed.last_seq)
        if pushed.since is not None:
            first = self._first_at_or_after(pushed.since)
            self.start = max(self.start, self.bounds.last_seq if first is None else first - 1)
        if pushed.until is not None:
            after = self._first_at_or_after(pushed.until + dt.timedelta(microseconds=1))
            if after is not None:  # a message after the time exists: none stored later can be before it
                self.end = after - 1 if self.end is None else min(self.end, after - 1)
        if self.end is not None:
            self._nothing = self.end <= self.start
        return result

    def _first_at_or_after(self, when: dt.datetime) -> int | None:
        opts = self.opts

        async def lookup() -> int | None:
            nc = await runtime.connection(opts.connection)
            return await jsapi.first_seq_at_or_after(nc, opts.stream, when, opts.api_prefix)

        return _ask_server(opts, lookup, "The time lookup of a pushed filter")

    def _plan(self) -> list[JetStreamPartition]:
        if self._nothing:
            return []
        keys = self._keys
        if keys is None:
            return super()._plan()
        # A bucket's latest view of literal keys: batched direct gets, one request per 1,024 keys.
        per = -(-len(keys) // max(1, min(self.opts.num_partitions, -(-len(keys) // 1024))))
        chunks = [keys[i:i + per] for i in range(0, len(keys), per)]
        return [JetStreamPartition(self.opts.stream, i, self.start + 1, None, self.bounds.created,
                                   self.bounds.max_age, True, None, True, len(chunks), keys=chunk)
                for i, chunk in enumerate(chunks)]

