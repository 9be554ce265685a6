"""The order stage of a task's write (sink/order/stage.py) on its own: which batches go out at once, which
are held and given back in source order, and what the stage counts for the commit message."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest

from pyspark_jetstream.errors import OrderError
from pyspark_jetstream.sink.encode.layout import InputLayout
from pyspark_jetstream.sink.order.stage import OrderStage
from pyspark_jetstream.task_notes import ReadNote

AS_READ = InputLayout(subject="subject", source_stream="stream", source_seq="seq")


def _plan(order: str, layout: InputLayout = AS_READ) -> SimpleNamespace:
    options = SimpleNamespace(order=order, bucket=None, subject=None, order_max_buffer_bytes=1 << 20)
    return SimpleNamespace(options=options, layout=layout, sequence=None)


def _batch(rows: list[tuple[str, int]]) -> pa.RecordBatch:
    return pa.record_batch({"subject": pa.array([s for s, _ in rows], pa.string()),
                            "stream": pa.array(["S"] * len(rows), pa.string()),
                            "seq": pa.array([q for _, q in rows], pa.int64())})


def test_rows_through_a_shuffle_are_held_and_given_back_in_source_order(monkeypatch):
    monkeypatch.setattr("pyspark_jetstream.task_notes.take", lambda **_: [])  # no read in this task
    stage = OrderStage(_plan("subject"), "stream 'T'")
    assert not stage.order(_batch([("a", 5), ("b", 2)]))
    assert not stage.order(_batch([("a", 1), ("b", 9)]))
    stage.check_at_end()
    held = stage.release()
    try:
        seqs = [q for batch in held.batches(100) for q in batch.column("seq").to_pylist()]
    finally:
        held.close()
    assert seqs == [1, 2, 5, 9] and stage.release() is None
    assert sorted(s for _, s in stage.sample.entries) == ["a", "b"]
    assert stage.out_of_order == 0 and stage.unpositioned is None


def test_rows_without_a_position_go_out_as_they_come_and_are_counted(monkeypatch):
    monkeypatch.setattr("pyspark_jetstream.task_notes.take", lambda **_: [])
    stage = OrderStage(_plan("subject", InputLayout(subject="subject")), "stream 'T'")
    assert stage.order(_batch([("a", 5), ("a", 1)])) and stage.order(_batch([("b", 1)]))
    assert stage.unpositioned == 3 and stage.release() is None


def test_a_task_fed_straight_from_a_read_split_by_sequence_is_refused_at_its_end(monkeypatch):
    notes = [ReadNote("S", "sequence", 4, 0)]
    monkeypatch.setattr("pyspark_jetstream.task_notes.take", lambda **_: notes)
    stage = OrderStage(_plan("subject"), "stream 'T'")
    assert not stage.order(_batch([("a", 1)]))  # held: the task might read the other ranges yet
    notes = []  # the task's end brings no note of the other ranges
    with pytest.raises(OrderError, match="stream 'T'"):
        stage.check_at_end()
    stage.close()


def test_order_none_publishes_rows_as_read_and_counts_those_that_step_back():
    stage = OrderStage(_plan("none"), "stream 'T'")
    assert stage.order(_batch([("a", 1), ("a", 3), ("a", 2)]))
    assert stage.order(_batch([("a", 0)]))
    assert stage.out_of_order == 2 and stage.sample is None
