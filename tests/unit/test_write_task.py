"""A task's write (sink/task/write.py) as a pipeline of stages, each replaced here by a stand-in: which stage
a batch goes through, in what slices and at what positions, and where refused rows go."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pytest

from pyspark_jetstream.errors import PublishError
from pyspark_jetstream.sink.encode.frames import ReplyForm
from pyspark_jetstream.sink.encode.rows import EncodedBatch, RowRejection
from pyspark_jetstream.sink.records.attempt import ReplayRecords
from pyspark_jetstream.sink.task.write import MIN_SLICE, WriteTask


class _Publisher:
    reply_prefix, low_water = "_INBOX.t.", 3000
    reply_form = ReplyForm(reply_prefix)

    def __init__(self) -> None:
        self.sent: list[tuple[list, bool]] = []

    async def publish(self, frames, *, dead_letter=False):
        self.sent.append((frames, dead_letter))


class _Encoder:
    """Every row a frame (position, ...); the row at position 7 refused."""

    def encode(self, batch, first, reply_prefix, choice=None):
        out = EncodedBatch(expired=1)
        for i in range(batch.num_rows):
            if first + i == 7:
                out.rejected.append(RowRejection(first + i, "s", "refused", "data", None))
            else:
                out.frames.append((first + i, b"", "s", None, f"id{first + i}", 0, 0))
        return out


def _task(dead_letter_subject=None, ordering=None, reduction=None) -> WriteTask:
    task = WriteTask.__new__(WriteTask)
    task.plan = SimpleNamespace(guard=None, options=None, encoder=SimpleNamespace(max_payload=1 << 20))
    task.opts = SimpleNamespace(dead_letter_subject=dead_letter_subject)
    task.partition, task.msg_ids, task.position, task.expired, task.markers_skipped = 2, None, 0, 0, 0
    task.encoder, task.pub, task.retry, task.barrier = _Encoder(), _Publisher(), None, None
    task.records = ReplayRecords(task.plan, None, 2)
    task.ordering = ordering or SimpleNamespace(order=lambda batch: True)
    task.reduction = reduction
    task.settle = lambda: False
    return task


def _rows(n: int) -> pa.RecordBatch:
    return pa.record_batch({"data": pa.array([b"x"] * n)})


def test_a_batch_is_published_in_slices_of_the_refill_size_with_running_positions(monkeypatch):
    published = []
    task = _task()
    monkeypatch.setattr(task, "publish", lambda batch, first, choice=None: published.append((first, batch.num_rows)))
    task.write(_rows(7000))
    task.write(_rows(10))
    assert task.pub.low_water > MIN_SLICE
    assert published == [(0, 3000), (3000, 3000), (6000, 1000), (7000, 10)] and task.position == 7010


def test_a_held_batch_and_a_reduced_batch_are_not_published_at_once(monkeypatch):
    published, reduced = [], []
    held = _task(ordering=SimpleNamespace(order=lambda batch: False))
    monkeypatch.setattr(held, "publish", lambda *a, **k: published.append(a))
    held.write(_rows(5))
    sequenced = _task(reduction=SimpleNamespace(reduce=lambda batch, first: reduced.append((first, batch.num_rows))))
    sequenced.write(_rows(5))
    sequenced.write(_rows(4))
    assert published == [] and reduced == [(0, 5), (5, 4)] and sequenced.position == 9


def test_publish_encodes_diverts_the_refused_and_sends_the_rest():
    task = _task(dead_letter_subject="dlq")
    task.publish(_rows(10), 0)
    (dead, to_dlq), (frames, plain) = task.pub.sent
    assert to_dlq and [f[0] for f in dead] == [7] and dead[0][2] == "dlq"
    assert not plain and [f[0] for f in frames] == [0, 1, 2, 3, 4, 5, 6, 8, 9] and task.expired == 1


def test_without_a_dead_letter_subject_the_first_refused_row_fails_the_task():
    task = _task()
    with pytest.raises(PublishError) as failed:
        task.divert([RowRejection(9, "s", "late", "ttl", "x"), RowRejection(7, "s", "first", "data", None)])
    assert "first" in str(failed.value) and task.pub.sent == []


def test_rows_an_earlier_attempt_stored_are_skipped_and_counted():
    task = _task()
    task.records.already = {"id1": (5,), "id3": (6,)}
    kept = task.skip_stored([(p, b"", "s", None, f"id{p}", 0, 0) for p in range(4)])
    assert [f[0] for f in kept] == [0, 2] and task.records.already_stored == 2

