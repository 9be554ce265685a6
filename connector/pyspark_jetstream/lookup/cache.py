"""A Python worker's partial lookup cache (``cache=partial``), as Flink's ``lookup.cache=PARTIAL``: the keys
looked up, at most ``max_rows`` (the least recently used go first), each answer used for ``ttl`` seconds
after it was fetched (expire after write), a key with no value cached too unless ``cache_missing`` is off.
Pure: the caller gives the clock.
"""

from __future__ import annotations

import collections
import math

MISSING = None
"""What the cache holds for a key that had no value (missing, deleted, purged, expired) when fetched."""

Entry = tuple[bytes, int, int]
"""A key's value, revision and creation time in microseconds."""


class PartialCache:
    """Module docstring."""

    def __init__(self, max_rows: int, ttl: float | None, cache_missing: bool) -> None:
        self._max_rows = max_rows
        self._ttl = math.inf if ttl is None else ttl
        self._cache_missing = cache_missing
        self._held: collections.OrderedDict[str, tuple[float, Entry | None]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def lookup(self, keys: list[str], now: float) -> tuple[dict[str, Entry], list[str]]:
        """(the entries held for ``keys``, the keys to fetch: not held, or held past their time). A key held
        as missing is in neither."""
        held, fetch = {}, []
        for key in keys:
            got = self._held.get(key)
            if got is None or now - got[0] >= self._ttl:
                fetch.append(key)
                continue
            self._held.move_to_end(key)
            if got[1] is not MISSING:
                held[key] = got[1]
        return held, fetch

    def remember(self, fetched: list[str], entries: dict[str, Entry], now: float) -> None:
        """The answers to the keys ``fetched``: ``entries`` for those that had a value."""
        for key in fetched:
            entry = entries.get(key, MISSING)
            if entry is MISSING and not self._cache_missing:
                self._held.pop(key, None)
                continue
            self._held[key] = (now, entry)
            self._held.move_to_end(key)
        while len(self._held) > self._max_rows:
            self._held.popitem(last=False)
