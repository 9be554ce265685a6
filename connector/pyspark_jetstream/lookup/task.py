"""What ``mapInArrow`` runs for a lookup on an executor: each Arrow batch's keys checked and deduplicated,
their entries taken from the worker's cache or fetched (:mod:`.fetch`), and joined to the rows (:mod:`.join`).

Where the entries come from is one of three :class:`EntrySource` s, by the option ``cache``: the bucket itself
(``none``), a :class:`~.cache.PartialCache` in front of it (``partial``), or a worker's full copy kept by a
KV watch (``full``, :mod:`.full_cache`). The caches are the worker process's, shared by its tasks.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

from ..options import LookupOptions
from .cache import PartialCache
from .fetch import Target, fetch
from .full_cache import full_copy
from .join import Found, check_keys, joined, keys_to_fetch, value_fields

_partial_caches: dict[tuple, PartialCache] = {}
_lock = threading.Lock()


class EntrySource(ABC):
    """Where a batch's entries come from (module docstring)."""

    @abstractmethod
    def found(self, keys: list[str]) -> Found:
        """The live entries of ``keys`` (distinct, valid keys)."""


class FromBucket(EntrySource):
    def __init__(self, opts: LookupOptions, target: Target) -> None:
        self._opts, self._target = opts, target

    def found(self, keys: list[str]) -> Found:
        return fetch(self._opts, self._target, keys)


class FromPartialCache(EntrySource):
    def __init__(self, opts: LookupOptions, target: Target) -> None:
        self._opts, self._target = opts, target
        key = (opts.connection, opts.api_prefix, opts.bucket, target, opts.cache_max_rows, opts.cache_ttl,
               opts.cache_missing)
        with _lock:
            self._cache = _partial_caches.setdefault(
                key, PartialCache(opts.cache_max_rows, opts.cache_ttl, opts.cache_missing))

    def found(self, keys: list[str]) -> Found:
        now = time.monotonic()
        with _lock:
            held, missing = self._cache.lookup(keys, now)
        if not missing:
            return Found.of_entries(held)
        fetched = fetch(self._opts, self._target, missing).entries()
        with _lock:
            self._cache.remember(missing, fetched, now)
        return Found.of_entries({**held, **fetched})


class FromFullCopy(EntrySource):
    def __init__(self, opts: LookupOptions) -> None:
        self._opts = opts

    def found(self, keys: list[str]) -> Found:
        return Found.of_entries(full_copy(self._opts).lookup(keys))


class LookupTask:
    """The function a lookup's ``mapInArrow`` runs (picklable: options, the bucket's :class:`Target`, names)."""

    def __init__(self, opts: LookupOptions, target: Target, key_name: str) -> None:
        self.opts, self.target, self.key_name = opts, target, key_name

    def _source(self) -> EntrySource:
        if self.opts.cache == "partial":
            return FromPartialCache(self.opts, self.target)
        if self.opts.cache == "full":
            return FromFullCopy(self.opts)
        return FromBucket(self.opts, self.target)

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        source = self._source()
        schema = None
        position = 0
        for group in _groups(batches):
            if schema is None:
                schema = pa.schema([*group[0].schema, *(pa.field(n, t) for n, t in value_fields(self.opts.prefix))])
            # A large_string key column (spark.sql.execution.arrow.useLargeVarTypes) is read as a string one.
            keys = pa.chunked_array([batch.column(self.key_name).cast(pa.string()) for batch in group], pa.string())
            if self.opts.invalid_key == "error":
                check_keys(keys, position, self.key_name, _where())
            found = source.found(keys_to_fetch(keys))
            for batch in group:
                yield joined(batch, self.key_name, found, schema, self.opts.how)
            position += len(keys)


GROUP_ROWS = 65_536
GROUP_BYTES = 32 << 20
"""A task looks up the distinct keys of this many rows (or bytes of Arrow batches) at once: Spark hands
``mapInArrow`` batches of ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows (10,000), whose keys repeat
from one batch to the next."""


def _groups(batches: Iterator[Any]) -> Iterator[list[Any]]:
    """``batches`` in groups of about :data:`GROUP_ROWS` rows or :data:`GROUP_BYTES` (one batch at least)."""
    group: list[Any] = []
    rows = size = 0
    for batch in batches:
        group.append(batch)
        rows += batch.num_rows
        size += batch.nbytes
        if rows >= GROUP_ROWS or size >= GROUP_BYTES:
            yield group
            group, rows, size = [], 0, 0
    if group:
        yield group


def _where() -> str:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return "this task" if ctx is None else f"partition {ctx.partitionId()}"
