"""Splitting a read by subject (option ``split=subject``), free of I/O.

**Why.** A read split into contiguous sequence ranges spreads one subject's history over
every partition, and Spark runs the write tasks that follow in parallel: a copy then
stores a later message of a subject before an earlier one (a bucket copy ends with stale
values). Split by subject, each subject's messages of a micro-batch are read by exactly
one partition, in sequence order (one consumer delivers its filters' messages in stream
order), and the narrow write that follows publishes them in that order.

**How subjects become consumer filters.** A consumer's filter subjects can only name
subjects and token wildcards, so subjects are grouped by their first ``depth`` tokens: a
subject longer than that belongs to the group ``<first depth tokens>.>``, a shorter one is
its own group; ``depth=None`` keeps every subject its own group (literal filters) and
``depth=0`` puts everything in one group (one partition reads it all: the fallback when
there are more subjects than a listing returns). Groups never overlap (``a.b.>`` needs a
token after ``a.b``), so no message is read twice.

**Who reads a group.** :func:`owner` is a hash of the group's name modulo the partition
count: it depends on nothing else, so the driver, every executor and a replay after a
restart agree on it without exchanging the assignment, and a subject first seen later
(a new key under a wildcard group, or at read time) lands in a partition too. The depth
and the count are recorded with the offset (streaming) or carried by the partition
(batch); only they have to match.

**Limits.** A consumer takes at most :data:`MAX_FILTERS` filter subjects (nats-server
proposes this limit, #6046: many filters make a consumer slow), so a partition with more
groups reads them in chunks, one consumer after the other; order is kept because a
subject is in one chunk. :func:`choose_depth` keeps the number of groups within
:data:`MAX_GROUPS` (the subjects one ``STREAM.INFO`` page lists) and prefers groups coarse enough
for about one consumer per partition when the subjects are many.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

MAX_FILTERS = 100
"""Filter subjects per consumer; a partition with more groups reads them in chunks of this size."""
MAX_GROUPS = 100_000
"""Most groups a split uses (nats-server lists at most 100,000 subjects per STREAM.INFO page)."""
ALL = 0
"""``depth`` of the one-group split: one partition reads everything."""


def group_of(subject: str, depth: int | None) -> str:
    """The group ``subject`` belongs to (module docstring)."""
    if depth is None:
        return subject
    if depth == ALL:
        return ">"
    tokens = subject.split(".")
    if len(tokens) <= depth:
        return subject
    return ".".join(tokens[:depth]) + ".>"


def owner(group: str, partitions: int) -> int:
    """The partition that reads ``group``: a stable hash (crc32, not Python's salted ``hash``)."""
    if partitions <= 1 or group == ">":
        return 0
    return zlib.crc32(group.encode()) % partitions


def needs_listing(num_subjects: int, partitions: int) -> bool:
    """Whether :func:`choose_depth` needs the subjects themselves (more than literal filters can carry
    in one consumer per partition); otherwise the stream's subject count decides."""
    return partitions > 1 and num_subjects > partitions * MAX_FILTERS


def choose_depth(num_subjects: int, partitions: int, subjects: Sequence[str] = (),
                 max_groups: int = MAX_GROUPS) -> int | None:
    """How a read of a stream with ``num_subjects`` subjects is grouped over ``partitions``.

    One partition: :data:`ALL`. Up to ``MAX_FILTERS`` subjects per partition: literal
    (``None``; one consumer each). More (``subjects`` then lists them, :func:`needs_listing`): the
    deepest token prefix that gives every partition about one consumer's worth of groups and at
    least two groups each; failing that, literal subjects read in chunks while there are at most
    ``max_groups``, then the deepest prefix within ``max_groups``, and last :data:`ALL`."""
    if partitions <= 1:
        return ALL
    if not needs_listing(num_subjects, partitions):
        return None
    deepest = max((s.count(".") + 1 for s in subjects), default=1)
    counts = {depth: len({group_of(s, depth) for s in subjects}) for depth in range(deepest - 1, 0, -1)}
    for depth, groups in counts.items():  # deepest first
        if 2 * partitions <= groups <= partitions * MAX_FILTERS:
            return depth
    if len(subjects) <= max_groups:
        return None
    for depth, groups in counts.items():
        if 2 <= groups <= max_groups:
            return depth
    return ALL


def intersect(a: str, b: str) -> str | None:
    """The subject pattern matching exactly what both NATS patterns ``a`` and ``b`` match, or None
    when they share no subject (``*`` matches one token, a final ``>`` one or more)."""
    ta, tb = a.split("."), b.split(".")
    out: list[str] = []
    i = 0
    while True:
        if i == len(ta) and i == len(tb):
            return ".".join(out)
        if i == len(ta) or i == len(tb):
            return None  # one ran out; a '>' would have ended the walk before
        x, y = ta[i], tb[i]
        if x == ">":
            return ".".join(out + tb[i:])
        if y == ">":
            return ".".join(out + ta[i:])
        if x == "*":
            out.append(y)
        elif y == "*" or x == y:
            out.append(x)
        else:
            return None
        i += 1


def filters_for(subjects: Iterable[str], depth: int | None, partitions: int, index: int,
                user_filters: Sequence[str]) -> list[str]:
    """The filter subjects of partition ``index``: the groups it owns among ``subjects``, each narrowed
    to the user's filters (option ``subjects``; none: everything). Sorted, without repeats.

    ``subjects`` are the stream's subjects (those matching the user's filters); a wildcard group also
    matches subjects not listed, which is what lets a read see subjects that came after the listing."""
    subjects = list(subjects)
    depth = _readable_depth(subjects, depth)
    if depth == ALL:
        return (sorted(user_filters) or [">"]) if index == 0 else []
    narrowed = set()
    for group in {group_of(s, depth) for s in subjects}:
        if owner(group, partitions) != index:
            continue
        if not user_filters:
            narrowed.add(group)
            continue
        for user in user_filters:
            common = intersect(group, user)
            if common is not None:
                narrowed.add(common)
    return sorted(narrowed)


def _readable_depth(subjects: Sequence[str], depth: int | None) -> int | None:
    """``depth``, made coarse enough that no filter names a token that is not UTF-8. The server lists
    such a subject with U+FFFD in place of its bytes, a filter that matches nothing; grouping above
    the token reads it through a wildcard (every partition lists the same subjects, so all agree)."""
    bad = [s.split(".").index(next(t for t in s.split(".") if "\ufffd" in t)) for s in subjects if "\ufffd" in s]
    if not bad:
        return depth
    cut = min(bad)
    return cut if depth is None else min(depth, cut)


def chunks(filters: Sequence[str], size: int = MAX_FILTERS) -> list[tuple[str, ...]]:
    """``filters`` in consumer-sized chunks (none: the partition reads nothing)."""
    return [tuple(filters[i:i + size]) for i in range(0, len(filters), size)]
