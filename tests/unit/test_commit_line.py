"""The commit line (sink/task/commit.py, issue #54): one short INFO line of counts per write or micro-batch,
and a WARNING for each order problem, with what to do."""

from __future__ import annotations

import logging

from pyspark_jetstream.sink.task.commit import SinkCommitMessage, log_totals


def _lines(caplog, *messages, batch_id=7):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pyspark_jetstream"):
        log_totals(list(messages), batch_id, "stream 'S'")
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("pyspark_jetstream")]


def test_a_plain_commit_is_one_short_line(caplog):
    lines = _lines(caplog, SinkCommitMessage(partition=0, published=300, duplicates=2),
                   SinkCommitMessage(partition=1, published=200, batches=1))
    assert lines == [("INFO", "JetStream sink batch 7 committed: 500 published, 2 duplicates, 0 dead-lettered, "
                              "0 expired, 1 fast-ingest batches (to stream 'S')")]


def test_the_other_counts_show_when_not_zero_and_order_problems_warn(caplog):
    lines = _lines(caplog, SinkCommitMessage(published=10, already_stored=3, reordered=4, left_out_of_order=2,
                                             unpositioned=5, out_of_order=6, older_in_write=1, older_than_stored=2))
    assert lines[0] == ("INFO", "JetStream sink batch 7 committed: 10 published, 0 duplicates, 0 dead-lettered, "
                                "0 expired, 3 stored before, 4 moved, 2 out of order, 5 unpositioned, 6 out of "
                                "source order, 3 older skipped (2 not newer than the stored value, 1 superseded) "
                                "(to stream 'S')")
    warnings = [text for level, text in lines[1:] if level == "WARNING"]
    assert len(warnings) == 3 and len(lines) == 4
    assert warnings[0].startswith("JetStream sink batch 7 (to stream 'S'): 2 messages stay ahead of an earlier one")
    assert ": 5 rows published in the order they arrived, without the column 'seq'" in warnings[1]
    assert ": 6 rows came after a later source sequence of their subject in the same task" in warnings[2]
