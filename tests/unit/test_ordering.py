"""The sink's order per subject (sink/order/decide.py, sorted_rows.py, subject_sample.py) and the read's notes to it (task_notes.py), as plain values."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_jetstream.errors import LocalDirectoryError, OrderError
from pyspark_jetstream.sink.order import spill_dirs
from pyspark_jetstream.sink.order.decide import PUBLISH, SORT, decide
from pyspark_jetstream.sink.order.sorted_rows import SortedRows
from pyspark_jetstream.sink.order.subject_sample import SubjectSample, shared_subjects
from pyspark_jetstream.task_notes import ReadNote


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
            rows.hold(_batch(run[k:k + 13]))
    assert (len(rows.runs) > 1) == (max_bytes == 200)
    out = _drain(rows)
    assert out.column("seq").to_pylist() == seqs
    assert out.column("data").to_pylist() == [f"x{s}" for s in seqs]
    assert not list(tmp_path.iterdir())  # spilled runs removed


@pytest.mark.parametrize("max_bytes", [1 << 30, 100])
def test_equal_sequences_keep_their_arrival_order_and_nulls_come_last(tmp_path, max_bytes):
    rows = SortedRows("seq", max_bytes, str(tmp_path))
    rows.hold(_batch([3, None, 1], "a"))
    rows.hold(_batch([1, 2, None], "b"))
    rows.hold(_batch([3, 2], "c"))
    out = _drain(rows, 2)
    assert list(zip(out.column("seq").to_pylist(), out.column("data").to_pylist(), strict=True)) == [
        (1, "a1"), (1, "b1"), (2, "b2"), (2, "c2"), (3, "a3"), (3, "c3"), (None, "aNone"), (None, "bNone")]


def test_memory_held_is_bounded_by_the_option(tmp_path):
    rows = SortedRows("seq", 1 << 16, str(tmp_path))
    for k in range(50):
        rows.hold(_batch(list(range(k * 1000, k * 1000 + 1000))))
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


def test_a_checkpoint_split_by_subject_is_kept_until_the_user_chooses():
    """An upgrade keeps running (issue #39): a streaming query whose checkpoint records the read split by
    subject (the default before 0.2.0) goes on so, unless the option 'split' is given."""
    from pyspark_jetstream.options import parse_source_options
    from pyspark_jetstream.source.plan.offsets import keeps_subject_split

    old = {"stream": "S", "seq": 10, "partitions": 4, "split": "subject", "depth": 1}
    default = parse_source_options({"servers": "nats://127.0.0.1:4222", "stream": "S"}, streaming=True)
    chosen = parse_source_options({"servers": "nats://127.0.0.1:4222", "stream": "S", "split": "sequence"},
                                  streaming=True)
    assert keeps_subject_split(default, old) is True
    assert keeps_subject_split(chosen, old) is False
    assert keeps_subject_split(default, {**old, "split": None}) is False
# The spill (issue #39): under Spark's local directories, removed however the task ends, swept when
# its task was killed, and memory about order.maxBufferBytes.

def _spill_folders(root):
    return [p for p in root.iterdir() if p.name.startswith(spill_dirs.PREFIX)]


def test_the_spill_goes_under_the_first_usable_spark_local_dir(tmp_path, monkeypatch):
    local = tmp_path / "blockmgr-1"
    local.mkdir()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path / 'missing'},{local}")
    rows = SortedRows("seq", 100)
    for k in range(5):
        rows.hold(_batch(list(range(k * 10, k * 10 + 10))))
    assert rows.runs and all(Path(run).parent.parent == local for run in rows.runs)
    (folder,) = _spill_folders(local)
    assert folder.name.startswith(f"{spill_dirs.PREFIX}none-")  # the task attempt (none here), no pid
    assert _drain(rows).num_rows == 50
    assert not _spill_folders(local)  # removed after success
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "")
    assert spill_dirs.spill_root() == tempfile.gettempdir()


def test_the_spill_is_removed_when_the_consumer_fails_midway(tmp_path):
    rows = SortedRows("seq", 100, str(tmp_path))
    for k in range(5):
        rows.hold(_batch(list(range(k * 10, k * 10 + 10))))
    out = rows.batches(3)
    with pytest.raises(RuntimeError):
        for _ in out:
            raise RuntimeError("the publish failed")
    out.close()  # the generator closed: its memory maps too
    assert not rows._maps
    rows.close()  # what the task's finally does
    assert not _spill_folders(tmp_path)


HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("claimed", flush=True)
sys.stdin.read()  # until the test closes it
"""


def _claimed_by_another_process(lock: Path) -> subprocess.Popen:
    """A process that holds ``lock`` as a live task holds its folder's (its pid is irrelevant: it could be in
    another PID namespace); the test ends it by closing its stdin."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "claimed"  # waits for the lock, however long the start takes
    return holder


def test_the_sweep_goes_by_the_folders_lock_never_by_a_pid(tmp_path):
    """Issue #47: containers sharing a spill root do not share PID namespaces. A live task's folder is kept
    whatever pid its name holds (here one that is not running in this namespace), and a dead task's folder
    is swept though its name holds a running pid."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(done.stdout)
    live = tmp_path / f"{spill_dirs.PREFIX}{dead}-17-abc"  # named as the old rule would, from another namespace
    live.mkdir()
    (live / "run-0.arrow").write_bytes(b"x" * 100)
    holder = _claimed_by_another_process(live / spill_dirs.LOCK)
    try:
        left = tmp_path / f"{spill_dirs.PREFIX}{os.getpid()}-18-def"  # a running pid; its task is gone
        left.mkdir()
        (left / spill_dirs.LOCK).write_bytes(b"")
        other = tmp_path / "blockmgr-00"
        other.mkdir()
        SortedRows("seq", 100, str(tmp_path))  # a task's sort starts: it sweeps
        assert live.exists() and (live / "run-0.arrow").exists()
        assert not left.exists() and other.exists()
    finally:
        holder.stdin.close()
        holder.wait(30)
    assert spill_dirs.sweep(str(tmp_path)) == [live.name]  # its task ended without removing it: swept now


def test_a_folder_being_claimed_is_kept_and_one_whose_task_died_unclaimed_goes_later(tmp_path):
    young = tmp_path / f"{spill_dirs.PREFIX}1-a"  # made, its lock file a moment away
    young.mkdir()
    old = tmp_path / f"{spill_dirs.PREFIX}2-b"
    old.mkdir()
    long_ago = time.time() - spill_dirs.CLAIM_GRACE - 5
    os.utime(old, (long_ago, long_ago))
    assert spill_dirs.sweep(str(tmp_path)) == [old.name]
    assert young.exists()


def test_a_spill_folder_removed_under_its_task_stops_the_write_naming_it(tmp_path):
    """A guard that cannot keep its rows refuses (issue #47): runs lost under a task are never merged without them."""
    rows = SortedRows("seq", 100, str(tmp_path))
    for k in range(3):
        rows.hold(_batch(list(range(k * 10, k * 10 + 10))))
    assert rows.runs
    folder = rows.folder.path
    shutil.rmtree(folder)  # someone else's cleanup
    with pytest.raises(LocalDirectoryError, match="spill folder") as stopped:
        for k in range(3, 5):
            rows.hold(_batch(list(range(k * 10, k * 10 + 10))))
    assert folder in str(stopped.value) and "order.maxBufferBytes" in str(stopped.value)
    rows.close()
    reading = SortedRows("seq", 100, str(tmp_path))
    for k in range(3):
        reading.hold(_batch(list(range(k * 10, k * 10 + 10))))
    for run in reading.runs:
        os.remove(run)
    with pytest.raises(LocalDirectoryError):
        _drain(reading)
    reading.close()
    assert not _spill_folders(tmp_path)


PEAK = """
import sys
sys.path.insert(0, {connector!r})
import pyarrow as pa
from pyspark_jetstream.sink.order.sorted_rows import SortedRows
buffer = {buffer}
rows = SortedRows("seq", buffer, {directory!r})
fed = k = 0
while fed < 3 * buffer:  # 4 read tasks' blocks, each in order, arriving block by block (a shuffle)
    seqs = [(k // 4) * 40_000 + i * 4 + k % 4 for i in range(10_000)]
    batch = pa.record_batch([pa.array(seqs, pa.int64()), pa.array([b"x" * 100] * 10_000)], names=["seq", "data"])
    fed += batch.nbytes
    k += 1
    rows.hold(batch)
    del batch
last = -1
for batch in rows.batches(4096):
    seqs = batch.column(0).to_pylist()
    assert seqs == sorted(seqs) and seqs[0] > last
    last = seqs[-1]
assert rows.runs
rows.close()
print(pa.default_memory_pool().max_memory())
"""


def test_a_sort_of_three_times_its_buffer_peaks_at_about_the_buffer(tmp_path):
    """pyarrow's pool at its highest over a whole sort (held batches, spills, merge), in a fresh
    interpreter: the batches held, plus one batch arriving and a merge round (about 1/16 of the buffer)."""
    buffer = 16 << 20
    connector = str(Path(__file__).resolve().parents[2] / "connector")
    done = subprocess.run([sys.executable, "-c", PEAK.format(connector=connector, buffer=buffer,
                                                              directory=str(tmp_path))],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    peak = int(done.stdout.split()[-1])
    assert peak <= 1.2 * buffer, f"peak {peak / buffer:.2f}x the buffer"
