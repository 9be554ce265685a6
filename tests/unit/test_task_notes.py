"""The read's note to the write of its task (task_notes.py): where it goes, and that it fails closed (issue #47).

A note that is not there must mean that no read of the task ran: a read that cannot leave its note fails,
and a write that cannot look for its notes, or read one, is refused. Plain files, no Spark."""

from __future__ import annotations

import os
import time

import pytest

from pyspark_jetstream import task_notes
from pyspark_jetstream.errors import LocalDirectoryError
from pyspark_jetstream.task_notes import FOLDER, ReadNote, leave, notes_root, take


def _note(split="sequence", partitions=4, index=0, stream="S"):
    return ReadNote(stream, split, partitions, index)


def test_notes_are_taken_by_their_own_task_once(tmp_path):
    leave(_note(index=2), key="7", root=tmp_path).release()
    leave(_note(index=3, stream="B"), key="7", root=tmp_path).release()
    leave(_note(index=1), key="8", root=tmp_path).release()
    assert sorted(take(key="7", root=tmp_path), key=lambda n: n.index) == [_note(index=2),
                                                                            _note(index=3, stream="B")]
    assert take(key="7", root=tmp_path) == []
    assert take(key="8", root=tmp_path) == [_note(index=1)]
    assert take(key="9", root=tmp_path / "missing") == []  # no read on this executor yet
    assert list(tmp_path.iterdir()) == []  # a task's folder goes with its last note


def test_no_task_no_note(tmp_path):
    leave(_note(), root=tmp_path).release()  # outside a Spark task: nothing to tie the note to
    assert list(tmp_path.iterdir()) == []
    assert take(root=tmp_path) == []


def test_the_notes_go_under_the_first_spark_local_dir_never_the_temp_dir():
    """Both workers of a task are given the same SPARK_LOCAL_DIRS; the first is used even when a later one
    would do (two workers must not choose differently)."""
    assert notes_root({"SPARK_LOCAL_DIRS": "/a/blockmgr-1,/b/blockmgr-2"}) == \
        notes_root({"SPARK_LOCAL_DIRS": "/a/blockmgr-1"}) == __import__("pathlib").Path("/a/blockmgr-1") / FOLDER
    with pytest.raises(LocalDirectoryError, match="no SPARK_LOCAL_DIRS") as refused:
        notes_root({"TMPDIR": "/tmp"})
    assert "order='none'" in str(refused.value)


def test_a_read_that_cannot_leave_its_note_fails_naming_the_folder(tmp_path):
    blocked = tmp_path / "notes"
    blocked.write_text("a plain file where the folder goes (a full disk, a read-only mount look the same)")
    with pytest.raises(LocalDirectoryError) as failed:
        leave(_note(stream="ORDERS"), key="7", root=blocked)
    text = str(failed.value)
    assert "stream 'ORDERS'" in text and str(blocked / "7") in text and "spark.local.dir" in text
    assert failed.value.path == blocked / "7"


def test_a_write_that_cannot_look_or_read_a_note_is_refused(tmp_path):
    blocked = tmp_path / "notes"
    blocked.write_text("not a folder")
    with pytest.raises(LocalDirectoryError, match="order guard cannot tell"):
        take(key="7", root=blocked)
    leave(_note(), key="8", root=tmp_path).release()
    (tmp_path / "8" / "S.1").write_text("{not json")
    with pytest.raises(LocalDirectoryError, match="cannot read the notes") as refused:
        take(key="8", root=tmp_path)
    assert refused.value.path == tmp_path / "8" / "S.1"


def test_the_sweep_takes_old_notes_but_never_one_a_running_read_holds(tmp_path, monkeypatch):
    running = leave(_note(index=0), key="1", root=tmp_path)  # a read still under way
    leave(_note(index=1), key="2", root=tmp_path).release()  # a read into count(): nobody takes its note
    leave(_note(index=2), key="3", root=tmp_path).release()  # a read that ended a moment ago
    old = time.time() - task_notes.MAX_AGE - 10
    for path in (tmp_path / "1" / "S.0", tmp_path / "2" / "S.1", tmp_path / "2"):
        os.utime(path, (old, old))
    monkeypatch.setattr(task_notes, "_last_sweep", 0.0)
    task_notes._sweep(tmp_path)
    assert (tmp_path / "1" / "S.0").exists()  # held: its write may take it yet
    assert not (tmp_path / "2").exists()  # old and let go: swept, folder and all
    assert (tmp_path / "3" / "S.2").exists()  # young
    running.release()  # the read ends: its note's age starts now, so the write of its task still finds it
    monkeypatch.setattr(task_notes, "_last_sweep", 0.0)
    task_notes._sweep(tmp_path)
    assert take(key="1", root=tmp_path) == [_note(index=0)]
