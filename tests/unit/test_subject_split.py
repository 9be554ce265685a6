"""The split by subject: groups, owners, filter intersections and chunks, as plain values."""

from __future__ import annotations

import random

import pytest

from pyspark_jetstream.source.subject_split import (
    ALL,
    MAX_FILTERS,
    choose_depth,
    chunks,
    filters_for,
    group_of,
    intersect,
    owner,
)


def _matches(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(s) == len(p)


@pytest.mark.parametrize(("subject", "depth", "group"), [
    ("a.b.c", None, "a.b.c"), ("a.b.c", 1, "a.>"), ("a.b.c", 2, "a.b.>"), ("a.b.c", 3, "a.b.c"),
    ("a", 1, "a"), ("a.b", 5, "a.b"), ("a.b", ALL, ">"),
])
def test_groups(subject, depth, group):
    assert group_of(subject, depth) == group


@pytest.mark.parametrize(("a", "b", "both"), [
    ("a.>", "a.*.c", "a.*.c"), ("a.b.>", "a.*.c", "a.b.c"), ("a.b.c", "a.*.c", "a.b.c"), ("a.b", "a.*.c", None),
    ("a.>", ">", "a.>"), ("a.b", "a.b.>", None), ("x.>", "y.>", None), ("*.b", "a.*", "a.b"), ("a.*", "a.>", "a.*"),
    ("$KV.B.dev0", "$KV.B.>", "$KV.B.dev0"), ("dev0", "$KV.B.>", None),
])
def test_intersections(a, b, both):
    assert intersect(a, b) == both
    assert intersect(b, a) == both


def test_intersections_match_exactly_what_both_patterns_match():
    rng = random.Random(7)
    tokens = ["a", "b", "*"]
    subjects = [".".join(rng.choice("ab") for _ in range(rng.randint(1, 4))) for _ in range(300)]
    for _ in range(400):
        def pattern():
            parts = [rng.choice(tokens) for _ in range(rng.randint(1, 3))]
            if rng.random() < 0.4:
                parts.append(">")
            return ".".join(parts)

        a, b = pattern(), pattern()
        both = intersect(a, b)
        for s in subjects:
            expected = _matches(a, s) and _matches(b, s)
            assert (both is not None and _matches(both, s)) == expected, (a, b, both, s)


def test_owners_are_stable_and_spread():
    assert owner("a.b", 4) == owner("a.b", 4)
    assert owner("anything", 1) == 0 and owner(">", 8) == 0
    counts = [0] * 4
    for i in range(4000):
        counts[owner(f"dev{i}", 4)] += 1
    assert min(counts) > 850  # crc32 spreads names that differ in one token's digits


def test_every_subject_is_read_by_exactly_one_partition():
    rng = random.Random(3)
    subjects = sorted({f"t.s{rng.randint(0, 30)}.d{rng.randint(0, 50)}" for _ in range(800)} | {"t", "t.s1"})
    for depth in (None, 1, 2, 3):
        parts = [filters_for(subjects, depth, 4, i, ()) for i in range(4)]
        for s in subjects:
            readers = [i for i, fs in enumerate(parts) if any(_matches(f, s) for f in fs)]
            assert len(readers) == 1, (depth, s, readers)
        for fs in parts:  # filters of one consumer never overlap (the server refuses that)
            assert all(intersect(x, y) is None for x in fs for y in fs if x != y)


def test_user_filters_narrow_the_groups():
    subjects = ["t.a.x", "t.a.y", "t.b.x", "t.b.y"]
    got = sorted(f for i in range(3) for f in filters_for(subjects, 2, 3, i, ("t.*.x",)))
    assert got == ["t.a.x", "t.b.x"]
    assert sorted(f for i in range(3) for f in filters_for(["t.a.x", "t.b.x"], None, 3, i, ("t.*.x",))) == [
        "t.a.x", "t.b.x"]


def test_one_group_is_read_by_partition_zero():
    assert filters_for(["a", "b"], ALL, 4, 0, ()) == [">"]
    assert filters_for(["a", "b"], ALL, 4, 0, ("a", "b")) == ["a", "b"]
    assert filters_for(["a", "b"], ALL, 4, 2, ()) == []


def test_depth_choice():
    assert choose_depth(5, 1) == ALL
    assert choose_depth(0, 4) is None and choose_depth(8, 4) is None  # literal: a few filters each
    assert choose_depth(4 * MAX_FILTERS, 4) is None
    many = [f"tele.site{s}.dev{d}" for s in range(20) for d in range(100)]
    assert choose_depth(len(many), 4, many) == 2  # 20 site groups: parallel, one consumer each
    flat = [f"$KV.B.k{i}" for i in range(5000)]
    assert choose_depth(len(flat), 4, flat) is None  # no prefix to group by: literal, read in chunks
    assert choose_depth(len(flat), 4, flat, max_groups=1000) == ALL  # too many to list: one partition


def test_chunks():
    assert chunks([]) == []
    assert chunks(["a"]) == [("a",)]
    filters = [f"s{i}" for i in range(250)]
    got = chunks(filters)
    assert [len(c) for c in got] == [MAX_FILTERS, MAX_FILTERS, 50]
    assert [f for c in got for f in c] == filters
