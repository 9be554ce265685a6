"""The sink's order per subject (sink/ordering.py) and the read's notes to it (task_notes.py), as plain values."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from pyspark_jetstream.errors import OrderError
from pyspark_jetstream.sink.ordering import PUBLISH, SORT, SortedRows, SubjectSample, decide, shared_subjects
from pyspark_jetstream.task_notes import ReadNote, leave, take


def _note(split="sequence", partitions=4, index=0, stream="S"):
    return ReadNote(stream, split, partitions, index)


def test_a_narrow_write_from_a_read_split_by_sequence_is_refused_naming_the_fix():
    # At its first rows the task may yet read the other ranges (coalesce(1)): held, and checked at the end.
    assert decide([_note()], True, "stream 'T'") == SORT
    with pytest.raises(OrderError) as refused:
        decide([_note()], True, "stream 'T'", ended=True)
    text = str(refused.value)
    assert "stream 'S'" in text and "4 sequence ranges" in text and '.repartition(n, "subject")' in text
    assert "order='none'" in text and "reads 1 of them" in text
    with pytest.raises(OrderError):  # no positions to hold the rows in order by: refused at once
        decide([_note()], False, "stream 'T'")


def test_a_task_that_read_every_range_by_its_end_is_accepted():
    first = [_note(index=0)]
    assert decide(first, True, "stream 'T'") == SORT
    assert decide(first + [_note(index=i) for i in (1, 2, 3)], True, "stream 'T'", ended=True) == SORT
    with pytest.raises(OrderError):
        decide(first + [_note(index=2)], True, "stream 'T'", ended=True)


@pytest.mark.parametrize(("notes", "positions", "mode"), [
    ([_note(partitions=1)], True, SORT),  # one range: in order as read (sorted all the same)
    ([_note(split="subject")], True, SORT),  # each subject in one partition
    ([_note(split="snapshot")], False, PUBLISH),
    ([_note(index=i) for i in range(4)], True, SORT),  # coalesce(1): every range in one task
    ([_note(index=i) for i in range(4)], False, PUBLISH),
    ([], True, SORT),  # through a shuffle: sort by the source sequence
    ([], False, PUBLISH),  # nothing to sort by, nothing known
])
def test_what_a_task_does(notes, positions, mode):
    assert decide(notes, positions, "stream 'T'") == mode


def _batch(seqs, tag="x"):
    return pa.RecordBatch.from_pydict({"seq": pa.array(seqs, pa.int64()),
                                       "data": pa.array([f"{tag}{s}" for s in seqs], pa.string())})


def _drain(rows: SortedRows, size=7):
    out = pa.Table.from_batches(list(rows.batches(size)))
    rows.close()
    return out


@pytest.mark.parametrize("max_bytes", [1 << 30, 200])  # in memory; spilled nearly every batch
def test_rows_come_back_in_sequence_order_whatever_the_arrival(tmp_path, max_bytes):
    rng = random.Random(5)
    seqs = list(range(1, 500))
    # runs as a reduce task gets them: blocks of ascending sequences from several ranges, in any order
    runs = [seqs[i:i + 50] for i in range(0, len(seqs), 50)]
    rng.shuffle(runs)
    rows = SortedRows("seq", max_bytes, str(tmp_path))
    for run in runs:
        for k in range(0, len(run), 13):
            rows.add(_batch(run[k:k + 13]))
    assert (len(rows.runs) > 1) == (max_bytes == 200)
    out = _drain(rows)
    assert out.column("seq").to_pylist() == seqs
    assert out.column("data").to_pylist() == [f"x{s}" for s in seqs]
    assert not list(tmp_path.iterdir())  # spilled runs removed


@pytest.mark.parametrize("max_bytes", [1 << 30, 100])
def test_equal_sequences_keep_their_arrival_order_and_nulls_come_last(tmp_path, max_bytes):
    rows = SortedRows("seq", max_bytes, str(tmp_path))
    rows.add(_batch([3, None, 1], "a"))
    rows.add(_batch([1, 2, None], "b"))
    rows.add(_batch([3, 2], "c"))
    out = _drain(rows, 2)
    assert list(zip(out.column("seq").to_pylist(), out.column("data").to_pylist(), strict=True)) == [
        (1, "a1"), (1, "b1"), (2, "b2"), (2, "c2"), (3, "a3"), (3, "c3"), (None, "aNone"), (None, "bNone")]


def test_memory_held_is_bounded_by_the_option(tmp_path):
    rows = SortedRows("seq", 1 << 16, str(tmp_path))
    for k in range(50):
        rows.add(_batch(list(range(k * 1000, k * 1000 + 1000))))
        assert rows.held_bytes <= (1 << 16) + _batch(list(range(1000))).nbytes
    assert len(rows.runs) > 5
    assert _drain(rows, 4096).num_rows == 50_000


def test_samples_show_subjects_written_by_two_tasks():
    everything = pa.array([f"s{i}" for i in range(1000)])
    spread = [SubjectSample().merged(everything) for _ in range(3)]  # every subject in every task
    shared = shared_subjects(list(enumerate(spread)))
    assert len(shared) == SubjectSample.K and all(tasks == [0, 1, 2] for tasks in shared.values())
    apart = [SubjectSample().merged(pa.array([f"s{i}" for i in range(1000) if i % 3 == k])) for k in range(3)]
    assert shared_subjects(list(enumerate(apart))) == {}
    one = SubjectSample().merged(pa.array(["only", None, "only"]))
    assert [s for _, s in one.entries] == ["only"]
    # merging batch by batch gives the same sample as all at once
    step = SubjectSample()
    for k in range(0, 1000, 100):
        step = step.merged(everything.slice(k, 100))
    assert step == spread[0]


def test_notes_are_taken_by_their_own_task_once(tmp_path):
    leave(_note(index=2), key="7", directory=tmp_path)
    leave(_note(index=3, stream="B"), key="7", directory=tmp_path)
    leave(_note(index=1), key="8", directory=tmp_path)
    assert sorted(take(key="7", directory=tmp_path), key=lambda n: n.index) == [_note(index=2),
                                                                                 _note(index=3, stream="B")]
    assert take(key="7", directory=tmp_path) == []
    assert take(key="8", directory=tmp_path) == [_note(index=1)]
    assert take(key="9", directory=tmp_path / "missing") == []


def test_no_task_no_note(tmp_path):
    leave(_note(), directory=tmp_path)  # outside a Spark task: nothing to tie the note to
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_split_by_subject_is_kept_until_the_user_chooses():
    """An upgrade keeps running (issue #39): a streaming query whose checkpoint records the read split by
    subject (the default before 0.2.0) goes on so, unless the option 'split' is given."""
    from pyspark_jetstream.options import parse_source_options
    from pyspark_jetstream.source.reader import _keeps_subject_split

    old = {"stream": "S", "seq": 10, "partitions": 4, "split": "subject", "depth": 1}
    default = parse_source_options({"servers": "nats://127.0.0.1:4222", "stream": "S"}, streaming=True)
    chosen = parse_source_options({"servers": "nats://127.0.0.1:4222", "stream": "S", "split": "sequence"},
                                  streaming=True)
    assert _keeps_subject_split(default, old) is True
    assert _keeps_subject_split(chosen, old) is False
    assert _keeps_subject_split(default, {**old, "split": None}) is False
