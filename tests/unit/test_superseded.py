"""Which rows a replay skips although the target no longer holds them (sink/records/superseded.py)."""

from __future__ import annotations

import pytest

from pyspark_jetstream.sink.records.superseded import Superseded, order_key

RUN = "q-1:7"


def test_order_key_reads_both_id_shapes_of_the_run_only():
    assert order_key(RUN, f"{RUN}:3:41") == ("#3", 41)
    assert order_key(RUN, f"{RUN}:SRC.12:0123456789abcdef") == ("SRC", 12)
    assert order_key(RUN, f"{RUN}:SRC.12:0123456789abcdef.2") == ("SRC", 12)
    assert order_key(RUN, "q-1:8:3:41") is None  # another batch of the query
    assert order_key(RUN, "user-chosen") is None


def test_a_row_is_covered_once_the_target_keeps_fewer_than_the_later_rows_of_its_subject():
    found = Superseded(RUN, limit=2)
    for position in (5, 9):
        found.note_stored("t.k", f"{RUN}:0:{position}")
    assert found.covers("t.k", f"{RUN}:0:1")  # two later rows stored: a 2-per-subject target dropped it
    assert not found.covers("t.k", f"{RUN}:0:6")  # only one later: the target would still hold it
    assert not found.covers("t.j", f"{RUN}:0:1")  # another subject
    assert not found.covers("t.k", f"{RUN}:1:1")  # another task's positions are another order
    assert not found.covers("t.k", None)


@pytest.mark.parametrize("limit", [None, 0, -1])  # -1: the server's "unlimited" in a stream config
def test_without_a_per_subject_limit_only_a_rollup_covers_earlier_rows(limit):
    found = Superseded(RUN, limit=limit)
    found.note_stored("t.k", f"{RUN}:SRC.10:aa")
    assert not found.covers("t.k", f"{RUN}:SRC.3:bb")
    found.note_stored("t.k", f"{RUN}:SRC.8:cc", rollup=True)
    assert found.covers("t.k", f"{RUN}:SRC.3:bb")
    assert not found.covers("t.k", f"{RUN}:SRC.9:dd")
    assert not found.covers("t.k", f"{RUN}:OTHER.3:bb")
