"""NATS subjects: which ones the server takes (judged here only, as the server judges them), and which
a pattern matches."""

from __future__ import annotations

import re

SEPARATORS = " \t\r\n"
"""The client protocol's argument separators (nats-server ``parser.go`` ``splitArg``): a ``PUB``/``HPUB``
subject ends at one, so no message the server stores has one in its subject."""
REFUSED = SEPARATORS + "\f"
"""What nats-server refuses inside a subject or filter (``sublist.go`` ``isValidSubject``): ASCII space,
tab, CR, LF and FF, nothing else. Python's ``\\s`` matches far more (U+3000, U+00A0, U+2028, ``\\v``,
``\\x1c``-``\\x1f``, ``\\x85``), all of which the server takes and stores (observed on 2.15.1)."""


_INVALID = re.compile(f"[{re.escape(REFUSED)}]|^\\.|\\.\\.|\\.$|(^|\\.)>\\.")
"""A refused character, an empty token, or ``>`` before the last token (one search: the sink asks per row)."""


def is_valid_subject(subject: str) -> bool:
    """A subject or filter as nats-server judges one (``sublist.go`` ``isValidSubject``): not empty, no
    empty token, none of :data:`REFUSED`, ``>`` only as the last token; wildcards allowed. The one judge
    of subject validity in the connector (options, pushdown, the sink): a consumer or stream given
    anything else is refused (err_code 10052)."""
    return bool(subject) and _INVALID.search(subject) is None


def is_valid_token(token: str) -> bool:
    """One token (no ``.``) the server accepts inside a subject, e.g. a stream name in an API subject."""
    return "." not in token and is_valid_subject(token)


def is_literal(subject: str) -> bool:
    """No wildcard token (``*`` or ``>``): the subject names itself only."""
    return not any(t in ("*", ">") for t in subject.split("."))


def is_publish_subject(subject: str) -> bool:
    """A subject a message can be published to as the server judges it: valid and without wildcards."""
    return is_valid_subject(subject) and is_literal(subject)


def is_receivable_subject(subject: str) -> bool:
    """A publish subject a nats-py client can also receive: nats-py's ``MSG``/``HMSG`` line regexes split
    on bytes ``\\s``, which adds VT to the server's refused five, so a message stored under a subject with
    VT is never delivered to one. This connector's reader takes them (``client/nats_internals.py``,
    ``receive_every_subject``); other nats-py readers do not. What the sink writes: a message it stores
    must be readable by any client."""
    return is_publish_subject(subject) and "\v" not in subject


def can_be_stored(subject: str) -> bool:
    """Whether a message may be stored under ``subject`` although it is not a valid subject: the server
    stores a publish to a subject with FF (``a.b\\fc``, observed on 2.15.1) or with a wildcard token,
    but never one with an empty token or a protocol separator (:data:`SEPARATORS`)."""
    return all(t and not any(c in SEPARATORS for c in t) for t in subject.split("."))


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
