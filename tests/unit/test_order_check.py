"""The sink's count of rows whose source order was broken before they reached it (sink/order/order_check.py)."""

from __future__ import annotations

import pyarrow as pa

from pyspark_jetstream.sink.order.order_check import OrderCheck


def _batch(rows):
    subjects, streams, seqs = zip(*rows, strict=True) if rows else ((), (), ())
    return pa.record_batch({"subject": pa.array(subjects, pa.string()), "stream": pa.array(streams, pa.string()),
                            "seq": pa.array(seqs, pa.int64())})


def test_rows_in_source_order_per_subject_count_nothing_however_interleaved():
    check = OrderCheck("subject", "stream", "seq")
    check.check(_batch([("a", "S", 1), ("b", "S", 2), ("a", "S", 3), ("b", "T", 1), ("b", "S", 9)]))
    check.check(_batch([("a", "S", 10), ("b", "T", 2), ("b", "S", 11)]))
    assert check.behind == 0


def test_each_step_back_of_a_subject_counts_within_a_batch_and_across_batches():
    check = OrderCheck("subject", "stream", "seq")
    check.check(_batch([("a", "S", 5), ("b", "S", 6), ("a", "S", 3), ("a", "S", 4), ("b", "S", 7)]))
    assert check.behind == 1  # a: 5 then 3
    check.check(_batch([("b", "S", 2), ("a", "S", 6)]))  # b went back from 7 to 2; a goes on from 5
    assert check.behind == 2
    check.check(_batch([("a", "S", None), ("c", "S", 1)]))  # a null sequence is not a source position
    assert check.behind == 2


def test_the_same_sequence_from_two_streams_is_two_subjects_histories():
    check = OrderCheck("subject", "stream", "seq")
    check.check(_batch([("a", "S", 5), ("a", "T", 1), ("a", "S", 6), ("a", "T", 2)]))
    assert check.behind == 0


def test_without_a_subject_column_every_row_is_the_default_subjects():
    check = OrderCheck(None, "stream", "seq")
    check.check(_batch([("x", "S", 2), ("y", "S", 1)]))
    assert check.behind == 1


def test_the_highest_sequence_of_each_subject_is_carried_over_many_batches():
    check = OrderCheck("subject", "stream", "seq")
    for first in (1, 11, 21):  # three batches in order for two subjects, then one going back for b only
        check.check(_batch([("a", "S", first), ("b", "S", first + 1), ("a", "S", first + 2)]))
    assert check.behind == 0
    check.check(_batch([("a", "S", 40), ("b", "S", 12)]))
    assert check.behind == 1


def test_a_task_writing_a_million_subjects_keeps_a_bounded_table_and_still_counts_recent_steps_back():
    """Issue #33, item 7: the table of highest sequences stays within MAX_SUBJECTS pairs (measured: its
    Arrow buffers at 100,000 subjects), a million subjects in order count nothing, and a recent subject
    going back still counts; a forgotten one is not counted (a lower bound, never a false alarm)."""
    from pyspark_jetstream.sink.order.order_check import MAX_SUBJECTS

    check = OrderCheck("subject", "stream", "seq")
    total, step = 1_000_000, 100_000
    for start in range(0, total, step):
        ids = range(start, start + step)
        check.check(pa.record_batch({"subject": pa.array([f"copy.orders.c{i}" for i in ids]),
                                   "stream": pa.array(["ORDERS"] * step), "seq": pa.array([i + 1 for i in ids])}))
        assert check.seen.num_rows <= MAX_SUBJECTS
    assert check.behind == 0
    assert check.forgotten == total - MAX_SUBJECTS
    size = check.seen.nbytes
    print(f"order check table at {MAX_SUBJECTS} of {total} subjects: {size / 1e6:.1f} MB")
    assert size < 8_000_000
    check.check(_batch([(f"copy.orders.c{total - 1}", "ORDERS", 5)]))  # recent: remembered
    assert check.behind == 1
    check.check(_batch([("copy.orders.c0", "ORDERS", 0)]))  # forgotten long ago: not counted
    assert check.behind == 1
