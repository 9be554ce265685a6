"""The filter subjects a consumer is given for a set of user filters (protocol/subjects.py).

nats-server refuses a consumer whose filter subjects overlap (err_code 10138), and a read must still
deliver every subject any user filter matches, once: containing filters absorb those they contain,
partial overlaps are read through a cover and kept by pattern on the client."""

from __future__ import annotations

import random

import pytest

from pyspark_jetstream.protocol.subjects import (
    consumer_filters,
    contains,
    intersect,
    reduce_filters,
    subject_matches,
)


@pytest.mark.parametrize(("filters", "server", "exact"), [
    ((), (), True),
    (("a.>",), ("a.>",), True),
    (("t.>", "t.s1.*"), ("t.>",), True),
    (("t.>", "t.>", "t.s1.d1"), ("t.>",), True),
    (("a.b", "a.c"), ("a.b", "a.c"), True),
    (("a.*.c", "a.b.>"), ("a.*.>",), False),
    (("a.*", "*.b"), ("*.*",), False),
    (("a.*.c", "a.b.*", "x.>"), ("a.*.*", "x.>"), False),
    ((">", "a.b"), (">",), True),
])
def test_cases(filters, server, exact):
    assert consumer_filters(filters) == (server, exact)


def test_contains_and_reduce():
    assert contains("a.>", "a.*") and contains("a.*", "a.b") and not contains("a.*", "a.>")
    assert reduce_filters(["b", "a.>", "a.b", "a.>"]) == ["a.>", "b"]


def _pattern(rng: random.Random) -> str:
    parts = [rng.choice(["a", "b", "c", "*"]) for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.3:
        parts.append(">")
    return ".".join(parts)


def test_any_filter_set_becomes_disjoint_filters_that_cover_it_exactly_or_flagged():
    rng = random.Random(11)
    subjects = sorted({".".join(rng.choice("abcd") for _ in range(rng.randint(1, 4))) for _ in range(400)})
    for _ in range(600):
        filters = [_pattern(rng) for _ in range(rng.randint(1, 5))]
        server, exact = consumer_filters(filters)
        # the server accepts them: no two share a subject
        assert all(intersect(x, y) is None for i, x in enumerate(server) for y in server[i + 1:]), (filters, server)
        for s in subjects:
            wanted = any(subject_matches(f, s) for f in filters)
            delivered = sum(subject_matches(f, s) for f in server)
            assert delivered <= 1
            if wanted:
                assert delivered == 1, (filters, server, s)  # nothing asked for is missed
            elif exact:
                assert delivered == 0, (filters, server, s)  # exact: nothing more either
