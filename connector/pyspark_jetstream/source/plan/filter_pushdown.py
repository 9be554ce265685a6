"""Spark's pushed filters turned into what the server can do for a batch read, free of I/O.

PySpark 4.1+ hands a reader the top-level conjuncts of a query's ``WHERE`` that it can express
(``EqualTo``, ``In``, ``StringStartsWith``, comparisons, ``IsNotNull``, ``Not`` of those; never an
``OR``: probed on 4.3.0), and the reader returns those Spark must still evaluate.
:func:`translate` decides, per filter, one of three things:

* **applied exactly** (not returned): the read then yields exactly the rows the filter keeps.
  ``subject``/``key`` equal to, in, or starting with a prefix ending at a token boundary
  (``a.b.``) become consumer filter subjects (or, for a bucket's latest view, direct gets of the
  keys); ``seq`` comparisons become the read's sequence range; ``IsNotNull`` of a column that is
  never null is true of every row.
* **narrowing** (returned, and used): ``seq IN (...)`` reads from the smallest to the greatest, and
  Spark checks the rows again. ``timestamp`` comparisons are returned and never narrow the read: a
  clustered stream stamps each message with its leader's clock, so after a leader change (or a clock
  step) time need not grow with the sequence, and a range found by time could leave out rows that
  match. They only tell when the conditions contradict each other (no time can match: nothing to read).
* **returned**: everything else, including any value that could be read as a wildcard (``*``,
  ``>``), a bytes-replacement character (a subject that is not UTF-8 is shown with U+FFFD, so it
  cannot be asked for by name), a prefix that does not end at a token boundary, and ``NOT``.

A snapshot (``kv.view=latest``, ``startingOffsets=lastPerSubject``) returns the last message of each
subject: filtering subjects first gives the same rows, but a sequence or time range would change
which message is the last, so those filters are returned untouched.

Filters are recognised by class name and fields, so this module imports nothing of PySpark (the
classes exist from 4.1 on); unit tests feed it PySpark's own classes.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from ...protocol.subjects import can_be_stored, intersect, is_publish_subject

_ONE_US = dt.timedelta(microseconds=1)
_LAST_TIME = dt.datetime.max.replace(tzinfo=dt.timezone.utc)
_NEVER_NULL = {"subject", "seq", "timestamp", "stream"}
"""Columns every row has (with ``bucket``, ``key`` too): ``IsNotNull`` of them keeps every row."""


@dataclass(frozen=True)
class Pushed:
    """What the pushed filters ask of the read.

    ``subjects``: the subject patterns a row's subject must match (one of), or None when no filter
    names subjects; an empty tuple matches nothing. ``first_seq``/``last_seq``: the inclusive
    sequence range, exact. ``since``/``until``: the inclusive time range (UTC, at Spark's precision,
    the microsecond), narrowing only. ``empty_range``: no sequence or time can match."""

    subjects: tuple[str, ...] | None = None
    first_seq: int | None = None
    last_seq: int | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    empty_range: bool = False

    @property
    def nothing(self) -> bool:
        """No row can match: the read needs no partition."""
        return self.empty_range or self.subjects == ()


@dataclass(frozen=True)
class Translation:
    """:func:`translate`'s answer: the read's narrowing, the filters Spark keeps evaluating (the
    very objects it passed), and among the applied ones those that name subjects (a reader that
    cannot use the subjects after all returns them: :meth:`without_subjects`)."""

    pushed: Pushed
    returned: tuple[Any, ...]
    subject_filters: tuple[Any, ...] = ()

    def without_subjects(self) -> Translation:
        p = self.pushed
        pushed = Pushed(None, p.first_seq, p.last_seq, p.since, p.until, p.empty_range)
        return Translation(pushed, self.returned + self.subject_filters, ())


def _column(f: Any) -> str | None:
    path = getattr(f, "attribute", None)
    return path[0] if isinstance(path, tuple) and len(path) == 1 and isinstance(path[0], str) else None


def literal_subject(value: Any) -> str | None | bool:
    """``value`` as a subject a consumer filter names exactly: the subject; False when no message
    can have it as its subject (an empty token, or an ASCII space, tab, CR or LF: a filter for it keeps
    nothing); None when unsure (a wildcard character anywhere; U+FFFD, which stands for bytes that are
    not UTF-8; an FF, which the server stores but refuses in a filter). Whether it is a subject is the
    server's rule (:func:`~pyspark_jetstream.protocol.subjects.is_publish_subject`): U+3000 or U+00A0
    are as good as letters."""
    if not isinstance(value, str):
        return None
    if "*" in value or ">" in value or "\ufffd" in value:
        return None
    if is_publish_subject(value):
        return value
    return None if can_be_stored(value) else False


def prefix_pattern(prefix: str) -> str | None:
    """The subject pattern matching exactly the subjects that start with ``prefix``, when the prefix
    ends at a token boundary (``a.b.`` -> ``a.b.>``); None otherwise (``a.b`` also starts ``a.bc``)."""
    if not prefix.endswith("."):
        return None
    return prefix + ">" if literal_subject(prefix[:-1]) else None


def _subject_patterns(f: Any, name: str, prefix: str) -> tuple[str, ...] | None:
    """The patterns a subject filter (on ``subject``, or on ``key`` with ``prefix`` = ``$KV.<b>.``)
    keeps exactly; None when it cannot be applied exactly."""
    if name in ("EqualTo", "EqualNullSafe"):
        subject = literal_subject(prefix + f.value) if isinstance(f.value, str) else None
        if subject is None:
            return None
        return (subject,) if subject else ()
    if name == "In":
        values = [v for v in f.value if v is not None]  # x IN (.., NULL) is never true for NULL
        if not all(isinstance(v, str) for v in values):
            return None
        found = [literal_subject(prefix + v) for v in values]
        if any(s is None for s in found):
            return None
        return tuple(sorted({s for s in found if s}))
    if name == "StringStartsWith" and isinstance(f.value, str):
        pattern = prefix_pattern(prefix + f.value)
        return None if pattern is None else (pattern,)
    return None


def is_literal(patterns: tuple[str, ...]) -> bool:
    """Whether every pattern names one subject (no wildcard token): such a set can be read by name."""
    return all("*" not in p.split(".") and ">" not in p.split(".") for p in patterns)


def _intersect_sets(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(sorted({c for x in a for y in b if (c := intersect(x, y)) is not None}))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _utc(value: Any) -> dt.datetime | None:
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        return None
    try:
        return value.astimezone(dt.timezone.utc)
    except OverflowError:  # past the year 1 or 9999 in UTC: not narrowed
        return None


def _shifted(t: dt.datetime | None, delta: dt.timedelta) -> dt.datetime | None:
    """``t + delta``, or None (not narrowed) past what a datetime holds (``timestamp < '0001-01-01'``)."""
    try:
        return None if t is None else t + delta
    except OverflowError:
        return None


def translate(filters: list[Any], *, bucket: str | None, snapshot: bool,
              open_end_last: int | None) -> Translation:
    """Decide each of Spark's ``filters`` (module docstring). ``bucket``: the read is a bucket's
    (``key`` maps to ``$KV.<bucket>.<key>``). ``snapshot``: a last-per-subject read. ``open_end_last``:
    the stream's last sequence when the read has no explicit end (its end is then decided when it
    runs): an upper sequence bound at or past it cannot fix the end, and is returned."""
    returned: list[Any] = []
    subject_filters: list[Any] = []
    subjects: tuple[str, ...] | None = None
    first = last = None
    since = until = None
    nothing = False
    never_null = _NEVER_NULL | ({"key", "operation"} if bucket else set())
    for f in filters:
        name, column = type(f).__name__, _column(f)
        if name == "IsNotNull" and column in never_null:
            continue
        if column == "subject" or (column == "key" and bucket):
            found = _subject_patterns(f, name, f"$KV.{bucket}." if column == "key" else "")
            if found is None:
                returned.append(f)
                continue
            subjects = found if subjects is None else _intersect_sets(subjects, found)
            subject_filters.append(f)
            continue
        if column == "seq" and not snapshot:
            if name == "In":
                values = [v for v in f.value if v is not None]
                if not all(_int(v) is not None for v in values):
                    returned.append(f)
                    continue
                returned.append(f)  # narrowing: Spark keeps the values in between out
                if not values:
                    nothing = True
                    continue
                lo, hi = min(values), max(values)
                if open_end_last is not None and hi >= open_end_last:
                    hi = None  # the end stays open (decided when the read runs)
            else:
                v = _int(getattr(f, "value", None))
                bounds = {"GreaterThan": (None if v is None else v + 1, None), "GreaterThanOrEqual": (v, None),
                          "LessThan": (None, None if v is None else v - 1), "LessThanOrEqual": (None, v),
                          "EqualTo": (v, v), "EqualNullSafe": (v, v)}.get(name)
                if v is None or bounds is None:
                    returned.append(f)
                    continue
                lo, hi = bounds
                if hi is not None and open_end_last is not None and hi >= open_end_last:
                    returned.append(f)  # the end is decided when the read runs: cannot be fixed here
                    if lo is None:
                        continue
                    hi = None
            if lo is not None:
                first = lo if first is None else max(first, lo)
            if hi is not None:
                last = hi if last is None else min(last, hi)
            continue
        if column == "timestamp" and not snapshot:
            returned.append(f)  # narrowing only: Spark checks the rows again
            t = _utc(getattr(f, "value", None))
            window = {"GreaterThan": (_shifted(t, _ONE_US), None), "GreaterThanOrEqual": (t, None),
                      "LessThan": (None, _shifted(t, -_ONE_US)), "LessThanOrEqual": (None, t),
                      "EqualTo": (t, t), "EqualNullSafe": (t, t)}.get(name) if t is not None else None
            if window is None:
                continue
            lo_t, hi_t = window
            if lo_t is not None:
                since = lo_t if since is None else max(since, lo_t)
            if hi_t is not None:
                until = hi_t if until is None else min(until, hi_t)
            continue
        returned.append(f)
    if first is not None and first < 1:
        first = None  # sequences start at 1
    if last is not None and last < 1 or (first is not None and last is not None and first > last):
        nothing = True
    if since is not None and until is not None and since > until:
        nothing = True
    if until == _LAST_TIME:
        until = None  # every time is at or before it (and the reader looks one microsecond past the end)
    pushed = Pushed(subjects, first, last, since, until, nothing)
    return Translation(pushed, tuple(returned), tuple(subject_filters))


def narrow_subjects(base: tuple[str, ...], pushed: tuple[str, ...]) -> tuple[str, ...]:
    """The filter subjects of a read whose own filters are ``base`` (none: everything), narrowed to
    ``pushed``. Empty: the read matches nothing.

    Never narrowed by the stream's configured subjects: they are not the subjects it holds. A stream
    that sources others stores each message under its origin's subject (or its source transform's), a
    mirror holds its origin's and has none of its own, a ``subject_transform`` stores the transformed
    subject, and a stream whose subjects were changed keeps the messages of the old ones (all seen on
    nats-server 2.15.1, which takes a consumer filter naming any subject). A filter no message matches
    costs one consumer that delivers nothing."""
    return _intersect_sets(base or (">",), pushed)
