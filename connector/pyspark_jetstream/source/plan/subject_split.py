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

**Who filters.** A partition with at most :data:`SERVER_FILTERS` groups lets the server
filter (its consumer's filter subjects are the groups). One with more reads the whole range
(the user's filters only) and keeps the messages whose group it owns (:class:`SubjectKeep`):
the owner is the same function of the subject either way, so the partitions still share
every subject out exactly once, and a subject's messages still come from one consumer in
order. Why: nats-server delivers to a filtered consumer at a rate that falls with the
number of subjects interleaved in the stream (measured on 2.15.1, one consumer, 200,000
messages: 129,000 messages/s with 4 subjects, 61,000 with 40, 3,000 with 1,000, whether
it has 1 or 100 filters), and a consumer takes at most :data:`MAX_FILTERS` of them
(nats-server #6046). Reading everything costs each partition the whole range instead;
with 4 partitions that is the faster way from about 16 groups each (docs/source.md).

:func:`choose_depth` keeps the number of groups within :data:`MAX_GROUPS` (the subjects one
``STREAM.INFO`` page lists) and prefers groups coarse enough for about one consumer per
partition when the subjects are many.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

from ...protocol.subjects import consumer_filters, intersect, subject_matches

MAX_FILTERS = 100
"""Filter subjects per consumer (nats-server #6046); a snapshot with more groups reads them in chunks."""
SERVER_FILTERS = 8
"""Most groups a partition leaves the server to filter; with more it reads every message and keeps its own
(4 partitions, 100,000 messages, count only: 16 subjects, the server's filters 1.4x as fast; 64 subjects,
reading everything 1.3x as fast; 400 subjects, 8x)."""
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


MAX_KNOWN = 65_536
"""Subjects a :class:`SubjectKeep` remembers before it starts again: memory stays bounded by options,
never by how many subjects a range holds."""


class SubjectKeep:
    """Whether a message a consumer delivered is kept, told from its subject as it arrives (bytes off the
    wire): it must match one of ``patterns`` (the user's filters, when the consumer's own are wider:
    :func:`~pyspark_jetstream.protocol.subjects.consumer_filters`) and, with ``partitions``, its group
    must be owned by partition ``index`` (the same owner :func:`filters_for` gives). Remembered per
    subject (up to :data:`MAX_KNOWN`), so the hot path costs one dict lookup a message."""

    __slots__ = ("patterns", "depth", "partitions", "index", "known")

    def __init__(self, patterns: Sequence[str] | None = None, depth: int | None = None, partitions: int = 1,
                 index: int = 0) -> None:
        self.patterns = tuple(patterns) if patterns else None
        self.depth, self.partitions, self.index = depth, partitions, index
        self.known: dict[bytes, bool] = {}

    def keeps(self, subject: bytes) -> bool:
        mine = self.known.get(subject)
        if mine is None:
            if len(self.known) >= MAX_KNOWN:
                self.known.clear()
            text = subject.decode("utf-8", "replace")
            mine = (self.patterns is None or any(subject_matches(p, text) for p in self.patterns)) and (
                self.partitions <= 1 or owner(group_of(text, self.depth), self.partitions) == self.index)
            self.known[subject] = mine
        return mine


def sequence_consumer(user_filters: Sequence[str]) -> tuple[tuple[str, ...], SubjectKeep | None]:
    """The one consumer of a partition read by sequence range: its filter subjects, and the
    :class:`SubjectKeep` that drops what they match beyond the user's filters (when these overlap in part)."""
    server, exact = consumer_filters(list(user_filters))
    return server, None if exact else SubjectKeep(user_filters)


def consumers_for(subjects: Iterable[str], depth: int | None, partitions: int, index: int,
                  user_filters: Sequence[str], *,
                  by_owner: bool = True) -> list[tuple[tuple[str, ...], SubjectKeep | None]]:
    """The consumers partition ``index`` runs, one after the other: each one's filter subjects, and the
    :class:`SubjectKeep` that keeps its messages when the server does not filter them exactly.

    The groups it owns (:func:`filters_for`) when they are at most :data:`SERVER_FILTERS`; otherwise the
    user's filters (:func:`~pyspark_jetstream.protocol.subjects.consumer_filters`), every message read and
    kept by owner. ``by_owner=False`` (a snapshot: one delivery per subject, each listed subject
    awaited) and one group for everything keep the server's filters, in chunks; a chunk whose narrowed
    filters overlap (the user's did) is read through a covering filter and kept by pattern."""
    subjects = list(subjects)
    filters = filters_for(subjects, depth, partitions, index, user_filters)
    depth = _readable_depth(subjects, depth)
    if len(filters) > SERVER_FILTERS and by_owner and depth != ALL and partitions > 1:
        server, exact = consumer_filters(list(user_filters))
        return [(server, SubjectKeep(None if exact else user_filters, depth, partitions, index))]
    consumers: list[tuple[tuple[str, ...], SubjectKeep | None]] = []
    for chunk in chunks(filters):
        server, exact = consumer_filters(list(chunk))
        consumers.append((server, None if exact else SubjectKeep(chunk)))
    return consumers


def chunks(filters: Sequence[str], size: int = MAX_FILTERS) -> list[tuple[str, ...]]:
    """``filters`` in consumer-sized chunks (none: the partition reads nothing)."""
    return [tuple(filters[i:i + size]) for i in range(0, len(filters), size)]
