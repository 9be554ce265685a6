"""The split by subject: groups, owners, filter intersections and chunks, as plain values."""

from __future__ import annotations

import random

import pytest

from pyspark_jetstream.protocol.subjects import intersect, subject_matches
from pyspark_jetstream.source.plan.subject_split import (
    ALL,
    MAX_FILTERS,
    MAX_KNOWN,
    SERVER_FILTERS,
    SubjectKeep,
    choose_depth,
    chunks,
    consumers_for,
    filters_for,
    group_of,
    owner,
    sequence_consumer,
)


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
            expected = subject_matches(a, s) and subject_matches(b, s)
            assert (both is not None and subject_matches(both, s)) == expected, (a, b, both, s)


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
            readers = [i for i, fs in enumerate(parts) if any(subject_matches(f, s) for f in fs)]
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


def _reads(consumers: list, subject: str) -> bool:
    """Whether a partition running ``consumers`` takes ``subject``'s messages (a consumer without
    filters delivers every subject; a keep keeps only its own)."""
    return any((not filters or any(subject_matches(f, subject) for f in filters))
               and (keep is None or keep.keeps(subject.encode())) for filters, keep in consumers)


@pytest.mark.parametrize("user_filters", [(), tuple(f"t.*.d{j}" for j in range(20))])
def test_many_groups_are_kept_by_owner_on_the_client(user_filters):
    """More groups than the server filters well: the partition reads its filters' every message and keeps
    its own, and each subject is still read by the partition the server's filters would have given it."""
    flat = [f"t.s{i}.d{j}" for i in range(30) for j in range(40)]  # 1,200 subjects, 4 partitions
    kept_by_owner: set[int] = set()
    for depth in (None, 2):
        plans = [consumers_for(flat, depth, 4, i, user_filters) for i in range(4)]
        for i, plan in enumerate(plans):
            server_side = filters_for(flat, depth, 4, i, user_filters)
            if len(server_side) > SERVER_FILTERS:
                assert [f for f, _ in plan] == [tuple(sorted(user_filters))]
                assert all(o is not None and o.index == i and o.partitions == 4 for _, o in plan)
            else:
                assert plan == [(f, None) for f in chunks(server_side)]
        kept_by_owner.update(i for i, plan in enumerate(plans) if any(o is not None for _, o in plan))
        for subject in flat:
            readers = [i for i, plan in enumerate(plans) if _reads(plan, subject)]
            wanted = not user_filters or any(subject_matches(f, subject) for f in user_filters)
            assert readers == ([owner(group_of(subject, depth), 4)] if wanted else []), (depth, subject, readers)
    assert kept_by_owner == {0, 1, 2, 3}  # every partition had more groups than the server filters


def test_a_snapshot_keeps_the_server_filters_in_chunks():
    flat = [f"$KV.B.k{i}" for i in range(1000)]
    plan = consumers_for(flat, None, 4, 1, (), by_owner=False)
    assert all(o is None for _, o in plan) and sum(len(f) for f, _ in plan) == len(filters_for(flat, None, 4, 1, ()))
    assert len(plan) == 3


def test_ownership_remembers_and_reads_bytes_that_are_not_utf8():
    own = SubjectKeep(None, None, 4, owner("a.b", 4))
    assert own.keeps(b"a.b") and own.known == {b"a.b": True}
    odd = b"a.\xff"
    assert own.keeps(odd) == (owner("a.\ufffd", 4) == own.index)


def test_a_few_groups_are_left_to_the_server():
    subjects = [f"t.k{i}" for i in range(4 * SERVER_FILTERS - 8)]  # about 6 each over 4 partitions
    plans = [consumers_for(subjects, None, 4, i, ()) for i in range(4)]
    assert all(o is None for plan in plans for _, o in plan)
    assert sorted(f for plan in plans for filters, _ in plan for f in filters) == sorted(subjects)


def test_user_filters_that_contain_others_are_read_once_and_partial_overlaps_through_a_cover():
    """A consumer refuses overlapping filter subjects: repeats and filters inside another are dropped;
    filters that overlap only in part are read through one pattern covering them, kept by pattern."""
    flat = [f"t.s{i}.d{j}" for i in range(30) for j in range(40)]
    contained = consumers_for(flat, None, 4, 1, ("t.>", "t.s1.>", "t.>"))
    assert [f for f, _ in contained] == [("t.>",)] and contained[0][1] is not None
    assert contained[0][1].patterns is None  # exact: only the owner is checked
    partial = consumers_for(flat, None, 4, 1, ("t.*.d1", "t.s1.>"))
    assert [f for f, _ in partial] == [("t.*.>",)] and partial[0][1].patterns == ("t.*.d1", "t.s1.>")
    plans = [consumers_for(flat, None, 4, i, ("t.*.d1", "t.s1.>")) for i in range(4)]
    for subject in flat + ["t.s1.d1"]:
        readers = [i for i in range(4) if _reads(plans[i], subject)]
        wanted = subject_matches("t.*.d1", subject) or subject_matches("t.s1.>", subject)
        assert readers == ([owner(subject, 4)] if wanted else []), subject


def test_a_sequence_range_reads_overlapping_filters_once_each():
    assert sequence_consumer(("t.>", "t.s1.*")) == (("t.>",), None)
    assert sequence_consumer(()) == ((), None)
    server, keep = sequence_consumer(("a.*.c", "a.b.>"))
    assert server == ("a.*.>",) and keep.patterns == ("a.*.c", "a.b.>")
    assert keep.keeps(b"a.x.c") and keep.keeps(b"a.b.q.r") and not keep.keeps(b"a.x.d")


def test_one_partition_or_one_group_never_needs_an_ownership():
    flat = [f"t.k{i}" for i in range(500)]
    assert consumers_for(flat, ALL, 4, 0, ()) == [((">",), None)]
    assert consumers_for(flat, None, 1, 0, tuple(f"t.k{i}" for i in range(20))) == [
        (tuple(sorted(f"t.k{i}" for i in range(20))), None)]


def test_ownership_memory_is_bounded():
    own = SubjectKeep(None, None, 4, 0)
    for i in range(MAX_KNOWN + 10):
        own.keeps(f"k.{i}".encode())
    assert len(own.known) <= MAX_KNOWN
    assert own.keeps(b"k.1") == (owner("k.1", 4) == 0)
