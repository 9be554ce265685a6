"""NATS subjects: which ones a message can be published to, and which a pattern matches."""

from __future__ import annotations

import re

_NOT_PUBLISHABLE = re.compile(r"\s|(^|\.)[*>](\.|$)|^\.|\.\.|\.$")


def is_publish_subject(subject: str) -> bool:
    """A subject a message can be published to: no whitespace, no wildcard or empty token."""
    return bool(subject) and not _NOT_PUBLISHABLE.search(subject)


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` one or more trailing tokens."""
    pat = pattern.split(".")
    sub = subject.split(".")
    for i, token in enumerate(pat):
        if token == ">":
            return len(sub) > i
        if i >= len(sub) or (token != "*" and token != sub[i]):
            return False
    return len(pat) == len(sub)


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


def contains(outer: str, inner: str) -> bool:
    """Whether every subject ``inner`` matches is matched by ``outer``."""
    return intersect(outer, inner) == inner


def _cover(patterns: list[str]) -> str:
    """The narrowest single pattern that matches everything each of ``patterns`` matches, token by token:
    a token all share stays, differing tokens become ``*``, and from the first ``>`` or the first
    position where the lengths differ, ``>``."""
    split = [p.split(".") for p in patterns]
    out: list[str] = []
    for i in range(max(len(t) for t in split)):
        column = [t[i] if i < len(t) else None for t in split]
        if None in column or ">" in column:
            out.append(">")
            break
        out.append(column[0] if all(c == column[0] for c in column) else "*")
    return ".".join(out)


def reduce_filters(filters: list[str] | tuple[str, ...]) -> list[str]:
    """``filters`` sorted, without repeats and without those another one contains."""
    unique = sorted(set(filters))
    return [f for f in unique if not any(g != f and contains(g, f) for g in unique)]


def consumer_filters(filters: list[str] | tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
    """The filter subjects a consumer can be given for a read of ``filters`` (none: everything), and
    whether they match exactly what ``filters`` match.

    nats-server refuses a consumer whose filter subjects share a subject (err_code 10138,
    "consumer subject filters cannot overlap"). Repeated filters and filters contained in another
    are dropped, which changes nothing; filters that overlap only in part (``a.*.c`` and ``a.b.>``)
    are replaced by one pattern covering them (``a.*.>``): the server then delivers a little more
    than was asked for, and ``False`` says the reader must keep only the messages that match
    ``filters`` (:class:`SubjectKeep`)."""
    kept = reduce_filters(filters)
    exact = True
    while True:
        merged = False
        for i, x in enumerate(kept):
            others = [y for y in kept[i + 1:] if intersect(x, y) is not None]
            if others:
                group = [x, *others]
                kept = reduce_filters([f for f in kept if f not in group] + [_cover(group)])
                exact, merged = False, True
                break
        if not merged:
            return tuple(kept), exact
